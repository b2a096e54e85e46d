package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/onc-net/onc/internal/netns"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/underlay"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/netfilter"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore"
	"github.com/vishvananda/netlink"
)

// Node is the kernel side of one node.
type Node struct {
	cfg Config
	up  Uplink

	mu  sync.Mutex
	ovl *overlay.Overlay   // nil until BringUp
	fp  *fastpath.Datapath // nil until BringUp
	// switchMu serialises fast-path switches (nodeFastPath.Switch).
	switchMu sync.Mutex

	policy   *policy.Node
	services *services.Node
	bypass   *bypass.Node
	underlay *underlay.Node

	conflicts string // the peers left out last time, logged when it changes
	// uplinkAttached: the overlay guard's programs are attached, and
	// uplinkLBAttached the load balancer's (or removed, without the
	// replacement); uplinkLBErr is its last failure, logged when it changes.
	uplinkAttached, uplinkLBAttached bool
	uplinkLBErr                      string
	clusterCIDR, clusterCIDRv6       netip.Prefix // from BringUp
}

// reservedMarks are ONC's fixed skb->mark bits, which the fast path's
// configurable one must not be: the uplink load balancer's SNAT and
// reject marks and the peer-host mark (whose chain clears it).
const reservedMarks = services.SNATMark | services.RejectMark | overlay.PeerHostMark

// New checks cfg and finds the uplink; nothing in the kernel changes until
// BringUp.
func New(cfg Config) (*Node, error) {
	if cfg.VNI < 1 || cfg.VNI > 1<<24-1 {
		return nil, fmt.Errorf("VNI %d: must be 1..16777215", cfg.VNI)
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("VXLAN port %d: must be 1..65535", cfg.Port)
	}
	if m := cfg.FastPathMark; m == 0 || m&(m-1) != 0 || m&reservedMarks != 0 {
		return nil, fmt.Errorf("fast-path mark %#x: must be one bit, and none of ONC's own (%#x)", m, reservedMarks)
	}
	if cfg.Services == "" {
		cfg.Services = services.All
	}
	if cfg.Bypass.Mode == "" {
		cfg.Bypass.Mode = bypass.Off
	}
	up, err := findUplink(cfg.Iface, cfg.NodeIP)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, up: up}
	// The socket LB and the bypass attach to one cgroup, resolved once for
	// both (resolving may mount a cgroup v2 hierarchy).
	cgroup := sync.OnceValues(func() (string, error) { return bpf.ResolveCgroup(cfg.Cgroup) })
	n.services = services.NewNode(cfg.Services, cfg.BPFFS, cgroup)
	n.bypass = bypass.NewNode(cfg.Bypass, cfg.BPFFS, cgroup)
	n.policy = policy.NewNode(n.fastPath, n.bypass.Loaded, cfg.PolicyLogGroup)
	n.underlay = underlay.NewNode(up.Index, up.NodeIP, n.fastPath)
	return n, nil
}

// Uplink is the interface overlay traffic leaves by.
func (n *Node) Uplink() Uplink { return n.up }

// BringUp builds the node's datapath for its pod CIDR: the eBPF datapath
// (without which the node does not come up: it guards the overlay),
// forwarding, the VXLAN device and the iptables rules. It is idempotent,
// and a failed call leaves nothing open, so the caller retries.
func (n *Node) BringUp(s NodeSetup) (err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	gw := Gateway(s.PodCIDR)
	n.clusterCIDR, n.clusterCIDRv6 = s.ClusterCIDR, s.ClusterCIDRv6
	fp := n.fp
	if fp == nil {
		if fp, err = n.openFastPath(s); err != nil {
			return err
		}
	}
	defer func() {
		if err != nil {
			fp.Close() // the next attempt opens it again
			fp = nil
			n.uplinkAttached, n.uplinkLBAttached = false, false
		}
		n.fp = fp
	}()
	// A fresh node: nothing listens on the VXLAN port yet, so the guard
	// goes on the uplink before the device does, dropping every frame
	// until it knows the peers. So does a node whose tunnel endpoint
	// changed: an earlier version's guard may not judge frames of the new
	// family (before 68f69b2 it let every outer IPv6 frame on). On a
	// restart or upgrade the uplink's programs stay as they are until the
	// first peer sync (attachUplink).
	if !overlay.ListensOn(n.up.NodeIP) {
		if err := n.attachUplinkLocked(fp); err != nil {
			return err
		}
	}
	if err := n.writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	if s.PodCIDRv6.IsValid() {
		if err := n.forwardIPv6(); err != nil {
			return err
		}
	}
	// Peers' learned headers hold this uplink's MAC: if it changes, tell
	// them at once (gratuitous ARP), so their agents evict those headers
	// (EvictStaleHeaders) instead of their kernels finding out seconds later.
	notify := "net/ipv4/conf/" + n.up.Name + "/arp_notify"
	if n.up.NodeIP.Is6() {
		notify = "net/ipv6/conf/" + n.up.Name + "/ndisc_notify"
	}
	if err := n.writeSysctl(notify, "1"); err != nil {
		return err
	}
	ovl, err := overlay.Ensure(overlay.Config{VNI: n.cfg.VNI, Port: n.cfg.Port, LocalIP: n.up.NodeIP, Uplink: n.up.Index,
		MAC: s.VTEPMAC, MTU: n.up.MTU - n.up.Overhead(), Gateway: gw, Gateway6: Gateway(s.PodCIDRv6), ProcSys: n.cfg.ProcSys})
	if err != nil {
		return err
	}
	// A strict reverse-path filter checks a peer's host's packets against
	// the route their mark selects (overlay.PeerHostMark).
	if err := n.writeSysctl("net/ipv4/conf/"+overlay.DeviceName+"/src_valid_mark", "1"); err != nil {
		return err
	}
	var marking netfilter.Marking
	if fp.Enabled() {
		marking = n.marking() // off, nothing marks (nodeFastPath.Switch)
	}
	var lbMarks netfilter.UplinkLB // zero: the rules go
	// Pods' masquerade keeps clear of the ports the uplink serves in each
	// family it translates: a reply to a pod's flow would otherwise find
	// a NodePort's entry.
	masqueradePorts, masqueradePorts6 := "", ""
	if uplink4, uplink6 := n.uplinkFamilies(); uplink4 || uplink6 {
		lbMarks = netfilter.UplinkLB{SNATMark: services.SNATMark, RejectMark: services.RejectMark, LocalPods: s.PodCIDR, LocalPods6: s.PodCIDRv6}
		if uplink4 {
			masqueradePorts = services.MasqueradePorts
		}
		if uplink6 {
			masqueradePorts6 = services.MasqueradePorts
		}
	}
	if err := netfilter.Ensure(s.ClusterCIDR, n.netfilterOverlay(), marking, masqueradePorts); err != nil {
		return err
	}
	if err := netfilter.EnsureUplinkLB(lbMarks); err != nil {
		return err
	}
	if err := netfilter.EnsureIPv6(s.ClusterCIDRv6, n.netfilterOverlay(), masqueradePorts6); err != nil {
		return err
	}
	// Conntrack does not see the data the fast path carries, so its TCP
	// window falls behind; strict window checks would then mark the
	// flow's FIN, or its packets after a fast-path switch, INVALID.
	if err := n.writeSysctl("net/netfilter/nf_conntrack_tcp_be_liberal", "1"); err != nil {
		return err
	}
	// As kube-proxy sets it (--conntrack-tcp-timeout-close-wait): a
	// connection its peer half-closed keeps its NAT entry an hour, not the
	// kernel's minute, while the other end may still send.
	if n.cfg.KubeProxyReplacement {
		if err := n.writeSysctl("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"); err != nil {
			return err
		}
	}
	n.services.Load(fp.FlowCache(), s.PodCIDRv6.IsValid() || s.ClusterCIDRv6.IsValid())
	// On a fresh node the uplink got its programs before the services
	// loaded; on a restart it gets them at the first peer sync.
	if n.uplinkAttached {
		n.attachServicesUplinkLocked()
	}
	n.bypass.Load(fp.FlowCache())
	n.ovl = ovl
	slog.Info("node datapath up", "podCIDR", s.PodCIDR, "gateway", gw, "podCIDRv6", s.PodCIDRv6, "vxlan", overlay.DeviceName)
	return nil
}

// forwardIPv6 turns on IPv6 forwarding, which IPv6 pods need. The kernel
// then ignores router advertisements on interfaces whose accept_ra is 1:
// the uplink's goes to 2 (accept them even when forwarding), so a node
// that learns its IPv6 route by advertisements keeps it.
func (n *Node) forwardIPv6() error {
	ra := filepath.Join("net/ipv6/conf", n.up.Name, "accept_ra")
	if v, err := n.readSysctl(ra); err == nil && v == "1" {
		if err := n.writeSysctl(ra, "2"); err != nil {
			return err
		}
	}
	return n.writeSysctl("net/ipv6/conf/all/forwarding", "1")
}

// openFastPath loads the eBPF datapath (adopting pinned maps and links).
// A node cannot run without it, fast path on or off: its programs guard
// the overlay (datapath/bpf/include/overlay.h) and the pods' veths.
func (n *Node) openFastPath(s NodeSetup) (*fastpath.Datapath, error) {
	fp, err := fastpath.Open(fastpath.Options{PinDir: n.cfg.BPFFS, VNI: n.cfg.VNI, Port: n.cfg.Port,
		Mark: n.cfg.FastPathMark, Mode: fastpath.Mode(n.cfg.AttachMode), NodeIP: n.up.NodeIP, PodCIDR: s.PodCIDR,
		PodCIDRv6: s.PodCIDRv6, ConnSetup: n.connSetup(), EventsPerSecond: n.cfg.FlowEvents})
	if err == nil {
		err = fp.Configure(n.cfg.FastPath)
	}
	if err != nil {
		if fp != nil {
			fp.Close()
		}
		return nil, fmt.Errorf("eBPF datapath (it guards the overlay, so the node cannot run without it): %w", err)
	}
	slog.Info("eBPF datapath loaded", "fastPath", n.cfg.FastPath, "connectionSetup", n.connSetup(), "attach", fp.Mode(), "pins", n.cfg.BPFFS)
	return fp, nil
}

// connSetup is which connections may open on the fast path. On
// Kubernetes, only where the socket LB translates the pods' Service
// connections: kube-proxy translating them in the stack could map one onto
// the addresses and ports of a connection conntrack never saw, and would
// not move it aside.
func (n *Node) connSetup() fastpath.ConnSetup {
	switch {
	case !n.cfg.FastPathConnSetup:
		return fastpath.SetupOff
	case n.cfg.NoPolicy:
		return fastpath.SetupEveryPod
	case n.cfg.Services != services.All:
		return fastpath.SetupOff
	}
	return fastpath.SetupOpenPods
}

// netfilterOverlay is what the overlay's iptables rules need.
func (n *Node) netfilterOverlay() netfilter.Overlay {
	return netfilter.Overlay{Device: overlay.DeviceName, Uplink: n.up.Name, Port: n.cfg.Port, IPv6: n.up.NodeIP.Is6(),
		PeerHostMark: overlay.PeerHostMark}
}

// marking is where the fast path on marks ESTABLISHED flows: across the
// overlay, and with the kube-proxy replacement on, by the uplink (the
// uplink programs carry what the flow cache learns there).
func (n *Node) marking() netfilter.Marking {
	m := netfilter.Marking{Mark: n.cfg.FastPathMark, IPv6: n.clusterCIDRv6.IsValid()}
	if n.cfg.KubeProxyReplacement {
		m.Uplink = n.up.Name
	}
	return m
}

// Policy is the node's NetworkPolicy enforcement.
func (n *Node) Policy() *policy.Node { return n.policy }

// Services is the node's socket load balancer.
func (n *Node) Services() *services.Node { return n.services }

// Bypass is the node's intra-node bypass.
func (n *Node) Bypass() *bypass.Node { return n.bypass }

// Underlay keeps the fast path's learned headers true to the underlay.
func (n *Node) Underlay() *underlay.Node { return n.underlay }

// FastPath is the flow cache, or nil when it is not loaded.
func (n *Node) FastPath() FastPath {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fp == nil {
		return nil // not a typed nil: callers compare with nil
	}
	return nodeFastPath{n.fp, n.netfilterOverlay(), n.marking(), &n.switchMu}
}

// nodeFastPath is the flow cache as the agent drives it: switching it
// switches the slow path's ESTABLISHED mark too, so that a node with the
// fast path off neither marks nor learns (the learning programs would
// otherwise run on every established packet for nothing).
type nodeFastPath struct {
	*fastpath.Datapath
	overlay netfilter.Overlay // for the overlay guard's netfilter counters
	marking netfilter.Marking
	mu      *sync.Mutex // one switch at a time: the two steps must not interleave
}

func (f nodeFastPath) Switch(enabled bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if enabled {
		// Marks first: the fast path learns from its first packet on.
		if err := netfilter.EnsureMark(overlay.DeviceName, f.marking); err != nil {
			return err
		}
		return f.Datapath.Switch(true)
	}
	if err := f.Datapath.Switch(false); err != nil {
		return err
	}
	// The fast path is off either way: marks left behind cost a rule per
	// packet but learn nothing (the programs return when disabled).
	if err := netfilter.EnsureMark(overlay.DeviceName, netfilter.Marking{}); err != nil {
		slog.Warn("fast path off, but removing the ESTABLISHED mark rules failed; they stay until the next switch", "err", err)
	}
	return nil
}

// Stats adds to the programs' counters the overlay guard's drops in
// netfilter, as overlay_drop_<reason>.
func (f nodeFastPath) Stats() ([]fastpath.Stat, error) {
	st, err := f.Datapath.Stats()
	if err != nil {
		return nil, err
	}
	drops, err := netfilter.GuardDrops(f.overlay)
	if err != nil {
		return nil, err
	}
	for _, reason := range slices.Sorted(maps.Keys(drops)) {
		st = append(st, fastpath.Stat{Name: "overlay_drop_" + reason, Value: drops[reason]})
	}
	return st, nil
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
	errs := []error{n.policy.Close(), n.services.Close(), n.bypass.Close()}
	if n.fp != nil {
		errs = append(errs, n.fp.Close())
		n.fp = nil
	}
	return errors.Join(errs...)
}

// SyncPeers programs every other node that has a pod CIDR as an overlay
// peer, and gives the fast path the peers that run it and every node's
// address (traffic to and from them stays on the slow path). Only what differs
// from what was programmed last is written; checkKernel also reads the
// kernel's entries back and repairs what drifted.
func (n *Node) SyncPeers(self string, nodes []datastore.Node, checkKernel bool) error {
	n.mu.Lock()
	ovl, fp := n.ovl, n.fp
	n.mu.Unlock()
	if ovl == nil {
		return errNotUp
	}
	want := peersOf(self, n.up.NodeIP, nodes)
	n.logConflicts(want.conflicts)
	// The guard first: a peer that left is refused before its routes go,
	// one that came is accepted before traffic is routed to it.
	if err := fp.SyncSenders(want.senders, checkKernel); err != nil {
		return fmt.Errorf("overlay guard: %w", err)
	}
	if err := n.attachUplink(fp); err != nil {
		return err
	}
	err := ovl.Sync(want.overlay, checkKernel)
	err = errors.Join(err, fp.SetHosts(want.hosts, checkKernel), fp.SyncPeers(want.fastPath, checkKernel))
	vteps := map[netip.Addr]net.HardwareAddr{}
	for _, p := range want.overlay {
		vteps[p.NodeIP] = p.VTEPMAC
	}
	// (The underlay watcher checks every header on its own resync; this
	// is for a peer's change.)
	return errors.Join(err, n.underlay.SetPeers(vteps))
}

// attachUplink puts the guard and the ingress fast path on the uplink, on
// a restarted agent once the guard knows the peers: swapped in with an
// empty sender set (the first start of a version that adds the guard), it
// would drop every frame until then. Later calls do nothing; the pinned
// link outlives the agent.
func (n *Node) attachUplink(fp *fastpath.Datapath) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.attachUplinkLocked(fp)
}

func (n *Node) attachUplinkLocked(fp *fastpath.Datapath) error {
	if !n.uplinkAttached {
		if err := fp.AttachUplink(n.up.Name); err != nil {
			return fmt.Errorf("attach the overlay guard to %s: %w", n.up.Name, err)
		}
		n.uplinkAttached = true
	}
	// After the fast path's programs, which may have been attached afresh
	// at the head: the load balancer's must run before them.
	n.attachServicesUplinkLocked()
	return nil
}

// attachServicesUplinkLocked attaches (or removes) the uplink load
// balancer once. A failure leaves clients outside without Services
// (onctl status says why) but must not keep the node from its peers: it
// is logged when it changes and retried on every peer sync.
func (n *Node) attachServicesUplinkLocked() {
	// Before the services load (a fresh node attaches the guard first),
	// or when they failed to (their status says why), there is nothing
	// to attach yet.
	if n.uplinkLBAttached || (n.cfg.KubeProxyReplacement && n.services.Tables() == nil) {
		return
	}
	if err := n.attachServicesUplink(); err != nil {
		if msg := err.Error(); msg != n.uplinkLBErr {
			slog.Error("clients outside the cluster reach no Service (retried on every peer sync)", "err", err)
			n.uplinkLBErr = msg
		}
		return
	}
	n.uplinkLBAttached, n.uplinkLBErr = true, ""
}

// attachServicesUplink puts the uplink load balancer on the uplink with
// the kube-proxy replacement on, and takes it off otherwise, so that no
// program translates with service entries nobody updates.
func (n *Node) attachServicesUplink() error {
	if !n.uplinkLB() {
		return services.RemoveUplink(n.cfg.BPFFS)
	}
	// Sources no packet from outside may carry: the cluster's pods and
	// this node's tunnel endpoint, in each family it has.
	var internal []netip.Prefix
	for _, p := range []netip.Prefix{n.clusterCIDR, n.clusterCIDRv6, netip.PrefixFrom(n.up.NodeIP, n.up.NodeIP.BitLen())} {
		if p.IsValid() {
			internal = append(internal, p)
		}
	}
	return n.services.AttachUplink(n.up.Name, internal)
}

// uplinkLB says whether the uplink load balancer serves clients outside:
// with the kube-proxy replacement on, in a family it translates here.
func (n *Node) uplinkLB() bool {
	ipv4, ipv6 := n.uplinkFamilies()
	return ipv4 || ipv6
}

// UplinkFamilies are the address families the uplink load balancer
// translates on this node with the kube-proxy replacement on: IPv4 where
// the cluster has IPv4 pods and the underlay is IPv4 (its fast path sends
// IPv4 tunnels), IPv6 where the cluster has IPv6 pods (on the slow path,
// over either underlay). The services watcher reports the frontends of
// the others unserved there. Fixed once the node is up.
func (n *Node) UplinkFamilies() (ipv4, ipv6 bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.uplinkFamilies()
}

// uplinkFamilies is UplinkFamilies with n.mu held.
func (n *Node) uplinkFamilies() (ipv4, ipv6 bool) {
	replace := n.cfg.KubeProxyReplacement
	return replace && n.up.NodeIP.Is4() && n.clusterCIDR.IsValid(), replace && n.clusterCIDRv6.IsValid()
}

// logConflicts says once which nodes are left out of the peers and why:
// the records need an operator (a VTEP MAC copied with a cloned disk, say).
func (n *Node) logConflicts(conflicts []string) {
	msg := strings.Join(conflicts, "; ")
	n.mu.Lock()
	changed := msg != n.conflicts
	n.conflicts = msg
	n.mu.Unlock()
	if changed && msg != "" {
		slog.Error("nodes left out of the peers: their records conflict; fix or delete them", "conflicts", msg)
	}
}

// KernelWrites counts the writes made to program peers since start:
// netlink messages of the overlay and BPF map updates and deletes of the
// fast path's peer and host maps and of the overlay guard's sender map.
func (n *Node) KernelWrites() uint64 {
	n.mu.Lock()
	ovl, fp := n.ovl, n.fp
	n.mu.Unlock()
	var w uint64
	if ovl != nil {
		w += ovl.Writes()
	}
	if fp != nil {
		w += fp.PeerWrites()
	}
	return w
}

// ProgrammedPeers names the peers whose overlay entries are in place.
func (n *Node) ProgrammedPeers() map[string]bool {
	n.mu.Lock()
	ovl := n.ovl
	n.mu.Unlock()
	out := map[string]bool{}
	if ovl != nil {
		for name := range ovl.Programmed() {
			out[name] = true
		}
	}
	return out
}

// AttachPod makes the pod's veth, address and routes, then lets the fast
// path deliver to it and see its traffic. On error part of it may exist:
// the caller rolls back with DetachPod.
func (n *Node) AttachPod(p Pod) (PodLink, error) {
	spec := p.spec()
	spec.Cookie = n.socketsOwnPods()
	spec.ProcSys = n.cfg.ProcSys
	link, err := pods.Setup(spec)
	if err != nil {
		return PodLink{}, err
	}
	p.MAC = link.PodMAC
	if err := n.addToFastPath(p, link.HostIndex, link.HostMAC); err != nil {
		return PodLink{}, err
	}
	if spec.Cookie {
		if err := n.ownPodSockets(p, link.NetnsCookie); err != nil {
			return PodLink{}, err
		}
	}
	return PodLink{PodMAC: link.PodMAC, HostMAC: link.HostMAC}, nil
}

// AdoptPod puts a pod attached before an agent restart back on the fast
// path; its veth and routes are still in place.
func (n *Node) AdoptPod(p Pod) error {
	// Each independently: a pod off the fast path still gets its Services,
	// and policy can still end its bypassed connections.
	var errs []error
	if n.socketsOwnPods() {
		cookie, err := netns.Cookie(p.Netns)
		if err != nil {
			err = fmt.Errorf("pod sockets: %w", err)
		} else {
			err = n.ownPodSockets(p, cookie)
		}
		errs = append(errs, err)
	}
	host, err := netlink.LinkByName(p.HostIface)
	if err == nil {
		err = n.addToFastPath(p, host.Attrs().Index, host.Attrs().HardwareAddr)
	}
	return errors.Join(append(errs, err)...)
}

func (n *Node) addToFastPath(p Pod, hostIndex int, hostMAC net.HardwareAddr) error {
	fp := n.fastPath()
	if fp == nil {
		return nil
	}
	if len(p.MAC) != 6 {
		return fmt.Errorf("pod %v: no MAC recorded for its interface", p.IPs)
	}
	for _, ip := range p.IPs {
		if err := fp.SetLocalPod(ip, hostIndex, p.MAC, hostMAC); err != nil {
			return err
		}
	}
	return fp.AttachPod(p.HostIface)
}

// socketsOwnPods says whether a socket program acts on pods' sockets, so
// that a pod's namespace cookie is needed (and the kernel has them).
func (n *Node) socketsOwnPods() bool {
	return n.services.BalancesPods() || n.bypass.Loaded() != nil
}

// ownPodSockets registers the pod's network namespace, by its cookie,
// with the socket programs that act on pods' sockets: the socket LB in
// mode all, which must know it before the pod runs or its first
// connections would go to kube-proxy, and the intra-node bypass.
func (n *Node) ownPodSockets(p Pod, cookie uint64) error {
	var errs []error
	if ip := p.name(); ip.IsValid() {
		errs = append(errs, n.services.OwnPod(cookie, ip, p.Netns))
	}
	// The bypass pairs pods in both families: every address.
	return errors.Join(append(errs, n.bypass.OwnPod(p.IPs, p.Netns, cookie))...)
}

// CheckPod verifies that the pod's network is as AttachPod left it.
func (n *Node) CheckPod(p Pod) error { return pods.Check(p.spec()) }

// DetachPod forgets the pod in the fast path, evicting its flows before its
// address can be reused, then removes its veth. Missing parts are fine:
// DEL is idempotent.
func (n *Node) DetachPod(p Pod) error {
	errs := []error{n.services.ForgetPod(p.name()), n.bypass.ForgetPod(p.IPs...)}
	if fp := n.fastPath(); fp != nil {
		for _, a := range p.IPs {
			errs = append(errs, fp.DeleteLocalPod(a))
		}
		errs = append(errs, fp.DetachPod(p.HostIface))
		if err := errors.Join(errs...); err != nil {
			return err // the veth stays until the flows are gone; DEL is retried
		}
	}
	return errors.Join(append(errs, pods.Teardown(p.HostIface))...)
}

// errNotUp is returned by calls that need BringUp first.
var errNotUp = errors.New("the node's datapath is not up yet")
