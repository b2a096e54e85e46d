package fastpath

// Fuzz targets for the flow cache's decoders (onctl cache list): any bytes
// a map entry may hold decode, without panic, into exactly what the C
// structs (include/fastpath.h) and headers say they mean. The expected values
// are read from the raw bytes at the C offsets, not through the Go types.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
)

// ip4 is a network-order IPv4 address at b[off:].
func ip4(b []byte, off int) netip.Addr { return netip.AddrFrom4([4]byte(b[off : off+4])) }

// mac is the MAC address at b[off:].
func mac(b []byte, off int) string { return net.HardwareAddr(b[off : off+6]).String() }

// FuzzDecodeFlow: struct flow_key {__be32 local_ip, remote_ip; __be16
// local_port, remote_port; __u8 proto; pad} and flow_val {__u32 epoch;
// __u8 egress, ingress, opener, closing}; a direction is learned when its
// byte is not 0, as flow_allowed reads it, the entry is live in the
// current epoch, and it is closing when any FLOW_CLOSING_* bit is set.
func FuzzDecodeFlow(f *testing.F) {
	f.Add([]byte{10, 244, 1, 2, 10, 244, 2, 3, 0x1f, 0x90, 0x9c, 0x40, 6, 0, 0, 0}, []byte{7, 0, 0, 0, 1, 1, 0, 0}, uint32(7))
	f.Add([]byte{10, 244, 1, 2, 10, 96, 0, 10, 0, 53, 0xc3, 0x50, 17, 0, 0, 0}, []byte{6, 0, 0, 0, 1, 0, 0, 0}, uint32(7))
	f.Add([]byte{192, 0, 2, 1, 192, 0, 2, 2, 0, 0, 0, 0, 1, 0, 0, 0}, []byte{0, 0, 0, 0, 0, 1, 0, 0}, uint32(0))
	f.Add([]byte{10, 244, 1, 2, 10, 244, 2, 3, 0x9c, 0x40, 0, 80, 6, 0, 0, 0}, []byte{7, 0, 0, 0, 1, 1, 2, 3}, uint32(7)) // opened by the remote pod, a FIN each way
	f.Fuzz(func(t *testing.T, key, val []byte, epoch uint32) {
		key, k := testutil.MapEntry[FlowKey](t, key)
		val, v := testutil.MapEntry[FlowVal](t, val)
		got := decodeFlow(k, v, epoch)
		wantProto := strconv.Itoa(int(key[12]))
		switch key[12] {
		case 6:
			wantProto = "tcp"
		case 17:
			wantProto = "udp"
		}
		want := Flow{
			Local:  netip.AddrPortFrom(ip4(key, 0), binary.BigEndian.Uint16(key[8:])),
			Remote: netip.AddrPortFrom(ip4(key, 4), binary.BigEndian.Uint16(key[10:])),
			Proto:  wantProto, Egress: val[4] != 0, Ingress: val[5] != 0, Live: binary.NativeEndian.Uint32(val) == epoch,
			Opener: Opener(val[6]), Closing: val[7] != 0,
		}
		if got != want {
			t.Fatalf("key % x, value % x, epoch %d: decoded %+v, want %+v", key, val, epoch, got, want)
		}
	})
}

// FuzzDecodeDest: key __be32 remote pod, struct egress_val {__be32 node_ip}.
func FuzzDecodeDest(f *testing.F) {
	f.Add([]byte{10, 244, 2, 3}, []byte{192, 0, 2, 2})
	f.Add([]byte{255, 255, 255, 255}, []byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, key, val []byte) {
		key, k := testutil.MapEntry[uint32](t, key)
		val, v := testutil.MapEntry[EgressVal](t, val)
		if got, want := decodeDest(k, v), (Dest{Pod: ip4(key, 0), Node: ip4(val, 0)}); got != want {
			t.Fatalf("key % x, value % x: decoded %+v, want %+v", key, val, got, want)
		}
	})
}

// The outer headers an encap entry holds (ONC_HDR_LEN), as the kernel's
// VXLAN device built them.
const (
	ethLen   = 14 // dst MAC, src MAC, EtherType
	ipv4Len  = 20 // no options; saddr at 12, daddr at 16
	udpLen   = 8
	vxlanLen = 8
	innerEth = ethLen + ipv4Len + udpLen + vxlanLen
	hdrLen   = innerEth + ethLen
)

// FuzzDecodeEncap: key __be32 node, struct encap_val {__u8 hdr[64]; __u32
// ifindex}. The MACs are copies: Encaps reuses one value for every entry.
func FuzzDecodeEncap(f *testing.F) {
	hdr := make([]byte, hdrLen+4)
	copy(hdr, []byte{0xbe, 0x15, 0xb0, 0x24, 0xdb, 0xf6, 0xaa, 0x5d, 0x01, 0x0c, 0x04, 0x2a, 0x08, 0x00})
	copy(hdr[ethLen+12:], []byte{172, 31, 250, 11, 172, 31, 250, 12})
	hdr[hdrLen] = 2
	f.Add([]byte{172, 31, 250, 12}, hdr)
	f.Add([]byte{0, 0, 0, 0}, []byte{})
	f.Fuzz(func(t *testing.T, key, val []byte) {
		key, k := testutil.MapEntry[uint32](t, key)
		val, v := testutil.MapEntry[EncapVal](t, val)
		if len(val) != hdrLen+4 {
			t.Fatalf("struct encap_val is %d bytes, want %d", len(val), hdrLen+4)
		}
		got := decodeEncap(k, &v)
		v = EncapVal{} // the next entry
		want := [7]string{ip4(key, 0).String(), mac(val, 0), mac(val, 6), ip4(val, ethLen+12).String(), ip4(val, ethLen+16).String(),
			mac(val, innerEth) + " " + mac(val, innerEth+6), strconv.Itoa(int(binary.NativeEndian.Uint32(val[hdrLen:])))}
		if have := [7]string{got.Node.String(), got.OuterDst.String(), got.OuterSrc.String(), got.OuterSrcIP.String(), got.OuterDstIP.String(),
			got.InnerDst.String() + " " + got.InnerSrc.String(), strconv.Itoa(got.Ifindex)}; have != want {
			t.Fatalf("key % x, value % x: decoded %v, want %v", key, val, have, want)
		}
	})
}

// FuzzDecodeLocal: key __be32 pod, struct local_pod {__u32 ifindex; __u8
// pod_mac[6], host_mac[6]}. The MACs are copies: Locals reuses one value.
func FuzzDecodeLocal(f *testing.F) {
	f.Add([]byte{10, 244, 1, 2}, []byte{7, 0, 0, 0, 0xfe, 0xa1, 0x9c, 0x33, 0x2c, 0xb5, 0x02, 0xff, 0, 0, 0, 1})
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, key, val []byte) {
		key, k := testutil.MapEntry[uint32](t, key)
		val, v := testutil.MapEntry[LocalPod](t, val)
		got := decodeLocal(bpf.IPv4(k), &v)
		want := [4]string{ip4(key, 0).String(), strconv.Itoa(int(binary.NativeEndian.Uint32(val))), mac(val, 4), mac(val, 10)}
		v = LocalPod{} // the next entry
		if have := [4]string{got.Pod.String(), strconv.Itoa(got.Ifindex), got.PodMAC.String(), got.HostMAC.String()}; have != want {
			t.Fatalf("key % x, value % x: decoded %v, want %v", key, val, have, want)
		}
	})
}
