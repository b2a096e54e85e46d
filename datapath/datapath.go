// Package datapath is the agent's one seam to the kernel. Node composes the
// pieces that program it — overlay (the VXLAN slow path), podnet (pod
// veths), netfilter (iptables), fastpath (the eBPF flow cache), sysctls and
// uplink discovery — and is the one place that turns datastore records into
// what each piece programs. Policy, Services and the socket bypass join as
// pieces beside these.
package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/netfilter"
	"github.com/onc-net/onc/datapath/overlay"
)

// Config of a node's datapath.
type Config struct {
	Iface        string     // uplink name; "" = the one holding NodeIP, else the default route's
	NodeIP       netip.Addr // "" = the uplink's first address
	VNI          int
	Port         int    // VXLAN UDP port
	FastPath     bool   // start with the fast path on
	BPFFS        string // where the fast path pins its maps and links
	FastPathMark uint32 // skb->mark bit for ESTABLISHED pod traffic
	AttachMode   string // auto, tcx or clsact
}

// NodeSetup is what bringing the node up needs from the control plane.
type NodeSetup struct {
	PodCIDR     netip.Prefix
	ClusterCIDR netip.Prefix
	VTEPMAC     net.HardwareAddr // persisted by the agent, so peers' FDB entries survive restarts
}

// DeviceName is the VXLAN device ONC owns.
const DeviceName = overlay.DeviceName

// OverlayOverhead is what VXLAN over IPv4 adds to a frame: a pod's MTU is
// at most the uplink's minus this.
const OverlayOverhead = overlay.Overhead

// Gateway of a pod CIDR: its first usable address, on the host side.
func Gateway(cidr netip.Prefix) netip.Addr { return overlay.Gateway(cidr) }

// Node is the kernel side of one node.
type Node struct {
	cfg Config
	up  Uplink

	mu  sync.Mutex
	ovl *overlay.Overlay   // nil until BringUp
	fp  *fastpath.Datapath // nil: slow path only
}

// New checks cfg and finds the uplink; nothing in the kernel changes until
// BringUp.
func New(cfg Config) (*Node, error) {
	if cfg.VNI < 1 || cfg.VNI > 1<<24-1 {
		return nil, fmt.Errorf("VNI %d: must be 1..16777215", cfg.VNI)
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("VXLAN port %d: must be 1..65535", cfg.Port)
	}
	up, err := findUplink(cfg.Iface, cfg.NodeIP)
	if err != nil {
		return nil, err
	}
	return &Node{cfg: cfg, up: up}, nil
}

// Uplink is the interface overlay traffic leaves by.
func (n *Node) Uplink() Uplink { return n.up }

// BringUp builds the node's datapath for its pod CIDR: forwarding, the
// VXLAN device, the fast path (a node whose fast path cannot load runs the
// slow path only, and says so in its log) and the iptables rules. It is
// idempotent, and a failed call leaves nothing open, so the caller retries.
func (n *Node) BringUp(s NodeSetup) (err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	gw := Gateway(s.PodCIDR)
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	ovl, err := overlay.Ensure(overlay.Config{VNI: n.cfg.VNI, Port: n.cfg.Port, LocalIP: n.up.NodeIP, Uplink: n.up.Index,
		MAC: s.VTEPMAC, MTU: n.up.MTU - overlay.Overhead, Gateway: gw})
	if err != nil {
		return err
	}
	fp := n.fp
	if fp == nil {
		fp = n.openFastPath()
	}
	defer func() {
		if err != nil && fp != nil {
			fp.Close() // the next attempt opens it again
			fp = nil
		}
		n.fp = fp
	}()
	var mark uint32
	if fp != nil {
		mark = n.cfg.FastPathMark
	}
	if err := netfilter.Ensure(s.ClusterCIDR.String(), overlay.DeviceName, mark); err != nil {
		return err
	}
	if fp != nil {
		// Conntrack does not see the data the fast path carries, so its TCP
		// window falls behind; strict window checks would then mark the
		// flow's FIN, or its packets after a fast-path switch, INVALID.
		if err := writeSysctl("net/netfilter/nf_conntrack_tcp_be_liberal", "1"); err != nil {
			return err
		}
	}
	n.ovl = ovl
	slog.Info("node datapath up", "podCIDR", s.PodCIDR, "gateway", gw, "vxlan", overlay.DeviceName)
	return nil
}

// openFastPath loads the flow cache (adopting pinned maps and links) and
// attaches it to the uplink. Without it the node runs the slow path only.
func (n *Node) openFastPath() *fastpath.Datapath {
	fp, err := fastpath.Open(fastpath.Options{PinDir: n.cfg.BPFFS, VNI: n.cfg.VNI, Port: n.cfg.Port,
		Mark: n.cfg.FastPathMark, Mode: fastpath.Mode(n.cfg.AttachMode)})
	if err == nil {
		err = fp.AttachUplink(n.up.Name)
	}
	if err == nil {
		err = fp.Configure(n.cfg.FastPath)
	}
	if err != nil {
		slog.Error("fast path unavailable; this node runs the slow path only", "err", err)
		if fp != nil {
			fp.Close()
		}
		return nil
	}
	slog.Info("fast path loaded", "enabled", n.cfg.FastPath, "attach", fp.Mode(), "pins", n.cfg.BPFFS)
	return fp
}

// FastPath is the flow cache's controls, as the agent and onctl use them;
// *fastpath.Datapath implements it.
type FastPath interface {
	Enabled() bool
	Mode() fastpath.Mode
	// Switch turns the fast path on or off; turning it on starts from a
	// clean epoch, since verdicts learned while off may be stale.
	Switch(enabled bool) error
	Flush() error
	Stats() ([]fastpath.Stat, error)
	Dests() ([]fastpath.Dest, error)
	Encaps() ([]fastpath.Encap, error)
	Locals() ([]fastpath.Local, error)
	Flows() ([]fastpath.Flow, error)
}

// FastPath is the flow cache, or nil when it is not loaded.
func (n *Node) FastPath() FastPath {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fp == nil {
		return nil // not a typed nil: callers compare with nil
	}
	return n.fp
}

func (n *Node) fastPath() *fastpath.Datapath {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fp
}

// Close releases the fast path's handles; the pinned maps and links keep
// forwarding, and everything else stays in the kernel for the next agent.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fp == nil {
		return nil
	}
	err := n.fp.Close()
	n.fp = nil
	return err
}

func writeSysctl(name, val string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", name), []byte(val), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), val, err)
	}
	return nil
}

// errNotUp is returned by calls that need BringUp first.
var errNotUp = errors.New("the node's datapath is not up yet")
