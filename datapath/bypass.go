package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/policy"
)

// Bypass is the intra-node bypass's setting and tables, as the agent and
// onctl use them; *bypass.Bypass implements it.
type Bypass interface {
	Config() bypass.Config
	SetConfig(bypass.Config) error
	Cgroup() string
	Conns() ([]bypass.Conn, error)
	Stats() ([]bpf.Counter, error)
}

// openBypass loads the bypass programs and attaches them to the socket
// LB's cgroup, adopting an earlier agent's pins, and applies the
// configured setting. They are loaded even when the setting is off, so
// that `onctl bypass on` needs no restart; off, they record nothing.
func (n *Node) openBypass() (*bypass.Bypass, error) {
	cgroup, err := n.cgroup()
	if err != nil {
		return nil, err
	}
	bp, err := bypass.Open(bypass.Options{PinDir: n.cfg.BPFFS, Cgroup: cgroup})
	if err == nil {
		err = bp.Attach()
		if err == nil {
			err = bp.SetConfig(n.cfg.Bypass)
		}
		if err != nil {
			bp.Close()
		}
	}
	if err != nil {
		// No program may go on redirecting by a setting nobody controls.
		if rerr := bypass.Remove(n.cfg.BPFFS); rerr != nil {
			err = fmt.Errorf("%w; removing the programs an earlier agent left failed too: %w", err, rerr)
		}
		return nil, err
	}
	slog.Info("intra-node bypass loaded", "setting", n.cfg.Bypass, "cgroup", cgroup)
	return bp, nil
}

// Bypass is the intra-node bypass, or nil when it failed to load
// (BypassStatus says why).
func (n *Node) Bypass() Bypass {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.bp == nil {
		return nil
	}
	return n.bp
}

// BypassStatus says why the node has no bypass: "" when it has one.
func (n *Node) BypassStatus() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.bp != nil:
		return ""
	case n.bpErr != nil:
		return "failed to load, every connection takes the TCP/IP stack: " + n.bpErr.Error()
	}
	return "not up yet"
}

func (n *Node) bypass() *bypass.Bypass {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bp
}

func (n *Node) forgetPodBypass(p Pod) error {
	bp := n.bypass()
	if bp == nil || !p.IP.IsValid() {
		return nil
	}
	return bp.ForgetPods(func(a netip.Addr) bool { return a != p.IP })
}

// endDeniedBypassed ends the bypassed connections of the pods at ips
// that rs no longer allows: their bytes never pass netfilter, so deleting
// conntrack entries would not stop them. It returns how many it ended.
func endDeniedBypassed(bp *bypass.Bypass, rs policy.Ruleset, ips map[netip.Addr]bool) (int, error) {
	conns, err := bp.Conns()
	if err != nil {
		return 0, err
	}
	ended := 0
	var errs []error
	for _, c := range conns {
		if !ips[c.Client.Addr()] && !ips[c.Server.Addr()] {
			continue
		}
		if rs.Allows(policy.Connection{Client: c.Client.Addr(), Server: c.Server.Addr(), Proto: policy.TCP, Port: c.Server.Port()}) {
			continue
		}
		// One that fails does not keep the others alive.
		if err := bp.Destroy(c); err != nil {
			errs = append(errs, err)
			continue
		}
		ended++
	}
	return ended, errors.Join(errs...)
}

// KeepBypassedConntrack keeps the conntrack entries of bypassed
// connections from expiring (see bypass.KeepConntrack); the agent calls it
// on every resync.
func (n *Node) KeepBypassedConntrack() error {
	bp := n.bypass()
	if bp == nil {
		return nil
	}
	_, err := bp.KeepConntrack()
	return err
}
