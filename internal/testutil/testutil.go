// Package testutil holds what ONC's tests share: the gate for tests that
// need root or outside programs (which fail instead of skipping under
// ONC_PRIVILEGED=1, as CI sets it), the real binaries, real etcd servers,
// a real kube-apiserver (internal/kubeapiserver), throwaway network
// namespaces and polling. The lab's own test helpers are in lab/labtest;
// this package does not depend on e2e.
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

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/kubeapiserver"
	"github.com/onc-net/onc/internal/netns"
	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
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

// EmbeddedEtcd starts an in-process etcd on loopback; data lives in dir
// (a new temporary one when empty). It is stopped when the test ends.
func EmbeddedEtcd(t testing.TB, dir string) *etcdstore.Embedded {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	e, err := etcdstore.StartEmbedded(dir, fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// SecureEtcd starts an in-process etcd as the controller runs it (mutual
// TLS, authentication; its PKI in a new temporary directory) on loopback.
// It is stopped when the test ends.
func SecureEtcd(t testing.TB) *etcdstore.Embedded {
	t.Helper()
	e, err := etcdstore.StartEmbeddedTLS(t.TempDir(), fmt.Sprintf("https://127.0.0.1:%d", FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// SecureEtcdStore opens ONC's store on e with files' credentials; it is
// closed when the test ends.
func SecureEtcdStore(t testing.TB, e *etcdstore.Embedded, files etcdstore.TLSFiles) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{e.ClientURL}, TLSFiles: files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// SecureEtcdNode makes node name's etcd user and role on e, as the
// controller does (onc-controller node-cert), and returns its agent's
// credentials.
func SecureEtcdNode(t testing.TB, e *etcdstore.Embedded, name string) etcdstore.TLSFiles {
	t.Helper()
	if err := SecureEtcdStore(t, e, e.PKI.Controller()).AuthorizeNode(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	files, err := e.PKI.IssueNode(name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// SecureEtcdClient is a raw etcd client of e with files' credentials,
// closed when the test ends.
func SecureEtcdClient(t testing.TB, e *etcdstore.Embedded, files etcdstore.TLSFiles) *clientv3.Client {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.ClientURL}, TLS: cfg, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// EtcdServer starts Debian's etcd (package etcd-server) as a separate
// process on loopback and returns its client URL. It is killed (by PID)
// when the test ends.
func EtcdServer(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	Require(t, err == nil, "etcd binary not installed (apt-get install etcd-server; make prereqs)")
	client := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
	log := filepath.Join(t.TempDir(), "etcd.log")
	Start(t, log, bin, "--name", "onc-test", "--data-dir", t.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "onc-test="+peer, "--log-level", "error")
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", strings.TrimPrefix(client, "http://"))
		if err == nil {
			c.Close()
			return client
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log)
			t.Fatalf("etcd did not listen on %s in 20s:\n%s", client, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
// `make kube-bins` builds it) on loopback, backed by an embedded etcd, and
// stops it (by PID) when the test ends.
func KubeAPIServer(t testing.TB) *kubeapiserver.Server {
	t.Helper()
	requireTier(t, "runs kube-apiserver")
	bin := filepath.Join(os.Getenv("ONC_KUBE_BIN"), "kube-apiserver")
	_, err := os.Stat(bin)
	Require(t, os.Getenv("ONC_KUBE_BIN") != "" && err == nil, "kube-apiserver not built: run `make kube-bins` (it sets ONC_KUBE_BIN for make test)")
	etcd := EmbeddedEtcd(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := kubeapiserver.Start(ctx, "", t.TempDir(), bin, etcd.ClientURL, netip.MustParseAddr("127.0.0.1"), FreePort(t))
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

// Cgroup is a fresh child of the cgroup v2 root, removed when the test
// ends: programs attached there act only on the test's own sockets, never
// the machine's.
func Cgroup(t testing.TB) string {
	t.Helper()
	Privileged(t)
	root, err := bpf.ResolveCgroup("")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "onc-"+Prefix())
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
