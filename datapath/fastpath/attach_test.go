package fastpath

import (
	"net"
	"os"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
)

// inVethNetns runs fn in a fresh namespace holding veth pair "up0"/"up1".
func inVethNetns(t *testing.T, fn func()) {
	testutil.InNewNetns(t, "fp", func() {
		must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0", HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}}, PeerName: "up1"}))
		fn()
	})
}

func linkID(t *testing.T, pin string) link.ID {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatalf("pinned link %s: %v", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// A restarted agent (a second Open on the same pins) adopts the tcx links
// instead of attaching new ones, and DetachPod removes the pins.
func TestTCXLinksArePinnedAndAdopted(t *testing.T) {
	d := open(t)
	inVethNetns(t, func() {
		must(t, d.AttachUplink("up0"))
		must(t, d.AttachPod("up1"))
		in, out := linkID(t, d.linkPin("up0", ingress)), linkID(t, d.linkPin("up0", egress))

		again, err := Open(d.opts)
		must(t, err)
		defer again.Close()
		must(t, again.AttachUplink("up0"))
		if linkID(t, d.linkPin("up0", ingress)) != in || linkID(t, d.linkPin("up0", egress)) != out {
			t.Fatal("restart attached new links instead of adopting the pinned ones")
		}
		l, err := link.LoadPinnedLink(d.linkPin("up0", ingress), nil)
		must(t, err)
		info, _ := l.Info()
		l.Close()
		progInfo, _ := again.progs.ingressFast.Info()
		if id, _ := progInfo.ID(); info.Program != id {
			t.Fatal("adopted link does not run the new program")
		}

		must(t, again.DetachPod("up1"))
		for _, dir := range []direction{ingress, egress} {
			if _, err := os.Stat(d.linkPin("up1", dir)); !os.IsNotExist(err) {
				t.Fatalf("pin of up1 %s left after DetachPod", dir.name)
			}
		}
	})
}

func TestClsactMode(t *testing.T) {
	c := openMode(t, ModeClsact)
	inVethNetns(t, func() {
		must(t, c.AttachUplink("up0"))
		must(t, c.AttachUplink("up0")) // idempotent: replaces
		l, _ := netlink.LinkByName("up0")
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			filters, err := netlink.FilterList(l, parent)
			must(t, err)
			if len(filters) != 1 || !filters[0].(*netlink.BpfFilter).DirectAction {
				t.Fatalf("parent %x: filters %v, want one direct-action bpf filter", parent, filters)
			}
		}
	})
	if c.Mode() != ModeClsact {
		t.Fatalf("mode %s", c.Mode())
	}
}
