package agent

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// lockConfig is an agent's configuration with the given directories.
func lockConfig(node, stateDir, runDir string) Config {
	cfg := DefaultConfig()
	cfg.NodeName, cfg.StateDir, cfg.RunDir = node, stateDir, runDir
	return cfg
}

// lockNode locks cfg's directories until the test ends.
func lockNode(t *testing.T, cfg Config) *NodeLock {
	t.Helper()
	l, err := LockNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// refusal checks that locking cfg fails naming the holder.
func refusal(t *testing.T, cfg Config, want string) {
	t.Helper()
	l, err := LockNode(cfg)
	if err == nil {
		l.Close()
		t.Fatalf("a second agent locked %s and %s", cfg.StateDir, cfg.RunDir)
	}
	if !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), ": one agent per node") {
		t.Fatalf("refusal %q, want it to say %q", err, want)
	}
}

// A second agent on the state or the run directory of a running one
// refuses to start and names it; once the first has stopped, the second
// starts although the lock files are still there.
func TestLockNodeRefusesASecondAgent(t *testing.T) {
	me := fmt.Sprintf("(pid %d, node node-a, since ", os.Getpid())
	for _, tc := range []struct {
		name          string
		first, second func(shared string) Config
		want          string
	}{
		{name: "shared state directory",
			first:  func(shared string) Config { return lockConfig("node-a", shared, t.TempDir()) },
			second: func(shared string) Config { return lockConfig("node-b", shared, t.TempDir()) },
			want:   "state directory %s is held by another agent " + me},
		{name: "shared run directory",
			first:  func(shared string) Config { return lockConfig("node-a", t.TempDir(), shared) },
			second: func(shared string) Config { return lockConfig("node-b", t.TempDir(), shared) },
			want:   "run directory %s is held by another agent " + me},
		{name: "state directory is the run directory",
			first:  func(shared string) Config { return lockConfig("node-a", shared, shared) },
			second: func(shared string) Config { return lockConfig("node-b", shared, shared) },
			want:   "state and run directory %s is held by another agent " + me},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shared := t.TempDir()
			first := lockNode(t, tc.first(shared))
			second := tc.second(shared)
			refusal(t, second, fmt.Sprintf(tc.want, shared))
			if second.StateDir != shared {
				// The refused agent released its own state directory,
				// which it had locked before the run directory refused it.
				lockNode(t, lockConfig("node-c", second.StateDir, t.TempDir())).Close()
			}

			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(shared, lockFileName)); err != nil {
				t.Fatalf("the lock file went with its holder: %v", err)
			}
			lockNode(t, second)
		})
	}
}

// lockHolderEnv makes the test binary a lock holder (holdNodeLock): its
// value is the state and the run directory, as a path list.
const lockHolderEnv = "ONC_TEST_LOCK_HOLDER"

// holdNodeLock locks the directories in dirs, says "locked" and holds the
// lock until it is killed.
func holdNodeLock(dirs string) int {
	d := filepath.SplitList(dirs)
	l, err := LockNode(lockConfig("holder", d[0], d[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin) // the test keeps stdin open
	return 0
}

// A holder that dies without closing anything (as in a crash) leaves no
// stale lock.
func TestLockNodeFreedWhenTheHolderDies(t *testing.T) {
	cfg := lockConfig("node-b", t.TempDir(), t.TempDir())
	holder := exec.Command(os.Args[0])
	holder.Env = append(os.Environ(), lockHolderEnv+"="+cfg.StateDir+string(os.PathListSeparator)+cfg.RunDir)
	holder.Stderr = os.Stderr
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "locked\n" {
		t.Fatalf("the holder did not lock: %q, %v", line, err)
	}
	refusal(t, cfg, fmt.Sprintf("state directory %s is held by another agent (pid %d, node holder, since ", cfg.StateDir, holder.Process.Pid))

	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait() // killed: an error by design
	lockNode(t, cfg)
}
