package bypass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// KeepConntrack resets the idle timer of the conntrack entries of the
// bypassed connections, in the caller's network namespace (the node's,
// whose FORWARD hook saw their handshakes). A bypassed connection sends
// no packet through conntrack after its handshake, so its entry would
// expire (nf_conntrack_tcp_timeout_established: 5 days, 1 day under
// kube-proxy); the FIN that ends it, or its sends after a fall-back to
// the stack, would then be INVALID to conntrack, and policy drops those.
// Call it well within that timeout; it returns the entries refreshed.
func (b *Bypass) KeepConntrack() (int, error) {
	timeout, err := establishedTimeout()
	if err != nil {
		return 0, err
	}
	conns, err := b.Conns()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, c := range conns {
		if !c.Paired() {
			continue
		}
		switch err := refreshConntrack(c, timeout); {
		case err == nil:
			n++
		case errors.Is(err, unix.ENOENT):
			// Not tracked here (no rule needed conntrack): nothing expires.
		default:
			errs = append(errs, fmt.Errorf("conntrack of %s -> %s: %w", c.Client, c.Server, err))
		}
	}
	return n, errors.Join(errs...)
}

func establishedTimeout() (uint32, error) {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // conntrack not loaded: nothing to keep
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	return uint32(v), err
}

// refreshConntrack sets the timeout of the entry whose original direction
// is c's client to its server, in c's family; nothing else of the entry
// changes.
func refreshConntrack(c Conn, timeout uint32) error {
	if timeout == 0 {
		return nil
	}
	family, src, dst := uint8(unix.AF_INET), nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
	if !c.Client.Addr().Unmap().Is4() {
		family, src, dst = unix.AF_INET6, nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	orig := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_ORIG, nil)
	ip := orig.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	ip.AddRtAttr(src, c.Client.Addr().Unmap().AsSlice())
	ip.AddRtAttr(dst, c.Server.Addr().Unmap().AsSlice())
	proto := orig.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_PROTO, nil)
	proto.AddRtAttr(nl.CTA_PROTO_NUM, []byte{unix.IPPROTO_TCP})
	proto.AddRtAttr(nl.CTA_PROTO_SRC_PORT, binary.BigEndian.AppendUint16(nil, c.Client.Port()))
	proto.AddRtAttr(nl.CTA_PROTO_DST_PORT, binary.BigEndian.AppendUint16(nil, c.Server.Port()))
	req.AddData(orig)
	req.AddData(nl.NewRtAttr(nl.CTA_TIMEOUT, binary.BigEndian.AppendUint32(nil, timeout)))
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}
