package services

import (
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	utilnet "k8s.io/utils/net"
	"k8s.io/utils/ptr"

	"github.com/onc-net/onc/datapath/services"
)

// Compile resolves the Services of snap into the socket load balancer's
// table on node, with the backends kube-proxy's iptables mode would give
// their ClusterIP traffic there (k8s.io/kubernetes pkg/proxy). It is
// deterministic, so callers can compare two tables with reflect.DeepEqual.
//
// Only the IPv4 cluster IP of TCP and UDP ports is ours: NodePorts, load
// balancer and external IPs, SCTP and IPv6 stay with kube-proxy. Topology
// hints (trafficDistribution, topology-aware routing) are ignored: kube-proxy
// would prefer the endpoints of this zone or node, the table balances over
// all of them.
func Compile(snap Snapshot, node string) []services.Service {
	byService := map[string][]*discoveryv1.EndpointSlice{}
	for _, es := range snap.EndpointSlices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if es.AddressType == discoveryv1.AddressTypeIPv4 && name != "" {
			byService[es.Namespace+"/"+name] = append(byService[es.Namespace+"/"+name], es)
		}
	}
	var out []services.Service
	for _, svc := range snap.Services {
		vip, ok := clusterIPv4(svc)
		if !ok {
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		eps := endpoints(byService[key], node)
		local := ptr.Deref(svc.Spec.InternalTrafficPolicy, corev1.ServiceInternalTrafficPolicyCluster) == corev1.ServiceInternalTrafficPolicyLocal
		for _, p := range svc.Spec.Ports {
			proto, ok := protos[p.Protocol]
			if !ok {
				continue
			}
			backends, ok := usable(eps[portName{p.Name, p.Protocol}], local)
			if !ok {
				// kube-proxy DROPs this traffic (the Service has endpoints,
				// none on this node). A table entry without backends would
				// refuse it instead; without an entry the socket program
				// leaves it to kube-proxy's DROP rule.
				continue
			}
			out = append(out, services.Service{Name: key + ":" + p.Name, VIP: vip, Port: uint16(p.Port), Proto: proto,
				Affinity: affinity(svc), Backends: backends})
		}
	}
	services.SortServices(out)
	return out
}

var protos = map[corev1.Protocol]services.Proto{corev1.ProtocolTCP: services.TCP, corev1.ProtocolUDP: services.UDP}

// clusterIPv4 is the Service's IPv4 cluster IP, chosen as kube-proxy does
// (pkg/proxy/util: ShouldSkipService, GetClusterIPByFamily): none for an
// ExternalName Service, nor a headless one (its "None" does not parse).
func clusterIPv4(s *corev1.Service) (netip.Addr, bool) {
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return netip.Addr{}, false
	}
	ip := ""
	if len(s.Spec.IPFamilies) == 0 { // written by an API server older than dual-stack
		ip = s.Spec.ClusterIP
	} else if i := slices.Index(s.Spec.IPFamilies, corev1.IPv4Protocol); i >= 0 && i < len(s.Spec.ClusterIPs) {
		ip = s.Spec.ClusterIPs[i]
	}
	return ipv4(ip)
}

// ipv4 parses an address as kube-proxy does: the API still accepts
// leading zeros in these fields ("010.0.0.1" is 10.0.0.1).
func ipv4(s string) (netip.Addr, bool) {
	ip := utilnet.ParseIPSloppy(s).To4()
	if ip == nil {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(ip)), true
}

func affinity(s *corev1.Service) time.Duration {
	if s.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	timeout := corev1.DefaultClientIPServiceAffinitySeconds // the API's default
	if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		timeout = *c.ClientIP.TimeoutSeconds
	}
	return time.Duration(timeout) * time.Second
}

// portName is what matches a Service port to an EndpointSlice port.
type portName struct {
	name  string
	proto corev1.Protocol
}

type endpoint struct {
	services.Backend
	local, serving, terminating bool
}

// endpoints are a Service's endpoints by port, as kube-proxy's
// EndpointSliceCache gathers them (pkg/proxy/endpointslicecache.go): the
// backend port is the slice port's number (how a named targetPort
// resolves, per pod), and an address:port in several slices counts once,
// the first seen unless a later one is on this node.
func endpoints(from []*discoveryv1.EndpointSlice, node string) map[portName]map[netip.AddrPort]endpoint {
	byPort := map[portName]map[netip.AddrPort]endpoint{}
	for _, es := range from {
		for _, p := range es.Ports {
			if p.Name == nil || p.Port == nil || *p.Port == 0 {
				continue // kube-proxy ignores such a port
			}
			pn := portName{*p.Name, ptr.Deref(p.Protocol, corev1.ProtocolTCP)} // the API's default
			if byPort[pn] == nil {
				byPort[pn] = map[netip.AddrPort]endpoint{}
			}
			for _, ep := range es.Endpoints {
				if len(ep.Addresses) == 0 {
					continue
				}
				ip, ok := ipv4(ep.Addresses[0])
				if !ok {
					continue
				}
				ready := ptr.Deref(ep.Conditions.Ready, true)
				e := endpoint{
					Backend: services.Backend{Addr: netip.AddrPortFrom(ip, uint16(*p.Port)), Node: ptr.Deref(ep.NodeName, ""), Ready: ready},
					local:   node != "" && ptr.Deref(ep.NodeName, "") == node,
					serving: ptr.Deref(ep.Conditions.Serving, true), terminating: ptr.Deref(ep.Conditions.Terminating, false),
				}
				if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" {
					e.Pod = ref.Namespace + "/" + ref.Name
				}
				if _, dup := byPort[pn][e.Addr]; !dup || e.local {
					byPort[pn][e.Addr] = e
				}
			}
		}
	}
	return byPort
}

// usable picks a port's backends as kube-proxy's CategorizeEndpoints does
// for ClusterIP traffic (pkg/proxy/topology.go): the ready endpoints, else
// the serving terminating ones; with internalTrafficPolicy Local, only
// those on this node. No backends: kube-proxy REJECTs. ok is false where
// it DROPs instead (pkg/proxy/iptables/proxier.go): Local, and the Service
// has usable endpoints, but not here.
func usable(eps map[netip.AddrPort]endpoint, local bool) (backends []services.Backend, ok bool) {
	pick := func(keep func(endpoint) bool) {
		for _, e := range eps {
			if (!local || e.local) && keep(e) {
				backends = append(backends, e.Backend)
			}
		}
	}
	pick(func(e endpoint) bool { return e.Ready })
	if len(backends) == 0 {
		pick(endpoint.fallback)
	}
	if len(backends) == 0 && local {
		for _, e := range eps {
			if e.Ready || e.fallback() {
				return nil, false
			}
		}
	}
	return backends, true
}

// fallback: a serving, terminating endpoint is used when no endpoint is
// ready, so that connections still find a pod during a rollout.
func (e endpoint) fallback() bool { return e.serving && e.terminating }
