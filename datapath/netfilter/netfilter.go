// Package netfilter installs ONC's iptables rules: masquerade for pod
// traffic leaving the cluster CIDR; FORWARD accepts for pod traffic, so
// hosts whose FORWARD policy is DROP (Docker's, for one) still forward
// pods; the overlay guard's rules, which drop VXLAN frames that did not
// reach the VXLAN socket by the uplink, where its eBPF program runs; and,
// for the fast path, a mark on pod traffic that conntrack saw ESTABLISHED,
// which the learning programs require; and the mark that routes a peer's
// host's connections to pods over the overlay both ways. The rules live
// in ONC's own chains, rewritten whole on every Ensure.
package netfilter

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

const (
	natChain          = "ONC-POSTROUTING"
	forwardChain      = "ONC-FORWARD"
	markChain         = "ONC-MARK"
	guardInputChain   = "ONC-GUARD-INPUT"
	guardForwardChain = "ONC-GUARD-FORWARD"
	peerHostChain     = "ONC-PEER-HOST"
	peerHostOutChain  = "ONC-PEER-HOST-OUT"
)

// Overlay is what the overlay's rules need to know.
type Overlay struct {
	Device string // the VXLAN device
	Uplink string // the only interface VXLAN frames may come in by
	Port   int    // the VXLAN UDP port
	// IPv6: the tunnel's endpoints are IPv6 (an IPv6 underlay), so the
	// guard's rules and the peer host's marks are ip6tables'.
	IPv6 bool
	// PeerHostMark: on the packets of connections a peer's host opened
	// over the device, both ways, for policy routing (datapath/overlay);
	// cleared before they are encapsulated. Required.
	PeerHostMark uint32
}

// guardRule is one of the overlay guard's drops: its reason (a counter of
// onctl stats) is its comment, after "onc: overlay guard, ".
type guardRule struct {
	chain, reason string
	match         []string
}

// guardRules are the overlay guard's netfilter half. They sit in mangle,
// after address translation (kube-proxy's NodePorts, externalIPs and
// Service endpoints could otherwise lead a packet to the VXLAN port that
// the eBPF programs saw going elsewhere) and after reassembly, and before
// any filter chain's ACCEPT.
func guardRules(ovl Overlay) []guardRule {
	port := []string{"-p", "udp", "--dport", strconv.Itoa(ovl.Port)}
	return []guardRule{
		// The kernel's VXLAN socket listens on every address: a frame by
		// another interface (a second NIC, loopback, a pod's veth) skips
		// the uplink's program.
		{guardInputChain, "other_interface", append([]string{"!", "-i", ovl.Uplink}, port...)},
		{guardInputChain, "translated", append(port, "-m", "conntrack", "--ctstate", "DNAT")},
		// Real frames end at a node; one forwarded would leave as this
		// node's, a trusted sender.
		{guardForwardChain, "forwarded", port},
	}
}

func (r guardRule) comment() string { return "onc: overlay guard, " + r.reason }

// Ensure makes iptables' chains hold exactly the rules for clusterCIDR
// (IPv4's; invalid on an IPv6-only node) and ovl, pods' traffic to outside
// masqueraded to masqueradePorts ("" any; a range "low-high" keeps it off
// ports the uplink load balancer serves, whose programs take any UDP
// packet to them for a new flow), and jumps to them first in POSTROUTING,
// FORWARD and mangle's PREROUTING, INPUT, FORWARD and POSTROUTING, with
// the ESTABLISHED mark as m says. The guard's rules and the peer host's
// marks are there on an IPv4 underlay, empty on an IPv6 one (EnsureIPv6
// has them then). It is idempotent.
func Ensure(clusterCIDR netip.Prefix, ovl Overlay, m Marking, masqueradePorts string) error {
	ipt, err := newIPv4()
	if err != nil {
		return err
	}
	if err := fillOverlay(ipt, clusterCIDR, ovl, !ovl.IPv6); err != nil {
		return err
	}
	if err := fillPods(ipt, clusterCIDR, "224.0.0.0/4", masqueradePorts); err != nil {
		return err
	}
	return ensureMarks(ipt, ovl.Device, m)
}

// fillOverlay fills the guard's chains and the peer host's in ipt's
// family: with underlay for the tunnel's endpoints of that family, empty
// otherwise (the other family's chains, which an earlier run on another
// underlay may have filled).
func fillOverlay(ipt *iptables.IPTables, clusterCIDR netip.Prefix, ovl Overlay, underlay bool) error {
	guard := map[string][][]string{guardInputChain: nil, guardForwardChain: nil}
	if underlay {
		for _, r := range guardRules(ovl) {
			guard[r.chain] = append(guard[r.chain], append(r.match, "-m", "comment", "--comment", r.comment(), "-j", "DROP"))
		}
	}
	if err := fill(ipt, "mangle", guardInputChain, "INPUT", guard[guardInputChain]); err != nil {
		return err
	}
	if err := fill(ipt, "mangle", guardForwardChain, "FORWARD", guard[guardForwardChain]); err != nil {
		return err
	}
	return fillPeerHost(ipt, clusterCIDR, ovl, underlay && clusterCIDR.IsValid())
}

// fillPods fills the chains of pods' traffic in ipt's family: masquerade
// (to masqueradePorts, "" any) from clusterCIDR to anywhere outside it but
// multicast, and FORWARD accepts from and to it. With an invalid
// clusterCIDR the chains are left empty.
func fillPods(ipt *iptables.IPTables, clusterCIDR netip.Prefix, multicast, masqueradePorts string) error {
	var nat, fwd [][]string
	if clusterCIDR.IsValid() {
		cidr := clusterCIDR.String()
		masquerade := func(match ...string) []string {
			return append(append([]string{"-s", cidr, "!", "-d", multicast}, match...),
				"-m", "comment", "--comment", "onc: pod to outside", "-j", "MASQUERADE", "--random-fully")
		}
		nat = [][]string{{"-s", cidr, "-d", cidr, "-m", "comment", "--comment", "onc: pod to pod, no NAT", "-j", "RETURN"}}
		if masqueradePorts != "" { // ports are TCP's and UDP's only
			nat = append(nat, append(masquerade("-p", "tcp"), "--to-ports", masqueradePorts),
				append(masquerade("-p", "udp"), "--to-ports", masqueradePorts))
		}
		nat = append(nat, masquerade())
		fwd = [][]string{
			{"-s", cidr, "-m", "comment", "--comment", "onc: from pods", "-j", "ACCEPT"},
			{"-d", cidr, "-m", "comment", "--comment", "onc: to pods", "-j", "ACCEPT"},
		}
	}
	if err := fill(ipt, "nat", natChain, "POSTROUTING", nat); err != nil {
		return err
	}
	return fill(ipt, "filter", forwardChain, "FORWARD", fwd)
}

// EnsureIPv6 makes ip6tables hold the rules of IPv6 pods, whose addresses
// are in clusterCIDR: masquerade to outside it (TCP and UDP to
// masqueradePorts if given, as Ensure), FORWARD accepts (the fast path's
// mark is ensureMarks'), and on an IPv6 underlay (ovl.IPv6) the
// guard's rules and the peer host's marks. A node with neither IPv6 pods
// nor an IPv6 underlay makes nothing, and empties the chains an earlier
// run left; it does not need ip6tables to work, so that is only logged if
// it fails.
func EnsureIPv6(clusterCIDR netip.Prefix, ovl Overlay, masqueradePorts string) error {
	ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6), iptables.Timeout(10))
	if !clusterCIDR.IsValid() && !ovl.IPv6 {
		if err == nil {
			err = clearIfPresent(ipt, [][2]string{{"nat", natChain}, {"filter", forwardChain},
				{"mangle", guardInputChain}, {"mangle", guardForwardChain}, {"mangle", peerHostChain}, {"mangle", peerHostOutChain}})
		}
		if err != nil && !errors.Is(err, exec.ErrNotFound) { // no ip6tables, no rules to empty
			slog.Warn("cannot check ip6tables for IPv6 rules of an earlier run", "err", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("ip6tables, which IPv6 pods and an IPv6 underlay need: %w", err)
	}
	if err := fillOverlay(ipt, clusterCIDR, ovl, ovl.IPv6); err != nil {
		return err
	}
	return fillPods(ipt, clusterCIDR, "ff00::/8", masqueradePorts)
}

// clearIfPresent empties the chains (table, chain) that exist.
func clearIfPresent(ipt *iptables.IPTables, chains [][2]string) error {
	for _, tc := range chains {
		table, chain := tc[0], tc[1]
		ok, err := ipt.ChainExists(table, chain)
		if err == nil && ok {
			err = ipt.ClearChain(table, chain)
		}
		if err != nil {
			return fmt.Errorf("ip6tables -t %s %s: %w", table, chain, err)
		}
	}
	return nil
}

// Marking is where the fast path's ESTABLISHED bit goes, on packets of
// flows conntrack saw ESTABLISHED (an skb->mark bit, never a header bit):
// pod traffic crossing the VXLAN device, in IPv6 too with IPv6 set (the
// node has IPv6 pods), and with Uplink set (the kube-proxy replacement)
// connections opened from outside through Uplink to this node's pods, both
// ways, in each family the uplink load balancer carries on the fast path.
// The zero value marks nothing.
type Marking struct {
	Mark   uint32
	Uplink string
	IPv6   bool
}

// EnsureMark sets or clears the ESTABLISHED mark alone: the fast path
// switched off needs no mark, and its learning programs then see no packet
// at all.
func EnsureMark(vxlanDev string, m Marking) error {
	ipt, err := newIPv4()
	if err != nil {
		return err
	}
	return ensureMarks(ipt, vxlanDev, m)
}

// ensureMarks fills the mark chain of ipt (IPv4) and of ip6tables as m
// says. Without IPv6 pods ip6tables' chain is emptied if it exists, as
// EnsureIPv6 empties the others.
func ensureMarks(ipt *iptables.IPTables, vxlanDev string, m Marking) error {
	if err := fillMark(ipt, vxlanDev, m); err != nil {
		return err
	}
	ipt6, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6), iptables.Timeout(10))
	if !m.IPv6 {
		if err == nil {
			err = clearIfPresent(ipt6, [][2]string{{"mangle", markChain}})
		}
		if err != nil && !errors.Is(err, exec.ErrNotFound) {
			slog.Warn("cannot check ip6tables for IPv6 pods' marks of an earlier run", "err", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("ip6tables, which IPv6 pods need: %w", err)
	}
	return fillMark(ipt6, vxlanDev, m)
}

// GuardDrops counts the packets each of the overlay guard's rules dropped,
// by reason, in the underlay's family.
func GuardDrops(ovl Overlay) (map[string]uint64, error) {
	ipt, err := newIPv4()
	if ovl.IPv6 {
		ipt, err = iptables.New(iptables.IPFamily(iptables.ProtocolIPv6), iptables.Timeout(10))
	}
	if err != nil {
		return nil, err
	}
	stats := map[string][]iptables.Stat{}
	for _, chain := range []string{guardInputChain, guardForwardChain} {
		if stats[chain], err = ipt.StructuredStats("mangle", chain); err != nil {
			return nil, fmt.Errorf("iptables -t mangle -L %s: %w", chain, err)
		}
	}
	out := map[string]uint64{}
	for _, r := range guardRules(ovl) {
		i := slices.IndexFunc(stats[r.chain], func(s iptables.Stat) bool { return strings.Contains(s.Options, "/* "+r.comment()+" */") })
		if i < 0 {
			return nil, fmt.Errorf("iptables -t mangle %s has no rule %q", r.chain, r.comment())
		}
		out[r.reason] = stats[r.chain][i].Packets
	}
	return out, nil
}

func newIPv4() (*iptables.IPTables, error) {
	ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv4), iptables.Timeout(10))
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return ipt, nil
}

func fillMark(ipt *iptables.IPTables, vxlanDev string, m Marking) error {
	if m.Mark == 0 {
		return fill(ipt, "mangle", markChain, "FORWARD", nil)
	}
	rule := func(in, out, comment string, match ...string) []string {
		r := []string{"-i", in, "-o", out, "-m", "comment", "--comment", "onc: established, " + comment,
			"-m", "conntrack", "--ctstate", "ESTABLISHED"}
		return append(append(r, match...), "-j", "MARK", "--or-mark", fmt.Sprintf("0x%x", m.Mark))
	}
	marks := [][]string{
		rule("onc+", vxlanDev, "pod to overlay"),
		rule(vxlanDev, "onc+", "overlay to pod"),
	}
	if m.Uplink != "" {
		// Connections opened from outside only (--ctdir): a pod's own
		// connections out, masqueraded, are no flow the uplink programs
		// serve.
		marks = append(marks,
			rule(m.Uplink, "onc+", "from outside to pod", "--ctdir", "ORIGINAL"),
			rule("onc+", m.Uplink, "pod to outside, reply", "--ctdir", "REPLY"))
	}
	return fill(ipt, "mangle", markChain, "FORWARD", marks)
}

// fillPeerHost marks the connections a peer's host opens to a pod over
// the overlay (source outside the cluster CIDR: by the guard, that peer's
// node address), and their packets both ways, for ovl.PeerHostMark's
// policy route; with on false (node addresses of the other family) the
// chains are left empty. The mark is cleared as a packet enters the device
// (that chain filled first): the tunnel's own route lookup must not take
// it.
func fillPeerHost(ipt *iptables.IPTables, clusterCIDR netip.Prefix, ovl Overlay, on bool) error {
	if !on {
		return errors.Join(fill(ipt, "mangle", peerHostOutChain, "POSTROUTING", nil), fill(ipt, "mangle", peerHostChain, "PREROUTING", nil))
	}
	m := fmt.Sprintf("0x%x/0x%x", ovl.PeerHostMark, ovl.PeerHostMark)
	out := [][]string{{"-o", ovl.Device, "-m", "mark", "--mark", m, "-m", "comment", "--comment",
		"onc: routed, not for the tunnel", "-j", "MARK", "--set-xmark", fmt.Sprintf("0x0/0x%x", ovl.PeerHostMark)}}
	if err := fill(ipt, "mangle", peerHostOutChain, "POSTROUTING", out); err != nil {
		return err
	}
	in := [][]string{
		{"-i", ovl.Device, "!", "-s", clusterCIDR.String(), "-d", clusterCIDR.String(), "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment",
			"onc: a peer's host to a pod", "-j", "CONNMARK", "--set-xmark", m},
		// onc+ is the pods' veths (the replies) and the device itself (the
		// peer's packets, which the reverse-path check must route by the
		// mark too).
		{"-i", "onc+", "-m", "connmark", "--mark", m, "-m", "comment", "--comment",
			"onc: a peer's host and a pod, both ways", "-j", "MARK", "--set-xmark", m},
	}
	return fill(ipt, "mangle", peerHostChain, "PREROUTING", in)
}

func fill(ipt *iptables.IPTables, table, chain, parent string, rules [][]string) error {
	if err := ipt.ClearChain(table, chain); err != nil { // creates it if missing
		return fmt.Errorf("iptables -t %s -F %s: %w", table, chain, err)
	}
	for _, r := range rules {
		if err := ipt.Append(table, chain, r...); err != nil {
			return fmt.Errorf("iptables -t %s -A %s %v: %w", table, chain, r, err)
		}
	}
	jump := []string{"-m", "comment", "--comment", "onc", "-j", chain}
	ok, err := ipt.Exists(table, parent, jump...)
	if err != nil {
		return fmt.Errorf("iptables -t %s -C %s: %w", table, parent, err)
	}
	if !ok {
		if err := ipt.Insert(table, parent, 1, jump...); err != nil {
			return fmt.Errorf("iptables -t %s -I %s: %w", table, parent, err)
		}
	}
	return nil
}

// The uplink load balancer's chains (the kube-proxy replacement).
const (
	lbNATChain     = "ONC-LB-POSTROUTING"
	lbInputChain   = "ONC-LB-INPUT"
	lbForwardChain = "ONC-LB-FORWARD"
)

// UplinkLB is what the uplink load balancer's rules match: the skb->mark
// bits its programs set. The zero value removes the rules (the chains stay,
// empty).
type UplinkLB struct {
	// SNATMark: a packet from outside sent to a backend; masqueraded
	// unless it goes to one of LocalPods, so that a backend on another node
	// (a pod over the overlay, or a host-network or external endpoint by
	// the uplink) answers through this node (conntrack undoes it on the
	// reply).
	SNATMark  uint32
	LocalPods netip.Prefix // this node's pod CIDR
	// LocalPods6 is this node's IPv6 pod CIDR, if it has one: the IPv6
	// twin of LocalPods, for ip6tables' rules.
	LocalPods6 netip.Prefix
	// RejectMark: a packet to a service without backends; refused as
	// kube-proxy's REJECT refuses it, TCP with a reset, UDP with an ICMP
	// port unreachable.
	RejectMark uint32
}

// uplinkLBRules are the uplink load balancer's rules in one family: nat
// POSTROUTING's masquerade, not to localPods (if valid), and filter's
// refusals with unreachable (ICMP's or ICMPv6's port unreachable).
func uplinkLBRules(lb UplinkLB, localPods netip.Prefix, unreachable string) (nat, reject [][]string) {
	if lb.SNATMark != 0 {
		m := fmt.Sprintf("0x%x/0x%x", lb.SNATMark, lb.SNATMark)
		var notLocal []string
		if localPods.IsValid() {
			notLocal = []string{"!", "-d", localPods.String()}
		}
		nat = [][]string{append(notLocal, "-m", "mark", "--mark", m, "-m", "comment", "--comment",
			"onc: service from outside, to another node", "-j", "MASQUERADE", "--random-fully")}
	}
	if lb.RejectMark != 0 {
		m := fmt.Sprintf("0x%x/0x%x", lb.RejectMark, lb.RejectMark)
		comment := []string{"-m", "comment", "--comment", "onc: service without endpoints"}
		reject = [][]string{
			append(append([]string{"-p", "tcp", "-m", "mark", "--mark", m}, comment...), "-j", "REJECT", "--reject-with", "tcp-reset"),
			append(append([]string{"-m", "mark", "--mark", m}, comment...), "-j", "REJECT", "--reject-with", unreachable),
		}
	}
	return nat, reject
}

// fillUplinkLB fills the uplink load balancer's chains of ipt.
func fillUplinkLB(ipt *iptables.IPTables, nat, reject [][]string) error {
	if err := fill(ipt, "nat", lbNATChain, "POSTROUTING", nat); err != nil {
		return err
	}
	if err := fill(ipt, "filter", lbInputChain, "INPUT", reject); err != nil {
		return err
	}
	return fill(ipt, "filter", lbForwardChain, "FORWARD", reject)
}

// EnsureUplinkLB makes ONC's uplink load balancer chains hold exactly the
// rules for lb, jumped to first from nat POSTROUTING, filter INPUT and
// FORWARD (a refused frontend is a node address or one the node forwards),
// in iptables and, for IPv6 frontends, in ip6tables: there with
// LocalPods6 for LocalPods, and ICMPv6's port unreachable. A node without
// ip6tables gets the IPv4 rules alone, unless it has IPv6 pods
// (LocalPods6), which need them. Without LocalPods (LocalPods6) every
// marked packet of that family is masqueraded: the node has no pods of it.
func EnsureUplinkLB(lb UplinkLB) error {
	ipt, err := newIPv4()
	if err != nil {
		return err
	}
	nat, reject := uplinkLBRules(lb, lb.LocalPods, "icmp-port-unreachable")
	// Agents of 6365723..087c936 kept the uplink's ESTABLISHED marks in a
	// chain of their own, now ONC-MARK's: left, it would go on marking
	// with the fast path switched off.
	if old, err := ipt.ChainExists("mangle", "ONC-LB-MARK"); err != nil || old {
		if err == nil {
			err = ipt.DeleteIfExists("mangle", "FORWARD", "-m", "comment", "--comment", "onc", "-j", "ONC-LB-MARK")
		}
		if err == nil {
			err = ipt.ClearAndDeleteChain("mangle", "ONC-LB-MARK")
		}
		if err != nil {
			return fmt.Errorf("remove mangle ONC-LB-MARK: %w", err)
		}
	}
	if err := fillUplinkLB(ipt, nat, reject); err != nil {
		return err
	}
	return ensureUplinkLB6(lb)
}

// ensureUplinkLB6 fills ip6tables' uplink load balancer chains for lb,
// where ip6tables is: a node without it, and without IPv6 pods, has no
// IPv6 frontend that needs them. The zero lb empties the chains that
// exist, and makes none.
func ensureUplinkLB6(lb UplinkLB) error {
	ipt6, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6), iptables.Timeout(10))
	if lb.SNATMark == 0 && lb.RejectMark == 0 {
		if err == nil {
			err = clearIfPresent(ipt6, [][2]string{{"nat", lbNATChain}, {"filter", lbInputChain}, {"filter", lbForwardChain}})
		}
		if err != nil && !errors.Is(err, exec.ErrNotFound) { // no ip6tables, no rules to empty
			slog.Warn("cannot check ip6tables for the uplink load balancer's rules of an earlier run", "err", err)
		}
		return nil
	}
	if errors.Is(err, exec.ErrNotFound) && !lb.LocalPods6.IsValid() {
		slog.Debug("no ip6tables: the uplink load balancer's IPv6 rules are left out")
		return nil
	}
	if err != nil {
		return fmt.Errorf("ip6tables, which the uplink load balancer's IPv6 frontends need: %w", err)
	}
	nat, reject := uplinkLBRules(lb, lb.LocalPods6, "icmp6-port-unreachable")
	return fillUplinkLB(ipt6, nat, reject)
}
