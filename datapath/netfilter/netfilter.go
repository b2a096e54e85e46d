// Package netfilter installs ONC's iptables rules: masquerade for pod
// traffic leaving the cluster CIDR; FORWARD accepts for pod traffic, so
// hosts whose FORWARD policy is DROP (Docker's, for one) still forward
// pods; and, for the fast path, a mark on pod traffic that conntrack saw
// ESTABLISHED, which the learning programs require. The rules live in
// ONC's own chains, rewritten whole on every Ensure.
package netfilter

import (
	"fmt"

	"github.com/coreos/go-iptables/iptables"
)

const (
	natChain     = "ONC-POSTROUTING"
	forwardChain = "ONC-FORWARD"
	markChain    = "ONC-MARK"
)

// Ensure makes the chains hold exactly the rules for clusterCIDR and jumps
// to them first in POSTROUTING and FORWARD. With mark != 0, pod traffic
// that crosses onc.vxlan in a flow conntrack saw ESTABLISHED gets that
// skb->mark bit (never a header bit). It is idempotent.
func Ensure(clusterCIDR, vxlanDev string, mark uint32) error {
	ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv4), iptables.Timeout(10))
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
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
	ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv4), iptables.Timeout(10))
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	return fillMark(ipt, vxlanDev, mark)
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
