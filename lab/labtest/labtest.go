// Package labtest holds the test helpers for the lab (see lab): a lab
// brought up for one test and taken down when it ends, and the count of
// what pods leave behind in a lab node's namespace. The helpers every test
// shares (the root gate, binaries, namespaces) are in internal/testutil.
package labtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/internal/daemon"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// failedLogLines is how much of each daemon's log a failed test prints.
const failedLogLines = 20

// Lab brings up a lab (see lab) with a unique prefix in a short
// temporary state root (unix socket paths are limited to 108 bytes), and
// takes it down when the test ends, also on failure.
// Only Nodes, PodsPerNode, NodeTimeout, ControllerArgs, Datastore and
// Underlay of o are used.
func Lab(t testing.TB, o lab.Options) *lab.Lab {
	t.Helper()
	testutil.Privileged(t)
	root, err := os.MkdirTemp("", "onc")
	if err != nil {
		t.Fatal(err)
	}
	o.Prefix, o.BinDir, o.StateRoot = testutil.Prefix(), testutil.Binaries(t), root
	if o.Datastore == "kubernetes" {
		o.KubeBin = os.Getenv("ONC_KUBE_BIN")
		_, err := os.Stat(filepath.Join(o.KubeBin, "kube-apiserver"))
		testutil.Require(t, err == nil, "kube-apiserver not built: run `make kube-bins` (it sets ONC_KUBE_BIN for make test)")
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = time.Hour
	}
	l, err := lab.Up(context.Background(), o)
	if err != nil {
		os.RemoveAll(root)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// Tails only: a CI report shows the end of a failing test's
			// output, and whole logs would push its failure out of it.
			t.Logf("controller log, last %d lines:\n%s", failedLogLines, daemon.Tail(l.Controller.Log, failedLogLines))
			for _, n := range l.Nodes {
				t.Logf("agent log of %s, last %d lines:\n%s", n.Name, failedLogLines, daemon.Tail(n.Agent.Log, failedLogLines))
			}
		}
		if err := l.Down(); err != nil {
			t.Errorf("lab down: %v", err)
		}
		os.RemoveAll(root)
	})
	return l
}

// PodState counts what pods leave in a node namespace: host-side veths
// (every veth but the node's uplinks, eth0 and on the direct underlay ctl0), ONC pod routes (proto 183 on
// anything but onc.vxlan) and permanent neighbours (likewise).
type PodState struct{ Veths, Routes, Neighbours int }

// PodStateOf reads the pod state of the named node namespace.
func PodStateOf(t testing.TB, node string) PodState {
	t.Helper()
	h := testutil.NetlinkAt(t, node)
	var s PodState
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	podLink := map[int]bool{}
	for _, l := range links {
		if l.Type() == "veth" && l.Attrs().Name != "eth0" && l.Attrs().Name != "ctl0" {
			s.Veths++
			podLink[l.Attrs().Index] = true
		}
	}
	routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Protocol: pods.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if podLink[r.LinkIndex] || r.Gw == nil {
			s.Routes++
		}
	}
	neighs, err := h.NeighList(0, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if n.State == netlink.NUD_PERMANENT && podLink[n.LinkIndex] {
			s.Neighbours++
		}
	}
	return s
}
