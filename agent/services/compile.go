package services

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	utilnet "k8s.io/utils/net"
	"k8s.io/utils/ptr"

	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/datapath/services"
)

// Node is what the compiler needs to know of the node it compiles for.
type Node struct {
	Name string
	// Zone is its topology.kubernetes.io/zone label, "" if none: topology
	// hints for zones are then ignored, as kube-proxy ignores them.
	Zone string
	// Addresses are where its NodePorts are served (its addresses of
	// both families; each family's NodePorts on that family's).
	Addresses []netip.Addr
	// HostPorts are its pods' hostPorts (the CNI portMappings capability).
	HostPorts []HostPort
}

// HostPort is one of a pod's hostPorts.
type HostPort struct {
	Pod     string     // namespace/name, or the attachment's key outside Kubernetes
	Backend netip.Addr // the pod's address of the family it is served in
	ipam.PortMapping
}

// Proxying is how ONC serves Services on a node.
type Proxying struct {
	// Replace: no kube-proxy runs; ONC serves every frontend.
	Replace bool
	// DSR: a NodePort, externalIP or load balancer IP of
	// externalTrafficPolicy Cluster sends a client's packets to a backend
	// pod on another node directly, and the backend's node answers the
	// client (--load-balancer-mode dsr).
	DSR bool
	// UplinkIPv4, UplinkIPv6: with Replace, this node's uplink load
	// balancer translates the family's NodePorts, externalIPs, load
	// balancer IPs and hostPorts for clients outside the cluster and on
	// other nodes (datapath: the node's families and underlay decide).
	UplinkIPv4, UplinkIPv6 bool
}

// uplink says whether the uplink translates family's frontends.
func (p Proxying) uplink(family corev1.IPFamily) bool {
	if family == corev1.IPv4Protocol {
		return p.UplinkIPv4
	}
	return p.UplinkIPv6
}

// Compile resolves the Services of snap into the table the socket and
// uplink programs serve on node, with the backends kube-proxy would give
// each frontend there (k8s.io/kubernetes pkg/proxy). It is deterministic,
// so callers can compare two tables with reflect.DeepEqual.
//
// Without proxy.Replace (kube-proxy runs beside ONC) only the cluster IPs
// of TCP and UDP ports are ONC's, at the socket: each family's (a
// Service's spec.clusterIPs, one per family whatever its ipFamilyPolicy),
// with the endpoints of that family's EndpointSlices. With it, ONC is the
// only proxy: each family's NodePorts on every address of the node of
// that family, externalIPs and load balancer ingress IPs too, each at the
// socket (clients on this node) and, in the families proxy's uplink
// translates, on the uplink (clients outside the cluster, or on other
// nodes). SCTP is served by nobody, and the external frontends of the
// other families by nobody on the uplink (Unserved lists them).
func Compile(snap Snapshot, node Node, proxy Proxying) []services.Service {
	bySlices := slicesByService(snap)
	t := table{seen: map[services.Key]bool{}, clusterIPs: map[netip.Addr]bool{}, proxy: proxy}
	// Claims go in this order: every ClusterIP first, so that no
	// externalIP or hostPort another Service's author chose can take one
	// (CVE-2020-8554); then hostPorts, as the portmap plugin's chain comes
	// before kube-proxy's; then the external frontends.
	var externals []external
	for _, svc := range snap.Services {
		for _, family := range families {
			vip, ok := clusterIP(svc, family.ip)
			if !ok {
				continue
			}
			t.clusterIPs[vip] = true
			eps := endpoints(bySlices[sliceSet{svc.Namespace + "/" + svc.Name, family.slices}], family.ip, node.Name)
			// A family's external frontends get that family's
			// endpoints, as kube-proxy's proxier of the family serves them.
			ports := t.clusterIPPorts(svc, vip, eps, node, proxy.Replace)
			if proxy.Replace {
				externals = append(externals, ports...)
			}
		}
	}
	t.hostPorts(node)
	for _, e := range externals {
		t.external(e, node)
	}
	services.SortServices(t.out)
	return t.out
}

// external is a Service port of one family whose external frontends are
// added after every cluster IP and hostPort claimed theirs.
type external struct {
	svc    *corev1.Service
	port   corev1.ServicePort
	family corev1.IPFamily
	base   services.Service
	sets   endpointSets
}

// clusterIPPorts adds the entries of one cluster IP of svc, one per TCP
// and UDP port, with the endpoints of its family (eps); it returns the
// ports, for their external frontends. replace: no kube-proxy runs.
func (t *table) clusterIPPorts(svc *corev1.Service, vip netip.Addr, eps map[portName]map[netip.AddrPort]endpoint, node Node,
	replace bool) []external {
	var ports []external
	for _, p := range svc.Spec.Ports {
		proto, ok := protos[p.Protocol]
		if !ok {
			continue
		}
		sets := categorize(eps[portName{p.Name, p.Protocol}], node, hintsApply(svc))
		base := services.Service{Name: svc.Namespace + "/" + svc.Name + ":" + p.Name, Proto: proto, Affinity: affinity(svc)}
		if internalLocal(svc) {
			if sets.local != nil || !sets.any || replace {
				// No local endpoint, though some elsewhere: kube-proxy
				// drops; without kube-proxy the socket refuses.
				t.add(base, services.ClusterIP, services.Socket, vip, uint16(p.Port), sets.local)
			}
			// else: left to kube-proxy's DROP rule.
		} else {
			t.add(base, services.ClusterIP, services.Socket, vip, uint16(p.Port), sets.cluster)
		}
		ports = append(ports, external{svc, p, familyOf(vip), base, sets})
	}
	return ports
}

// families are the address families a Service may have a cluster IP of,
// each with the EndpointSlices that give it endpoints.
var families = []struct {
	ip     corev1.IPFamily
	slices discoveryv1.AddressType
}{{corev1.IPv4Protocol, discoveryv1.AddressTypeIPv4}, {corev1.IPv6Protocol, discoveryv1.AddressTypeIPv6}}

// sliceSet names the EndpointSlices of one Service and address type.
type sliceSet struct {
	service string // namespace/name
	family  discoveryv1.AddressType
}

// slicesByService groups the IPv4 and IPv6 EndpointSlices by their
// Service's namespace/name (the kubernetes.io/service-name label) and
// address type: a cluster IP takes the endpoints of its family's slices
// only, as kube-proxy's proxier of that family does.
func slicesByService(snap Snapshot) map[sliceSet][]*discoveryv1.EndpointSlice {
	out := map[sliceSet][]*discoveryv1.EndpointSlice{}
	for _, es := range snap.EndpointSlices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" || (es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		set := sliceSet{es.Namespace + "/" + name, es.AddressType}
		out[set] = append(out[set], es)
	}
	return out
}

// table collects the compiled entries. A frontend address:port/proto two
// Services claim (an externalIP one also uses, say) is the first's, in the
// snapshot's namespace/name order, as the API server lets such conflicts be.
type table struct {
	proxy      Proxying
	out        []services.Service
	seen       map[services.Key]bool
	clusterIPs map[netip.Addr]bool // no other frontend may use one
}

func (t *table) add(base services.Service, f services.Frontend, scope services.Scope, ip netip.Addr, port uint16, backends []services.Backend) *services.Service {
	s := base
	s.Frontend, s.Scope, s.VIP, s.Port, s.Backends = f, scope, ip, port, backends
	if t.seen[s.Key()] {
		return nil
	}
	t.seen[s.Key()] = true
	t.out = append(t.out, s)
	return &t.out[len(t.out)-1]
}

// external adds a port's frontends of its family for traffic from
// outside: NodePorts on the node's addresses of the family, externalIPs
// and load balancer IPs. Clients on this node reach them at the socket
// and get the cluster-wide backends (kube-proxy short-circuits pod and
// host traffic to them likewise); clients outside reach them on the
// uplink, where externalTrafficPolicy applies, if it translates the
// family (Unserved says so of the others).
func (t *table) external(e external, node Node) {
	svc, p, base, sets := e.svc, e.port, e.base, e.sets
	var frontends []struct {
		kind services.Frontend
		ip   netip.Addr
		port uint16
	}
	addAll := func(kind services.Frontend, port uint16, ips ...netip.Addr) {
		for _, ip := range ips {
			frontends = append(frontends, struct {
				kind services.Frontend
				ip   netip.Addr
				port uint16
			}{kind, ip, port})
		}
	}
	if hasNodePort(svc, p) {
		addAll(services.NodePort, uint16(p.NodePort), ofFamily(node.Addresses, e.family)...)
	}
	addAll(services.ExternalIP, uint16(p.Port), ipsOf(svc.Spec.ExternalIPs, e.family)...)
	addAll(services.LoadBalancer, uint16(p.Port), ipsOf(vipIngress(svc), e.family)...)
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	ranges := sourceRanges(svc, e.family)
	for _, f := range frontends {
		if t.clusterIPs[f.ip] {
			continue
		}
		t.add(base, f.kind, services.Socket, f.ip, f.port, sets.cluster)
		if !t.proxy.uplink(e.family) {
			continue
		}
		outside := t.add(base, f.kind, services.Uplink, f.ip, f.port, sets.cluster)
		if outside == nil {
			continue
		}
		if f.kind == services.LoadBalancer {
			outside.SourceRanges = ranges
		}
		if local {
			outside.Backends, outside.KeepClient = sets.local, true
			// Endpoints elsewhere only: dropped, as kube-proxy does, so that
			// the load balancer's health check steers clients away.
			outside.DropWhenEmpty = sets.local == nil && sets.any
		} else {
			outside.DSR = t.proxy.DSR
		}
	}
}

// hostPorts adds the pods' hostPorts, at the socket and on the uplink:
// served as the portmap plugin serves them, to the pod on this node, the
// client's address kept, on the node's addresses of the pod address's
// family (a dual-stack pod's hostPort is served in both). Like portmap,
// which matches local destinations only, a hostIP that is neither one of
// the node's addresses nor loopback is served nowhere: it could otherwise
// take any address from the node's clients. The uplink serves those of
// the families it translates.
func (t *table) hostPorts(node Node) {
	for _, hp := range node.HostPorts {
		proto, ok := protos[corev1.Protocol(strings.ToUpper(hp.Protocol))]
		if !ok {
			continue // the CNI server admits TCP and UDP only
		}
		family := familyOf(hp.Backend)
		addrs := ofFamily(node.Addresses, family)
		if hostIP := hp.HostIP.Unmap(); hostIP.IsValid() {
			// A hostIP of the other family is this backend's to serve
			// nowhere; an unspecified one is every node address of its
			// family. Loopback is the node's too: portmap serves it to the
			// node's own processes, so does the socket scope.
			switch {
			case familyOf(hostIP) != family:
				continue
			case hostIP.IsUnspecified():
			case !slices.Contains(node.Addresses, hostIP) && !hostIP.IsLoopback():
				continue
			default:
				addrs = []netip.Addr{hostIP}
			}
		}
		base := services.Service{Name: hp.Pod + ":" + strconv.Itoa(int(hp.HostPort)) + "/" + hp.Protocol, Proto: proto}
		be := []services.Backend{{Addr: netip.AddrPortFrom(hp.Backend, hp.ContainerPort), Pod: hp.Pod, Node: node.Name, Ready: true}}
		for _, ip := range addrs {
			t.add(base, services.HostPort, services.Socket, ip, hp.HostPort, be)
			if ip.IsLoopback() || !t.proxy.uplink(family) {
				continue // never on the wire, or not translated there
			}
			if outside := t.add(base, services.HostPort, services.Uplink, ip, hp.HostPort, be); outside != nil {
				outside.KeepClient = true
			}
		}
	}
}

// sourceRanges are the clients of family a load balancer IP of that
// family admits: spec.loadBalancerSourceRanges of the family; nil admits
// all. A Service that restricts its clients only in the other family
// admits none of this one (the unspecified address alone, which no
// client has): kube-proxy's proxier of the family would admit every one,
// leaving open what the Service's author meant to close.
func sourceRanges(svc *corev1.Service, family corev1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(s)
		if err == nil && familyOf(p.Addr()) == family && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	if len(out) == 0 && len(svc.Spec.LoadBalancerSourceRanges) > 0 {
		none := netip.IPv6Unspecified()
		if family == corev1.IPv4Protocol {
			none = netip.IPv4Unspecified()
		}
		return []netip.Prefix{netip.PrefixFrom(none, none.BitLen())}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

var protos = map[corev1.Protocol]services.Proto{corev1.ProtocolTCP: services.TCP, corev1.ProtocolUDP: services.UDP}

// UnservedPort is a Service port, or one of its frontends, nobody serves,
// and why.
type UnservedPort struct {
	Service *corev1.Service
	// Port is namespace/name:port-name/PROTO, followed for a frontend the
	// uplink does not translate by where: " on externalIP fd00::7", " on
	// load balancer IP fd00::8", " on NodePort 30080 of the node's IPv6
	// addresses".
	Port   string
	Reason string // one of the Unserved* reasons
}

// Why Unserved lists a port or frontend.
const (
	UnservedSCTP = "SCTP: this kernel has no SCTP sockets, and translating SCTP on the wire would break its checksum, which covers the addresses"

	UnservedIPv4Uplink = "served to this node's pods and processes at the socket, but this node's uplink does not translate IPv4 (it does with IPv4 pods over an IPv4 underlay): clients outside the cluster and on other nodes get no answer"
	UnservedIPv6Uplink = "served to this node's pods and processes at the socket, but this node's uplink does not translate IPv6 (it does where the cluster has IPv6 pods): clients outside the cluster and on other nodes get no answer"
)

// Unserved lists the Service ports and frontends nobody serves without
// kube-proxy: SCTP ports, which have no sockets on ONC's kernels to
// translate at, and whose checksum covers the addresses a translation on
// the wire would change; and the frontends of a family this node's uplink
// does not translate (proxy), which only the socket serves: of a Service
// with a cluster IP of that family (whose proxier kube-proxy would serve
// them in), its externalIPs and load balancer IPs of the family, and its
// NodePorts on the node's addresses of the family, if snap's Node lists
// any. Cluster IPs of both families are served.
func Unserved(snap Snapshot, proxy Proxying) []UnservedPort {
	var out []UnservedPort
	for _, svc := range snap.Services {
		_, has4 := clusterIP(svc, corev1.IPv4Protocol)
		_, has6 := clusterIP(svc, corev1.IPv6Protocol)
		for _, p := range svc.Spec.Ports {
			port := svc.Namespace + "/" + svc.Name + ":" + p.Name + "/" + string(p.Protocol)
			if p.Protocol == corev1.ProtocolSCTP {
				if has4 || has6 {
					out = append(out, UnservedPort{svc, port, UnservedSCTP})
				}
				continue
			}
			for _, family := range families {
				if _, has := clusterIP(svc, family.ip); !has || proxy.uplink(family.ip) {
					continue
				}
				reason := UnservedIPv4Uplink
				if family.ip == corev1.IPv6Protocol {
					reason = UnservedIPv6Uplink
				}
				for _, what := range externalFrontends(svc, family.ip) {
					out = append(out, UnservedPort{svc, port + " on " + what, reason})
				}
				if len(nodeAddresses(snap.Node, family.ip)) > 0 && hasNodePort(svc, p) {
					out = append(out, UnservedPort{svc, fmt.Sprintf("%s on NodePort %d of the node's %s addresses", port, p.NodePort, family.ip), reason})
				}
			}
		}
	}
	return out
}

// externalFrontends name a Service's externalIPs and (of a LoadBalancer,
// not in Proxy mode) load balancer IPs of family: "externalIP fd00::7",
// "load balancer IP fd00::8".
func externalFrontends(svc *corev1.Service, family corev1.IPFamily) []string {
	var out []string
	for _, ip := range ipsOf(svc.Spec.ExternalIPs, family) {
		out = append(out, "externalIP "+ip.String())
	}
	for _, ip := range ipsOf(vipIngress(svc), family) {
		out = append(out, "load balancer IP "+ip.String())
	}
	return out
}

// ipsOf are the addresses of family among the API's strings list, as
// parseIP reads them.
func ipsOf(list []string, family corev1.IPFamily) []netip.Addr {
	var out []netip.Addr
	for _, s := range list {
		if ip, ok := parseIP(s, family); ok {
			out = append(out, ip)
		}
	}
	return out
}

// vipIngress are a LoadBalancer Service's ingress IPs ONC may serve:
// not one in Proxy mode, whose load balancer sends its traffic to the
// NodePorts with its own address.
func vipIngress(svc *corev1.Service) []string {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return nil
	}
	var out []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if ptr.Deref(in.IPMode, corev1.LoadBalancerIPModeVIP) != corev1.LoadBalancerIPModeProxy {
			out = append(out, in.IP)
		}
	}
	return out
}

func hasNodePort(svc *corev1.Service, p corev1.ServicePort) bool {
	return p.NodePort != 0 && (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer)
}

// clusterIP is the Service's cluster IP of family, chosen as kube-proxy
// does (pkg/proxy/util: ShouldSkipService, GetClusterIPByFamily): none for
// an ExternalName Service, nor a headless one (its "None" does not parse).
func clusterIP(s *corev1.Service, family corev1.IPFamily) (netip.Addr, bool) {
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return netip.Addr{}, false
	}
	ip := ""
	if len(s.Spec.IPFamilies) == 0 { // written by an API server older than dual-stack
		ip = s.Spec.ClusterIP
	} else if i := slices.Index(s.Spec.IPFamilies, family); i >= 0 && i < len(s.Spec.ClusterIPs) {
		ip = s.Spec.ClusterIPs[i]
	}
	return parseIP(ip, family)
}

// parseIP parses an address of family as kube-proxy does: the API still
// accepts leading zeros in IPv4 fields ("010.0.0.1" is 10.0.0.1).
func parseIP(s string, family corev1.IPFamily) (netip.Addr, bool) {
	ip := utilnet.ParseIPSloppy(s)
	if ip4 := ip.To4(); ip4 != nil {
		return netip.AddrFrom4([4]byte(ip4)), family == corev1.IPv4Protocol
	}
	if ip == nil || family != corev1.IPv6Protocol {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16([16]byte(ip)), true
}

// familyOf is ip's address family.
func familyOf(ip netip.Addr) corev1.IPFamily {
	if ip.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// ofFamily are the addresses of family among addrs.
func ofFamily(addrs []netip.Addr, family corev1.IPFamily) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if familyOf(a) == family {
			out = append(out, a)
		}
	}
	return out
}

// nodeAddresses are the node's InternalIP and ExternalIP addresses of
// family, in its Node's order, each once.
func nodeAddresses(n *corev1.Node, family corev1.IPFamily) []netip.Addr {
	if n == nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, ok := parseIP(a.Address, family); ok && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
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

func internalLocal(s *corev1.Service) bool {
	return ptr.Deref(s.Spec.InternalTrafficPolicy, corev1.ServiceInternalTrafficPolicyCluster) == corev1.ServiceInternalTrafficPolicyLocal
}

// hintsApply: kube-proxy follows the EndpointSlice controller's hints
// unless the Service opts out of topology-aware routing by annotation;
// the controller writes them for trafficDistribution and for the
// annotation set to Auto, and clears them otherwise.
func hintsApply(s *corev1.Service) bool {
	for _, a := range []string{corev1.AnnotationTopologyMode, corev1.DeprecatedAnnotationTopologyAwareHints} {
		if v, ok := s.Annotations[a]; ok && (v == "Disabled" || v == "disabled") {
			return false
		}
	}
	return true
}

// portName is what matches a Service port to an EndpointSlice port.
type portName struct {
	name  string
	proto corev1.Protocol
}

type endpoint struct {
	services.Backend
	local, serving, terminating bool
	zones, nodes                []string // the EndpointSlice controller's hints
}

// endpoints are a Service's endpoints by port, as kube-proxy's
// EndpointSliceCache gathers them (pkg/proxy/endpointslicecache.go): the
// backend port is the slice port's number (how a named targetPort
// resolves, per pod), and an address:port in several slices counts once,
// the first seen unless a later one is on this node.
func endpoints(from []*discoveryv1.EndpointSlice, family corev1.IPFamily, node string) map[portName]map[netip.AddrPort]endpoint {
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
				ip, ok := parseIP(ep.Addresses[0], family)
				if !ok {
					continue
				}
				ready := ptr.Deref(ep.Conditions.Ready, true)
				e := endpoint{
					Backend: services.Backend{Addr: netip.AddrPortFrom(ip, uint16(*p.Port)), Node: ptr.Deref(ep.NodeName, ""), Ready: ready},
					local:   node != "" && ptr.Deref(ep.NodeName, "") == node,
					serving: ptr.Deref(ep.Conditions.Serving, true), terminating: ptr.Deref(ep.Conditions.Terminating, false),
				}
				if h := ep.Hints; h != nil {
					for _, z := range h.ForZones {
						e.zones = append(e.zones, z.Name)
					}
					for _, n := range h.ForNodes {
						e.nodes = append(e.nodes, n.Name)
					}
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

// endpointSets are a port's usable endpoints for each traffic policy, as
// kube-proxy's CategorizeEndpoints picks them (pkg/proxy/topology.go).
type endpointSets struct {
	// cluster: the ready endpoints (those the topology hints prefer for
	// this node or zone, when every ready one has hints and some name this
	// node or zone), else the serving terminating ones anywhere.
	cluster []services.Backend
	// local: this node's ready endpoints, else its serving terminating
	// ones; nil when it has neither.
	local []services.Backend
	// any: some endpoint is usable somewhere in the cluster.
	any bool
}

func categorize(eps map[netip.AddrPort]endpoint, node Node, hints bool) endpointSets {
	var s endpointSets
	pick := func(keep func(endpoint) bool) (out []services.Backend) {
		for _, e := range eps {
			if keep(e) {
				out = append(out, e.Backend)
			}
		}
		return out
	}
	prefer := func(endpoint) bool { return true }
	if hints {
		prefer = topology(eps, node)
	}
	s.cluster = pick(func(e endpoint) bool { return e.Ready && prefer(e) })
	if len(s.cluster) == 0 {
		s.cluster = pick(endpoint.fallback)
	}
	s.local = pick(func(e endpoint) bool { return e.local && e.Ready })
	if len(s.local) == 0 {
		s.local = pick(func(e endpoint) bool { return e.local && e.fallback() })
	}
	s.any = len(s.cluster) > 0
	return s
}

// topology is which ready endpoints the hints prefer on node: those hinted
// for it when every ready endpoint has node hints and one names it
// (trafficDistribution PreferSameNode), else those hinted for its zone when
// every ready endpoint has zone hints and one names it (PreferSameZone,
// PreferClose, topology-aware routing); otherwise all of them.
func topology(eps map[netip.AddrPort]endpoint, node Node) func(endpoint) bool {
	readyOnes, byNode, byZone := 0, true, true
	forNode, forZone := false, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		readyOnes++
		byNode = byNode && len(e.nodes) > 0
		byZone = byZone && len(e.zones) > 0
		forNode = forNode || slices.Contains(e.nodes, node.Name)
		forZone = forZone || (node.Zone != "" && slices.Contains(e.zones, node.Zone))
	}
	switch {
	case readyOnes > 0 && byNode && forNode:
		return func(e endpoint) bool { return slices.Contains(e.nodes, node.Name) }
	case readyOnes > 0 && byZone && forZone:
		return func(e endpoint) bool { return slices.Contains(e.zones, node.Zone) }
	}
	return func(endpoint) bool { return true }
}

// fallback: a serving, terminating endpoint is used when no endpoint is
// ready, so that connections still find a pod during a rollout.
func (e endpoint) fallback() bool { return e.serving && e.terminating }
