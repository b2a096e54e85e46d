package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// One agent per node. Two agents on one state directory would hand out the
// same pod addresses; two on one run directory would take each other's
// sockets (a stray second agent, stopping, once deleted the live agent's
// agent.sock). So an agent locks both directories before it touches
// anything, and a second one refuses to start, naming the holder.

// lockFileName is the lock file in the state and in the run directory. It
// is never removed: an agent locking a new file while another still holds
// the removed one would make two holders.
const lockFileName = "agent.lock"

// NodeLock is an agent's exclusive hold on its state and run directories:
// a flock on each directory's lock file (one, if they are the same
// directory). The kernel releases it when the process dies, so a crash
// leaves no stale lock. It must stay reachable until Close: an unreachable
// *os.File is closed by its finalizer, releasing the lock.
type NodeLock struct {
	runDir string
	files  []*os.File
}

// lockHolder is what a holder writes into its lock files, for the refusal
// of the next agent.
type lockHolder struct {
	PID   int       `json:"pid"` // in the holder's PID namespace (its pod's, on Kubernetes)
	Node  string    `json:"node"`
	Since time.Time `json:"since"`
}

// LockNode locks cfg's state and run directories for this process, creating
// them if needed, or says which agent holds them. Call it before anything
// reads or changes the node.
func LockNode(cfg Config) (*NodeLock, error) {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		return nil, err
	}
	type dir struct{ role, path string }
	dirs := []dir{{"state directory", cfg.StateDir}, {"run directory", cfg.RunDir}}
	same, err := sameDir(cfg.StateDir, cfg.RunDir)
	if err != nil {
		return nil, err
	}
	if same { // a second flock on the same file would refuse us
		dirs = []dir{{"state and run directory", cfg.StateDir}}
	}
	me := lockHolder{PID: os.Getpid(), Node: cfg.NodeName, Since: time.Now().UTC().Truncate(time.Second)}
	l := &NodeLock{runDir: cfg.RunDir}
	for _, d := range dirs {
		f, err := lockDir(d.role, d.path, me)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.files = append(l.files, f)
	}
	return l, nil
}

// sameDir reports whether a and b are one directory, however named.
func sameDir(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}

// lockDir locks dir's lock file and records me in it.
func lockDir(role, dir string, me lockHolder) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	// Not truncated on open: until we hold the lock, its content is the
	// holder's. Go opens it close-on-exec, so the programs the agent runs
	// (iptables, nft) cannot keep the lock after the agent dies.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", role, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s %s is held by another agent (%s): one agent per node", role, dir, describeHolder(path))
		}
		return nil, fmt.Errorf("lock %s %s: %w", role, path, err)
	}
	b, _ := json.Marshal(me) // cannot fail: plain fields
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("record the holder in %s: %w", path, err)
	}
	if _, err := f.WriteAt(append(b, '\n'), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("record the holder in %s: %w", path, err)
	}
	return f, nil
}

// describeHolder says who holds the lock file at path, as it recorded.
func describeHolder(path string) string {
	var h lockHolder
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &h) != nil || h.PID == 0 {
		return "its pid is not yet recorded in " + path // it has just locked it
	}
	return fmt.Sprintf("pid %d, node %s, since %s", h.PID, h.Node, h.Since.Format(time.RFC3339))
}

// Close releases the directories; the lock files stay (lockFileName).
func (l *NodeLock) Close() error {
	var errs []error
	for _, f := range l.files {
		errs = append(errs, f.Close())
	}
	l.files = nil
	return errors.Join(errs...)
}

// listen serves the unix socket name in the locked run directory. Holding
// the lock proves no live agent serves a socket there, so a stale one (a
// dead agent's) is replaced.
func (l *NodeLock) listen(name string) (net.Listener, error) {
	path := filepath.Join(l.runDir, name)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// net would remove whatever is at path on Close; ownedSocket removes
	// only the socket it bound.
	ul.SetUnlinkOnClose(false)
	s := &ownedSocket{UnixListener: ul, path: path}
	if s.bound, err = os.Stat(path); err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ownedSocket is a unix listener that removes its socket file on Close
// only if the file is still the one it bound (same device and inode): a
// socket that replaced it is another agent's.
type ownedSocket struct {
	*net.UnixListener
	path   string
	bound  os.FileInfo
	remove sync.Once // a second Close must not remove a later socket that reuses the inode
}

func (s *ownedSocket) Close() error {
	err := s.UnixListener.Close()
	s.remove.Do(func() {
		if fi, statErr := os.Stat(s.path); statErr == nil && os.SameFile(fi, s.bound) {
			_ = os.Remove(s.path)
		}
	})
	return err
}
