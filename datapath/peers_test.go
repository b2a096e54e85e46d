package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/onc-net/onc/datastore"
)

func node(name, ip, cidr string, fastPath bool) datastore.Node {
	n := datastore.Node{NodeSpec: datastore.NodeSpec{Name: name, IP: netip.MustParseAddr(ip),
		VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, name[0]}, FastPath: fastPath}}
	if cidr != "" {
		n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix(cidr)}
	}
	return n
}

// local4 is node a's tunnel endpoint in the IPv4 tests.
var local4 = netip.MustParseAddr("192.0.2.1")

func TestPeersOf(t *testing.T) {
	s := peersOf("a", local4, []datastore.Node{
		node("a", "192.0.2.1", "10.244.1.0/24", true),  // self: hosts only
		node("b", "192.0.2.2", "10.244.2.0/24", true),  // fast-path peer
		node("c", "192.0.2.3", "10.244.3.0/24", false), // slow-path-only peer
		node("d", "192.0.2.4", "", true),               // no CIDR yet: its IP is a host, nothing else
	})
	if len(s.overlay) != 2 || s.overlay[0].Name != "b" || s.overlay[1].Name != "c" ||
		s.overlay[0].PodCIDR.String() != "10.244.2.0/24" || s.overlay[1].NodeIP.String() != "192.0.2.3" ||
		s.overlay[1].VTEPMAC.String() != "02:00:00:00:00:63" {
		t.Errorf("overlay peers %+v, want b and c", s.overlay)
	}
	if len(s.fastPath) != 1 || s.fastPath[0].PodCIDR.String() != "10.244.2.0/24" || s.fastPath[0].NodeIP.String() != "192.0.2.2" {
		t.Errorf("fast-path peers %+v, want only b", s.fastPath)
	}
	want := "[192.0.2.1 192.0.2.2 192.0.2.3 192.0.2.4]"
	if got := fmt.Sprint(s.hosts); got != want {
		t.Errorf("hosts %s, want %s", got, want)
	}
	// Every overlay peer, fast path or not, may send for its pods and its
	// node address; nobody else (not this node, not a node without pods).
	want = "[{192.0.2.2 [10.244.2.0/24 192.0.2.2/32]} {192.0.2.3 [10.244.3.0/24 192.0.2.3/32]}]"
	if got := fmt.Sprint(s.senders); got != want {
		t.Errorf("overlay senders %s, want %s", got, want)
	}
}

// Records that claim another's pod CIDR, gateway or VTEP MAC are left out
// of both paths alike: the first by name keeps it, and this node keeps its
// own.
func TestPeersOfLeavesConflictsOut(t *testing.T) {
	b := node("b", "192.0.2.2", "10.244.2.0/24", true)
	sameMAC := node("c", "192.0.2.3", "10.244.3.0/24", true)
	sameMAC.VTEPMAC = b.VTEPMAC
	stealsSelf := node("d", "192.0.2.4", "10.244.1.0/24", true)
	sameGateway := node("e", "192.0.2.5", "10.244.2.0/25", true) // first address = b's gateway
	s := peersOf("a", local4, []datastore.Node{sameGateway, stealsSelf, sameMAC, b, node("a", "192.0.2.1", "10.244.1.0/24", true)})
	if len(s.overlay) != 1 || s.overlay[0].Name != "b" || len(s.fastPath) != 1 || s.fastPath[0].NodeIP.String() != "192.0.2.2" ||
		len(s.senders) != 1 || s.senders[0].NodeIP.String() != "192.0.2.2" {
		t.Errorf("peers %+v / %+v / senders %+v, want only b on both paths and in the guard", s.overlay, s.fastPath, s.senders)
	}
	want := []string{
		"node c left out: its VTEP MAC 02:00:00:00:00:62 is node b's",
		"node d left out: its gateway 10.244.1.1 is node a's, its pod CIDR 10.244.1.0/24 is node a's",
		"node e left out: its gateway 10.244.2.1 is node b's",
	}
	if fmt.Sprint(s.conflicts) != fmt.Sprint(want) {
		t.Errorf("conflicts:\n%s\nwant:\n%s", strings.Join(s.conflicts, "\n"), strings.Join(want, "\n"))
	}
}

// A record whose address is not of this node's family (a node may write
// its own) is left out, and the others are still programmed: one such
// record must not stop every peer's sync, nor the overlay guard's.
func TestPeersOfLeavesOtherFamilyOut(t *testing.T) {
	v6 := node("c", "2001:db8::3", "10.244.3.0/24", true)
	mapped := node("d", "::ffff:192.0.2.4", "10.244.4.0/24", true)
	s := peersOf("a", local4, []datastore.Node{node("a", "192.0.2.1", "10.244.1.0/24", true), node("b", "192.0.2.2", "10.244.2.0/24", true), v6, mapped})
	if len(s.overlay) != 1 || s.overlay[0].Name != "b" || len(s.senders) != 1 || len(s.fastPath) != 1 {
		t.Errorf("peers %+v / senders %+v, want only b", s.overlay, s.senders)
	}
	if want := "[192.0.2.1 192.0.2.2]"; fmt.Sprint(s.hosts) != want {
		t.Errorf("hosts %v, want %s", s.hosts, want)
	}
	want := []string{
		"node c left out: its address 2001:db8::3 is not of this node's underlay family",
		"node d left out: its address ::ffff:192.0.2.4 is not of this node's underlay family",
	}
	if fmt.Sprint(s.conflicts) != fmt.Sprint(want) {
		t.Errorf("conflicts:\n%s\nwant:\n%s", strings.Join(s.conflicts, "\n"), strings.Join(want, "\n"))
	}
}

// On an IPv6 underlay every tunnel endpoint is IPv6: IPv6-only peers
// speak for their IPv6 pods and their node address (/128), those that
// run the fast path are its peers by their IPv6 endpoints, and a record
// with an IPv4 address is left out.
func TestPeersOfOnAnIPv6Underlay(t *testing.T) {
	s := peersOf("a", netip.MustParseAddr("fd00:172::1"), []datastore.Node{
		node("a", "fd00:172::1", "fd00:10:244:1::/64", true),
		node("b", "fd00:172::2", "fd00:10:244:2::/64", true),
		dualStack(node("c", "fd00:172::3", "10.244.3.0/24", false), "fd00:10:244:3::/64"),
		node("d", "192.0.2.4", "fd00:10:244:4::/64", true),
	})
	want := "[{fd00:172::2 [fd00:10:244:2::/64 fd00:172::2/128]} {fd00:172::3 [10.244.3.0/24 fd00:10:244:3::/64 fd00:172::3/128]}]"
	if got := fmt.Sprint(s.senders); got != want {
		t.Errorf("overlay senders %s, want %s", got, want)
	}
	if len(s.overlay) != 2 || s.overlay[0].PodCIDR.IsValid() || s.overlay[0].PodCIDR6.String() != "fd00:10:244:2::/64" ||
		s.overlay[1].NodeIP.String() != "fd00:172::3" {
		t.Errorf("overlay peers %+v, want b (IPv6 only) and c", s.overlay)
	}
	// b runs the fast path, c does not.
	if want := "[{fd00:10:244:2::/64 fd00:172::2}]"; fmt.Sprint(s.fastPath) != want {
		t.Errorf("fast-path peers %v, want %s", s.fastPath, want)
	}
	if len(s.hosts) != 0 {
		t.Errorf("hosts %v, want none: the flow cache's host map is IPv4's", s.hosts)
	}
	if want := "[node d left out: its address 192.0.2.4 is not of this node's underlay family]"; fmt.Sprint(s.conflicts) != want {
		t.Errorf("conflicts %v, want %s", s.conflicts, want)
	}
}

// dualStack is node n with an IPv6 pod CIDR after its IPv4 one.
func dualStack(n datastore.Node, cidr6 string) datastore.Node {
	n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(cidr6))
	return n
}

// A peer's IPv6 pod CIDR is a source it may speak for, beside its IPv4
// ones; a peer without one speaks for IPv4 sources alone. The overlay
// routes both; the fast path carries both for a peer that runs it.
func TestPeersOfGivesIPv6PodCIDRs(t *testing.T) {
	s := peersOf("a", local4, []datastore.Node{
		dualStack(node("a", "192.0.2.1", "10.244.1.0/24", true), "fd00:10:244:1::/64"),  // self: in no sender
		dualStack(node("b", "192.0.2.2", "10.244.2.0/24", true), "fd00:10:244:2::1/64"), // masked
		node("c", "192.0.2.3", "10.244.3.0/24", false),                                  // IPv4 only
		dualStack(node("d", "192.0.2.4", "", true), "fd00:10:244:4::/64"),               // IPv6 only
	})
	want := "[{192.0.2.2 [10.244.2.0/24 fd00:10:244:2::/64 192.0.2.2/32]} {192.0.2.3 [10.244.3.0/24 192.0.2.3/32]} " +
		"{192.0.2.4 [fd00:10:244:4::/64 192.0.2.4/32]}]"
	if got := fmt.Sprint(s.senders); got != want {
		t.Errorf("overlay senders %s, want %s", got, want)
	}
	if len(s.overlay) != 3 || s.overlay[0].PodCIDR.String() != "10.244.2.0/24" || s.overlay[2].PodCIDR.IsValid() {
		t.Errorf("overlay peers %+v, want b and c with their IPv4 CIDRs, d without", s.overlay)
	}
	if want := "[{10.244.2.0/24 192.0.2.2} {fd00:10:244:2::/64 192.0.2.2} {fd00:10:244:4::/64 192.0.2.4}]"; fmt.Sprint(s.fastPath) != want {
		t.Errorf("fast-path peers %v, want %s (b's CIDRs, masked; c runs no fast path)", s.fastPath, want)
	}
	// The overlay routes b's IPv6 pods (masked), c has none.
	if len(s.overlay) == 3 && (s.overlay[0].PodCIDR6.String() != "fd00:10:244:2::/64" || s.overlay[1].PodCIDR6.IsValid()) {
		t.Errorf("overlay peers' IPv6 CIDRs %v and %v, want fd00:10:244:2::/64 and none", s.overlay[0].PodCIDR6, s.overlay[1].PodCIDR6)
	}
	if len(s.conflicts) != 0 {
		t.Errorf("conflicts %v, want none", s.conflicts)
	}
}

// A record whose IPv6 pod CIDR is this node's or an earlier one's is left
// out, as one claiming an IPv4 pod CIDR is: the guard would let it speak
// for those pods. So is one whose IPv6 block is IPv4-mapped.
func TestPeersOfLeavesIPv6ConflictsOut(t *testing.T) {
	s := peersOf("a", local4, []datastore.Node{
		dualStack(node("e", "192.0.2.5", "10.244.5.0/24", true), "fd00:10:244:1::/64"),
		dualStack(node("c", "192.0.2.3", "10.244.3.0/24", true), "fd00:10:244:2::/64"),
		dualStack(node("d", "192.0.2.4", "10.244.4.0/24", true), "::ffff:10.244.4.0/120"),
		dualStack(node("b", "192.0.2.2", "10.244.2.0/24", true), "fd00:10:244:2::/64"),
		dualStack(node("a", "192.0.2.1", "10.244.1.0/24", true), "fd00:10:244:1::/64"),
	})
	if len(s.overlay) != 1 || s.overlay[0].Name != "b" || len(s.fastPath) != 2 || len(s.senders) != 1 || s.senders[0].NodeIP.String() != "192.0.2.2" {
		t.Errorf("peers %+v / %+v / senders %+v, want only b on both paths and in the guard", s.overlay, s.fastPath, s.senders)
	}
	want := []string{
		"node c left out: its IPv6 pod CIDR fd00:10:244:2::/64 is node b's, its gateway fd00:10:244:2::1 is node b's",
		"node d left out: its IPv6 pod CIDR ::ffff:10.244.4.0/120 is IPv4-mapped",
		"node e left out: its IPv6 pod CIDR fd00:10:244:1::/64 is node a's, its gateway fd00:10:244:1::1 is node a's",
	}
	if fmt.Sprint(s.conflicts) != fmt.Sprint(want) {
		t.Errorf("conflicts:\n%s\nwant:\n%s", strings.Join(s.conflicts, "\n"), strings.Join(want, "\n"))
	}
}

// A node without a block of a family has no gateway in it: BringUp
// passes the overlay an IPv6 gateway only on a dual-stack node.
func TestGatewayOfNoBlockIsInvalid(t *testing.T) {
	if gw := Gateway(netip.Prefix{}); gw.IsValid() {
		t.Errorf("Gateway of no prefix = %s, want invalid", gw)
	}
	if gw := Gateway(netip.MustParsePrefix("fd00:10:244:1::/64")); gw.String() != "fd00:10:244:1::1" {
		t.Errorf("Gateway = %s", gw)
	}
}
