package overlay

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// createVXLAN sends RTM_NEWLINK itself because the netlink library omits
// IFLA_VXLAN_UDP_CSUM when false, and recent kernels then default the outer
// UDP checksum to on. ONC wants it off: it costs a checksum per packet and
// the fast path's learned headers carry a zero checksum.
func createVXLAN(cfg Config) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(DeviceName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(cfg.MTU))))
	req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, []byte(cfg.MAC)))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(nl.IFLA_VXLAN_ID, nl.Uint32Attr(uint32(cfg.VNI)))
	data.AddRtAttr(nl.IFLA_VXLAN_LINK, nl.Uint32Attr(uint32(cfg.Uplink)))
	if cfg.LocalIP.Is6() {
		data.AddRtAttr(nl.IFLA_VXLAN_LOCAL6, cfg.LocalIP.AsSlice())
	} else {
		data.AddRtAttr(nl.IFLA_VXLAN_LOCAL, cfg.LocalIP.AsSlice())
	}
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(cfg.Port))
	data.AddRtAttr(nl.IFLA_VXLAN_PORT, port)
	data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, []byte{0})
	data.AddRtAttr(nl.IFLA_VXLAN_UDP_CSUM, []byte{0})
	if cfg.LocalIP.Is6() {
		// The fast path sends a zero UDP checksum over IPv6, as over
		// IPv4 (datapath/bpf/include/encap6.h); a flow it does not
		// decapsulate itself reaches the device that way.
		data.AddRtAttr(nl.IFLA_VXLAN_UDP_ZERO_CSUM6_RX, []byte{1})
	}
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("create %s (VNI %d, port %d): %w", DeviceName, cfg.VNI, cfg.Port, err)
	}
	return nil
}
