package services

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/agent/report"
	"github.com/onc-net/onc/agent/watch"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/services"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NeedsKubernetes is what the agent says about Services on etcd.
const NeedsKubernetes = "no Services: they need the Kubernetes datastore (--datastore=kubernetes)"

// Datapath is what the services watcher needs of the kernel;
// *datapath/services.Node implements it.
type Datapath interface {
	// Tables are the loaded socket LB's, nil when it is off or not loaded;
	// Status then says why.
	Tables() services.Tables
	Status() string
	Mode() services.Mode
	// UplinkErr is why the uplink load balancer is not attached, if so.
	UplinkErr() error
	// UplinkFamilies are the address families the uplink load balancer
	// translates on this node, with the kube-proxy replacement on (fixed
	// once the node is up: its pod families and underlay decide).
	UplinkFamilies() (ipv4, ipv6 bool)
	// Sync makes the socket programs balance exactly svcs; with
	// checkKernel it also reads the maps back, repairing drift, and
	// forgets the namespaces of pods not among pods.
	Sync(svcs []services.Service, pods []netip.Addr, checkKernel bool) error
}

// Snapshots are the Kubernetes objects Services are balanced from (*Inputs:
// informers on Services, EndpointSlices and this node's Node).
type Snapshots interface {
	Snapshot() Snapshot
	// OnChange registers fn, called after any of them changes.
	OnChange(fn func())
}

// Sources are the Snapshots, and events on their Services.
type Sources interface {
	Snapshots
	// Warn records a Warning event on a Service.
	Warn(svc *corev1.Service, reason, message string)
}

// Watcher keeps the socket programs balancing the cluster's Services:
// every informer event only signals, and each reconcile compiles the whole
// table from the caches; the datapath writes only the services that
// changed.
type Watcher struct {
	*watch.Informed
	dp     Datapath
	inputs Sources
	node   Self
	pods   func() []ipam.Attachment // this node's; nil until it is up
	count  int                      // service ports last synced, for the log; reconcile's own
	warned map[string]bool          // unserved ports already logged and evented; reconcile's own

	mu       sync.Mutex
	unserved []string // for List
}

// Self is the node a watcher serves.
type Self struct {
	Name string
	IP   netip.Addr // its underlay address, a NodePort address even before its Node object says so
	// KubeProxyReplacement: no kube-proxy runs; ONC serves every frontend.
	KubeProxyReplacement bool
	// DSR: with the replacement, remote backends answer clients from
	// outside directly (Proxying.DSR).
	DSR bool
}

// NewWatcher is the services watcher of node; pods lists the node's
// attachments, nil before the node is up.
func NewWatcher(dp Datapath, in Sources, node Self, pods func() []ipam.Attachment, resync time.Duration) *Watcher {
	w := &Watcher{dp: dp, inputs: in, node: node, pods: pods}
	w.Informed = watch.NewInformed("services", resync, w.reconcile)
	in.OnChange(w.Signal)
	return w
}

func (w *Watcher) reconcile(ctx context.Context, full bool) error {
	if w.dp.Tables() == nil {
		return nil // off, failed (status says why) or not up yet: the agent signals at bring-up
	}
	atts := w.pods()
	if atts == nil {
		return nil
	}
	pods := make([]netip.Addr, 0, len(atts))
	for _, att := range atts {
		pods = append(pods, att.IPs...)
	}
	snap := w.inputs.Snapshot()
	proxy := w.proxying()
	w.reportUnserved(snap, proxy)
	svcs := Compile(snap, w.node.of(snap.Node, atts), proxy)
	if err := w.dp.Sync(svcs, pods, full); err != nil {
		return err
	}
	if len(svcs) != w.count {
		w.count = len(svcs)
		slog.Info("services balanced", "frontends", len(svcs))
	}
	return nil
}

// proxying is how this node serves Services.
func (w *Watcher) proxying() Proxying {
	p := Proxying{Replace: w.node.KubeProxyReplacement, DSR: w.node.DSR}
	if p.Replace {
		p.UplinkIPv4, p.UplinkIPv6 = w.dp.UplinkFamilies()
	}
	return p
}

// reportUnserved logs, and records as an event on its Service, each port
// nobody serves without kube-proxy, once while it lasts.
func (w *Watcher) reportUnserved(snap Snapshot, proxy Proxying) {
	var ports []UnservedPort
	if proxy.Replace { // beside kube-proxy, SCTP and the frontends the uplink does not translate are kube-proxy's
		ports = Unserved(snap, proxy)
	}
	now := make(map[string]bool, len(ports))
	for _, p := range ports {
		now[p.Port] = true
		if w.warned[p.Port] {
			continue
		}
		slog.Warn("a Service port is not served", "port", p.Port, "reason", p.Reason)
		event := "IPFamilyNotSupported"
		if p.Reason == UnservedSCTP {
			event = "ProtocolNotSupported"
		}
		w.inputs.Warn(p.Service, event, fmt.Sprintf("port %s is not served by ONC on node %s: %s", p.Port, w.node.Name, p.Reason))
	}
	w.warned = now
	list := make([]string, len(ports))
	for i, p := range ports {
		list[i] = p.Port + ": " + p.Reason
	}
	w.mu.Lock()
	w.unserved = list
	w.mu.Unlock()
}

// of is the node as the compiler sees it: its NodePorts and hostPorts are
// served on its underlay address and every InternalIP and ExternalIP its
// Node object lists, of both families, as kube-proxy's default
// nodePortAddresses serves the node's primary addresses; a pod's hostPorts
// reach each of its addresses.
func (s Self) of(n *corev1.Node, atts []ipam.Attachment) Node {
	out := Node{Name: s.Name}
	if s.IP.IsValid() {
		out.Addresses = append(out.Addresses, s.IP)
	}
	for _, att := range atts {
		pod := att.Key.String()
		if att.K8sName != "" {
			pod = att.K8sNamespace + "/" + att.K8sName
		}
		for _, backend := range att.IPs {
			for _, pm := range att.PortMappings {
				out.HostPorts = append(out.HostPorts, HostPort{Pod: pod, Backend: backend, PortMapping: pm})
			}
		}
	}
	// Two pods claiming one hostPort (the scheduler prevents it): the
	// first by name keeps it, whatever the pool's order.
	slices.SortFunc(out.HostPorts, func(a, b HostPort) int { return strings.Compare(a.Pod, b.Pod) })
	if n == nil {
		return out
	}
	out.Zone = n.Labels[corev1.LabelTopologyZone]
	for _, ip := range slices.Concat(nodeAddresses(n, corev1.IPv4Protocol), nodeAddresses(n, corev1.IPv6Protocol)) {
		if !slices.Contains(out.Addresses, ip) {
			out.Addresses = append(out.Addresses, ip)
		}
	}
	slices.SortFunc(out.Addresses, netip.Addr.Compare)
	return out
}

// KubeProxy is onctl status's line on kube-proxy, with p's uplink
// families as dp says.
func KubeProxy(dp Datapath, p Proxying) string {
	if !p.Replace {
		return "beside ONC: kube-proxy serves NodePorts, externalIPs, load balancer IPs and clients outside the cluster"
	}
	if err := dp.UplinkErr(); err != nil {
		return "replaced, but clients outside the cluster reach no Service: " + err.Error()
	}
	var families []string
	if p.UplinkIPv4, p.UplinkIPv6 = dp.UplinkFamilies(); p.UplinkIPv4 {
		families = append(families, "IPv4")
	}
	if p.UplinkIPv6 {
		families = append(families, "IPv6")
	}
	switch {
	case len(families) == 0:
		return "replaced at the socket; this node's uplink translates no family: clients outside the cluster reach no Service here (onctl services lists what is not served)"
	case p.DSR:
		// Direct server return in each family the uplink translates.
		return "replaced: ONC serves every Service frontend at the socket, and on the uplink in " + strings.Join(families, " and ") +
			"; backends on other nodes answer " + strings.Join(families, " and ") + " clients outside directly (DSR)"
	}
	return "replaced: ONC serves every Service frontend at the socket, and on the uplink in " + strings.Join(families, " and ")
}

// Status is onctl status's line: the mode, or why nothing is balanced at
// the socket.
func Status(dp Datapath) string {
	if dp.Tables() != nil {
		return string(dp.Mode())
	}
	return dp.Status()
}

// List answers onctl services: every Service balanced at the socket, its
// backends, affinities and the translation counters.
func (w *Watcher) List() (*apiv1.ListServicesResponse, error) {
	lb := w.dp.Tables()
	if lb == nil {
		return nil, status.Error(codes.FailedPrecondition, "socket load balancing: "+w.dp.Status())
	}
	ws := w.Loop().Status()
	w.mu.Lock()
	unserved := w.unserved
	w.mu.Unlock()
	resp := &apiv1.ListServicesResponse{Seen: ws.Seen, Applied: ws.Applied, LastError: ws.LastError,
		Mode: string(w.dp.Mode()), Cgroup: lb.Cgroup(), KubeProxyReplacement: w.node.KubeProxyReplacement, Unserved: unserved}
	states, err := lb.Services()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the service map: %v", err)
	}
	affs, err := lb.Affinities()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the affinity map: %v", err)
	}
	byService := map[services.Key][]*apiv1.ServiceAffinity{}
	for _, a := range affs {
		client := "host"
		switch {
		case a.Gone:
			client = fmt.Sprintf("gone (netns %d)", a.Netns)
		case a.Pod.IsValid():
			client = a.Pod.String()
		}
		byService[a.Service] = append(byService[a.Service], &apiv1.ServiceAffinity{Client: client,
			Backend: a.Backend.String(), AgeSeconds: a.Age.Seconds()})
	}
	for _, st := range states {
		bs := &apiv1.BalancedService{Name: st.Name, Vip: netip.AddrPortFrom(st.VIP, st.Port).String(), Proto: st.Proto.String(),
			AffinitySeconds: uint32(st.Affinity.Seconds()), Translated: st.Translated, Refused: st.Refused,
			Affinity: byService[st.Key()], Frontend: st.Frontend.String(), Scope: st.Scope.String(),
			KeepClient: st.KeepClient, DropWhenEmpty: st.DropWhenEmpty, Dsr: st.DSR}
		for _, r := range st.SourceRanges {
			bs.SourceRanges = append(bs.SourceRanges, r.String())
		}
		for _, b := range st.Backends {
			bs.Backends = append(bs.Backends, &apiv1.ServiceBackend{Addr: b.Addr.String(), Pod: b.Pod, Node: b.Node, Ready: b.Ready})
		}
		resp.Services = append(resp.Services, bs)
	}
	stats, err := lb.Stats()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the socket-LB counters: %v", err)
	}
	resp.Counters = report.Counters("services", stats)
	return resp, nil
}
