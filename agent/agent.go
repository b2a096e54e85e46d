// Package agent is onc-agent, one per node: it registers the node, waits
// for its pod CIDR, builds the VXLAN slow path and keeps every peer
// programmed, and serves the CNI API (cni.sock) and the operator API
// (agent.sock, for onctl).
package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/controller/datastore"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/netfilter"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/podnet"
	"github.com/onc-net/onc/internal/atomicfile"
	"google.golang.org/grpc"
)

// Version is set at build time.
var Version = "dev"

// Config of the agent.
type Config struct {
	NodeName string
	NodeIP   netip.Addr // optional: defaults to the uplink's first address
	Iface    string     // optional uplink name
	StateDir string     // persistent: VTEP MAC, pod attachments
	RunDir   string     // sockets
	VNI      int
	Port     int
	MTU      int // pod MTU; 0 = uplink MTU − 50
	LeaseTTL time.Duration

	FastPath     bool   // start with the fast path on
	BPFFS        string // where the fast path pins its maps and links
	FastPathMark uint32 // skb->mark bit for ESTABLISHED pod traffic
	AttachMode   string // auto, tcx or clsact

	// Pods, with the Kubernetes datastore, tells the phase of the pod an
	// attachment belongs to (onctl pods); nil elsewhere.
	Pods PodPhases
}

// PodPhases looks up a pod of this node in the Kubernetes API: its phase,
// or "gone" if the API has no such pod here.
type PodPhases interface {
	Phase(namespace, name string) string
}

// DefaultConfig has the production defaults.
func DefaultConfig() Config {
	return Config{StateDir: "/var/lib/onc", RunDir: "/var/run/onc", VNI: 1, Port: 4789, LeaseTTL: 15 * time.Second,
		FastPath: true, BPFFS: "/sys/fs/bpf/onc", FastPathMark: 0x40000, AttachMode: "auto"}
}

// Agent is one node's agent.
type Agent struct {
	cfg     Config
	store   datastore.Store
	started time.Time
	up      uplink
	vtepMAC net.HardwareAddr
	podMTU  int

	mu          sync.Mutex
	notReady    string // why not ready; "" when ready
	podCIDR     netip.Prefix
	clusterCIDR netip.Prefix
	pool        *ipam.Pool
	ovl         *overlay.Overlay
	fp          *fastpath.Datapath // nil: slow path only
	spec        datastore.NodeSpec // as published

	locks keyLocks
}

// New validates cfg and prepares the agent; Run starts it.
func New(cfg Config, store datastore.Store) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("node name is required")
	}
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
	podMTU := up.MTU - overlay.Overhead
	if cfg.MTU != 0 {
		if cfg.MTU < 576 || cfg.MTU > podMTU {
			return nil, fmt.Errorf("MTU %d: must be between 576 and the uplink's %d − %d = %d", cfg.MTU, up.MTU, overlay.Overhead, podMTU)
		}
		podMTU = cfg.MTU
	}
	mac, err := loadVTEPMAC(filepath.Join(cfg.StateDir, "vtep-mac"))
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, store: store, started: time.Now(), up: up, vtepMAC: mac, podMTU: podMTU,
		notReady: "registering the node"}, nil
}

// loadVTEPMAC returns the persisted VTEP MAC, creating one on first start:
// peers' FDB entries stay valid across agent restarts and reboots.
func loadVTEPMAC(path string) (net.HardwareAddr, error) {
	if b, err := os.ReadFile(path); err == nil {
		mac, err := net.ParseMAC(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return mac, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	mac[0] = (mac[0] | 0x02) &^ 0x01 // locally administered, unicast
	if err := atomicfile.Write(path, []byte(mac.String()+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("persist VTEP MAC: %w", err)
	}
	return mac, nil
}

// Run serves the sockets and brings the node up; it returns when ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if err := os.MkdirAll(a.cfg.RunDir, 0o755); err != nil {
		return err
	}
	cniSrv := grpc.NewServer()
	apiv1.RegisterCNIServer(cniSrv, &cniServer{a: a})
	agentSrv := grpc.NewServer()
	apiv1.RegisterAgentServer(agentSrv, &agentServer{a: a})
	for name, srv := range map[string]*grpc.Server{"cni.sock": cniSrv, "agent.sock": agentSrv} {
		l, err := listenUnix(filepath.Join(a.cfg.RunDir, name))
		if err != nil {
			return err
		}
		go func() { _ = srv.Serve(l) }()
		defer srv.Stop()
	}
	slog.Info("agent serving", "node", a.cfg.NodeName, "nodeIP", a.up.NodeIP, "uplink", a.up.Name, "run", a.cfg.RunDir)

	a.mu.Lock()
	a.spec = datastore.NodeSpec{Name: a.cfg.NodeName, IP: a.up.NodeIP, VTEPMAC: a.vtepMAC, FastPath: a.cfg.FastPath}
	spec := a.spec
	a.mu.Unlock()
	if err := retry(ctx, "register node", func() error { return a.store.RegisterNode(ctx, spec) }); err != nil {
		return nil
	}
	alive := make(chan struct{})
	go func() { _ = a.store.KeepAlive(ctx, a.cfg.NodeName, a.cfg.LeaseTTL); close(alive) }()
	defer func() { <-alive }() // let a clean stop revoke the lease, so peers see it at once
	a.setNotReady("waiting for the controller to allocate this node's pod CIDR")

	defer func() {
		if a.fp != nil {
			a.fp.Close() // the pinned maps and links keep forwarding
		}
	}()
	for range a.store.Changes(ctx) {
		if err := a.reconcile(ctx); err != nil && ctx.Err() == nil {
			slog.Error("reconcile failed; will retry on the next change", "err", err)
		}
	}
	return nil
}

// reconcile brings the node up once its CIDR exists, then keeps the peers
// programmed.
func (a *Agent) reconcile(ctx context.Context) error {
	nodes, err := a.store.Nodes(ctx)
	if err != nil {
		return err
	}
	var self *datastore.Node
	for i := range nodes {
		if nodes[i].Name == a.cfg.NodeName {
			self = &nodes[i]
		}
	}
	a.mu.Lock()
	spec := a.spec
	a.mu.Unlock()
	if self == nil || self.FastPath != spec.FastPath {
		slog.Warn("this node's registration is missing or outdated; registering again")
		return a.store.RegisterNode(ctx, spec)
	}
	if !self.PodCIDR.IsValid() {
		return nil
	}
	a.mu.Lock()
	cidr := a.podCIDR
	a.mu.Unlock()
	if !cidr.IsValid() {
		if err := a.bringUp(ctx, self.PodCIDR); err != nil {
			a.setNotReady(err.Error())
			return err
		}
	} else if cidr != self.PodCIDR {
		a.setNotReady(fmt.Sprintf("pod CIDR changed from %s to %s in the datastore; restart the agent after draining the node", cidr, self.PodCIDR))
		return nil
	}
	var peers []overlay.Peer
	for _, n := range nodes {
		if n.Name != a.cfg.NodeName && n.PodCIDR.IsValid() {
			peers = append(peers, overlay.Peer{Name: n.Name, NodeIP: n.IP, VTEPMAC: n.VTEPMAC, PodCIDR: n.PodCIDR})
		}
	}
	err = errors.Join(a.ovl.Sync(peers), a.fpSyncPeers(nodes))
	if err == nil {
		a.setNotReady("")
	}
	return err
}

// bringUp builds the node's datapath for cidr.
func (a *Agent) bringUp(ctx context.Context, cidr netip.Prefix) (err error) {
	cc, err := a.store.ClusterConfig(ctx)
	if err != nil {
		return fmt.Errorf("read cluster config: %w", err)
	}
	gw := overlay.Gateway(cidr)
	if err := writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	ovl, err := overlay.Ensure(overlay.Config{VNI: a.cfg.VNI, Port: a.cfg.Port, LocalIP: a.up.NodeIP, Uplink: a.up.Index,
		MAC: a.vtepMAC, MTU: a.up.MTU - overlay.Overhead, Gateway: gw})
	if err != nil {
		return err
	}
	fp := a.openFastPath()
	defer func() {
		if err != nil && fp != nil {
			fp.Close() // the next attempt opens it again
		}
	}()
	var mark uint32
	if fp != nil {
		mark = a.cfg.FastPathMark
	} else if a.cfg.FastPath {
		a.mu.Lock()
		a.spec.FastPath = false // peers must not fast-path to us
		a.mu.Unlock()
	}
	if err := netfilter.Ensure(cc.ClusterCIDR.String(), overlay.DeviceName, mark); err != nil {
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
	pool, dropped, err := ipam.Open(filepath.Join(a.cfg.StateDir, "ipam.json"), cidr, gw)
	if err != nil {
		return err
	}
	for _, d := range dropped {
		slog.Warn("dropping a pod attachment outside this node's CIDR", "pod", d.Key, "ip", d.IP)
		_ = podnet.Teardown(d.HostIface)
	}
	a.mu.Lock()
	a.podCIDR, a.clusterCIDR, a.pool, a.ovl, a.fp = cidr, cc.ClusterCIDR, pool, ovl, fp
	a.mu.Unlock()
	for _, att := range pool.List() { // adopt the pods of before a restart
		if err := a.fpAddPod(att); err != nil {
			slog.Warn("pod not on the fast path", "pod", att.Key, "err", err)
		}
	}
	slog.Info("node datapath up", "podCIDR", cidr, "gateway", gw, "vxlan", overlay.DeviceName, "podMTU", a.podMTU)
	return nil
}

func (a *Agent) setNotReady(reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.notReady != reason {
		if reason == "" {
			slog.Info("agent ready")
		} else {
			slog.Info("agent not ready", "reason", reason)
		}
	}
	a.notReady = reason
}

// readyPool returns the pod pool, or why the agent cannot serve pods yet.
func (a *Agent) readyPool() (*ipam.Pool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pool == nil {
		return nil, a.notReady
	}
	return a.pool, a.notReady
}

func writeSysctl(name, val string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", name), []byte(val), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), val, err)
	}
	return nil
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func retry(ctx context.Context, what string, fn func() error) error {
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		err := fn()
		if err == nil {
			return nil
		}
		slog.Warn(what+" failed; retrying", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// keyLocks serialises operations on one attachment.
type keyLocks struct {
	mu sync.Mutex
	m  map[ipam.Key]*lockRef
}

type lockRef struct {
	sync.Mutex
	n int
}

func (k *keyLocks) lock(key ipam.Key) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[ipam.Key]*lockRef{}
	}
	l := k.m[key]
	if l == nil {
		l = &lockRef{}
		k.m[key] = l
	}
	l.n++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.n--; l.n == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
