package bypass

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/onc-net/onc/datapath/bpf"
)

// Node is a node's intra-node bypass: loaded once at bring-up, or failed
// to load (Status says why).
type Node struct {
	cfg    Config
	pinDir string
	cgroup func() (string, error)
	bp     bpf.LoadOnce[*Bypass]
}

// NewNode is the node's bypass with setting cfg, pinned under pinDir,
// attached to the cgroup v2 directory cgroup returns; nothing loads until
// Load.
func NewNode(cfg Config, pinDir string, cgroup func() (string, error)) *Node {
	return &Node{cfg: cfg, pinDir: pinDir, cgroup: cgroup}
}

// Load loads the bypass programs and attaches them to the cgroup,
// adopting an earlier agent's pins, and applies the setting; their flow
// events go to events' ring (nil: none). They are loaded even when the
// setting is off, so that `onctl bypass on` needs no restart; off, they
// record nothing. It runs once: a node without the bypass still comes up,
// every connection taking the TCP/IP stack.
func (n *Node) Load(events *bpf.FlowCache) {
	n.bp.Load("intra-node bypass unavailable; every connection takes the TCP/IP stack", func() (*Bypass, bool, error) {
		return n.load(events)
	})
}

func (n *Node) load(events *bpf.FlowCache) (*Bypass, bool, error) {
	cgroup, err := n.cgroup()
	if err != nil {
		return nil, false, err
	}
	bp, err := Open(Options{PinDir: n.pinDir, Cgroup: cgroup, Events: events})
	if err == nil {
		err = bp.Attach()
		if err == nil {
			err = bp.SetConfig(n.cfg)
		}
		if err != nil {
			bp.Close()
		}
	}
	if err != nil {
		// No program may go on redirecting by a setting nobody controls.
		if rerr := Remove(n.pinDir); rerr != nil {
			err = fmt.Errorf("%w; removing the programs an earlier agent left failed too: %w", err, rerr)
		}
		return nil, false, err
	}
	slog.Info("intra-node bypass loaded", "setting", n.cfg, "cgroup", cgroup)
	return bp, true, nil
}

// Controls are the bypass's setting and tables as onctl and the metrics use
// them; *Bypass implements it.
type Controls interface {
	Config() Config
	SetConfig(Config) error
	Cgroup() string
	Conns() ([]Conn, error)
	Stats() ([]bpf.Counter, error)
}

// Controls is the loaded bypass, or nil (Status says why).
func (n *Node) Controls() Controls {
	if bp := n.Loaded(); bp != nil {
		return bp
	}
	return nil // not a typed nil: callers compare with nil
}

// Loaded is the bypass, or nil when it is not loaded (Status says why).
func (n *Node) Loaded() *Bypass {
	bp, _ := n.bp.Get()
	return bp
}

// Status says why the node has no bypass: "" when it has one.
func (n *Node) Status() string {
	_, ok := n.bp.Get()
	switch err := n.bp.Err(); {
	case ok:
		return ""
	case err != nil:
		return "failed to load, every connection takes the TCP/IP stack: " + err.Error()
	}
	return "not up yet"
}

// OwnPod registers the pod at ips (each of its addresses, both families),
// its namespace at path netns with cookie; nothing when the bypass is not
// loaded.
func (n *Node) OwnPod(ips []netip.Addr, netns string, cookie uint64) error {
	bp := n.Loaded()
	if bp == nil {
		return nil
	}
	var errs []error
	for _, ip := range ips {
		errs = append(errs, bp.OwnPod(ip, netns, cookie))
	}
	return errors.Join(errs...)
}

// ForgetPod forgets the pod at ips (each of its addresses).
func (n *Node) ForgetPod(ips ...netip.Addr) error {
	bp := n.Loaded()
	if bp == nil || len(ips) == 0 {
		return nil
	}
	return bp.ForgetPods(func(a netip.Addr) bool { return !slices.Contains(ips, a) })
}

// KeepConntrack keeps the conntrack entries of bypassed connections from
// expiring (Bypass.KeepConntrack); the agent calls it on every resync.
func (n *Node) KeepConntrack() error {
	bp := n.Loaded()
	if bp == nil {
		return nil
	}
	_, err := bp.KeepConntrack()
	return err
}

// Close releases the programs' handles; the pinned links stay.
func (n *Node) Close() error { return n.bp.Close() }
