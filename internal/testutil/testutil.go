// Package testutil holds what ONC's tests share: the gate for tests that
// need root or outside programs (which fail instead of skipping under
// ONC_PRIVILEGED=1, as CI sets it), the real binaries, a real
// kube-apiserver (internal/kubeapiserver), throwaway network namespaces and
// polling. It imports no other ONC package but internal ones, so any
// package's tests may use it: the helpers that start a datastore backend's
// server are beside it (datastore/etcdserver/etcdtest), the datapath's
// beside the datapath (datapath/bpf/bpftest), the lab's in lab/labtest.
package testutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onc-net/onc/internal/kubeapiserver"
	"github.com/onc-net/onc/internal/netns"
	"github.com/vishvananda/netlink"
)

// Strict reports whether missing prerequisites are failures (CI).
func Strict() bool { return os.Getenv("ONC_PRIVILEGED") == "1" }

// Require skips the test when ok is false, or fails it under ONC_PRIVILEGED=1.
func Require(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if Strict() {
		t.Fatalf("cannot run (ONC_PRIVILEGED=1 makes this a failure): %s", why)
	}
	t.Skipf("skipped: %s (set ONC_PRIVILEGED=1 to make this a failure)", why)
}

// Privileged gates tests that need root: netns, veth, VXLAN, iptables.
func Privileged(t testing.TB) {
	t.Helper()
	requireTier(t, "needs root")
	Require(t, os.Geteuid() == 0, "needs root for network namespaces")
	for _, bin := range []string{"ip", "iptables"} {
		_, err := exec.LookPath(bin)
		Require(t, err == nil, bin+" not installed (make prereqs)")
	}
}

// Prefix returns a short name prefix unique to this test run, for
// namespaces and interfaces ("t" + 5 hex digits).
func Prefix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b)[:5]
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binaries builds ONC's commands once per test process and returns the
// directory holding them.
func Binaries(t testing.TB) string {
	t.Helper()
	requireTier(t, "runs ONC's binaries")
	if !inMain.Load() {
		t.Fatal("testutil.Binaries needs the package's TestMain to call testutil.Main, which removes the binaries afterwards")
	}
	buildOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		binDir, buildErr = os.MkdirTemp("", "onc-bin-")
		if buildErr != nil {
			return
		}
		AtExit(func() { os.RemoveAll(binDir) })
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./cmd/onc", "./cmd/onc-agent", "./cmd/onc-controller", "./cmd/onctl", "./cmd/onc-lab")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

var (
	inMain   atomic.Bool
	atExitMu sync.Mutex
	atExit   []func()
)

// Main runs a package's tests (call it from TestMain), then what AtExit
// registered: what the package's tests share, such as Binaries' build
// (about 270 MB a run), must not outlive the test process.
func Main(m *testing.M) {
	inMain.Store(true)
	code := m.Run()
	atExitMu.Lock()
	for i := len(atExit) - 1; i >= 0; i-- {
		atExit[i]()
	}
	atExitMu.Unlock()
	os.Exit(code)
}

// AtExit registers fn to run after all of the package's tests (Main).
func AtExit(fn func()) {
	atExitMu.Lock()
	defer atExitMu.Unlock()
	atExit = append(atExit, fn)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Deps lists the packages that patterns (as go list takes them, from the
// module's root) import, directly or not, themselves included: for tests
// of what may import what.
func Deps(t testing.TB, patterns ...string) []string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"list", "-deps"}, patterns...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %v: %v\n%s", patterns, err, stderr)
	}
	return strings.Fields(string(out))
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs bin with its output in log and kills it (by PID) when the
// test ends, if it still runs.
func Start(t testing.TB, log, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	return cmd
}

// Netns creates a named network namespace removed when the test ends.
func Netns(t testing.TB, name string) string {
	t.Helper()
	requireTier(t, "makes a network namespace")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// NetlinkAt returns a netlink handle inside the named namespace, closed
// when the test ends.
func NetlinkAt(t testing.TB, name string) *netlink.Handle {
	t.Helper()
	ns, err := netns.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// InNewNetns creates a namespace named with a unique prefix and suffix,
// runs fn on a thread inside it, and removes it when the test ends.
func InNewNetns(t testing.TB, suffix string, fn func()) {
	t.Helper()
	Privileged(t)
	ns, err := netns.Open(Netns(t, Prefix()+"-"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Do(ns, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// KubeAPIServer starts a real kube-apiserver (from $ONC_KUBE_BIN, where
// `make kube-bins` builds it) on loopback, backed by the etcd at etcdURL
// (datastore/etcdserver/etcdtest.Embedded's, say), and stops it (by PID)
// when the test ends.
func KubeAPIServer(t testing.TB, etcdURL string) *kubeapiserver.Server {
	t.Helper()
	requireTier(t, "runs kube-apiserver")
	bin := filepath.Join(os.Getenv("ONC_KUBE_BIN"), "kube-apiserver")
	_, err := os.Stat(bin)
	Require(t, os.Getenv("ONC_KUBE_BIN") != "" && err == nil, "kube-apiserver not built: run `make kube-bins` (it sets ONC_KUBE_BIN for make test)")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := kubeapiserver.Start(ctx, "", t.TempDir(), bin, etcdURL, netip.MustParseAddr("127.0.0.1"), FreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// WaitFor polls cond every 50ms until it holds, or fails the test after d.
func WaitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}
