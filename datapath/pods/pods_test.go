//go:build privileged

package pods_test

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
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
		IP: netip.MustParseAddr("10.244.1.5"), Gateway: netip.MustParseAddr("10.244.1.1"), MTU: 1450}
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
