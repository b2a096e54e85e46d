// Package daemon runs programs as daemons, optionally inside a named
// network namespace: each in its own session, so it outlives its starter,
// and stopped later by PID after checking the PID is still that program.
// The lab (lab) runs its controller, agents, etcd and kube-apiserver
// this way, and tests run kube-apiserver (internal/kubeapiserver).
package daemon

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a daemon started inside a namespace. It outlives the command
// that started it (own session); Stop stops it by PID, after checking the
// PID is still that program. Its JSON form is kept in the lab's state file.
type Process struct {
	PID  int    `json:"pid"`
	Path string `json:"path"`
	Log  string `json:"log"`
}

// Start runs bin in netns ("" = this process's namespace), logging to logPath.
func Start(netns, logPath, bin string, args ...string) (Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Process{}, err
	}
	defer logf.Close()
	// `ip netns exec` enters the namespace and execs bin: the PID is bin's.
	cmd := exec.Command("ip", append([]string{"netns", "exec", netns, bin}, args...)...)
	if netns == "" {
		cmd = exec.Command(bin, args...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Process{}, fmt.Errorf("start %s in %s: %w", bin, netns, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // reap it if it exits while we run
	p := Process{PID: cmd.Process.Pid, Path: bin, Log: logPath}
	for deadline := time.Now().Add(5 * time.Second); !p.Alive(); { // until `ip` has exec'd bin
		select {
		case <-done:
			return p, fmt.Errorf("%s exited at once; log %s:\n%s", bin, logPath, Tail(logPath, 20))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("%s did not start in 5s", bin)
		}
	}
	return p, nil
}

// Alive reports whether the process is still the program we started.
func (p Process) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(p.PID) + "/exe")
	if err != nil {
		return false
	}
	if exe != p.Path {
		return false
	}
	// A zombie still has /proc/PID, but its state is Z.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
	return err == nil && !dead(stat)
}

// dead reports whether a task's /proc stat says it has exited (Z or X).
func dead(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// exited reports whether every thread of the process has exited. Alive
// turns false sooner, once the main thread has let go of the program's
// memory, while other threads may still hold its files: the lock or the
// socket that its successor is about to take.
func (p Process) exited() bool {
	dir := "/proc/" + strconv.Itoa(p.PID) + "/task/"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, t := range tasks {
		if stat, err := os.ReadFile(dir + t.Name() + "/stat"); err == nil && !dead(stat) {
			return false
		}
	}
	return true
}

// Stop sends SIGTERM, waits up to 10s, then SIGKILL, and returns once the
// process's last thread is gone (or after another 5s).
func (p Process) Stop() {
	if !p.Alive() {
		return
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	for i := 0; i < 100 && p.Alive(); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if p.Alive() {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	for i := 0; i < 500 && !p.exited(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// Tail returns the last n lines of the file at path (a log), or "" if it
// cannot be read.
func Tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
