// Package netfilter installs ONC's iptables rules: masquerade for pod
// traffic leaving the cluster CIDR; FORWARD accepts for pod traffic, so
// hosts whose FORWARD policy is DROP (Docker's, for one) still forward
// pods; a drop of VXLAN frames that come in by another interface than the
// uplink, where the overlay guard runs; and, for the fast path, a mark on
// pod traffic that conntrack saw ESTABLISHED, which the learning programs
// require. The rules live in ONC's own chains, rewritten whole on every
// Ensure.
package netfilter

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

const (
	natChain     = "ONC-POSTROUTING"
	forwardChain = "ONC-FORWARD"
	markChain    = "ONC-MARK"
	rawChain     = "ONC-PREROUTING"
)

// Overlay is what the overlay's rules need to know.
type Overlay struct {
	Device string // the VXLAN device
	Uplink string // the only interface VXLAN frames may come in by
	Port   int    // the VXLAN UDP port
}

// Ensure makes the chains hold exactly the rules for clusterCIDR and ovl,
// and jumps to them first in POSTROUTING, FORWARD and raw PREROUTING. With
// mark != 0, pod traffic that crosses the VXLAN device in a flow conntrack
// saw ESTABLISHED gets that skb->mark bit (never a header bit). It is
// idempotent.
func Ensure(clusterCIDR string, ovl Overlay, mark uint32) error {
	ipt, err := newIPv4()
	if err != nil {
		return err
	}
	// The kernel's VXLAN socket listens on every address: a frame that
	// came in by another interface (a second NIC, loopback) would skip the
	// overlay guard on the uplink.
	raw := [][]string{{"!", "-i", ovl.Uplink, "-p", "udp", "--dport", strconv.Itoa(ovl.Port),
		"-m", "comment", "--comment", vxlanElsewhere, "-j", "DROP"}}
	if err := fill(ipt, "raw", rawChain, "PREROUTING", raw); err != nil {
		return err
	}
	vxlanDev := ovl.Device
	nat := [][]string{
		{"-s", clusterCIDR, "-d", clusterCIDR, "-m", "comment", "--comment", "onc: pod to pod, no NAT", "-j", "RETURN"},
		{"-s", clusterCIDR, "!", "-d", "224.0.0.0/4", "-m", "comment", "--comment", "onc: pod to outside", "-j", "MASQUERADE", "--random-fully"},
	}
	fwd := [][]string{
		{"-s", clusterCIDR, "-m", "comment", "--comment", "onc: from pods", "-j", "ACCEPT"},
		{"-d", clusterCIDR, "-m", "comment", "--comment", "onc: to pods", "-j", "ACCEPT"},
	}
	if err := fill(ipt, "nat", natChain, "POSTROUTING", nat); err != nil {
		return err
	}
	if err := fillMark(ipt, vxlanDev, mark); err != nil {
		return err
	}
	return fill(ipt, "filter", forwardChain, "FORWARD", fwd)
}

// EnsureMark sets (mark != 0) or clears the ESTABLISHED mark alone: the
// fast path switched off needs no mark, and its learning programs then see
// no packet at all.
func EnsureMark(vxlanDev string, mark uint32) error {
	ipt, err := newIPv4()
	if err != nil {
		return err
	}
	return fillMark(ipt, vxlanDev, mark)
}

// vxlanElsewhere is the comment, and so the name, of the rule that drops
// VXLAN frames from another interface than the uplink.
const vxlanElsewhere = "onc: VXLAN only by the uplink"

// VXLANElsewhereDropped counts the frames for the VXLAN port that came in
// by another interface than the uplink and were dropped.
func VXLANElsewhereDropped() (uint64, error) {
	ipt, err := newIPv4()
	if err != nil {
		return 0, err
	}
	stats, err := ipt.StructuredStats("raw", rawChain)
	if err != nil {
		return 0, fmt.Errorf("iptables -t raw -L %s: %w", rawChain, err)
	}
	for _, s := range stats {
		if strings.Contains(s.Options, "/* "+vxlanElsewhere+" */") {
			return s.Packets, nil
		}
	}
	return 0, fmt.Errorf("iptables -t raw %s has no rule %q", rawChain, vxlanElsewhere)
}

func newIPv4() (*iptables.IPTables, error) {
	ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv4), iptables.Timeout(10))
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return ipt, nil
}

func fillMark(ipt *iptables.IPTables, vxlanDev string, mark uint32) error {
	var marks [][]string
	if mark != 0 {
		m := fmt.Sprintf("0x%x", mark)
		est := []string{"-m", "conntrack", "--ctstate", "ESTABLISHED", "-j", "MARK", "--or-mark", m}
		marks = [][]string{
			append([]string{"-i", "onc+", "-o", vxlanDev, "-m", "comment", "--comment", "onc: established, pod to overlay"}, est...),
			append([]string{"-i", vxlanDev, "-o", "onc+", "-m", "comment", "--comment", "onc: established, overlay to pod"}, est...),
		}
	}
	return fill(ipt, "mangle", markChain, "FORWARD", marks)
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
