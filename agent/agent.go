// Package agent is onc-agent, one per node: it registers the node, waits
// for its pod CIDR, brings the node's datapath up and keeps every peer
// programmed, and serves the CNI API (cni.sock) and the operator API
// (agent.sock, for onctl). Everything it does in the kernel goes through
// Datapath, one part per feature; each feature's watcher lives in its own
// package (agent/policy, agent/services, agent/underlay, agent/bypass).
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
	"sync/atomic"
	"time"

	"github.com/onc-net/onc/agent/bypass"
	"github.com/onc-net/onc/agent/flows"
	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/agent/peer"
	"github.com/onc-net/onc/agent/policy"
	"github.com/onc-net/onc/agent/services"
	"github.com/onc-net/onc/agent/underlay"
	"github.com/onc-net/onc/agent/watch"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/atomicfile"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
)

// Version is set at build time.
var Version = "dev"

// Config of the agent.
type Config struct {
	NodeName string
	StateDir string // persistent: VTEP MAC, pod attachments
	RunDir   string // sockets
	MTU      int    // pod MTU; 0 = uplink MTU − overlay overhead
	LeaseTTL time.Duration
	// Resync is how often every watcher reconciles without a signal, as
	// insurance against a missed one and against drift in the kernel.
	Resync time.Duration

	Datapath datapath.Config

	// Policy, with the Kubernetes datastore, is what NetworkPolicy
	// enforcement reads; nil elsewhere, and then nothing is policed.
	Policy policy.Sources

	// Services, with the Kubernetes datastore, is what the socket load
	// balancer balances; nil elsewhere.
	Services services.Sources

	// Health is kube-proxy's health endpoints, served with Services when
	// ONC replaces kube-proxy (Datapath.KubeProxyReplacement). Its
	// Timeout is set to twice Resync, as kube-proxy's is twice its sync
	// period.
	Health services.HealthConfig

	// Pods, with the Kubernetes datastore, tells the phase of the pod an
	// attachment belongs to (onctl pods); nil elsewhere.
	Pods PodPhases

	// FlowsBuffer is how many flow records the agent keeps (agent/flows),
	// read from Datapath.PolicyLogGroup (with Policy) and the eBPF
	// programs' events (Datapath.FlowEvents); 0: none.
	FlowsBuffer int
	// FlowsTopPods is how many of this node's pods onc_pod_drops_total
	// names: those with the most drops recorded; 0: none.
	FlowsTopPods int
	// FlowsExport is where the flow records are exported to, as they come.
	FlowsExport flows.ExportConfig

	// PeerPort is the TCP port of every node's peer API (agent/peer) on
	// its node address; 0: none served, none asked, no key published.
	PeerPort int
}

// PodPhases looks up a pod of this node in the Kubernetes API: its phase,
// or "gone" if the API has no such pod here.
type PodPhases interface {
	Phase(namespace, name string) string
}

// DefaultConfig has the production defaults.
func DefaultConfig() Config {
	return Config{StateDir: "/var/lib/onc", RunDir: "/var/run/onc", LeaseTTL: 40 * time.Second, Resync: time.Minute, PeerPort: peer.DefaultPort,
		Datapath: datapath.Config{VNI: 1, Port: 4789, FastPath: true, FastPathConnSetup: true, BPFFS: "/sys/fs/bpf/onc", FastPathMark: 0x40000, AttachMode: "auto"}}
}

// Agent is one node's agent.
type Agent struct {
	cfg      Config
	store    datastore.Store
	dp       Datapath
	started  time.Time
	up       datapath.Uplink
	vtepMAC  net.HardwareAddr
	podMTU   int
	peers    *watch.Watcher       // the node and its peers, from the datastore
	policy   *policy.Watcher      // nil without Config.Policy
	flows    *flows.Store         // nil when no flows are recorded
	recorder *flows.Recorder      // nil when no policy verdicts are recorded
	events   *flows.EventRecorder // nil when no eBPF events are recorded
	drops    *flows.PodDrops      // nil when no flows are recorded, or no pods' drops served
	exports  []*flows.Exporter    // of the records, as they come
	// nodeAddrs names the cluster's nodes by address, as reconcile last
	// read them (for the flow records).
	nodeAddrs atomic.Pointer[map[netip.Addr]string]
	svcs      *services.Watcher // nil without Config.Services
	health    *services.Health  // nil unless svcs and the kube-proxy replacement
	underlay  *underlay.Watcher
	// The peer API (agent/peer): this agent's key, the node records its
	// pins are read from, its client (nil when it is off: peerID.Pin is
	// empty then) and the questions of both sides.
	peerID     peer.Identity
	peerNodes  peer.Nodes
	peerClient *peer.Client
	peerCounts *peer.Counts
	// warnedCIDR is, by family, the pod CIDR a node without one at
	// bring-up got later, once reconcile warned of it (reconcile's own).
	warnedCIDR map[datastore.Family]netip.Prefix
	// registeredPin is the peer pin reconcile last registered again, and
	// droppedPin one the datastore dropped after that (reconcile's own).
	registeredPin, droppedPin string

	mu       sync.Mutex
	notReady string // why not ready; "" when ready
	// podCIDRs are the blocks the node serves, one per family in the
	// node's order (none before it is up), and clusterCIDRs the cluster's
	// CIDRs of the same families.
	podCIDRs, clusterCIDRs []netip.Prefix
	pool                   *ipam.Pool
	spec                   datastore.NodeSpec // as published

	locks keyLocks

	metrics *agentMetrics
}

// New validates cfg and prepares the agent; Run starts it.
func New(cfg Config, store datastore.Store, dp Datapath) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("node name is required")
	}
	if cfg.Resync <= 0 {
		return nil, fmt.Errorf("resync period %v: must be positive", cfg.Resync)
	}
	up := dp.Node.Uplink()
	podMTU := up.MTU - up.Overhead()
	if cfg.MTU != 0 {
		if cfg.MTU < 576 || cfg.MTU > podMTU {
			return nil, fmt.Errorf("MTU %d: must be between 576 and the uplink's %d − %d = %d", cfg.MTU, up.MTU, up.Overhead(), podMTU)
		}
		podMTU = cfg.MTU
	}
	mac, err := loadVTEPMAC(filepath.Join(cfg.StateDir, "vtep-mac"))
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, store: store, dp: dp, started: time.Now(), up: up, vtepMAC: mac, podMTU: podMTU,
		notReady: "registering the node", warnedCIDR: map[datastore.Family]netip.Prefix{},
		// Over an IPv6 underlay the fast path is published once the node
		// is up (bringUp): peers send it zero-checksum frames, which only
		// the rebuilt onc.vxlan takes.
		spec: datastore.NodeSpec{Name: cfg.NodeName, IP: up.NodeIP, VTEPMAC: mac, FastPath: cfg.Datapath.FastPath && !up.NodeIP.Is6()}}
	if cfg.PeerPort != 0 {
		if a.peerID, err = peer.LoadIdentity(cfg.StateDir); err != nil {
			return nil, err
		}
		a.spec.PeerPin = a.peerID.Pin
		a.peerCounts = peer.NewCounts()
		a.peerClient = peer.NewClient(a.peerID, &a.peerNodes, cfg.PeerPort, a.peerCounts)
	}
	a.peers = watch.New("peers", cfg.Resync, a.reconcile)
	a.metrics = newAgentMetrics(a)
	a.underlay = underlay.NewWatcher(dp.Underlay, cfg.Resync)
	if cfg.FlowsBuffer > 0 {
		a.flows = flows.NewStore(cfg.FlowsBuffer)
		if a.exports, err = flows.NewExporters(a.flows, cfg.FlowsExport); err != nil {
			return nil, fmt.Errorf("flow export: %w", err)
		}
		if cfg.FlowsTopPods > 0 {
			a.drops = flows.NewPodDrops(a.flows, cfg.NodeName)
		}
	} else if cfg.FlowsExport.File != "" || cfg.FlowsExport.OTLP != "" {
		slog.Warn("flow export: nothing to export: " + flows.NotRecording)
	}
	if cfg.Policy != nil {
		a.policy = policy.NewWatcher(dp.Policy, cfg.Policy, a.attachments, cfg.Resync)
		if a.flows != nil && cfg.Datapath.PolicyLogGroup != 0 {
			a.recorder = flows.NewRecorder(a.flows, cfg.NodeName, a.policy.Enforced, dp.Policy.Logged, func() []*corev1.Pod { return cfg.Policy.Snapshot().Pods })
			cfg.Policy.OnChange(a.recorder.PodsChanged)
		}
	} else {
		slog.Warn("network policy " + policy.NeedsKubernetes)
	}
	if a.flows != nil && cfg.Datapath.FlowEvents > 0 {
		a.events = flows.NewEventRecorder(a.flows, cfg.NodeName, a.flowResolver())
	}
	if cfg.Services != nil {
		a.svcs = services.NewWatcher(dp.Services, cfg.Services, services.Self{Name: cfg.NodeName, IP: up.NodeIP,
			KubeProxyReplacement: cfg.Datapath.KubeProxyReplacement, DSR: cfg.Datapath.DSR}, a.attachments, cfg.Resync)
		if cfg.Datapath.KubeProxyReplacement {
			hc := cfg.Health
			hc.Timeout = 2 * cfg.Resync
			a.health = services.NewHealth(hc, a.svcs.Loop(), cfg.Services, cfg.NodeName, cfg.Resync)
		}
	}
	return a, nil
}

// hostPortsChanged tells the services watcher that an attachment with
// hostPorts came or went: its frontends follow.
func (a *Agent) hostPortsChanged(att ipam.Attachment) {
	if a.svcs != nil && len(att.PortMappings) > 0 {
		a.svcs.Signal()
	}
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
// lock is the node's (LockNode): only its holder may replace and remove
// the sockets in the run directory.
func (a *Agent) Run(ctx context.Context, lock *NodeLock) error {
	if lock == nil || lock.runDir != a.cfg.RunDir {
		return fmt.Errorf("run directory %s is not locked by this agent (LockNode)", a.cfg.RunDir)
	}
	cniSrv := grpc.NewServer(grpc.UnaryInterceptor(a.metrics.observeCNI))
	apiv1.RegisterCNIServer(cniSrv, &cniServer{a: a})
	onctlSrv := grpc.NewServer()
	apiv1.RegisterAgentServer(onctlSrv, &onctlServer{a: a})
	for name, srv := range map[string]*grpc.Server{"cni.sock": cniSrv, "agent.sock": onctlSrv} {
		l, err := lock.listen(name)
		if err != nil {
			return err
		}
		go func() { _ = srv.Serve(l) }()
		defer srv.Stop()
	}
	if a.cfg.PeerPort != 0 {
		// Traces are not worth a node's networking: without the peer
		// API, the other nodes' traces say they got no answer.
		if srv, err := a.servePeers(); err != nil {
			slog.Error("peer API not served", "port", a.cfg.PeerPort, "err", err)
		} else {
			defer srv.Stop()
		}
		defer a.peerClient.Close()
	}
	slog.Info("agent serving", "node", a.cfg.NodeName, "nodeIP", a.up.NodeIP, "uplink", a.up.Name, "run", a.cfg.RunDir)

	spec := a.published()
	if err := retry(ctx, "register node", func() error { return a.store.RegisterNode(ctx, spec) }); err != nil {
		return nil
	}
	alive := make(chan struct{})
	go func() { _ = a.store.KeepAlive(ctx, a.cfg.NodeName, a.cfg.LeaseTTL); close(alive) }()
	defer func() { <-alive }() // let a clean stop revoke the lease, so peers see it at once
	a.setNotReady("waiting for the controller to allocate this node's pod CIDR")

	// The watchers run until ctx ends; every one has stopped before the
	// datapath closes, since they may be evicting flows or headers. The
	// pinned maps and links keep forwarding after Close.
	var running sync.WaitGroup
	for _, run := range a.runners() {
		running.Go(func() { run(ctx) })
	}
	a.peers.Run(ctx, a.store.Changes(ctx))
	running.Wait()
	if err := a.dp.Node.Close(); err != nil {
		slog.Warn("letting go of the datapath", "err", err) // what is in the kernel stays either way
	}
	return nil
}

// runners are the watchers that run beside the peer watcher, in the order
// they start.
func (a *Agent) runners() []func(context.Context) {
	rs := []func(context.Context){a.underlay.Run}
	if a.policy != nil {
		rs = append(rs, a.policy.Run)
	}
	if a.recorder != nil {
		rs = append(rs, a.recordFlows)
	}
	if a.events != nil {
		rs = append(rs, a.recordEvents)
	}
	for _, e := range a.exports {
		rs = append(rs, e.Run)
	}
	if a.svcs != nil {
		rs = append(rs, a.svcs.Run)
	}
	if a.health != nil {
		rs = append(rs, a.health.Run)
	}
	return rs
}

// recordFlows reads what the policy table logs into flow records until
// ctx ends, opening the log group again a resync period after it fails
// (another process may hold it).
func (a *Agent) recordFlows(ctx context.Context) {
	for ctx.Err() == nil {
		err := a.recorder.Run(ctx, a.cfg.Datapath.PolicyLogGroup)
		if err == nil {
			return
		}
		slog.Error("flow records: reading the policy table's log", "group", a.cfg.Datapath.PolicyLogGroup, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(a.cfg.Resync):
		}
	}
}

// reconcile is the peer watcher's: it brings the node up once its CIDR
// exists, then keeps the peers programmed. On a resync the datapath also
// checks the kernel against what it programmed.
func (a *Agent) reconcile(ctx context.Context, resync bool) error {
	nodes, err := a.store.Nodes(ctx)
	if err != nil {
		return err
	}
	a.noteNodes(nodes)
	a.peerNodes.Set(nodes)
	var self *datastore.Node
	for i := range nodes {
		if nodes[i].Name == a.cfg.NodeName {
			self = &nodes[i]
		}
	}
	if self == nil {
		slog.Warn("this node's registration is missing; registering again")
		return a.store.RegisterNode(ctx, a.published())
	}
	a.metrics.registeredPeers.Store(int64(len(nodes) - 1))
	a.mu.Lock()
	served := a.podCIDRs
	a.mu.Unlock()
	up := len(served) > 0
	if !up && len(self.PodCIDRs) > 0 {
		// A dual-stack node comes up with both blocks: the controller
		// may record them one after the other.
		cc, err := a.store.ClusterConfig(ctx)
		if err != nil {
			return fmt.Errorf("read cluster config: %w", err)
		}
		for _, p := range cc.Pools {
			if f := datastore.FamilyOf(p.CIDR); !datastore.BlockOf(self.PodCIDRs, f).IsValid() {
				a.setNotReady(fmt.Sprintf("waiting for this node's pod CIDR of the cluster's %s range %s", f, p.CIDR))
				return nil
			}
		}
		if err := a.bringUp(cc, nodeBlocks(self)); err != nil {
			a.setNotReady(err.Error())
			return err
		}
		served, up = nodeBlocks(self), true
	}
	for _, f := range datastore.Families {
		have, now := datastore.BlockOf(served, f), datastore.BlockOf(self.PodCIDRs, f).Masked()
		switch {
		case have.IsValid() && now != have:
			// The block it serves may be another node's now.
			to := "none"
			if now.IsValid() {
				to = now.String()
			}
			a.setNotReady(fmt.Sprintf("%spod CIDR changed from %s to %s in the datastore; restart the agent after draining the node",
				map[datastore.Family]string{datastore.IPv6: "IPv6 "}[f], have, to))
			return nil
		case up && !have.IsValid() && now.IsValid() && now != a.warnedCIDR[f]:
			// A cluster given another family under a running agent: pods
			// keep what they have; the new block serves after a restart.
			slog.Warn("this node got a pod CIDR of another family after the agent started; restart the agent to give new pods addresses from it", "cidr", now)
			a.warnedCIDR[f] = now
		}
	}
	// A registration that differs from what this agent publishes (an
	// older agent's, say) is corrected in this pass.
	spec := a.published()
	pinMissing := self.PeerPin != spec.PeerPin && spec.PeerPin != a.droppedPin
	if pinMissing && spec.PeerPin == a.registeredPin {
		// Registered again in an earlier pass, whose write the node
		// cache held when it returned, and gone again: the datastore
		// drops it. Writing it on every pass would not help.
		slog.Warn("the datastore drops this node's peer pin: an ONCNode CRD older than this agent prunes spec.peerPin; apply the current manifest (until then, no node can ask this one about its pods)")
		a.droppedPin, pinMissing = spec.PeerPin, false
	}
	if self.FastPath != spec.FastPath || pinMissing {
		slog.Warn("this node's registration is outdated; registering again", "fastPath", spec.FastPath, "peerPin", spec.PeerPin)
		if err := a.store.RegisterNode(ctx, spec); err != nil {
			return err
		}
		a.registeredPin = spec.PeerPin
	}
	if !up {
		return nil
	}
	if err := a.dp.Node.SyncPeers(a.cfg.NodeName, nodes, resync); err != nil {
		return err
	}
	if resync {
		// Housekeeping that only needs doing now and then, well within
		// conntrack's established timeout.
		bypass.KeepConntrack(a.dp.Bypass)
	}
	a.setNotReady("")
	return nil
}

// published is what this node publishes about itself.
func (a *Agent) published() datastore.NodeSpec {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spec
}

// minMTU6 is IPv6's minimum link MTU (RFC 8200).
const minMTU6 = 1280

// nodeBlocks are the node's pod CIDRs the agent serves, masked, in the
// node record's family order: the first of each family.
func nodeBlocks(self *datastore.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range self.PodCIDRs {
		if p == datastore.BlockOf(self.PodCIDRs, datastore.FamilyOf(p)) {
			out = append(out, p.Masked())
		}
	}
	return out
}

// bringUp builds the node's datapath for its pod CIDRs (an IPv4 one, and
// an IPv6 one on a dual-stack node, in the node's family order) in the
// cluster cc and takes over the pods of before a restart.
func (a *Agent) bringUp(cc datastore.ClusterConfig, cidrs []netip.Prefix) error {
	// Linux turns IPv6 off on an interface whose MTU is under IPv6's
	// minimum: the node's IPv6 pods would have none.
	if datastore.BlockOf(cidrs, datastore.IPv6).IsValid() && a.podMTU < minMTU6 {
		return fmt.Errorf("pod MTU %d is under IPv6's minimum of %d: IPv6 pods need --mtu (or the uplink's MTU less %d) of at least %d",
			a.podMTU, minMTU6, a.up.Overhead(), minMTU6)
	}
	if err := a.dp.Node.BringUp(datapath.NodeSetup{PodCIDR: datastore.BlockOf(cidrs, datastore.IPv4), ClusterCIDR: cc.IPv4().CIDR,
		PodCIDRv6: datastore.BlockOf(cidrs, datastore.IPv6), ClusterCIDRv6: cc.PoolOf(datastore.IPv6).CIDR, VTEPMAC: a.vtepMAC}); err != nil {
		return err
	}
	var gws []netip.Addr
	var clusterCIDRs []netip.Prefix
	for _, c := range cidrs {
		gws = append(gws, datapath.Gateway(c))
		clusterCIDRs = append(clusterCIDRs, cc.PoolOf(datastore.FamilyOf(c)).CIDR)
	}
	pool, dropped, err := ipam.Open(filepath.Join(a.cfg.StateDir, "ipam.json"), cidrs, gws...)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.podCIDRs, a.clusterCIDRs, a.pool = cidrs, clusterCIDRs, pool
	a.mu.Unlock()
	for _, d := range dropped {
		slog.Warn("dropping a pod attachment outside this node's CIDRs", "pod", d.Key, "ips", d.IPs)
		_ = a.dp.Pods.DetachPod(datapath.Pod{HostIface: d.HostIface})
	}
	for _, att := range pool.List() {
		if err := a.dp.Pods.AdoptPod(a.podOf(att)); err != nil {
			slog.Warn("pod not on the fast path", "pod", att.Key, "err", err)
		}
	}
	slog.Info("node up", "podCIDRs", cidrs, "gateways", gws, "podMTU", a.podMTU)
	if a.up.NodeIP.Is6() {
		a.mu.Lock()
		a.spec.FastPath = a.cfg.Datapath.FastPath // registered again by this pass (reconcile)
		a.mu.Unlock()
	}
	if a.policy != nil {
		a.policy.Signal() // the adopted pods' rules
	}
	if a.svcs != nil {
		a.svcs.Signal() // the socket LB is loaded now
	}
	return nil
}

// watchers lists the agent's watchers, for status.
func (a *Agent) watchers() []*watch.Watcher {
	ws := []*watch.Watcher{a.peers, a.underlay.Loop()}
	if a.policy != nil {
		ws = append(ws, a.policy.Loop())
	}
	if a.svcs != nil {
		ws = append(ws, a.svcs.Loop())
	}
	if a.health != nil {
		ws = append(ws, a.health.Loop())
	}
	return ws
}

// attachments are this node's pod attachments, nil before it is up.
func (a *Agent) attachments() []ipam.Attachment {
	pool, _ := a.readyPool()
	if pool == nil {
		return nil
	}
	return pool.List() // never nil: an up node without pods has an empty list
}

// podOf is an attachment as the datapath programs it.
func (a *Agent) podOf(att ipam.Attachment) datapath.Pod {
	mac, _ := net.ParseMAC(att.MAC) // empty until AttachPod has run
	p := datapath.Pod{Netns: att.Netns, IfName: att.IfName, HostIface: att.HostIface, IPs: att.IPs, MTU: a.podMTU, MAC: mac}
	for _, ip := range att.IPs {
		p.Gateways = append(p.Gateways, a.gatewayOf(ip))
	}
	return p
}

// gatewayOf is the node's gateway for a pod address: the first address
// of the node CIDR that holds it.
func (a *Agent) gatewayOf(ip netip.Addr) netip.Addr {
	pool, _ := a.readyPool()
	if pool != nil {
		for _, cidr := range pool.CIDRs() {
			if cidr.Contains(ip) {
				return datapath.Gateway(cidr)
			}
		}
	}
	return netip.Addr{}
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
