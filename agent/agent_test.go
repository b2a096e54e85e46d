package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/onc-net/onc/agent/peer"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/testutil"
)

func (ta *testAgent) peerIPs() map[string]string {
	ta.dp.mu.Lock()
	defer ta.dp.mu.Unlock()
	out := map[string]string{}
	for name, n := range ta.dp.peers {
		out[name] = n.IP.String() + " " + n.IPv4PodCIDR().String()
	}
	return out
}

func TestReconcilePeers(t *testing.T) {
	ta := newTestAgent(t)
	ta.addNode(t, "node-b", "192.0.2.2", "10.244.2.0/24", true)
	ta.addNode(t, "node-c", "192.0.2.3", "10.244.3.0/24", false)
	ta.addNode(t, "node-d", "192.0.2.4", "", true) // no CIDR yet: not a peer
	ta.bringUp(t, "10.244.1.0/24")

	steps := []struct {
		name   string
		change func(t *testing.T)
		want   map[string]string
	}{
		{"initial", func(*testing.T) {}, map[string]string{
			"node-b": "192.0.2.2 10.244.2.0/24", "node-c": "192.0.2.3 10.244.3.0/24"}},
		{"a node gets its CIDR", func(t *testing.T) {
			if _, err := datastore.ClaimCIDR(ctx(t), ta.store, "node-d", prefix("10.244.4.0/24")); err != nil {
				t.Fatal(err)
			}
		}, map[string]string{
			"node-b": "192.0.2.2 10.244.2.0/24", "node-c": "192.0.2.3 10.244.3.0/24", "node-d": "192.0.2.4 10.244.4.0/24"}},
		{"a node moves to another IP", func(t *testing.T) { ta.addNode(t, "node-b", "192.0.2.22", "", true) }, map[string]string{
			"node-b": "192.0.2.22 10.244.2.0/24", "node-c": "192.0.2.3 10.244.3.0/24", "node-d": "192.0.2.4 10.244.4.0/24"}},
		{"a node leaves", func(t *testing.T) {
			if err := ta.store.DeleteNode(ctx(t), "node-c"); err != nil {
				t.Fatal(err)
			}
		}, map[string]string{"node-b": "192.0.2.22 10.244.2.0/24", "node-d": "192.0.2.4 10.244.4.0/24"}},
	}
	for _, s := range steps {
		s.change(t)
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := ta.peerIPs(); !maps.Equal(got, s.want) {
			t.Errorf("%s: peers %v, want %v", s.name, got, s.want)
		}
	}
	// The fast-path flag of a peer reaches the datapath with it, and only
	// the full reconcile (bring-up's) asked the datapath to check the kernel.
	ta.dp.mu.Lock()
	fp, syncs, checks := ta.dp.peers["node-b"].FastPath, ta.dp.syncs, ta.dp.checks
	ta.dp.mu.Unlock()
	ta.bypassDP.mu.Lock()
	keptCT := ta.bypassDP.keptCT
	ta.bypassDP.mu.Unlock()
	if !fp {
		t.Error("node-b's fast-path flag was lost")
	}
	if syncs != 1+len(steps) || checks != 1 {
		t.Errorf("%d peer syncs, %d checking the kernel; want %d and 1", syncs, checks, 1+len(steps))
	}
	// The bypass's conntrack housekeeping rides the resyncs only.
	if keptCT != 1 {
		t.Errorf("bypassed conntrack entries refreshed %d times; want once, on the full reconcile", keptCT)
	}
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestReconcileBringUp(t *testing.T) {
	t.Run("waits for the CIDR", func(t *testing.T) {
		ta := newTestAgent(t)
		ta.addNode(t, self, "192.0.2.1", "", true)
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if ta.dp.setup != nil {
			t.Error("brought up without a pod CIDR")
		}
		if _, reason := ta.readyPool(); reason == "" {
			t.Error("ready without a pod CIDR")
		}
	})
	t.Run("registers again when the record is missing", func(t *testing.T) {
		ta := newTestAgent(t)
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, err := ta.store.Node(ctx(t), self); err != nil {
			t.Errorf("the node was not registered again: %v", err)
		}
	})
	t.Run("a failed bring-up is not ready and retried", func(t *testing.T) {
		ta := newTestAgent(t)
		ta.dp.setFail("BringUp", errors.New("cannot create onc.vxlan: file exists"))
		ta.addNode(t, self, "192.0.2.1", "10.244.1.0/24", true)
		if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: prefix("10.244.0.0/16"), NodePrefixLen: 24}}}); err != nil {
			t.Fatal(err)
		}
		if err := ta.reconcile(ctx(t), false); err == nil {
			t.Fatal("reconcile hid the bring-up failure")
		}
		if _, reason := ta.readyPool(); !strings.Contains(reason, "onc.vxlan") {
			t.Errorf("not-ready reason %q does not say why", reason)
		}
		ta.dp.setFail("BringUp", nil)
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, reason := ta.readyPool(); reason != "" {
			t.Errorf("still not ready: %s", reason)
		}
		if got := ta.dp.setup; got == nil || got.PodCIDR != prefix("10.244.1.0/24") || got.ClusterCIDR != prefix("10.244.0.0/16") ||
			got.VTEPMAC.String() != ta.vtepMAC.String() {
			t.Errorf("brought up with %+v", got)
		}
	})
	// A node of an IPv6-only cluster runs with its IPv6 block alone.
	t.Run("an IPv6-only node brings up its IPv6 block", func(t *testing.T) {
		ta := newTestAgent(t)
		ta.addNode(t, self, "fd00:172::1", "fd00:10:244:1::/64", true)
		if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: prefix("fd00:10:244::/56"), NodePrefixLen: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, reason := ta.readyPool(); reason != "" {
			t.Errorf("not ready: %s", reason)
		}
		if got := ta.dp.setup; got == nil || got.PodCIDR.IsValid() || got.ClusterCIDR.IsValid() ||
			got.PodCIDRv6 != prefix("fd00:10:244:1::/64") || got.ClusterCIDRv6 != prefix("fd00:10:244::/56") {
			t.Errorf("brought up with %+v", got)
		}
		r := ta.mustAdd(t, "c1", "/run/netns/p1")
		var res current.Result
		if err := json.Unmarshal(r.Result, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.IPs) != 1 || res.IPs[0].Address.String() != "fd00:10:244:1::2/128" || res.IPs[0].Gateway.String() != "fd00:10:244:1::1" {
			t.Errorf("ADD result %+v, want one IPv6 address via the IPv6 gateway", res.IPs)
		}
	})
	// Over an IPv6 underlay a node publishes the fast path only once it
	// is up: peers then send it zero-checksum frames, which only the
	// rebuilt onc.vxlan takes (an upgraded agent's first registration
	// comes before the device is rebuilt).
	t.Run("an IPv6-underlay node publishes the fast path once up", func(t *testing.T) {
		dp := newFakeDatapath()
		dp.up.NodeIP = netip.MustParseAddr("fd00:172::1")
		ta := newAgentWith(t, testStore(t), dp, func(c *Config) { c.Datapath.FastPath = true })
		if err := ta.store.RegisterNode(ctx(t), ta.published()); err != nil {
			t.Fatal(err)
		}
		if n, err := ta.store.Node(ctx(t), self); err != nil || n.FastPath {
			t.Fatalf("registered before the node is up: fast path %v (%v), want off", n.FastPath, err)
		}
		ta.addNode(t, self, "fd00:172::1", "fd00:10:244:1::/64", false)
		if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: prefix("fd00:10:244::/56"), NodePrefixLen: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if n, err := ta.store.Node(ctx(t), self); err != nil || !n.FastPath {
			t.Fatalf("once up: fast path %v (%v), want on", n.FastPath, err)
		}
	})
	// Linux turns IPv6 off on a link under 1280 bytes: a node whose pods
	// would get less does not come up with IPv6 pods, saying why.
	t.Run("an IPv6 block with a pod MTU under 1280 is not ready", func(t *testing.T) {
		ta := newTestAgent(t, func(c *Config) { c.MTU = 1200 })
		ta.addNode(t, self, "fd00:172::1", "fd00:10:244:1::/64", true)
		if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: prefix("fd00:10:244::/56"), NodePrefixLen: 64}}}); err != nil {
			t.Fatal(err)
		}
		if err := ta.reconcile(ctx(t), false); err == nil {
			t.Fatal("brought up IPv6 pods with an MTU of 1200")
		}
		if _, reason := ta.readyPool(); !strings.Contains(reason, "pod MTU 1200 is under IPv6's minimum of 1280") || ta.dp.setup != nil {
			t.Errorf("not-ready reason %q, brought up with %+v", reason, ta.dp.setup)
		}
	})
	t.Run("a dual-stack node brings up both blocks, in the cluster's family order", func(t *testing.T) {
		ta := newTestAgent(t)
		dual := datastore.ClusterConfig{Pools: []datastore.Pool{
			{CIDR: prefix("fd00:10:244::/56"), NodePrefixLen: 64}, {CIDR: prefix("10.244.0.0/16"), NodePrefixLen: 24}}}
		if err := ta.store.PutClusterConfig(ctx(t), dual); err != nil {
			t.Fatal(err)
		}
		// The IPv4 block first: the node waits for its IPv6 one.
		ta.addNode(t, self, "192.0.2.1", "10.244.1.0/24", true)
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, reason := ta.readyPool(); !strings.Contains(reason, "waiting for this node's pod CIDR of the cluster's ipv6 range fd00:10:244::/56") || ta.dp.setup != nil {
			t.Fatalf("with the IPv4 block alone: not-ready reason %q, brought up with %+v", reason, ta.dp.setup)
		}
		if _, err := datastore.ClaimCIDR(ctx(t), ta.store, self, prefix("fd00:10:244:1::/64")); err != nil {
			t.Fatal(err)
		}
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, reason := ta.readyPool(); reason != "" {
			t.Errorf("not ready: %s", reason)
		}
		if got := ta.dp.setup; got == nil || got.PodCIDR != prefix("10.244.1.0/24") || got.ClusterCIDR != prefix("10.244.0.0/16") ||
			got.PodCIDRv6 != prefix("fd00:10:244:1::/64") || got.ClusterCIDRv6 != prefix("fd00:10:244::/56") {
			t.Errorf("brought up with %+v", got)
		}
		// A pod gets both addresses, IPv6 first as the cluster orders
		// them, each with its gateway and default route.
		r := ta.mustAdd(t, "c1", "/run/netns/p1")
		var res current.Result
		if err := json.Unmarshal(r.Result, &res); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ip := range res.IPs {
			got = append(got, ip.Address.String()+" via "+ip.Gateway.String())
		}
		for _, rt := range res.Routes {
			got = append(got, rt.Dst.String()+" via "+rt.GW.String())
		}
		want := []string{"fd00:10:244:1::2/128 via fd00:10:244:1::1", "10.244.1.2/32 via 10.244.1.1", "::/0 via fd00:10:244:1::1", "0.0.0.0/0 via 10.244.1.1"}
		if !slices.Equal(got, want) {
			t.Errorf("ADD result %v, want %v", got, want)
		}
		ta.dp.mu.Lock()
		pod := ta.dp.pods[datapath.HostIfaceName("c1", "eth0")]
		ta.dp.mu.Unlock()
		if fmt.Sprint(pod.IPs, pod.Gateways) != "[fd00:10:244:1::2 10.244.1.2] [fd00:10:244:1::1 10.244.1.1]" {
			t.Errorf("the datapath made the pod with %v via %v", pod.IPs, pod.Gateways)
		}
		// Its IPv6 block changes under it: it may be another node's now.
		if err := ta.store.ReleaseCIDR(ctx(t), self); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"10.244.1.0/24", "fd00:10:244:9::/64"} {
			if _, err := datastore.ClaimCIDR(ctx(t), ta.store, self, prefix(p)); err != nil {
				t.Fatal(err)
			}
		}
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, reason := ta.readyPool(); !strings.Contains(reason, "IPv6 pod CIDR changed from fd00:10:244:1::/64 to fd00:10:244:9::/64") {
			t.Errorf("after its IPv6 block changed: not-ready reason %q", reason)
		}
	})
	t.Run("a changed CIDR stops readiness", func(t *testing.T) {
		ta := newTestAgent(t)
		ta.bringUp(t, "10.244.1.0/24")
		if err := ta.store.ReleaseCIDR(ctx(t), self); err != nil {
			t.Fatal(err)
		}
		if _, err := datastore.ClaimCIDR(ctx(t), ta.store, self, prefix("10.244.9.0/24")); err != nil {
			t.Fatal(err)
		}
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
		if _, reason := ta.readyPool(); !strings.Contains(reason, "10.244.9.0/24") {
			t.Errorf("not-ready reason %q", reason)
		}
	})
}

func TestMTU(t *testing.T) {
	for _, tc := range []struct {
		mtu     int
		want    int
		wantErr bool
	}{{0, 1450, false}, {1400, 1400, false}, {1451, 0, true}, {575, 0, true}} {
		cfg := DefaultConfig()
		cfg.NodeName, cfg.StateDir, cfg.MTU = self, t.TempDir(), tc.mtu
		a, err := New(cfg, nil, fakeParts(newFakeDatapath(), &fakePolicy{}, &fakeBypass{}))
		if (err != nil) != tc.wantErr {
			t.Errorf("MTU %d: err %v", tc.mtu, err)
			continue
		}
		if err == nil && a.podMTU != tc.want {
			t.Errorf("MTU %d: pod MTU %d, want %d", tc.mtu, a.podMTU, tc.want)
		}
	}
}

// Run wires the peer watcher to the datastore's changes: a node that
// appears is programmed without anyone calling reconcile, and the status
// says which generation is applied.
func TestRunFollowsTheDatastore(t *testing.T) {
	ta := newTestAgent(t)
	if err := ta.store.PutClusterConfig(ctx(t), datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: prefix("10.244.0.0/16"), NodePrefixLen: 24}}}); err != nil {
		t.Fatal(err)
	}
	ta.run(t)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the node's registration", func() bool { _, err := ta.store.Node(ctx(t), self); return err == nil })
	if _, err := datastore.ClaimCIDR(ctx(t), ta.store, self, prefix("10.244.1.0/24")); err != nil {
		t.Fatal(err)
	}
	waitFor("readiness", func() bool { _, reason := ta.readyPool(); return reason == "" })
	ta.addNode(t, "node-b", "192.0.2.2", "10.244.2.0/24", true)
	waitFor("node-b programmed", func() bool { return ta.dp.ProgrammedPeers()["node-b"] })

	st, err := ta.ctl.GetStatus(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Watchers) != 2 || st.Watchers[0].Name != "peers" || st.Watchers[0].Seen == 0 || st.Watchers[0].LastError != "" ||
		st.Watchers[1].Name != "underlay" || st.Watchers[1].LastError != "" {
		t.Fatalf("watchers in status: %v", st.Watchers)
	}
	if !st.Ready || st.Peers != 1 || st.PodCidr != "10.244.1.0/24" {
		t.Errorf("status: ready=%v peers=%d podCIDR=%s", st.Ready, st.Peers, st.PodCidr)
	}
}

// run runs the agent under its node lock until the returned stop, which
// waits for Run to return and checks its error; the test's end stops it too.
func (ta *testAgent) run(t *testing.T) (stop func()) {
	lock := lockNode(t, ta.cfg)
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ta.Run(c, lock) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// A stopping agent removes the sockets it made, and only those: a socket
// that replaced its agent.sock (another agent's) stays.
func TestStopRemovesOnlyItsOwnSockets(t *testing.T) {
	ta := newTestAgent(t)
	stop := ta.run(t)
	agentSock, cniSock := filepath.Join(ta.cfg.RunDir, "agent.sock"), filepath.Join(ta.cfg.RunDir, "cni.sock")
	testutil.WaitFor(t, "the agent's sockets", 10*time.Second, func() bool {
		_, errA := os.Stat(agentSock)
		_, errC := os.Stat(cniSock)
		return errA == nil && errC == nil
	})
	if err := os.Remove(agentSock); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", agentSock)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	others, err := os.Stat(agentSock)
	if err != nil {
		t.Fatal(err)
	}

	stop()
	if fi, err := os.Stat(agentSock); err != nil || !os.SameFile(fi, others) {
		t.Errorf("the stopped agent removed or replaced another agent's agent.sock (%v)", err)
	}
	if _, err := os.Stat(cniSock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stopped agent left its cni.sock behind (%v)", err)
	}
}

// TestPeerPinPublished: the agent publishes the pin of its peer key, the
// same key after a restart; none with the peer API off.
func TestPeerPinPublished(t *testing.T) {
	dir := t.TempDir()
	pin := func(port int) string {
		return newTestAgent(t, func(c *Config) { c.StateDir, c.PeerPort = dir, port }).published().PeerPin
	}
	first := pin(peer.DefaultPort)
	if len(first) != 44 || pin(peer.DefaultPort) != first || pin(0) != "" {
		t.Errorf("pins %q, then %q, off %q; want one, the same, none", first, pin(peer.DefaultPort), pin(0))
	}
}

// pinDropper is a datastore that drops the node's peer pin, as the
// ONCNode CRD of an agent before the peer API prunes spec.peerPin.
type pinDropper struct {
	datastore.Store
	registered int
}

func (s *pinDropper) RegisterNode(ctx context.Context, spec datastore.NodeSpec) error {
	s.registered++
	spec.PeerPin = ""
	return s.Store.RegisterNode(ctx, spec)
}

// TestPeerPinDroppedByTheDatastore: a pin the datastore drops is
// registered again once, not on every reconcile.
func TestPeerPinDroppedByTheDatastore(t *testing.T) {
	store := &pinDropper{Store: testStore(t)}
	ta := newAgentOn(t, store, func(c *Config) { c.PeerPort = peer.DefaultPort })
	if ta.published().PeerPin == "" {
		t.Fatal("no peer pin published")
	}
	if err := store.RegisterNode(ctx(t), ta.published()); err != nil { // as Run does
		t.Fatal(err)
	}
	for range 4 {
		if err := ta.reconcile(ctx(t), false); err != nil {
			t.Fatal(err)
		}
	}
	if store.registered != 2 {
		t.Errorf("registered %d times, want 2: at the start and once again", store.registered)
	}
}
