//go:build privileged

package overlay_test

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
)

// TestLookup: the forwarding onctl trace shows is the kernel's: a pod of
// a peer goes into the overlay, to the peer's VTEP MAC and on to its node;
// a missing neighbour is named; an underlay address is not the overlay's.
func TestLookup(t *testing.T) {
	inNode(t, func(uplink int) {
		o, _ := ensure(t, uplink)
		b := peer("b", "192.0.2.2", "10.244.2.0/24", 2)
		testutil.Must(t, o.Sync([]overlay.Peer{b}, false))
		testutil.Must(t, os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644))
		testutil.Must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0"}, PeerName: "pod1"}))
		for _, name := range []string{"pod0", "pod1"} {
			l, err := netlink.LinkByName(name)
			testutil.Must(t, err)
			testutil.Must(t, netlink.LinkSetUp(l))
		}
		src := netip.MustParseAddr("10.244.1.5")

		f, err := overlay.Lookup("pod0", src, netip.MustParseAddr("10.244.2.7"))
		testutil.Must(t, err)
		if f.Dev != overlay.DeviceName || f.Via != overlay.Gateway(b.PodCIDR) || f.VTEPMAC.String() != b.VTEPMAC.String() || f.Remote != b.NodeIP || f.Missing != "" {
			t.Errorf("to b's pod: %+v, want %s via %s, VTEP %s at %s", f, overlay.DeviceName, overlay.Gateway(b.PodCIDR), b.VTEPMAC, b.NodeIP)
		}

		f, err = overlay.Lookup("pod0", src, netip.MustParseAddr("192.0.2.9"))
		testutil.Must(t, err)
		if f.Dev != "ul0" || f.Via.IsValid() || f.VTEPMAC != nil {
			t.Errorf("to the underlay: %+v, want ul0, directly", f)
		}

		if _, err := overlay.Lookup("pod0", src, netip.MustParseAddr("203.0.113.1")); err == nil || !strings.Contains(err.Error(), "203.0.113.1") {
			t.Errorf("no route: err = %v, want one naming the destination", err)
		}

		dev, err := netlink.LinkByName(overlay.DeviceName)
		testutil.Must(t, err)
		gw := overlay.Gateway(b.PodCIDR)
		testutil.Must(t, netlink.NeighDel(&netlink.Neigh{LinkIndex: dev.Attrs().Index, IP: net.IP(gw.AsSlice()), Family: netlink.FAMILY_V4}))
		f, err = overlay.Lookup("pod0", src, netip.MustParseAddr("10.244.2.7"))
		testutil.Must(t, err)
		if !strings.Contains(f.Missing, "neighbour "+gw.String()) {
			t.Errorf("without the neighbour: %+v, want it named missing", f)
		}
	})
}
