package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
)

// fakeDatapath is the kernel as the agent's logic sees it through the
// seam: which pods and peers exist. Network namespaces "exist" when the
// test says so. fail makes the named call fail; partial makes AttachPod
// fail after it has made the veth, as a real failure half-way would.
type fakeDatapath struct {
	mu      sync.Mutex
	up      datapath.Uplink
	setup   *datapath.NodeSetup
	fp      datapath.FastPath
	netns   map[string]bool
	pods    map[string]datapath.Pod         // by host interface
	peers   map[string]datastore.Node       // programmed, by name
	adopted map[string]bool                 // host interfaces AdoptPod saw
	fail    map[string]error                // by method name
	broken  map[string]string               // CheckPod mismatch, by host interface
	syncs   int                             // SyncPeers calls
	checks  int                             // of which with checkKernel
	hook    map[string]func(p datapath.Pod) // runs inside the named call
}

func newFakeDatapath() *fakeDatapath {
	return &fakeDatapath{
		up:    datapath.Uplink{Name: "eth0", Index: 2, MTU: 1500, NodeIP: netip.MustParseAddr("192.0.2.1")},
		netns: map[string]bool{}, pods: map[string]datapath.Pod{}, peers: map[string]datastore.Node{},
		adopted: map[string]bool{}, fail: map[string]error{}, broken: map[string]string{}, hook: map[string]func(datapath.Pod){},
	}
}

func (f *fakeDatapath) Uplink() datapath.Uplink { return f.up }

func (f *fakeDatapath) BringUp(s datapath.NodeSetup) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail["BringUp"]; err != nil {
		return err
	}
	f.setup = &s
	return nil
}

func (f *fakeDatapath) SyncPeers(self string, nodes []datastore.Node, checkKernel bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs++
	if checkKernel {
		f.checks++
	}
	if err := f.fail["SyncPeers"]; err != nil {
		return err
	}
	f.peers = map[string]datastore.Node{}
	for _, n := range nodes {
		if n.Name != self && n.IPv4PodCIDR().IsValid() {
			f.peers[n.Name] = n
		}
	}
	return nil
}

func (f *fakeDatapath) ProgrammedPeers() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for n := range f.peers {
		out[n] = true
	}
	return out
}

func (f *fakeDatapath) AttachPod(p datapath.Pod) (datapath.PodLink, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hook["AttachPod"]; h != nil {
		h(p)
	}
	if !f.netns[p.Netns] {
		return datapath.PodLink{}, fmt.Errorf("%w: %s", datapath.ErrNoNetns, p.Netns)
	}
	for _, have := range f.pods {
		if have.Netns == p.Netns && have.IfName == p.IfName {
			return datapath.PodLink{}, fmt.Errorf("%w: %s in %s", datapath.ErrIfaceExists, p.IfName, p.Netns)
		}
	}
	if err := f.fail["AttachPod"]; err != nil {
		return datapath.PodLink{}, err
	}
	p.MAC = net.HardwareAddr{0x02, 0, 0, 0, 0, byte(len(f.pods) + 1)}
	f.pods[p.HostIface] = p
	if err := f.fail["AttachPod.partial"]; err != nil {
		return datapath.PodLink{}, err
	}
	return datapath.PodLink{PodMAC: p.MAC, HostMAC: net.HardwareAddr{0x02, 0xff, 0, 0, 0, 1}}, nil
}

func (f *fakeDatapath) AdoptPod(p datapath.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.adopted[p.HostIface] = true
	return nil
}

func (f *fakeDatapath) CheckPod(p datapath.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.netns[p.Netns] {
		return fmt.Errorf("%w: %s", datapath.ErrNoNetns, p.Netns)
	}
	have, ok := f.pods[p.HostIface]
	switch {
	case !ok:
		return fmt.Errorf("host interface %s missing", p.HostIface)
	case f.broken[p.HostIface] != "":
		return errors.New(f.broken[p.HostIface])
	case !slices.Equal(have.IPs, p.IPs) || have.IfName != p.IfName || have.MTU != p.MTU || !slices.Equal(have.Gateways, p.Gateways):
		return fmt.Errorf("pod interface %s is not as made: %+v, want %+v", p.IfName, have, p)
	}
	return nil
}

func (f *fakeDatapath) DetachPod(p datapath.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hook["DetachPod"]; h != nil {
		h(p)
	}
	if err := f.fail["DetachPod"]; err != nil {
		return err
	}
	delete(f.pods, p.HostIface)
	return nil
}

func (f *fakeDatapath) KernelWrites() uint64 { return 0 }

func (f *fakeDatapath) FastPath() datapath.FastPath {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fp
}

func (f *fakeDatapath) Close() error { return nil }

// noServices is a node without a socket load balancer: the lab's tests
// cover Services.
type noServices struct{}

func (noServices) Tables() services.Tables      { return nil }
func (noServices) Status() string               { return "off" }
func (noServices) Mode() services.Mode          { return services.Off }
func (noServices) UplinkErr() error             { return nil }
func (noServices) UplinkFamilies() (bool, bool) { return false, false }
func (noServices) Sync([]services.Service, []netip.Addr, bool) error {
	return errors.New("no socket LB")
}

// quietUnderlay is an underlay that never changes.
type quietUnderlay struct{}

func (quietUnderlay) Watch(ctx context.Context, _ func()) error {
	<-ctx.Done()
	return nil
}

func (quietUnderlay) EvictStaleHeaders() (int, error) { return 0, nil }

func (f *fakeDatapath) podCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pods)
}

func (f *fakeDatapath) setFail(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = err
}

// The agent's tests share one embedded etcd (real, unprivileged); each
// test has its own key prefix.
var (
	etcdOnce sync.Once
	etcdURL  string
	etcdErr  error
	prefixes atomic.Int64
)

func testStore(t *testing.T) datastore.Store {
	t.Helper()
	etcdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "onc-agent-test-etcd")
		if err != nil {
			etcdErr = err
			return
		}
		var e *etcdserver.Server
		// Every test of the package uses it; it goes after the last.
		e, etcdErr = etcdserver.Start(dir, fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t)))
		if etcdErr == nil {
			etcdURL = e.ClientURL
			testutil.AtExit(func() { e.Close() })
		}
		testutil.AtExit(func() { os.RemoveAll(dir) })
	})
	if etcdErr != nil {
		t.Fatal(etcdErr)
	}
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{etcdURL},
		Prefix: fmt.Sprintf("/onc-agent-test/%d/", prefixes.Add(1))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testAgent is an agent on a fake datapath and a real datastore.
type testAgent struct {
	*Agent
	dp       *fakeDatapath
	policyDP *fakePolicy
	bypassDP *fakeBypass
	store    datastore.Store
	cni      *cniServer
	ctl      *onctlServer
}

const self = "node-a"

// newTestAgent makes an agent; edit, if given, changes its configuration.
// The fake loads no fast path, so the agent starts with it off unless edit
// turns it on.
func newTestAgent(t *testing.T, edit ...func(*Config)) *testAgent {
	t.Helper()
	return newAgentOn(t, testStore(t), edit...)
}

// newAgentOn is newTestAgent on store.
func newAgentOn(tb testing.TB, store datastore.Store, edit ...func(*Config)) *testAgent {
	tb.Helper()
	return newAgentWith(tb, store, newFakeDatapath(), edit...)
}

// newAgentWith is newAgentOn with dp as its node's datapath.
func newAgentWith(tb testing.TB, store datastore.Store, dp *fakeDatapath, edit ...func(*Config)) *testAgent {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.StateDir, cfg.RunDir = self, tb.TempDir(), tb.TempDir()
	cfg.Datapath.FastPath = false
	cfg.PeerPort = 0 // the fake node address is none of this host's
	for _, e := range edit {
		e(&cfg)
	}
	pol, bp := &fakePolicy{}, &fakeBypass{}
	a, err := New(cfg, store, fakeParts(dp, pol, bp))
	if err != nil {
		tb.Fatal(err)
	}
	return &testAgent{Agent: a, dp: dp, policyDP: pol, bypassDP: bp, store: store, cni: &cniServer{a: a}, ctl: &onctlServer{a: a}}
}

// fakeParts is the agent's datapath made of fakes.
func fakeParts(dp *fakeDatapath, pol *fakePolicy, bp *fakeBypass) Datapath {
	return Datapath{Node: dp, Pods: dp, Policy: pol, Services: noServices{}, Bypass: bp, Underlay: quietUnderlay{}}
}

// ctx is a test's context with a deadline.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// addNode registers a node with a pod CIDR ("" for none yet).
func (ta *testAgent) addNode(t *testing.T, name, ip, cidr string, fastPath bool) {
	t.Helper()
	spec := datastore.NodeSpec{Name: name, IP: netip.MustParseAddr(ip), VTEPMAC: net.HardwareAddr{0x02, 1, 2, 3, 4, byte(len(name))}, FastPath: fastPath}
	if name == self {
		ta.mu.Lock()
		spec = ta.spec
		ta.mu.Unlock()
	}
	if err := ta.store.RegisterNode(ctx(t), spec); err != nil {
		t.Fatal(err)
	}
	if cidr != "" {
		if _, err := datastore.ClaimCIDR(ctx(t), ta.store, name, netip.MustParsePrefix(cidr)); err != nil {
			t.Fatal(err)
		}
	}
}

// bringUp makes the agent ready with pod CIDR cidr.
func (ta *testAgent) bringUp(t *testing.T, cidr string) {
	t.Helper()
	if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}}}); err != nil {
		t.Fatal(err)
	}
	ta.addNode(t, self, "192.0.2.1", cidr, true)
	if err := ta.reconcile(ctx(t), true); err != nil {
		t.Fatal(err)
	}
	if _, reason := ta.readyPool(); reason != "" {
		t.Fatalf("agent not ready after bring-up: %s", reason)
	}
}

// netns makes a "network namespace" exist for the fake datapath.
func (ta *testAgent) netns(path string) string {
	ta.dp.mu.Lock()
	defer ta.dp.mu.Unlock()
	ta.dp.netns[path] = true
	return path
}

// stateFile is the pod IPAM's file.
func (ta *testAgent) stateFile() string { return filepath.Join(ta.cfg.StateDir, "ipam.json") }

// parts is the test agent's datapath, for another agent on the same
// "kernel" (a restart).
func (ta *testAgent) parts() Datapath { return fakeParts(ta.dp, ta.policyDP, ta.bypassDP) }
