//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/bench"
	"github.com/onc-net/onc/lab/labtest"
	"github.com/vishvananda/netlink"
)

// The bench's bed works as the bench relies on it: two nodes on a direct
// veth pair carry ONC's pods (through the fast path) and a real Flannel's
// pods (through flannel.1, Flannel's own VXLAN) side by side, redis answers
// redis-benchmark across nodes, and Down stops flanneld and its etcd.
func TestBenchBed(t *testing.T) {
	dir := os.Getenv("ONC_FLANNEL_BIN")
	_, err := os.Stat(filepath.Join(dir, "flanneld"))
	testutil.Require(t, err == nil, "flanneld not built: run `make flannel-bins` (it sets ONC_FLANNEL_BIN for make test)")
	for _, b := range []string{"redis-server", "redis-benchmark", "redis-cli", "ethtool"} {
		_, err := exec.LookPath(b)
		testutil.Require(t, err == nil, b+" not installed (make prereqs)")
	}
	_, hostBridgeErr := netlink.LinkByName("cni0")
	ctx := context.Background()
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1, Underlay: lab.UnderlayDirect})
	n1, n2 := l.Nodes[0], l.Nodes[1]

	// The nodes' addresses, so their tunnels, are on the pair's ends.
	for i, n := range l.Nodes {
		eth0, err := testutil.NetlinkAt(t, n.Netns).LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if eth0.Type() != "veth" || !netip.MustParsePrefix("172.31.251.0/24").Contains(n.IP) {
			t.Fatalf("node %d: eth0 is a %s, node IP %s", i+1, eth0.Type(), n.IP)
		}
	}

	if err := l.StartFlannel(ctx, dir); err != nil {
		t.Fatal(err)
	}
	f1, err := l.AddFlannelPod(ctx, n1)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := l.AddFlannelPod(ctx, n2)
	if err != nil {
		t.Fatal(err)
	}
	flannelNet := netip.MustParsePrefix("10.245.0.0/16")
	if !flannelNet.Contains(f1.IP) || !flannelNet.Contains(f2.IP) {
		t.Fatalf("flannel pods at %s and %s, outside Flannel's %s", f1.IP, f2.IP, flannelNet)
	}
	stop, err := lab.ServeEcho([]string{f2.Netns, n2.Pods[0].Netns}, []int{lab.ProbePort}, []int{lab.ProbePort})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// Flannel's pods talk through flannel.1, not ONC's device.
	flannelTx := func() uint64 {
		link, err := testutil.NetlinkAt(t, n1.Netns).LinkByName("flannel.1")
		if err != nil {
			t.Fatal(err)
		}
		return link.Attrs().Statistics.TxPackets
	}
	before := flannelTx()
	for _, network := range []string{"tcp", "udp"} {
		if _, err := lab.Probe(f1.Netns, network, f2.IP, lab.ProbePort, 5*time.Second); err != nil {
			t.Fatalf("flannel pod to flannel pod, %s: %v", network, err)
		}
	}
	if sent := flannelTx() - before; sent < 4 {
		t.Fatalf("flannel.1 sent %d packets for the flannel pods' exchanges", sent)
	}

	// ONC's pods beside it still take ONC's fast path.
	hits := func() uint64 {
		c, err := n1.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c["egress_hit"]
	}
	before = hits()
	for range 3 {
		if _, err := lab.Probe(n1.Pods[0].Netns, "tcp", n2.Pods[0].IP, lab.ProbePort, 5*time.Second); err != nil {
			t.Fatalf("ONC pod to ONC pod: %v", err)
		}
	}
	if hits() == before {
		t.Fatal("ONC's cross-node TCP took no fast-path hit beside Flannel")
	}

	stopRedis, err := bench.RedisServers(ctx, "", f2.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer stopRedis()
	samples, err := bench.Redis(ctx, f1.Netns, f2.IP.String(), 2000, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if s.Value <= 0 {
			t.Fatalf("redis %s: %v requests/s", s.Test, s.Value)
		}
	}

	// Flannel's plugins ran in the node's namespace, as on a node.
	if _, err := netlink.LinkByName("cni0"); err == nil && hostBridgeErr != nil {
		t.Fatal("Flannel's bridge cni0 appeared in the test's own namespace")
	}
	if _, err := testutil.NetlinkAt(t, n1.Netns).LinkByName("cni0"); err != nil {
		t.Fatalf("no cni0 on %s: %v", n1.Name, err)
	}

	if err := l.Down(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []interface{ Alive() bool }{n1.Flanneld, n2.Flanneld, l.Flannel.Etcd} {
		if p.Alive() {
			t.Fatalf("a Flannel process outlived Down: %+v", p)
		}
	}
}
