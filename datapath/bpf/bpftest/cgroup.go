package bpftest

// The cgroup-attached programs' tests (datapath/services,
// datapath/bypass) run in a throwaway cgroup, so that what they attach
// acts only on the test's own sockets.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
)

// Cgroup is a fresh child of the cgroup v2 root, removed when the test
// ends: programs attached there act only on the test's own sockets, never
// the machine's.
func Cgroup(t testing.TB) string {
	t.Helper()
	testutil.Privileged(t)
	root, err := bpf.ResolveCgroup("")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "onc-"+testutil.Prefix())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Removable once its processes have left or exited.
		for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}

// JoinCgroup moves this test process into the cgroup dir until the test
// ends, so that every socket it makes, in any namespace, belongs to dir.
func JoinCgroup(t testing.TB, dir string) {
	t.Helper()
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	orig := "/" // the v2 line is "0::/path", beside any v1 ones
	for _, line := range strings.Split(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			orig = p
		}
	}
	root, err := bpf.ResolveCgroup("")
	if err != nil {
		t.Fatal(err)
	}
	pid := []byte(fmt.Sprint(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		t.Fatalf("join cgroup %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(root, orig, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("leave cgroup %s for %s: %v", dir, orig, err)
		}
	})
}
