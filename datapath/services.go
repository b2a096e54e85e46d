package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"

	"github.com/onc-net/onc/internal/netns"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/services"
)

// SocketLBMode says whose sockets the node balances Services for.
type SocketLBMode string

const (
	// SocketLBAll balances the host's sockets and every pod's.
	SocketLBAll SocketLBMode = "all"
	// SocketLBHostOnly balances only the host's sockets: pods see the
	// ClusterIP and kube-proxy balances their traffic, as sidecar meshes
	// that intercept ClusterIP traffic inside the pod need.
	SocketLBHostOnly SocketLBMode = "host-only"
	// SocketLBOff leaves every Service to kube-proxy.
	SocketLBOff SocketLBMode = "off"
)

// ParseSocketLBMode checks a --socket-lb value.
func ParseSocketLBMode(s string) (SocketLBMode, error) {
	switch m := SocketLBMode(s); m {
	case SocketLBAll, SocketLBHostOnly, SocketLBOff:
		return m, nil
	}
	return "", fmt.Errorf("socket LB mode %q: must be all, host-only or off", s)
}

// SocketLB is the socket load balancer's state and tables, as the agent
// and onctl use them; *socketLB implements it.
type SocketLB interface {
	Mode() SocketLBMode
	Cgroup() string
	Services() ([]services.ServiceState, error)
	Affinities() ([]services.Affinity, error)
	Stats() ([]bpf.Counter, error)
}

type socketLB struct {
	*services.LB
	mode SocketLBMode
}

func (s socketLB) Mode() SocketLBMode { return s.mode }

// openSocketLB loads the socket programs, attaches them to the configured
// cgroup (adopting an earlier agent's links) and gives them the host's
// network namespace. With the mode off, or when that fails, it removes
// whatever an earlier agent pinned, so that no program goes on translating
// with maps nobody updates: the node leaves Services to kube-proxy.
func (n *Node) openSocketLB() (*services.LB, error) {
	if n.cfg.SocketLB == SocketLBOff {
		return nil, services.Remove(n.cfg.BPFFS)
	}
	lb, err := n.attachSocketLB()
	if err != nil {
		if rerr := services.Remove(n.cfg.BPFFS); rerr != nil {
			err = fmt.Errorf("%w; removing the programs an earlier agent left failed too: %w", err, rerr)
		}
		return nil, err
	}
	slog.Info("socket load balancing on", "mode", n.cfg.SocketLB, "cgroup", lb.Cgroup())
	return lb, nil
}

func (n *Node) attachSocketLB() (*services.LB, error) {
	cgroup, err := n.cgroup()
	if err != nil {
		return nil, err
	}
	lb, err := services.Open(services.Options{PinDir: n.cfg.BPFFS, Cgroup: cgroup})
	if err != nil {
		return nil, err
	}
	host, err := netns.Cookie("")
	if err == nil {
		err = lb.OwnHost(host)
	}
	if err == nil && n.cfg.SocketLB == SocketLBHostOnly {
		err = lb.ForgetPods(func(netip.Addr) bool { return false }) // owned in an earlier mode
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

// SocketLB is the socket load balancer, or nil when it is off or failed
// to load (SocketLBStatus says which).
func (n *Node) SocketLB() SocketLB {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lb == nil {
		return nil
	}
	return socketLB{n.lb, n.cfg.SocketLB}
}

// SocketLBStatus says why the node balances no Services at the socket:
// "" when it does.
func (n *Node) SocketLBStatus() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.lb != nil:
		return ""
	case n.cfg.SocketLB == SocketLBOff:
		return "off (--socket-lb=off): kube-proxy balances every Service"
	case n.lbErr != nil:
		return "failed to load, kube-proxy balances every Service: " + n.lbErr.Error()
	}
	return "not up yet"
}

// SyncServices makes the socket programs balance exactly svcs. With
// checkKernel it also reads the maps back, repairing drift, and forgets
// the namespaces of pods other than pods (a DEL that found no address
// left its entry behind).
func (n *Node) SyncServices(svcs []services.Service, pods []netip.Addr, checkKernel bool) error {
	n.mu.Lock()
	lb := n.lb
	n.mu.Unlock()
	if lb == nil {
		return errNoSocketLB
	}
	if checkKernel && n.cfg.SocketLB == SocketLBAll {
		local := make(map[netip.Addr]bool, len(pods))
		for _, a := range pods {
			local[a] = true
		}
		if err := lb.ForgetPods(func(a netip.Addr) bool { return local[a] }); err != nil {
			return err
		}
	}
	return lb.Sync(svcs, checkKernel)
}

var errNoSocketLB = errors.New("socket load balancing is not on")

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
	if err != nil || !ap.Addr().Is4() {
		return nil // not an IPv4 ClusterIP: nothing of ONC's
	}
	return services.Unbalance(bpffs, services.Key{VIP: ap.Addr(), Port: ap.Port(), Proto: services.TCP})
}

func (n *Node) forgetPodSockets(p Pod) error {
	lb := n.socketLBIfPods()
	if lb == nil || !p.IP.IsValid() {
		return nil
	}
	return lb.ForgetPods(func(a netip.Addr) bool { return a != p.IP })
}

func (n *Node) socketLBIfPods() *services.LB {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cfg.SocketLB != SocketLBAll {
		return nil
	}
	return n.lb
}
