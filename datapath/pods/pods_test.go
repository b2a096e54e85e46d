//go:build privileged

package pods_test

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func setupNode(t *testing.T) (node netns.Handle, podPath string) {
	testutil.Privileged(t)
	p := testutil.Prefix()
	nodePath := testutil.Netns(t, p+"-node")
	podPath = testutil.Netns(t, p+"-pod")
	node, err := netns.Open(nodePath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	return node, podPath
}

func pod(path, ifname string) pods.Pod {
	return pods.Pod{Netns: path, IfName: ifname, HostIface: pods.HostIfaceName("c1", ifname),
		IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Gateways: []netip.Addr{netip.MustParseAddr("10.244.1.1")}, MTU: 1450}
}

func links(t *testing.T, path string) []string {
	ls, _ := testutil.NetlinkAt(t, filepath.Base(path)).LinkList()
	var names []string
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	return names
}

func TestSetupCheckTeardown(t *testing.T) {
	node, podPath := setupNode(t)
	p := pod(podPath, "eth0")
	err := netns.Do(node, func() error {
		if _, err := pods.Setup(p); err != nil {
			return err
		}
		if err := pods.Check(p); err != nil {
			return err
		}
		if _, err := pods.Setup(p); !errors.Is(err, pods.ErrIfaceExists) {
			t.Errorf("second Setup: err = %v, want ErrIfaceExists", err)
		}
		if err := pods.Check(p); err != nil {
			t.Errorf("a rejected second Setup broke the pod: %v", err)
		}
		if err := pods.Teardown(p.HostIface); err != nil {
			return err
		}
		if err := pods.Teardown(p.HostIface); err != nil {
			t.Errorf("second Teardown: %v", err)
		}
		if err := pods.Check(p); err == nil {
			t.Error("Check passed after Teardown")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := links(t, podPath); len(got) != 1 {
		t.Fatalf("pod netns after teardown has %v, want only lo", got)
	}
}

// A dual-stack pod gets both addresses, usable at once (no duplicate
// address detection), a default route per family over permanent
// neighbours, and the node routes both to it, even with IPv6 off by
// default in both namespaces (as some runtimes and nodes leave it); Check
// tells a missing IPv6 piece.
func TestDualStackPod(t *testing.T) {
	node, podPath := setupNode(t)
	for _, ns := range []string{"", podPath} {
		// New interfaces start with IPv6 off (the node keeps it on lo,
		// where the test puts the gateway).
		args := []string{"sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.lo.disable_ipv6=0"}
		var err error
		if ns == "" {
			err = netns.Do(node, func() error { return exec.Command(args[0], args[1:]...).Run() })
		} else {
			err = exec.Command("ip", append([]string{"netns", "exec", filepath.Base(ns)}, args...)...).Run()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	p := pod(podPath, "eth0")
	p.IPs = []netip.Addr{netip.MustParseAddr("fd00:10:244:1::5"), netip.MustParseAddr("10.244.1.5")}
	p.Gateways = []netip.Addr{netip.MustParseAddr("fd00:10:244:1::1"), netip.MustParseAddr("10.244.1.1")}
	err := netns.Do(node, func() error {
		if _, err := pods.Setup(p); err != nil {
			return err
		}
		defer pods.Teardown(p.HostIface)
		if err := pods.Check(p); err != nil {
			return err
		}
		// The node reaches the pod's IPv6 address at once, from the
		// gateway address as the overlay device would hold it.
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: p.Gateways[0].AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		podNS, err := netns.Open(podPath)
		if err != nil {
			return err
		}
		defer podNS.Close()
		var l net.Listener
		if err := netns.Do(podNS, func() (err error) {
			l, err = net.Listen("tcp6", netip.AddrPortFrom(p.IPs[0], 7000).String())
			return err
		}); err != nil {
			return err
		}
		defer l.Close()
		c, err := net.DialTimeout("tcp6", netip.AddrPortFrom(p.IPs[0], 7000).String(), 2*time.Second)
		if err != nil {
			t.Errorf("node -> pod over IPv6: %v", err)
		} else {
			c.Close()
		}
		// Without its IPv6 default route the pod fails Check.
		nh := testutil.NetlinkAt(t, filepath.Base(podPath))
		if err := nh.RouteDel(&netlink.Route{LinkIndex: mustLink(t, nh, "eth0"), Gw: p.Gateways[0].AsSlice(), Family: unix.AF_INET6}); err != nil {
			return err
		}
		if err := pods.Check(p); err == nil || !strings.Contains(err.Error(), "default route via fd00:10:244:1::1") {
			t.Errorf("Check without the IPv6 default route: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, nh *netlink.Handle, name string) int {
	t.Helper()
	l, err := nh.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// A failure after the veth exists must remove it from both namespaces.
func TestSetupRollsBack(t *testing.T) {
	node, podPath := setupNode(t)
	p := pod(podPath, "bad/name") // the rename inside the pod fails
	err := netns.Do(node, func() error {
		_, err := pods.Setup(p)
		if err == nil {
			t.Fatal("Setup with an invalid interface name succeeded")
		}
		if _, lerr := netlink.LinkByName(p.HostIface); lerr == nil {
			t.Errorf("host end %s left behind after: %v", p.HostIface, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links(t, podPath) {
		if strings.HasPrefix(l, "onctmp") || l == "bad/name" {
			t.Fatalf("pod end %s left behind", l)
		}
	}
	if _, err := netns.Open("/run/netns/onc-does-not-exist"); !errors.Is(err, netns.ErrNotExist) {
		t.Fatalf("missing netns: err = %v, want ErrNoNetns", err)
	}
}

// Setup returns what the node programs next without looking again: the
// host end and, when asked, the pod namespace's cookie (the one the
// socket programs see), read while the namespace is open.
func TestSetupReturnsHostEndAndCookie(t *testing.T) {
	node, podPath := setupNode(t)
	want, err := netns.Cookie(podPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, cookie := range []bool{false, true} {
		p := pod(podPath, "eth0")
		p.Cookie = cookie
		err := netns.Do(node, func() error {
			link, err := pods.Setup(p)
			if err != nil {
				return err
			}
			defer pods.Teardown(p.HostIface)
			host, err := netlink.LinkByName(p.HostIface)
			if err != nil {
				return err
			}
			if link.HostIndex != host.Attrs().Index || link.HostMAC.String() != host.Attrs().HardwareAddr.String() {
				t.Errorf("host end %d %s, want %d %s", link.HostIndex, link.HostMAC, host.Attrs().Index, host.Attrs().HardwareAddr)
			}
			switch {
			case cookie && link.NetnsCookie != want:
				t.Errorf("cookie %d, want the pod namespace's %d", link.NetnsCookie, want)
			case !cookie && link.NetnsCookie != 0:
				t.Errorf("cookie %d read though not asked for", link.NetnsCookie)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
