//go:build privileged

package fastpath

// The fastpath package on an IPv6 underlay: what Open refuses and gives
// the programs, and the fast path, which cannot run there.

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// This node's tunnel endpoint on the IPv6 underlay.
var localNode6 = netip.MustParseAddr("2001:db8:0:2::1")

// openNode loads the datapath with o's node settings on a private bpffs
// mounted on a temporary dir, the fast path left off.
func openNode(t *testing.T, o Options) *Datapath {
	testutil.Privileged(t)
	dir := t.TempDir()
	o.PinDir, o.VNI, o.Port, o.Mark = dir, 1, 4789, mark
	d, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	return d
}

// openU6 is a node on the IPv6 underlay with the IPv6 pod CIDR localCIDR6
// and podCIDR (zero: an IPv6-only node).
func openU6(t *testing.T, podCIDR netip.Prefix) *Datapath {
	return openNode(t, Options{NodeIP: localNode6, PodCIDR: podCIDR, PodCIDRv6: localCIDR6})
}

// The flow cache carries IPv4 outer headers only: on an IPv6 underlay it
// cannot be switched on, and the caller can know so before it tries.
func TestFastPathNeedsAnIPv4Underlay(t *testing.T) {
	if err := (Options{NodeIP: localNode}).CheckFastPath(); err != nil {
		t.Fatalf("IPv4 underlay: %v", err)
	}
	if err := (Options{NodeIP: localNode6}).CheckFastPath(); err == nil || !strings.Contains(err.Error(), "IPv4 underlay") {
		t.Fatalf("IPv6 underlay: %v, want an error saying the fast path needs an IPv4 underlay", err)
	}
	d := openU6(t, localCIDR)
	c, err := d.config()
	testutil.Must(t, err)
	for what, on := range map[string]func() error{"Configure": func() error { return d.Configure(true) }, "Switch": func() error { return d.Switch(true) }} {
		if err := on(); err == nil || !strings.Contains(err.Error(), "the fast path needs an IPv4 underlay") {
			t.Errorf("%s(true) on an IPv6 underlay: %v, want refused", what, err)
		}
		if after, err := d.config(); err != nil || after != c {
			t.Errorf("%s(true) refused, the config went from %+v to %+v (%v)", what, c, after, err)
		}
	}
	testutil.Must(t, d.Configure(false))
	testutil.Must(t, d.Switch(false))
	if d.Enabled() {
		t.Fatal("the fast path is on")
	}
}

// What Open gives the programs: the endpoint of the underlay's family,
// the other zero, and an all-zero mask for a family without pods.
func TestOpenSetsTheEndpointOfTheUnderlaysFamily(t *testing.T) {
	for _, c := range []struct {
		name            string
		o               Options
		ip4             uint32
		ip6             [16]byte
		podMask, pod6M0 uint32
	}{
		{"IPv4 underlay, dual-stack", Options{NodeIP: localNode, PodCIDR: localCIDR, PodCIDRv6: localCIDR6}, bpf.NetIPv4(localNode), [16]byte{}, 0x00ffffff, 0xffffffff},
		{"IPv4 underlay, IPv6-only", Options{NodeIP: localNode, PodCIDRv6: localCIDR6}, bpf.NetIPv4(localNode), [16]byte{}, 0, 0xffffffff},
		{"IPv6 underlay, dual-stack", Options{NodeIP: localNode6, PodCIDR: localCIDR, PodCIDRv6: localCIDR6}, 0, localNode6.As16(), 0x00ffffff, 0xffffffff},
		{"IPv6 underlay, IPv6-only", Options{NodeIP: localNode6, PodCIDRv6: localCIDR6}, 0, localNode6.As16(), 0, 0xffffffff},
		{"IPv6 underlay, IPv4-only", Options{NodeIP: localNode6, PodCIDR: localCIDR}, 0, localNode6.As16(), 0x00ffffff, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := openNode(t, c.o)
			v := d.objs.FastpathVariables
			var ip4, podMask uint32
			var ip6 [16]byte
			var pod6Mask [4]uint32
			testutil.Must(t, v.OncNodeIp.Get(&ip4))
			testutil.Must(t, v.OncNodeIp6.Get(&ip6))
			testutil.Must(t, v.OncPodMask.Get(&podMask))
			testutil.Must(t, v.OncPod6Mask.Get(&pod6Mask))
			if ip4 != c.ip4 || ip6 != c.ip6 || podMask != c.podMask || pod6Mask[0] != c.pod6M0 {
				t.Fatalf("onc_node_ip %#x, onc_node_ip6 %x, onc_pod_mask %#x, onc_pod6_mask[0] %#x; want %#x, %x, %#x, %#x",
					ip4, ip6, podMask, pod6Mask[0], c.ip4, c.ip6, c.podMask, c.pod6M0)
			}
		})
	}
}

// Open refuses node settings the guard cannot hold, before loading
// anything.
func TestOpenRefusesWhatTheGuardCannotHold(t *testing.T) {
	testutil.Privileged(t)
	for _, c := range []struct {
		name, want string
		o          Options
	}{
		{"no pod CIDR, IPv4 underlay", "no pod CIDR", Options{NodeIP: localNode}},
		{"no pod CIDR, IPv6 underlay", "no pod CIDR", Options{NodeIP: localNode6}},
		{"an IPv4-mapped node IP", "IPv4-mapped", Options{NodeIP: netip.AddrFrom16(localNode.As16()), PodCIDR: localCIDR}},
		{"no node IP", "tunnel endpoint", Options{PodCIDR: localCIDR}},
		{"the IPv4 unspecified node IP", "tunnel endpoint", Options{NodeIP: netip.IPv4Unspecified(), PodCIDR: localCIDR}},
		{"the IPv6 unspecified node IP", "tunnel endpoint", Options{NodeIP: netip.IPv6Unspecified(), PodCIDRv6: localCIDR6}},
		{"an IPv6 prefix as the IPv4 pod CIDR", "not an IPv4 prefix", Options{NodeIP: localNode6, PodCIDR: localCIDR6}},
		{"an IPv4-mapped prefix as the IPv4 pod CIDR", "not an IPv4 prefix", Options{NodeIP: localNode, PodCIDR: netip.MustParsePrefix("::ffff:10.244.1.0/120")}},
		{"an IPv4 pod CIDR of /0", "not an IPv4 prefix", Options{NodeIP: localNode, PodCIDR: netip.MustParsePrefix("0.0.0.0/0")}},
	} {
		dir := t.TempDir()
		c.o.PinDir, c.o.VNI, c.o.Port, c.o.Mark = dir, 1, 4789, mark
		d, err := Open(c.o)
		if err == nil {
			d.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
		// A fresh bpffs may hold the kernel's own iterators (maps.debug).
		if pins, _ := filepath.Glob(filepath.Join(dir, "onc_*")); len(pins) != 0 {
			t.Errorf("%s: pinned %v before the refusal", c.name, pins)
		}
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
}
