package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/lab"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernel reads a lab node's overlay from its network namespace.
type Kernel struct{ h *netlink.Handle }

// OpenKernel opens a netlink handle inside the named namespace.
func OpenKernel(netnsName string) (*Kernel, error) {
	ns, err := netns.Open(lab.NetnsPath(netnsName))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	return &Kernel{h: h}, nil
}

// Close lets go of the handle.
func (k *Kernel) Close() { k.h.Close() }

// vxlan is the overlay device's index, looked up each time: it is
// recreated when a cold start is measured.
func (k *Kernel) vxlan() (int, error) {
	l, err := k.h.LinkByName(overlay.DeviceName)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// PeerRoutes counts the routes via a gateway on the overlay device: one
// per programmed peer (0 when there is no device).
func (k *Kernel) PeerRoutes() (int, error) {
	idx, err := k.vxlan()
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	routes, err := k.h.RouteListFiltered(unix.AF_INET, &netlink.Route{LinkIndex: idx}, netlink.RT_FILTER_OIF)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range routes {
		if r.Gw != nil {
			n++
		}
	}
	return n, nil
}

// Routes reports whether the node routes cidr to its peer: whether a
// lookup of an address in it (one kernel lookup, cheap at any number of
// peers, unlike a dump) resolves via the CIDR's gateway on the overlay.
func (k *Kernel) Routes(cidr netip.Prefix) (bool, error) {
	idx, err := k.vxlan()
	if err != nil {
		return false, err
	}
	gw := overlay.Gateway(cidr)
	rs, err := k.h.RouteGet(gw.Next().AsSlice())
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
		return false, nil // lab nodes have no default route
	}
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		if r.LinkIndex == idx && r.Gw.Equal(gw.AsSlice()) {
			return true, nil
		}
	}
	return false, nil
}

// FDB returns the remote address the overlay's forwarding entry for mac
// points at (invalid if there is none).
func (k *Kernel) FDB(mac net.HardwareAddr) (netip.Addr, error) {
	idx, err := k.vxlan()
	if err != nil {
		return netip.Addr{}, err
	}
	fdb, err := k.h.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, f := range fdb {
		if f.HardwareAddr.String() == mac.String() {
			a, _ := netip.AddrFromSlice(f.IP)
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, nil
}

// wipe leaves a stopped agent's node as after a reboot: no overlay device
// (so no peer routes, neighbours or FDB entries) and nothing pinned in
// its bpffs (maps and links; unpinning a tcx link detaches its program).
func (k *Kernel) wipe(n *lab.Node) error {
	if l, err := k.h.LinkByName(overlay.DeviceName); err == nil {
		if err := k.h.LinkDel(l); err != nil {
			return fmt.Errorf("delete %s: %w", overlay.DeviceName, err)
		}
	}
	entries, err := os.ReadDir(n.BPFFS())
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".debug") {
			continue // the bpffs' own iterator files (bpf_preload), not pins
		}
		if err := os.RemoveAll(filepath.Join(n.BPFFS(), e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// AgentState is what the bench and tests read of the agent: its
// programmed peers, the kernel writes it made for peers, and its peers
// watcher's generations.
type AgentState struct {
	Peers                   int
	KernelWrites            uint64
	PeersSeen, PeersApplied uint64
	Ready                   bool
}

// ReadAgent asks the node's agent.
func ReadAgent(ctx context.Context, n *lab.Node) (AgentState, error) {
	st, err := n.Status(ctx)
	if err != nil {
		return AgentState{}, err
	}
	return agentState(st), nil
}

func agentState(st *apiv1.NodeStatus) AgentState {
	a := AgentState{Peers: int(st.Peers), KernelWrites: st.PeerKernelWrites, Ready: st.Ready}
	for _, w := range st.Watchers {
		if w.Name == "peers" {
			a.PeersSeen, a.PeersApplied = w.Seen, w.Applied
		}
	}
	return a
}

// Settle waits until n's agent has applied every signal its peers watcher
// has seen and its peer state (programmed peers, kernel writes,
// generations) has stood still for quiet: the controller's last writes
// after an allocation, say, have reached it.
func Settle(ctx context.Context, n *lab.Node, quiet, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last AgentState
	since := time.Now()
	for {
		st, err := ReadAgent(ctx, n)
		if err != nil {
			return err
		}
		if st != last || st.PeersApplied != st.PeersSeen {
			last, since = st, time.Now()
		} else if time.Since(since) >= quiet {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not settle in %s: %+v", timeout, st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
