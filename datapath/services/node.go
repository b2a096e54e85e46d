package services

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync/atomic"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/netns"
)

// Mode says whose sockets the node balances Services for.
type Mode string

const (
	// All balances the host's sockets and every pod's.
	All Mode = "all"
	// HostOnly balances only the host's sockets: pods see the
	// ClusterIP and kube-proxy balances their traffic, as sidecar meshes
	// that intercept ClusterIP traffic inside the pod need.
	HostOnly Mode = "host-only"
	// Off leaves every Service to kube-proxy.
	Off Mode = "off"
)

// ParseMode checks a --services value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case All, HostOnly, Off:
		return m, nil
	}
	return "", fmt.Errorf("services mode %q: must be all, host-only or off", s)
}

// Tables are the socket load balancer's state and tables, as onctl and
// the metrics read them; *LB implements it.
type Tables interface {
	Cgroup() string
	Services() ([]ServiceState, error)
	Affinities() ([]Affinity, error)
	Stats() ([]bpf.Counter, error)
	PodOfNetns(cookie uint64) (netip.Addr, bool)
	ServiceAt(scope Scope, vip netip.AddrPort, proto Proto) (string, bool)
}

// Node is a node's socket load balancer: off, loaded once at bring-up, or
// failed to load (Status says which).
type Node struct {
	uplinkErr atomic.Pointer[error] // the last AttachUplink's
	mode      Mode
	pinDir    string
	cgroup    func() (string, error)
	lb        bpf.LoadOnce[*LB] // nothing when off
}

// NewNode is the node's socket LB in mode, pinned under pinDir, attached
// to the cgroup v2 directory cgroup returns; nothing loads until Load.
func NewNode(mode Mode, pinDir string, cgroup func() (string, error)) *Node {
	return &Node{mode: mode, pinDir: pinDir, cgroup: cgroup}
}

// Mode is whose sockets the node balances for.
func (n *Node) Mode() Mode { return n.mode }

// Load loads the socket programs, attaches them to the configured
// cgroup (adopting an earlier agent's links) and gives them the host's
// network namespace. With the mode off, or when that fails, it removes
// whatever an earlier agent pinned, so that no program goes on translating
// with maps nobody updates: the node leaves Services to kube-proxy. It
// runs once: a node whose socket LB cannot load leaves Services to
// kube-proxy rather than failing to come up. cache is the fast path's
// flow cache, which the uplink programs share. ipv6 says the node's
// cluster has IPv6 pods (Options.IPv6): without, the IPv6 maps the
// programs write are loaded small.
func (n *Node) Load(cache *bpf.FlowCache, ipv6 bool) {
	n.lb.Load("socket load balancing unavailable; kube-proxy balances every Service",
		func() (*LB, bool, error) { return n.load(cache, ipv6) })
}

func (n *Node) load(cache *bpf.FlowCache, ipv6 bool) (*LB, bool, error) {
	if n.mode == Off {
		return nil, false, Remove(n.pinDir)
	}
	lb, err := n.attach(cache, ipv6)
	if err != nil {
		if rerr := Remove(n.pinDir); rerr != nil {
			err = fmt.Errorf("%w; removing the programs an earlier agent left failed too: %w", err, rerr)
		}
		return nil, false, err
	}
	slog.Info("socket load balancing on", "mode", n.mode, "cgroup", lb.Cgroup(), "ipv6", ipv6)
	return lb, true, nil
}

func (n *Node) attach(cache *bpf.FlowCache, ipv6 bool) (*LB, error) {
	cgroup, err := n.cgroup()
	if err != nil {
		return nil, err
	}
	lb, err := Open(Options{PinDir: n.pinDir, Cgroup: cgroup, FlowCache: cache, IPv6: ipv6})
	if err != nil {
		return nil, err
	}
	host, err := netns.Cookie("")
	if err == nil {
		err = lb.OwnHost(host)
	}
	if err == nil && n.mode == HostOnly {
		err = lb.ForgetPods() // owned in an earlier mode
	}
	if err == nil {
		err = lb.Attach()
	}
	if err != nil {
		lb.Close()
		return nil, err
	}
	return lb, nil
}

// Tables are the loaded socket LB's tables, or nil when it is off or failed
// to load (Status says which).
func (n *Node) Tables() Tables {
	lb, ok := n.lb.Get()
	if !ok {
		return nil // not a typed nil: callers compare with nil
	}
	return lb
}

// Status says why the node balances no Services at the socket: "" when
// it does.
func (n *Node) Status() string {
	_, ok := n.lb.Get()
	switch err := n.lb.Err(); {
	case ok:
		return ""
	case n.mode == Off:
		return "off (--services=off): kube-proxy balances every Service"
	case err != nil:
		return "failed to load, kube-proxy balances every Service: " + err.Error()
	}
	return "not up yet"
}

// Sync makes the socket programs balance exactly svcs. With
// checkKernel it also reads the maps back, repairing drift, and forgets
// the namespaces of pods other than pods (a DEL that found no address
// left its entry behind).
func (n *Node) Sync(svcs []Service, pods []netip.Addr, checkKernel bool) error {
	lb, ok := n.lb.Get()
	if !ok {
		return errNotOn
	}
	if checkKernel && n.mode == All {
		if err := lb.ForgetPods(pods...); err != nil {
			return err
		}
	}
	return lb.Sync(svcs, checkKernel)
}

var errNotOn = errors.New("socket load balancing is not on")

// UnbalanceAPIServer takes the kubernetes Service's ClusterIP, which an
// agent in a cluster dials (KUBERNETES_SERVICE_HOST), out of the pinned
// service map before the agent's first API call: an earlier agent's entry
// may name API servers that have moved meanwhile, and only this agent
// could fix it. kube-proxy serves it until the services watcher writes it
// again.
func UnbalanceAPIServer(bpffs string) error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" {
		return nil
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(host, port))
	if err != nil {
		return nil // not a ClusterIP: nothing of ONC's
	}
	return Unbalance(bpffs, Key{VIP: ap.Addr().Unmap(), Port: ap.Port(), Proto: TCP})
}

// OwnPod registers a pod's network namespace (by its cookie and path) in
// mode all, before the pod runs: its first connections would otherwise go
// to kube-proxy. Other modes and an unloaded LB ignore it.
func (n *Node) OwnPod(cookie uint64, ip netip.Addr, path string) error {
	if lb := n.podsLB(); lb != nil {
		return lb.OwnPod(cookie, ip, path)
	}
	return nil
}

// ForgetPod forgets the namespace of the pod at ip.
func (n *Node) ForgetPod(ip netip.Addr) error {
	lb := n.podsLB()
	if lb == nil || !ip.IsValid() {
		return nil
	}
	return lb.ForgetPod(ip)
}

// BalancesPods says whether pods' sockets are balanced (mode all, loaded).
func (n *Node) BalancesPods() bool { return n.podsLB() != nil }

func (n *Node) podsLB() *LB {
	if lb, ok := n.lb.Get(); ok && n.mode == All {
		return lb
	}
	return nil
}

// AttachUplink balances the uplink-scope services for clients outside the
// cluster (the kube-proxy replacement): the uplink programs go first on
// ifname, and drop as spoofed what comes from internal (the cluster's pod
// CIDR, this node's addresses). An unloaded LB attaches nothing: its
// failure already removed every program (Load).
func (n *Node) AttachUplink(ifname string, internal []netip.Prefix) error {
	lb, ok := n.lb.Get()
	if !ok {
		return nil
	}
	err := lb.SetInternal(internal)
	if err == nil {
		err = lb.AttachUplink(ifname)
	}
	if err != nil {
		err = fmt.Errorf("uplink load balancer on %s: %w", ifname, err)
	}
	n.uplinkErr.Store(&err)
	return err
}

// UplinkErr is why the uplink load balancer is not attached, nil when it
// is (or was never asked to be).
func (n *Node) UplinkErr() error {
	if p := n.uplinkErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Close releases the programs' handles; the pinned links keep balancing.
func (n *Node) Close() error { return n.lb.Close() }
