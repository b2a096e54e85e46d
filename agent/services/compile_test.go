package services

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/datapath/services"
)

const ns = "app"

// web is the Service most cases use: 10.96.0.10:80/TCP, port "http".
func web(edit ...func(*corev1.ServiceSpec)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Ports: []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80)}}}
	for _, e := range edit {
		e(&s.Spec)
	}
	return s
}

func svcPort(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port}
}

func local(s *corev1.ServiceSpec) {
	s.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
}

// slice is an IPv4 EndpointSlice of Service svc in namespace app.
func slice(name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: ports, Endpoints: eps}
}

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

func slicePort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port}
}

// http is the port of web's EndpointSlices: "http" → 8080.
var http = ports(slicePort("http", corev1.ProtocolTCP, 8080))

// ep is an endpoint on node (none if "") of pod app/pod-<ip>.
func ep(ip, node string, c discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: c,
		TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "pod-" + ip}}
	if node != "" {
		e.NodeName = &node
	}
	return e
}

func conditions(ready, serving, terminating bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
}

var (
	ready          = conditions(true, true, false)
	notReady       = conditions(false, false, false)
	servingTerm    = conditions(false, true, true)
	notServingTerm = conditions(false, false, true)
)

func backend(ip string, port uint16, node string, ready bool) services.Backend {
	return services.Backend{Addr: netip.AddrPortFrom(netip.MustParseAddr(ip), port), Pod: ns + "/pod-" + ip, Node: node, Ready: ready}
}

// webWant is what web compiles to with these backends.
func webWant(bs ...services.Backend) services.Service {
	return services.Service{Name: "app/web:http", VIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: services.TCP, Backends: bs}
}

func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		want     []services.Service // on node n1
	}{{
		name:     "ready endpoints only, on every node",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.1.1", "n1", ready), ep("10.0.2.1", "n2", ready), ep("10.0.2.2", "n2", notReady), ep("10.0.2.3", "n2", servingTerm))},
		want: []services.Service{webWant(backend("10.0.1.1", 8080, "n1", true), backend("10.0.2.1", 8080, "n2", true))},
	}, {
		name:     "conditions unset: ready",
		services: []*corev1.Service{web()},
		slices:   []*discoveryv1.EndpointSlice{slice("web-1", "web", http, ep("10.0.2.1", "n2", discoveryv1.EndpointConditions{}))},
		want:     []services.Service{webWant(backend("10.0.2.1", 8080, "n2", true))},
	}, {
		name:     "ready and terminating is ready",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.2.1", "n2", conditions(true, true, true)), ep("10.0.2.2", "n2", servingTerm))},
		want: []services.Service{webWant(backend("10.0.2.1", 8080, "n2", true))},
	}, {
		name:     "none ready: serving terminating ones",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.2.1", "n2", servingTerm), ep("10.0.2.2", "n2", notServingTerm), ep("10.0.2.3", "n2", notReady),
			ep("10.0.2.4", "n2", discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true)}))},
		want: []services.Service{webWant(backend("10.0.2.1", 8080, "n2", false))},
	}, {
		name:     "serving unset is serving (as kube-proxy reads it): a not-ready terminating endpoint is the fallback",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.2.1", "n2", discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)}))},
		want: []services.Service{webWant(backend("10.0.2.1", 8080, "n2", false))},
	}, {
		name:     "no endpoints: refused",
		services: []*corev1.Service{web()},
		want:     []services.Service{webWant()},
	}, {
		name:     "Local: this node's endpoints only",
		services: []*corev1.Service{web(local)},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.1.1", "n1", ready), ep("10.0.1.2", "n1", servingTerm), ep("10.0.2.1", "n2", ready), ep("10.0.0.1", "", ready))},
		want: []services.Service{webWant(backend("10.0.1.1", 8080, "n1", true))},
	}, {
		name:     "Local: this node's serving terminating ones though others are ready",
		services: []*corev1.Service{web(local)},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.1.1", "n1", servingTerm), ep("10.0.1.2", "n1", notServingTerm), ep("10.0.2.1", "n2", ready))},
		want: []services.Service{webWant(backend("10.0.1.1", 8080, "n1", false))},
	}, {
		name:     "Local: endpoints elsewhere only: left to kube-proxy, which drops",
		services: []*corev1.Service{web(local)},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.2.1", "n2", ready), ep("10.0.1.1", "n1", notReady))},
	}, {
		name:     "Local: serving terminating ones elsewhere only: left to kube-proxy",
		services: []*corev1.Service{web(local)},
		slices:   []*discoveryv1.EndpointSlice{slice("web-1", "web", http, ep("10.0.2.1", "n2", servingTerm))},
	}, {
		name:     "Local: no usable endpoint anywhere: refused",
		services: []*corev1.Service{web(local)},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.2.1", "n2", notReady), ep("10.0.2.2", "n2", notServingTerm))},
		want: []services.Service{webWant()},
	}, {
		name: "affinity: the API's default timeout, and an explicit one",
		services: []*corev1.Service{
			web(func(s *corev1.ServiceSpec) { s.SessionAffinity = corev1.ServiceAffinityClientIP }),
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sticky"}, Spec: corev1.ServiceSpec{
				ClusterIP: "10.96.0.11", ClusterIPs: []string{"10.96.0.11"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
				Ports:           []corev1.ServicePort{svcPort("", corev1.ProtocolTCP, 80)},
				SessionAffinity: corev1.ServiceAffinityClientIP, SessionAffinityConfig: &corev1.SessionAffinityConfig{
					ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "none"}, Spec: corev1.ServiceSpec{
				ClusterIP: "10.96.0.12", ClusterIPs: []string{"10.96.0.12"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
				Ports: []corev1.ServicePort{svcPort("", corev1.ProtocolTCP, 80)}, SessionAffinity: corev1.ServiceAffinityNone}},
		},
		want: []services.Service{
			{Name: "app/web:http", VIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: services.TCP, Affinity: 3 * time.Hour},
			{Name: "app/sticky:", VIP: netip.MustParseAddr("10.96.0.11"), Port: 80, Proto: services.TCP, Affinity: time.Minute},
			{Name: "app/none:", VIP: netip.MustParseAddr("10.96.0.12"), Port: 80, Proto: services.TCP},
		},
	}, {
		name:     "named target port: each slice's own number",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{
			slice("web-1", "web", http, ep("10.0.2.1", "n2", ready)),
			slice("web-2", "web", ports(slicePort("http", corev1.ProtocolTCP, 9090)), ep("10.0.2.2", "n2", ready)),
		},
		want: []services.Service{webWant(backend("10.0.2.1", 8080, "n2", true), backend("10.0.2.2", 9090, "n2", true))},
	}, {
		name: "ports matched by name and protocol; TCP and UDP; SCTP left to kube-proxy",
		services: []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dns"}, Spec: corev1.ServiceSpec{
			ClusterIP: "10.96.0.53", ClusterIPs: []string{"10.96.0.53"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{svcPort("dns", corev1.ProtocolUDP, 53), svcPort("dns-tcp", corev1.ProtocolTCP, 53),
				svcPort("metrics", corev1.ProtocolTCP, 9153), svcPort("sctp", corev1.ProtocolSCTP, 53)}}}},
		slices: []*discoveryv1.EndpointSlice{slice("dns-1", "dns",
			ports(slicePort("dns", corev1.ProtocolTCP, 5353), slicePort("dns", corev1.ProtocolUDP, 1053),
				slicePort("dns-tcp", corev1.ProtocolTCP, 1053), slicePort("metrics", corev1.ProtocolTCP, 9153),
				slicePort("sctp", corev1.ProtocolSCTP, 53)),
			ep("10.0.2.1", "n2", ready))},
		want: []services.Service{
			{Name: "app/dns:dns-tcp", VIP: netip.MustParseAddr("10.96.0.53"), Port: 53, Proto: services.TCP,
				Backends: []services.Backend{backend("10.0.2.1", 1053, "n2", true)}},
			{Name: "app/dns:dns", VIP: netip.MustParseAddr("10.96.0.53"), Port: 53, Proto: services.UDP,
				Backends: []services.Backend{backend("10.0.2.1", 1053, "n2", true)}},
			{Name: "app/dns:metrics", VIP: netip.MustParseAddr("10.96.0.53"), Port: 9153, Proto: services.TCP,
				Backends: []services.Backend{backend("10.0.2.1", 9153, "n2", true)}},
		},
	}, {
		name: "unnamed port: a slice port named \"\"; one without a name or number is invalid",
		services: []*corev1.Service{web(func(s *corev1.ServiceSpec) {
			s.Ports = []corev1.ServicePort{svcPort("", corev1.ProtocolTCP, 80)}
		})},
		slices: []*discoveryv1.EndpointSlice{
			slice("web-1", "web", ports(slicePort("", corev1.ProtocolTCP, 8080)), ep("10.0.2.1", "n2", ready)),
			slice("web-2", "web", ports(discoveryv1.EndpointPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}), ep("10.0.2.2", "n2", ready)),
			slice("web-3", "web", ports(discoveryv1.EndpointPort{Name: ptr.To(""), Protocol: ptr.To(corev1.ProtocolTCP)}), ep("10.0.2.3", "n2", ready)),
			slice("web-4", "web", ports(slicePort("", corev1.ProtocolTCP, 0)), ep("10.0.2.4", "n2", ready)),
		},
		want: []services.Service{{Name: "app/web:", VIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: services.TCP,
			Backends: []services.Backend{backend("10.0.2.1", 8080, "n2", true)}}},
	}, {
		name: "not ours: headless, ExternalName; an IPv6 cluster IP takes no IPv4 slice's endpoints",
		services: []*corev1.Service{
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
				ClusterIPs: []string{corev1.ClusterIPNone}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Ports: web().Spec.Ports}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unset"}, Spec: corev1.ServiceSpec{Ports: web().Spec.Ports}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "external"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName,
				ExternalName: "example.com", ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Ports: web().Spec.Ports}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "v6"}, Spec: corev1.ServiceSpec{ClusterIP: "fd00::10",
				ClusterIPs: []string{"fd00::10"}, IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}, Ports: web().Spec.Ports}},
		},
		slices: []*discoveryv1.EndpointSlice{slice("headless-1", "headless", http, ep("10.0.2.1", "n2", ready)),
			slice("external-1", "external", http, ep("10.0.2.2", "n2", ready)), slice("v6-1", "v6", http, ep("10.0.2.3", "n2", ready))},
		want: []services.Service{{Name: "app/v6:http", VIP: netip.MustParseAddr("fd00::10"), Port: 80, Proto: services.TCP}},
	}, {
		name: "both of dual-stack cluster IPs; Services from before dual-stack, of either family",
		services: []*corev1.Service{
			web(func(s *corev1.ServiceSpec) {
				s.ClusterIP, s.ClusterIPs = "fd00::10", []string{"fd00::10", "10.96.0.10"}
				s.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
			}),
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "old"}, Spec: corev1.ServiceSpec{ClusterIP: "010.096.000.011",
				Ports: web().Spec.Ports}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "old6"}, Spec: corev1.ServiceSpec{ClusterIP: "fd00::11",
				Ports: web().Spec.Ports}},
		},
		want: []services.Service{webWant(),
			{Name: "app/old:http", VIP: netip.MustParseAddr("10.96.0.11"), Port: 80, Proto: services.TCP},
			{Name: "app/web:http", VIP: netip.MustParseAddr("fd00::10"), Port: 80, Proto: services.TCP},
			{Name: "app/old6:http", VIP: netip.MustParseAddr("fd00::11"), Port: 80, Proto: services.TCP}},
	}, {
		name:     "only EndpointSlices of the Service's family (IPv4), in its namespace",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{
			slice("web-1", "web", http, ep("10.0.2.1", "n2", ready)),
			slice("db-1", "db", http, ep("10.0.2.2", "n2", ready)),
			func() *discoveryv1.EndpointSlice {
				es := slice("web-2", "web", http, ep("fd00::1", "n2", ready))
				es.AddressType = discoveryv1.AddressTypeIPv6
				return es
			}(),
			func() *discoveryv1.EndpointSlice {
				es := slice("web-5", "web", http, ep("10.0.2.5", "n2", ready))
				es.AddressType = discoveryv1.AddressTypeFQDN
				return es
			}(),
			func() *discoveryv1.EndpointSlice {
				es := slice("web-3", "web", http, ep("10.0.2.3", "n2", ready))
				es.Namespace = "other"
				return es
			}(),
			func() *discoveryv1.EndpointSlice {
				es := slice("web-4", "web", http, ep("10.0.2.4", "n2", ready))
				es.Labels = nil
				return es
			}(),
		},
		want: []services.Service{webWant(backend("10.0.2.1", 8080, "n2", true))},
	}, {
		name:     "an address:port in several slices counts once: the first, unless a later one is here",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{
			slice("web-1", "web", http, ep("10.0.2.1", "n2", ready), ep("10.0.3.1", "n3", notReady)),
			slice("web-2", "web", http, ep("10.0.2.1", "n3", notReady), ep("10.0.3.1", "n1", ready)),
			// The same address behind another port number is another backend.
			slice("web-3", "web", ports(slicePort("http", corev1.ProtocolTCP, 9090)), ep("10.0.2.1", "n2", ready)),
		},
		want: []services.Service{webWant(backend("10.0.2.1", 8080, "n2", true), backend("10.0.2.1", 9090, "n2", true),
			backend("10.0.3.1", 8080, "n1", true))},
	}, {
		name:     "a backend's pod is its Pod targetRef",
		services: []*corev1.Service{web()},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			discoveryv1.Endpoint{Addresses: []string{"10.0.2.1"}, TargetRef: &corev1.ObjectReference{Kind: "Node", Name: "n2"}},
			discoveryv1.Endpoint{Addresses: []string{"10.0.2.2"}})},
		want: []services.Service{webWant(
			services.Backend{Addr: netip.MustParseAddrPort("10.0.2.1:8080"), Ready: true},
			services.Backend{Addr: netip.MustParseAddrPort("10.0.2.2:8080"), Ready: true})},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := Compile(Snapshot{Services: tc.services, EndpointSlices: tc.slices}, Node{Name: "n1"}, Proxying{})
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// The same snapshot gives the same table, whatever the order of the
// Services and of the maps Compile goes through.
func TestCompileDeterministic(t *testing.T) {
	var svcs []*corev1.Service
	var ess []*discoveryv1.EndpointSlice
	for _, name := range []string{"a", "b", "c", "d"} {
		ip := fmt.Sprintf("10.96.1.%d", len(svcs)+1)
		svcs = append(svcs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{
			ClusterIP: ip, ClusterIPs: []string{ip}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80), svcPort("dns", corev1.ProtocolUDP, 53)}}})
		ess = append(ess, slice(name+"-1", name, ports(slicePort("http", corev1.ProtocolTCP, 8080), slicePort("dns", corev1.ProtocolUDP, 53)),
			ep("10.0.2.9", "n2", ready), ep("10.0.1.5", "n1", ready), ep("10.0.3.7", "n3", servingTerm), ep("10.0.2.1", "n2", ready)))
	}
	first := Compile(Snapshot{Services: svcs, EndpointSlices: ess}, Node{Name: "n1"}, Proxying{})
	if len(first) != 8 || len(first[0].Backends) != 3 {
		t.Fatalf("not the table meant: %+v", first)
	}
	reversed := slices.Clone(svcs)
	slices.Reverse(reversed)
	for range 20 {
		if got := Compile(Snapshot{Services: reversed, EndpointSlices: ess}, Node{Name: "n1"}, Proxying{}); !reflect.DeepEqual(got, first) {
			t.Fatalf("got\n%+v\nthen\n%+v", first, got)
		}
	}
}

// n1 is the node the replacement cases compile for: two addresses.
var n1 = Node{Name: "n1", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1")}}

func nodePort(s *corev1.ServiceSpec) {
	s.Type = corev1.ServiceTypeNodePort
	s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	s.Ports[0].NodePort = 30080
}

func externalLocal(s *corev1.ServiceSpec) {
	s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}

// entry is web's port at a frontend.
func entry(f services.Frontend, scope services.Scope, addr string, bs ...services.Backend) services.Service {
	ap := netip.MustParseAddrPort(addr)
	return services.Service{Name: "app/web:http", Frontend: f, Scope: scope, VIP: ap.Addr(), Port: ap.Port(), Proto: services.TCP, Backends: bs}
}

func with(s services.Service, edit func(*services.Service)) services.Service {
	edit(&s)
	return s
}

func TestCompileWithoutKubeProxy(t *testing.T) {
	here, there := backend("10.0.1.1", 8080, "n1", true), backend("10.0.2.1", 8080, "n2", true)
	both := slice("web-1", "web", http, ep("10.0.1.1", "n1", ready), ep("10.0.2.1", "n2", ready))
	thereOnly := slice("web-1", "web", http, ep("10.0.2.1", "n2", ready))
	keep := func(s *services.Service) { s.KeepClient = true }
	for _, tc := range []struct {
		name     string
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		want     []services.Service
	}{{
		name:     "NodePort: on every node address, at the socket and on the uplink",
		services: []*corev1.Service{web(nodePort)},
		slices:   []*discoveryv1.EndpointSlice{both},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", here, there),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080", here, there),
			entry(services.NodePort, services.Uplink, "192.0.2.1:30080", here, there),
			entry(services.NodePort, services.Socket, "198.51.100.1:30080", here, there),
			entry(services.NodePort, services.Uplink, "198.51.100.1:30080", here, there),
		},
	}, {
		name:     "externalTrafficPolicy Local: outside clients get this node's endpoints and keep their address; this node's get all",
		services: []*corev1.Service{web(nodePort, externalLocal)},
		slices:   []*discoveryv1.EndpointSlice{both},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", here, there),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080", here, there),
			with(entry(services.NodePort, services.Uplink, "192.0.2.1:30080", here), keep),
			entry(services.NodePort, services.Socket, "198.51.100.1:30080", here, there),
			with(entry(services.NodePort, services.Uplink, "198.51.100.1:30080", here), keep),
		},
	}, {
		name:     "externalTrafficPolicy Local, endpoints elsewhere only: outside clients dropped",
		services: []*corev1.Service{web(nodePort, externalLocal, func(s *corev1.ServiceSpec) { s.Type = corev1.ServiceTypeLoadBalancer })},
		slices:   []*discoveryv1.EndpointSlice{thereOnly},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", there),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080", there),
			with(entry(services.NodePort, services.Uplink, "192.0.2.1:30080"), func(s *services.Service) { s.KeepClient, s.DropWhenEmpty = true, true }),
			entry(services.NodePort, services.Socket, "198.51.100.1:30080", there),
			with(entry(services.NodePort, services.Uplink, "198.51.100.1:30080"), func(s *services.Service) { s.KeepClient, s.DropWhenEmpty = true, true }),
		},
	}, {
		name:     "externalTrafficPolicy Local, no endpoints anywhere: refused, not dropped",
		services: []*corev1.Service{web(nodePort, externalLocal)},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80"),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080"),
			with(entry(services.NodePort, services.Uplink, "192.0.2.1:30080"), keep),
			entry(services.NodePort, services.Socket, "198.51.100.1:30080"),
			with(entry(services.NodePort, services.Uplink, "198.51.100.1:30080"), keep),
		},
	}, {
		name: "externalIPs of a ClusterIP Service; the first Service claiming a frontend keeps it",
		services: []*corev1.Service{
			web(func(s *corev1.ServiceSpec) { s.ExternalIPs = []string{"203.0.113.7", "fd00::7"} }),
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "zz"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.99",
				ClusterIPs: []string{"10.96.0.99"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
				Ports: web().Spec.Ports, ExternalIPs: []string{"203.0.113.7"}}},
		},
		slices: []*discoveryv1.EndpointSlice{thereOnly},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", there),
			{Name: "app/zz:http", VIP: netip.MustParseAddr("10.96.0.99"), Port: 80, Proto: services.TCP},
			entry(services.ExternalIP, services.Socket, "203.0.113.7:80", there),
			entry(services.ExternalIP, services.Uplink, "203.0.113.7:80", there),
		},
	}, {
		name: "LoadBalancer: its VIP-mode ingress IPs, source ranges on the uplink",
		services: []*corev1.Service{func() *corev1.Service {
			s := web(nodePort, func(s *corev1.ServiceSpec) {
				s.Type = corev1.ServiceTypeLoadBalancer
				s.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "198.51.100.7/32", "203.0.113.9/24", "fd00::/8"}
			})
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.50"},
				{IP: "203.0.113.51", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example.com"}}
			return s
		}()},
		slices: []*discoveryv1.EndpointSlice{thereOnly},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", there),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080", there),
			entry(services.NodePort, services.Uplink, "192.0.2.1:30080", there),
			entry(services.NodePort, services.Socket, "198.51.100.1:30080", there),
			entry(services.NodePort, services.Uplink, "198.51.100.1:30080", there),
			entry(services.LoadBalancer, services.Socket, "203.0.113.50:80", there),
			with(entry(services.LoadBalancer, services.Uplink, "203.0.113.50:80", there), func(s *services.Service) {
				s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32"), netip.MustParsePrefix("203.0.113.0/24")}
			}),
		},
	}, {
		name:     "a ClusterIP Service's node port field is not served",
		services: []*corev1.Service{web(func(s *corev1.ServiceSpec) { s.Ports[0].NodePort = 30080 })},
		slices:   []*discoveryv1.EndpointSlice{thereOnly},
		want:     []services.Service{entry(services.ClusterIP, services.Socket, "10.96.0.10:80", there)},
	}, {
		name:     "internalTrafficPolicy Local, endpoints elsewhere only: refused at the socket (no kube-proxy to drop)",
		services: []*corev1.Service{web(local)},
		slices:   []*discoveryv1.EndpointSlice{thereOnly},
		want:     []services.Service{entry(services.ClusterIP, services.Socket, "10.96.0.10:80")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := Compile(Snapshot{Services: tc.services, EndpointSlices: tc.slices}, n1, Proxying{Replace: true, UplinkIPv4: true})
			services.SortServices(tc.want)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// With DSR, every uplink entry of externalTrafficPolicy Cluster sends its
// remote backends the client (the datapath picks DSR per flow, for pods on
// another node only), and nothing else changes: a Local one keeps the
// client already, and socket entries never leave the node's sockets.
func TestCompileDSR(t *testing.T) {
	both := slice("web-1", "web", http, ep("10.0.1.1", "n1", ready), ep("10.0.2.1", "n2", ready))
	for _, tc := range []struct {
		name    string
		service *corev1.Service
		dsr     int // uplink entries with DSR
	}{
		{"externalTrafficPolicy Cluster: NodePorts and externalIPs", web(nodePort, func(s *corev1.ServiceSpec) { s.ExternalIPs = []string{"203.0.113.7"} }), 3},
		{"externalTrafficPolicy Local", web(nodePort, externalLocal), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := Snapshot{Services: []*corev1.Service{tc.service}, EndpointSlices: []*discoveryv1.EndpointSlice{both}}
			want := Compile(snap, n1, Proxying{Replace: true, UplinkIPv4: true})
			n := 0
			for i, s := range want {
				if s.Scope == services.Uplink && !s.KeepClient {
					want[i].DSR = true
					n++
				}
			}
			if n != tc.dsr {
				t.Fatalf("%d uplink entries without KeepClient, want %d", n, tc.dsr)
			}
			if got := Compile(snap, n1, Proxying{Replace: true, UplinkIPv4: true, DSR: true}); !reflect.DeepEqual(got, want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// A node whose uplink does not translate IPv4 (IPv4 pods over an IPv6
// underlay) gets the same socket entries and no uplink ones.
func TestCompileWithoutTheUplink(t *testing.T) {
	snap := Snapshot{Services: []*corev1.Service{web(nodePort, func(s *corev1.ServiceSpec) { s.ExternalIPs = []string{"203.0.113.7"} })},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http, ep("10.0.1.1", "n1", ready))}}
	with := Compile(snap, n1, Proxying{Replace: true, UplinkIPv4: true})
	without := Compile(snap, n1, Proxying{Replace: true})
	socket := slices.DeleteFunc(slices.Clone(with), func(s services.Service) bool { return s.Scope == services.Uplink })
	if len(socket) == len(with) || !reflect.DeepEqual(without, socket) {
		t.Fatalf("without the uplink\n%+v\nwant the socket entries of\n%+v", without, with)
	}
}

// Topology hints narrow the cluster-wide endpoints as kube-proxy narrows
// them, for ClusterIPs with kube-proxy present too.
func TestCompileTopology(t *testing.T) {
	hinted := func(ip, node string, zones, nodes []string) discoveryv1.Endpoint {
		e := ep(ip, node, ready)
		e.Hints = &discoveryv1.EndpointHints{}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
		return e
	}
	a, b, c := backend("10.0.1.1", 8080, "n1", true), backend("10.0.2.1", 8080, "n2", true), backend("10.0.3.1", 8080, "n3", true)
	for _, tc := range []struct {
		name string
		eps  []discoveryv1.Endpoint
		node Node
		edit func(*corev1.Service)
		want []services.Backend
	}{{
		name: "every ready endpoint hinted by zone: this zone's",
		eps:  []discoveryv1.Endpoint{hinted("10.0.1.1", "n1", []string{"z1"}, nil), hinted("10.0.2.1", "n2", []string{"z1"}, nil), hinted("10.0.3.1", "n3", []string{"z2"}, nil)},
		node: n1, want: []services.Backend{a, b},
	}, {
		name: "one ready endpoint without hints: all",
		eps:  []discoveryv1.Endpoint{hinted("10.0.1.1", "n1", []string{"z1"}, nil), ep("10.0.3.1", "n3", ready)},
		node: n1, want: []services.Backend{a, c},
	}, {
		name: "no endpoint hinted for this zone: all",
		eps:  []discoveryv1.Endpoint{hinted("10.0.2.1", "n2", []string{"z2"}, nil), hinted("10.0.3.1", "n3", []string{"z3"}, nil)},
		node: n1, want: []services.Backend{b, c},
	}, {
		name: "a node without a zone label: all",
		eps:  []discoveryv1.Endpoint{hinted("10.0.1.1", "n1", []string{"z1"}, nil), hinted("10.0.3.1", "n3", []string{"z2"}, nil)},
		node: Node{Name: "n1"}, want: []services.Backend{a, c},
	}, {
		name: "every ready endpoint hinted by node (PreferSameNode): this node's first",
		eps:  []discoveryv1.Endpoint{hinted("10.0.1.1", "n1", []string{"z1"}, []string{"n1"}), hinted("10.0.2.1", "n2", []string{"z1"}, []string{"n2"})},
		node: n1, want: []services.Backend{a},
	}, {
		name: "hints, but routing opted out by annotation: all",
		eps:  []discoveryv1.Endpoint{hinted("10.0.1.1", "n1", []string{"z1"}, nil), hinted("10.0.3.1", "n3", []string{"z2"}, nil)},
		node: n1, edit: func(s *corev1.Service) { s.Annotations = map[string]string{corev1.AnnotationTopologyMode: "Disabled"} },
		want: []services.Backend{a, c},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := web()
			if tc.edit != nil {
				tc.edit(svc)
			}
			got := Compile(Snapshot{Services: []*corev1.Service{svc}, EndpointSlices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http, tc.eps...)}}, tc.node, Proxying{})
			if want := []services.Service{webWant(tc.want...)}; !reflect.DeepEqual(got, want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// Without kube-proxy nothing serves an SCTP port, nor, of a Service with an
// IPv6 cluster IP, the IPv6 frontends on the uplink: its IPv6 externalIPs
// and load balancer IPs, and its NodePorts on the node's IPv6 addresses,
// which the socket alone serves. Each is listed with its own reason. The
// cluster IPs of both families are served: a dual-stack, an IPv6-only and
// an IPv6-primary Service list nothing else and compile to an entry per
// cluster IP.
func TestUnserved(t *testing.T) {
	sctp := func(s *corev1.ServiceSpec) { s.Ports = append(s.Ports, svcPort("assoc", corev1.ProtocolSCTP, 9999)) }
	svc := web(sctp)
	dual := web(sctp, func(s *corev1.ServiceSpec) {
		s.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		s.ClusterIPs = []string{s.ClusterIP, "fd00:10:96::10"}
	})
	dual.Name = "dual"
	v6only := web(func(s *corev1.ServiceSpec) {
		s.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		s.ClusterIP, s.ClusterIPs = "fd00:10:96::11", []string{"fd00:10:96::11"}
	})
	v6only.Name = "v6only"
	v6first := web(func(s *corev1.ServiceSpec) { // IPv6 the primary family
		s.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
		s.ClusterIP, s.ClusterIPs = "fd00:10:96::12", []string{"fd00:10:96::12", "10.96.0.12"}
	})
	v6first.Name = "v6first"
	ext := web(nodePort, func(s *corev1.ServiceSpec) {
		s.Type = corev1.ServiceTypeLoadBalancer
		s.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		s.ClusterIP, s.ClusterIPs = "10.96.0.13", []string{"10.96.0.13", "fd00:10:96::13"}
		s.ExternalIPs = []string{"203.0.113.7", "fd00::7"}
	})
	ext.Name = "ext"
	ext.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.50"}, {IP: "fd00::50"},
		{IP: "fd00::51", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
	// An IPv4-only Service's IPv6 externalIP is no family of its: not
	// served by kube-proxy either.
	v4ext := web(func(s *corev1.ServiceSpec) { s.ExternalIPs = []string{"fd00::8"} })
	v4ext.Name = "v4ext"
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}, {Type: corev1.NodeInternalIP, Address: "fd00:192::1"}}}}
	all := []*corev1.Service{svc, dual, v6only, v6first, ext, v4ext}
	reasons := map[string]string{UnservedSCTP: "sctp", UnservedIPv4Uplink: "ipv4", UnservedIPv6Uplink: "ipv6"}
	lines := func(got []UnservedPort) (out []string) {
		for _, p := range got {
			out = append(out, p.Port+" "+reasons[p.Reason])
		}
		return out
	}
	ipv4Uplink := Proxying{Replace: true, UplinkIPv4: true}
	got := Unserved(Snapshot{Services: all, Node: node}, ipv4Uplink)
	want := []string{"app/web:assoc/SCTP sctp", "app/dual:assoc/SCTP sctp",
		"app/ext:http/TCP on externalIP fd00::7 ipv6", "app/ext:http/TCP on load balancer IP fd00::50 ipv6",
		"app/ext:http/TCP on NodePort 30080 of the node's IPv6 addresses ipv6"}
	if l := lines(got); !reflect.DeepEqual(l, want) || got[0].Service != svc || got[4].Service != ext {
		t.Errorf("got %v, want %v", l, want)
	}
	// A node without IPv6 addresses has no NodePort to serve in IPv6.
	if l := lines(Unserved(Snapshot{Services: all}, ipv4Uplink)); !reflect.DeepEqual(l, want[:4]) {
		t.Errorf("without a Node: got %v, want %v", l, want[:4])
	}
	// An uplink that translates neither family (IPv4 pods over an IPv6
	// underlay): the IPv4 frontends too; one that translates both: SCTP only.
	want4 := []string{"app/web:assoc/SCTP sctp", "app/dual:assoc/SCTP sctp",
		"app/ext:http/TCP on externalIP 203.0.113.7 ipv4", "app/ext:http/TCP on load balancer IP 203.0.113.50 ipv4",
		"app/ext:http/TCP on NodePort 30080 of the node's IPv4 addresses ipv4", want[2], want[3], want[4]}
	if l := lines(Unserved(Snapshot{Services: all, Node: node}, Proxying{Replace: true})); !reflect.DeepEqual(l, want4) {
		t.Errorf("no uplink: got %v, want %v", l, want4)
	}
	if l := lines(Unserved(Snapshot{Services: all, Node: node}, Proxying{Replace: true, UplinkIPv4: true, UplinkIPv6: true})); !reflect.DeepEqual(l, want[:2]) {
		t.Errorf("both families on the uplink: got %v, want %v", l, want[:2])
	}
	// Every cluster IP of both families is compiled.
	compiled := map[netip.Addr]bool{}
	for _, c := range Compile(Snapshot{Services: all}, n1, Proxying{Replace: true, UplinkIPv4: true}) {
		compiled[c.VIP] = true
	}
	for _, s := range all {
		for _, ip := range s.Spec.ClusterIPs {
			if !compiled[netip.MustParseAddr(ip)] {
				t.Errorf("cluster IP %s of %s is not compiled", ip, s.Name)
			}
		}
	}
	// The IPv6 ones listed are served at the socket; an IPv4-only
	// Service's IPv6 externalIP nowhere.
	for _, c := range Compile(Snapshot{Services: all}, n1, Proxying{Replace: true, UplinkIPv4: true}) {
		if ip := c.VIP.String(); (ip == "fd00::7" || ip == "fd00::50") && c.Scope != services.Socket || ip == "fd00::8" {
			t.Errorf("%s compiled for the %s", ip, c.Scope)
		}
		compiled[c.VIP] = true
	}
	if !compiled[netip.MustParseAddr("fd00::7")] || !compiled[netip.MustParseAddr("fd00::50")] {
		t.Error("an IPv6 externalIP or load balancer IP is not served at the socket")
	}
}

// hostPorts: each pod's, on every node address or its hostIP, at the
// socket and on the uplink (the client kept: the pod is here), on
// loopback at the socket only; one that takes a NodePort's port wins it,
// as the portmap chain comes first.
func TestCompileHostPorts(t *testing.T) {
	node := n1
	pod := netip.MustParseAddr("10.0.1.7")
	node.HostPorts = []HostPort{
		{Pod: "app/hp", Backend: pod, PortMapping: ipam.PortMapping{HostPort: 30080, ContainerPort: 80, Protocol: "tcp"}},
		{Pod: "app/hp", Backend: pod, PortMapping: ipam.PortMapping{HostPort: 5353, ContainerPort: 53, Protocol: "udp",
			HostIP: netip.MustParseAddr("198.51.100.1")}},
		{Pod: "app/hp", Backend: pod, PortMapping: ipam.PortMapping{HostPort: 54323, ContainerPort: 80, Protocol: "tcp",
			HostIP: netip.MustParseAddr("127.0.0.1")}},
	}
	got := Compile(Snapshot{Services: []*corev1.Service{web(nodePort)}}, node, Proxying{Replace: true, UplinkIPv4: true})
	be := func(port uint16) []services.Backend {
		return []services.Backend{{Addr: netip.AddrPortFrom(pod, port), Pod: "app/hp", Node: "n1", Ready: true}}
	}
	hp := func(scope services.Scope, addr string, proto services.Proto, port uint16) services.Service {
		ap := netip.MustParseAddrPort(addr)
		name := "app/hp:" + fmt.Sprint(ap.Port()) + "/" + map[services.Proto]string{services.TCP: "tcp", services.UDP: "udp"}[proto]
		return services.Service{Name: name, Frontend: services.HostPort, Scope: scope, VIP: ap.Addr(), Port: ap.Port(), Proto: proto,
			Backends: be(port), KeepClient: scope == services.Uplink}
	}
	want := []services.Service{
		entry(services.ClusterIP, services.Socket, "10.96.0.10:80"),
		hp(services.Socket, "192.0.2.1:30080", services.TCP, 80), hp(services.Uplink, "192.0.2.1:30080", services.TCP, 80),
		hp(services.Socket, "198.51.100.1:30080", services.TCP, 80), hp(services.Uplink, "198.51.100.1:30080", services.TCP, 80),
		hp(services.Socket, "198.51.100.1:5353", services.UDP, 53), hp(services.Uplink, "198.51.100.1:5353", services.UDP, 53),
		hp(services.Socket, "127.0.0.1:54323", services.TCP, 80), // loopback: the node's own clients only
	}
	services.SortServices(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
	}
}

// No externalIP and no hostPort takes a ClusterIP, whatever the order of
// the Services (CVE-2020-8554), and a hostPort on an address that is not
// the node's is served nowhere (portmap matches local addresses only).
func TestCompileClaimsNoClusterIP(t *testing.T) {
	node := n1
	node.HostPorts = []HostPort{
		{Pod: "a/evil", Backend: netip.MustParseAddr("10.0.1.66"), PortMapping: ipam.PortMapping{HostPort: 80, ContainerPort: 80, Protocol: "tcp",
			HostIP: netip.MustParseAddr("10.96.0.10")}},
		{Pod: "a/evil", Backend: netip.MustParseAddr("10.0.1.66"), PortMapping: ipam.PortMapping{HostPort: 5432, ContainerPort: 5432, Protocol: "tcp",
			HostIP: netip.MustParseAddr("203.0.113.99")}},
	}
	thief := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "thief"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.66",
		ClusterIPs: []string{"10.96.0.66"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Ports: web().Spec.Ports,
		ExternalIPs: []string{"10.96.0.10"}}}
	for _, order := range [][]*corev1.Service{{thief, web()}, {web(), thief}} {
		got := Compile(Snapshot{Services: order}, node, Proxying{Replace: true, UplinkIPv4: true})
		want := []services.Service{entry(services.ClusterIP, services.Socket, "10.96.0.10:80"),
			{Name: "a/thief:http", VIP: netip.MustParseAddr("10.96.0.66"), Port: 80, Proto: services.TCP}}
		services.SortServices(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got\n%+v\nwant\n%+v", got, want)
		}
	}
}
