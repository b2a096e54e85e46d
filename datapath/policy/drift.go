package policy

// Drift: whether the kernel's table may differ from the one the Enforcer
// last wrote, told without reading it back. nftables numbers its ruleset:
// every committed transaction, anyone's, adds one to the generation. While
// the generation is the one the Enforcer's own last transaction left,
// nothing at all changed, and a resync costs one netlink request. Once
// another program commits (kube-proxy's nftables mode, iptables-nft, a
// firewall, an operator), the table may have changed: the resync rewrites
// it. Listing the table to compare instead costs about as much as the
// rewrite (nft lists 46,000 set elements in 1.5 s, docs/performance.md).

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// RulesetGeneration is nftables' ruleset generation (NFT_MSG_GETGEN), in
// the calling thread's network namespace.
func RulesetGeneration() (uint32, error) {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, 0)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.NFTA_GEN_ID && len(a.Value) == 4 {
				return binary.BigEndian.Uint32(a.Value), nil
			}
		}
	}
	return 0, errors.New("nftables generation: the kernel's answer has no NFTA_GEN_ID")
}

// ownership is the generation the Enforcer's last transaction left, if
// it knows it.
type ownership struct {
	gen   uint32
	known bool
}

// wrote records the Enforcer's own transaction, committed between the
// generations before and after (read: both were read). The table is known
// to be as written at after only if no other transaction came between,
// and, unless the transaction rewrote it whole, if it was known to be so
// before: an update leaves a hand edit made before it in place.
func (o *ownership) wrote(before, after uint32, read, rewrite bool) {
	o.known = read && after == before+1 && (rewrite || o.known && before == o.gen)
	o.gen = after
}

// drifted reports whether the table may differ from what the Enforcer
// last wrote: whether anything was committed since, or the generation
// cannot be read (a rewrite is the safe answer). A resync that rewrites
// records the generation it leaves, so the next one is quiet again.
func (o *ownership) drifted() bool {
	gen, err := RulesetGeneration()
	return err != nil || !o.known || gen != o.gen
}
