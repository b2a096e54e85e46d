package services

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/datapath/services"
)

// Each family of a Service compiles as the IPv4 one does, with the
// endpoints of its own family's EndpointSlices.

// slice6 is an IPv6 EndpointSlice of Service svc in namespace app.
func slice6(name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	es := slice(name, svc, ports, eps...)
	es.AddressType = discoveryv1.AddressTypeIPv6
	return es
}

// withFamilies sets web's cluster IPs: "10.96.0.10" and "fd00:10:96::10" in
// the order given, and the policy the API server allocated them by.
func withFamilies(policy corev1.IPFamilyPolicy, fams ...corev1.IPFamily) func(*corev1.ServiceSpec) {
	return func(s *corev1.ServiceSpec) {
		s.IPFamilyPolicy, s.IPFamilies, s.ClusterIPs = &policy, fams, nil
		for _, f := range fams {
			s.ClusterIPs = append(s.ClusterIPs, map[corev1.IPFamily]string{corev1.IPv4Protocol: "10.96.0.10", corev1.IPv6Protocol: "fd00:10:96::10"}[f])
		}
		s.ClusterIP = s.ClusterIPs[0]
	}
}

var (
	v4, v6 = corev1.IPv4Protocol, corev1.IPv6Protocol
	// both are web's endpoints in either family: one here, one on n2.
	both4 = slice("web-4", "web", http, ep("10.0.1.1", "n1", ready), ep("10.0.2.1", "n2", ready))
	both6 = slice6("web-6", "web", http, ep("fd00:10:244:1::1", "n1", ready), ep("fd00:10:244:2::1", "n2", ready))
)

// webWant6 is web's IPv6 cluster IP with these backends.
func webWant6(bs ...services.Backend) services.Service {
	s := webWant(bs...)
	s.VIP = netip.MustParseAddr("fd00:10:96::10")
	return s
}

func TestCompilePerFamily(t *testing.T) {
	here4, there4 := backend("10.0.1.1", 8080, "n1", true), backend("10.0.2.1", 8080, "n2", true)
	here6, there6 := backend("fd00:10:244:1::1", 8080, "n1", true), backend("fd00:10:244:2::1", 8080, "n2", true)
	sticky := func(s *corev1.ServiceSpec) { s.SessionAffinity = corev1.ServiceAffinityClientIP }
	for _, tc := range []struct {
		name    string
		service *corev1.Service
		slices  []*discoveryv1.EndpointSlice
		proxy   Proxying
		want    []services.Service
	}{{
		name:    "SingleStack IPv6: the IPv6 cluster IP with the IPv6 slices' endpoints only",
		service: web(withFamilies(corev1.IPFamilyPolicySingleStack, v6)),
		slices:  []*discoveryv1.EndpointSlice{both4, both6},
		want:    []services.Service{webWant6(here6, there6)},
	}, {
		name:    "PreferDualStack: each cluster IP with its family's endpoints",
		service: web(withFamilies(corev1.IPFamilyPolicyPreferDualStack, v4, v6)),
		slices:  []*discoveryv1.EndpointSlice{both4, both6},
		want:    []services.Service{webWant(here4, there4), webWant6(here6, there6)},
	}, {
		name:    "RequireDualStack, IPv6 first",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v6, v4)),
		slices:  []*discoveryv1.EndpointSlice{both6, both4},
		want:    []services.Service{webWant(here4, there4), webWant6(here6, there6)},
	}, {
		name:    "PreferDualStack in a single-stack IPv4 cluster: one cluster IP",
		service: web(withFamilies(corev1.IPFamilyPolicyPreferDualStack, v4)),
		slices:  []*discoveryv1.EndpointSlice{both4, both6},
		want:    []services.Service{webWant(here4, there4)},
	}, {
		name:    "dual-stack, IPv6 slices not written yet: the IPv6 cluster IP refuses",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6)),
		slices:  []*discoveryv1.EndpointSlice{both4},
		want:    []services.Service{webWant(here4, there4), webWant6()},
	}, {
		name:    "an address of the other family in a slice is no endpoint",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6)),
		slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", http, ep("fd00:10:244:1::9", "n1", ready), ep("10.0.2.1", "n2", ready)),
			slice6("web-6", "web", http, ep("10.0.1.9", "n1", ready), ep("fd00:10:244:2::1", "n2", ready))},
		want: []services.Service{webWant(there4), webWant6(there6)},
	}, {
		name:    "sessionAffinity ClientIP: both families",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6), sticky),
		slices:  []*discoveryv1.EndpointSlice{both4, both6},
		want: []services.Service{with(webWant(here4, there4), func(s *services.Service) { s.Affinity = 3 * time.Hour }),
			with(webWant6(here6, there6), func(s *services.Service) { s.Affinity = 3 * time.Hour })},
	}, {
		name:    "internalTrafficPolicy Local: this node's endpoints of each family",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6), local),
		slices:  []*discoveryv1.EndpointSlice{both4, both6},
		want:    []services.Service{webWant(here4), webWant6(here6)},
	}, {
		name:    "internalTrafficPolicy Local, IPv6 endpoints elsewhere only: left to kube-proxy beside it",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6), local),
		slices:  []*discoveryv1.EndpointSlice{both4, slice6("web-6", "web", http, ep("fd00:10:244:2::1", "n2", ready))},
		want:    []services.Service{webWant(here4)},
	}, {
		name:    "internalTrafficPolicy Local, IPv6 endpoints elsewhere only: refused without kube-proxy",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6), local),
		slices:  []*discoveryv1.EndpointSlice{both4, slice6("web-6", "web", http, ep("fd00:10:244:2::1", "n2", ready))},
		proxy:   Proxying{Replace: true},
		want:    []services.Service{entry(services.ClusterIP, services.Socket, "10.96.0.10:80", here4), webWant6()},
	}, {
		name:    "none ready in IPv6: its serving terminating endpoints, while IPv4 has ready ones",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6)),
		slices: []*discoveryv1.EndpointSlice{both4, slice6("web-6", "web", http,
			ep("fd00:10:244:2::1", "n2", servingTerm), ep("fd00:10:244:2::2", "n2", notReady))},
		want: []services.Service{webWant(here4, there4), webWant6(backend("fd00:10:244:2::1", 8080, "n2", false))},
	}, {
		name: "without kube-proxy the external frontends are IPv4's, with the IPv4 endpoints",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v6, v4), nodePort, func(s *corev1.ServiceSpec) {
			s.ExternalIPs = []string{"203.0.113.7", "fd00::7"}
		}),
		slices: []*discoveryv1.EndpointSlice{both4, both6},
		proxy:  Proxying{Replace: true},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", here4, there4),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080", here4, there4),
			entry(services.NodePort, services.Uplink, "192.0.2.1:30080", here4, there4),
			entry(services.NodePort, services.Socket, "198.51.100.1:30080", here4, there4),
			entry(services.NodePort, services.Uplink, "198.51.100.1:30080", here4, there4),
			entry(services.ExternalIP, services.Socket, "203.0.113.7:80", here4, there4),
			entry(services.ExternalIP, services.Uplink, "203.0.113.7:80", here4, there4),
			entry(services.ClusterIP, services.Socket, "[fd00:10:96::10]:80", here6, there6),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := Compile(Snapshot{Services: []*corev1.Service{tc.service}, EndpointSlices: tc.slices}, n1, tc.proxy)
			services.SortServices(tc.want)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// An IPv6 hostIP of a hostPort is served nowhere (hostPorts reach the
// pod's IPv4 address), nor is an IPv4-mapped one taken for another
// family's: it is the IPv4 address.
func TestCompileHostPortFamilies(t *testing.T) {
	node := n1
	pod := netip.MustParseAddr("10.0.1.7")
	on := func(ip string, port uint16) ipam.PortMapping {
		return ipam.PortMapping{HostPort: port, ContainerPort: 80, Protocol: "tcp", HostIP: netip.MustParseAddr(ip)}
	}
	node.HostPorts = []HostPort{{Pod: "app/hp", Backend: pod, PortMapping: on("::1", 8081)},
		{Pod: "app/hp", Backend: pod, PortMapping: on("fd00:192::1", 8082)}, {Pod: "app/hp", Backend: pod, PortMapping: on("::ffff:192.0.2.1", 8083)}}
	got := Compile(Snapshot{}, node, Proxying{Replace: true})
	if len(got) != 2 || got[0].VIP != netip.MustParseAddr("192.0.2.1") || got[0].Port != 8083 {
		t.Fatalf("got %+v, want port 8083 on 192.0.2.1 only (socket and uplink)", got)
	}
}
