//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"github.com/vishvananda/netlink"
)

// An IPv6 lab: pods with IPv6 addresses alone, and the overlay's tunnels
// between the nodes' IPv6 underlay addresses (VXLAN over IPv6, 70 bytes of
// overhead). The matrix passes (pod↔pod on one node and across nodes,
// node→pod, pod→node); after the handshake pods' TCP and UDP across nodes
// take the fast path, in IPv6 tunnels; the overlay guard refuses crafted
// frames over the IPv6 underlay as it does over IPv4's, each counted by
// its reason. On Kubernetes a NetworkPolicy admits one client pod and
// denies another, also when that pod sends with the client's address.
func TestIPv6Only(t *testing.T) {
	t.Run("etcd", func(t *testing.T) {
		l := labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 1, IPFamily: lab.IPFamilyIPv6})
		ipv6OnlyNodes(t, l)
		allPairsPass(t, l, "the IPv6 matrix")
		fastPathCarriesIPv6(t, l)
		guardOnIPv6Underlay(t, l)
	})
	t.Run("kubernetes", func(t *testing.T) {
		l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1, IPFamily: lab.IPFamilyIPv6, Datastore: "kubernetes"})
		ipv6OnlyNodes(t, l)
		allPairsPass(t, l, "the IPv6 matrix")
		policyInBothFamilies(t, l)
	})
}

// ipv6OnlyNodes checks each node's status (one IPv6 block of the cluster's
// range, the pod MTU 70 bytes under the uplink's, the fast path on), its
// VXLAN device's IPv6 tunnel endpoint, and that its pods have one IPv6
// address of its block.
func ipv6OnlyNodes(t *testing.T, l *lab.Lab) {
	t.Helper()
	cluster := netip.MustParsePrefix(lab.ClusterCIDR6)
	for _, n := range l.Nodes {
		st := nodeStatus(t, n)
		if len(st.PodCidrs) != 1 || st.PodCidr != st.PodCidrs[0] || st.ClusterCidr != lab.ClusterCIDR6 {
			t.Fatalf("%s: pod CIDRs %v (first %q), cluster %q; want one IPv6 block of %s", n.Name, st.PodCidrs, st.PodCidr, st.ClusterCidr, cluster)
		}
		block := netip.MustParsePrefix(st.PodCidr)
		if !block.Addr().Is6() || !cluster.Overlaps(block) || st.NodeIp != l.TunnelIP(n).String() {
			t.Fatalf("%s: block %s, node IP %s; want an IPv6 block of %s and the IPv6 underlay address %s", n.Name, block, st.NodeIp, cluster, l.TunnelIP(n))
		}
		uplink, err := testutil.NetlinkAt(t, n.Netns).LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if want := uint32(uplink.Attrs().MTU - 70); st.PodMtu != want {
			t.Errorf("%s: pod MTU %d, want %d (VXLAN over IPv6 adds 70 bytes)", n.Name, st.PodMtu, want)
		}
		if !st.FastPath {
			t.Errorf("%s: fast path off; want it on over an IPv6 underlay", n.Name)
		}
		dev, err := testutil.NetlinkAt(t, n.Netns).LinkByName(datapath.DeviceName)
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := dev.(*netlink.Vxlan); !ok || !v.SrcAddr.Equal(l.TunnelIP(n).AsSlice()) {
			t.Errorf("%s: %s's local address %v, want %s", n.Name, datapath.DeviceName, dev, l.TunnelIP(n))
		}
		for _, p := range n.Pods {
			if !block.Contains(p.IP) || p.IPv6 != p.IP {
				t.Errorf("pod %s has %s and %s; want one address of %s", p.Key(), p.IP, p.IPv6, block)
			}
		}
	}
}

// guardOnIPv6Underlay: TestOverlayGuard's cases over an IPv6 underlay,
// the frames crafted with IPv6 inside and sent to the target node's IPv6
// tunnel endpoint (address translation by ip6tables; the target's agent
// down).
func guardOnIPv6Underlay(t *testing.T, l *lab.Lab) {
	t.Helper()
	n1, n2, n3 := l.Nodes[0], l.Nodes[1], l.Nodes[2]
	p1, p3 := n1.Pods[0], n3.Pods[0]
	in := newInjector(t, l, n2, n2.Pods[0])
	outsider, cleanup, err := l.AddOutsider(l.Prefix+"-out", netip.MustParseAddr("172.31.250.200"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	mustRun(t, []string{"ip", "-n", outsider, "addr", "add", "fd00:172:31:250::200/64", "dev", "eth0", "nodad"})
	// A cable of its own into node 2, whose kernel's VXLAN socket listens
	// on that address too.
	secondCable(t, outsider, n2.Netns)
	side := netip.MustParseAddr("fd00:172:31:252::2")
	mustRun(t, []string{"ip", "-n", outsider, "addr", "add", "fd00:172:31:252::1/64", "dev", "side0", "nodad"})
	mustRun(t, []string{"ip", "-n", n2.Netns, "addr", "add", side.String() + "/64", "dev", "side1", "nodad"})
	expectInjections(t, in, []injection{
		{"a peer speaking for its own pod (control)", n1.Netns, p1.IP, nil, ""},
		{"a peer's host speaking for its node address (control)", n1.Netns, l.TunnelIP(n1), nil, ""},
		{"a pod, as its node's pod", p1.Netns, p1.IP, n1, "from_pod"},
		{"a pod, as another node's pod", p1.Netns, p3.IP, n1, "from_pod"},
		{"a host on the underlay that is no node", outsider, p1.IP, n2, "unknown_sender"},
		{"a peer speaking for another node's pod", n1.Netns, p3.IP, n2, "inner_source"},
		{"a peer speaking for the target node's own pod CIDR", n1.Netns, n2.Pods[0].IP.Next(), n2, "inner_source"},
		{"a peer speaking for an address outside the cluster", n1.Netns, netip.MustParseAddr("2001:db8::9"), n2, "inner_source"},
	})
	expectInjection(t, in, injection{"a host by another interface than the uplink", outsider, p1.IP, n2, "other_interface"}, side, vxlanPort)
	translatedToTheVXLANPort(t, l, in, outsider, netip.MustParseAddr("fd00:172:31:253::9"))
	// While the target's agent is down, its pinned programs and maps
	// guard on.
	n2.Agent.Stop()
	if in.send(t, outsider, p1.IP, in.endpoint) || in.send(t, n1.Netns, p3.IP, in.endpoint) {
		t.Error("with the target's agent down, a frame the guard refuses was delivered")
	}
	if !in.send(t, n1.Netns, p1.IP, in.endpoint) {
		t.Error("with the target's agent down, a peer's frame for its own pod was not delivered")
	}
	if err := l.RestartAgent(context.Background(), n2); err != nil {
		t.Fatal(err)
	}
	allPairsPass(t, l, "after the injections")
}
