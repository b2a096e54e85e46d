//go:build privileged

package fastpath

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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

// In a container /sys/fs/bpf is sysfs' read-only mount point with no bpffs
// on it, and the pin directory below it cannot be made: Open mounts a
// bpffs on the parent, then pins maps and links in the directory it makes.
func TestOpenMountsBPFFSOnAReadOnlyParent(t *testing.T) {
	testutil.Privileged(t)
	parent := t.TempDir()
	must(t, unix.Mount("tmpfs", parent, "tmpfs", unix.MS_RDONLY, ""))
	t.Cleanup(func() {
		for unix.Unmount(parent, unix.MNT_DETACH) == nil {
		}
	})
	d, err := Open(Options{PinDir: filepath.Join(parent, "onc"), VNI: 1, Port: 4789, Mark: mark, NodeIP: localNode, PodCIDR: localCIDR})
	must(t, err)
	defer d.Close()
	var st unix.Statfs_t
	if unix.Statfs(parent, &st) != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Fatal("no bpffs mounted on the parent")
	}
	inVethNetns(t, func() {
		must(t, d.AttachUplink("up0"))
		if _, err := os.Stat(d.linkPin("up0", ingress)); err != nil {
			t.Fatalf("link pin in the made directory: %v", err)
		}
	})
}
