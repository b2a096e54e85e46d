//go:build privileged

package fastpath

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inVethNetns runs fn in a fresh namespace holding veth pair "up0"/"up1".
func inVethNetns(t *testing.T, fn func()) {
	testutil.InNewNetns(t, "fp", func() {
		testutil.Must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0", HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}}, PeerName: "up1"}))
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
		testutil.Must(t, d.AttachUplink("up0"))
		testutil.Must(t, d.AttachPod("up1"))
		in, out := linkID(t, d.linkPin("up0", ingress)), linkID(t, d.linkPin("up0", egress))

		again, err := Open(d.opts)
		testutil.Must(t, err)
		defer again.Close()
		testutil.Must(t, again.AttachUplink("up0"))
		if linkID(t, d.linkPin("up0", ingress)) != in || linkID(t, d.linkPin("up0", egress)) != out {
			t.Fatal("restart attached new links instead of adopting the pinned ones")
		}
		l, err := link.LoadPinnedLink(d.linkPin("up0", ingress), nil)
		testutil.Must(t, err)
		info, _ := l.Info()
		l.Close()
		progInfo, _ := again.progs.OncIngressFast.Info()
		if id, _ := progInfo.ID(); info.Program != id {
			t.Fatal("adopted link does not run the new program")
		}

		testutil.Must(t, again.DetachPod("up1"))
		for _, dir := range []direction{ingress, egress} {
			if _, err := os.Stat(d.linkPin("up1", dir)); !os.IsNotExist(err) {
				t.Fatalf("pin of up1 %s left after DetachPod", dir.name)
			}
		}
	})
}

// An agent of this version on a v0 agent's pins (one object per attach
// point, the VNI, port, mark and addresses in onc_config): the fast-path
// maps are replaced, as the config's layout changed, and the pod's pinned
// links are adopted and given the new programs, so no packet passes the
// veth unguarded. The agent then puts the pod back (AdoptPod) and flows
// learn again through the slow path.
func TestUpgradeFromV0Pins(t *testing.T) {
	testutil.Privileged(t)
	dir := t.TempDir()
	testutil.Must(t, bpf.EnsurePinDir(dir))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	inVethNetns(t, func() {
		// The v0 agent attached its pod programs through pinned tcx links.
		eg, li := bpftest.LoadV0(t, bpftest.V0EgressFast, dir), bpftest.LoadV0(t, bpftest.V0LearnIngress, dir)
		up1, err := net.InterfaceByName("up1")
		testutil.Must(t, err)
		for _, a := range []struct {
			prog *ebpf.Program
			dir  direction
		}{{eg.Programs["onc_egress_fast"], ingress}, {li.Programs["onc_learn_ingress"], egress}} {
			l, err := link.AttachTCX(link.TCXOptions{Interface: up1.Index, Program: a.prog, Attach: a.dir.attach, Anchor: link.Head()})
			testutil.Must(t, err)
			testutil.Must(t, l.Pin(filepath.Join(dir, "link_up1_"+a.dir.name)))
			l.Close()
		}
		testutil.Must(t, eg.Maps["onc_local"].Put(bpf.NetIPv4(localPod), LocalPod{Ifindex: uint32(up1.Index)}))
		// The v0 agent had the fast path on, its guard on port 4789.
		v0cfg := [28]byte{4: 1, 5: 1, 6: 0x12, 7: 0xb5}
		testutil.Must(t, eg.Maps["onc_cfg"].Put(uint32(0), v0cfg))
		oldCfg, err := eg.Maps["onc_cfg"].Clone()
		testutil.Must(t, err)
		defer oldCfg.Close()
		in, out := linkID(t, filepath.Join(dir, "link_up1_ingress")), linkID(t, filepath.Join(dir, "link_up1_egress"))
		eg.Close()
		li.Close()

		d, err := Open(Options{PinDir: dir, VNI: 1, Port: 4789, Mark: mark, NodeIP: localNode, PodCIDR: localCIDR})
		testutil.Must(t, err)
		defer d.Close()
		testutil.Must(t, d.Configure(true))
		if locals, err := d.Locals(); err != nil || len(locals) != 0 {
			t.Fatalf("local pods %v (%v) after the upgrade, want the maps replaced", locals, err)
		}
		// A veth left on the v0 programs (its adoption failed) serves
		// nothing from the cache no eviction reaches, and its guard keeps
		// its settings.
		var got [28]byte
		testutil.Must(t, oldCfg.Lookup(uint32(0), &got))
		if want := ([28]byte{6: 0x12, 7: 0xb5}); got != want {
			t.Fatalf("the replaced v0 config is % x, want % x: switched off, the rest kept", got, want)
		}
		testutil.Must(t, d.AttachPod("up1"))
		for _, l := range []struct {
			dir  direction
			id   link.ID
			prog *ebpf.Program
		}{{ingress, in, d.progs.OncEgressFast}, {egress, out, d.progs.OncLearnIngress}} {
			pinned, err := link.LoadPinnedLink(d.linkPin("up1", l.dir), nil)
			testutil.Must(t, err)
			info, err := pinned.Info()
			pinned.Close()
			testutil.Must(t, err)
			progInfo, err := l.prog.Info()
			testutil.Must(t, err)
			if id, _ := progInfo.ID(); info.ID != l.id || info.Program != id {
				t.Fatalf("%s: link %d running program %d, want the v0 link %d adopted with the new program %d", l.dir.name, info.ID, info.Program, l.id, id)
			}
		}
		// The new program guards the veth with the constants Open set: a
		// frame the pod sends to the VXLAN port is dropped.
		for _, name := range []string{"up0", "up1"} {
			l, err := netlink.LinkByName(name)
			testutil.Must(t, err)
			testutil.Must(t, netlink.LinkSetUp(l))
		}
		up0, err := net.InterfaceByName("up0")
		testutil.Must(t, err)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		testutil.Must(t, err)
		defer unix.Close(fd)
		toVXLAN := frame(up1.HardwareAddr, podMAC, localPod, remotePod, unix.IPPROTO_UDP, 40000, 4789, 0, 10)
		// Sent until the veth carries it: it has just come up.
		testutil.WaitFor(t, "the pod's frame to the VXLAN port dropped", 2*time.Second, func() bool {
			testutil.Must(t, unix.Sendto(fd, toVXLAN, 0, &unix.SockaddrLinklayer{Ifindex: up0.Index}))
			return stat(t, d, "overlay_drop_from_pod") > 0
		})
	})
}

func TestClsactMode(t *testing.T) {
	c := openMode(t, ModeClsact)
	inVethNetns(t, func() {
		testutil.Must(t, c.AttachUplink("up0"))
		testutil.Must(t, c.AttachUplink("up0")) // idempotent: replaces
		l, _ := netlink.LinkByName("up0")
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			filters, err := netlink.FilterList(l, parent)
			testutil.Must(t, err)
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
	testutil.Must(t, unix.Mount("tmpfs", parent, "tmpfs", unix.MS_RDONLY, ""))
	t.Cleanup(func() {
		for unix.Unmount(parent, unix.MNT_DETACH) == nil {
		}
	})
	d, err := Open(Options{PinDir: filepath.Join(parent, "onc"), VNI: 1, Port: 4789, Mark: mark, NodeIP: localNode, PodCIDR: localCIDR})
	testutil.Must(t, err)
	defer d.Close()
	var st unix.Statfs_t
	if unix.Statfs(parent, &st) != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Fatal("no bpffs mounted on the parent")
	}
	inVethNetns(t, func() {
		testutil.Must(t, d.AttachUplink("up0"))
		if _, err := os.Stat(d.linkPin("up0", ingress)); err != nil {
			t.Fatalf("link pin in the made directory: %v", err)
		}
	})
}
