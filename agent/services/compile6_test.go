package services

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
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
		node    *Node // n1 unless set
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
		proxy:   Proxying{Replace: true, UplinkIPv4: true},
		want:    []services.Service{entry(services.ClusterIP, services.Socket, "10.96.0.10:80", here4), webWant6()},
	}, {
		name:    "none ready in IPv6: its serving terminating endpoints, while IPv4 has ready ones",
		service: web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6)),
		slices: []*discoveryv1.EndpointSlice{both4, slice6("web-6", "web", http,
			ep("fd00:10:244:2::1", "n2", servingTerm), ep("fd00:10:244:2::2", "n2", notReady))},
		want: []services.Service{webWant(here4, there4), webWant6(backend("fd00:10:244:2::1", 8080, "n2", false))},
	}, {
		name: "without kube-proxy each family's external frontends, with its endpoints; IPv6 ones at the socket only",
		service: withIngress(web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v6, v4), nodePort, func(s *corev1.ServiceSpec) {
			s.Type = corev1.ServiceTypeLoadBalancer
			s.ExternalIPs = []string{"203.0.113.7", "fd00::7"}
		}), "203.0.113.50", "fd00::50"),
		slices: []*discoveryv1.EndpointSlice{both4, both6},
		proxy:  Proxying{Replace: true, UplinkIPv4: true},
		node:   &Node{Name: "n1", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("fd00:192::1")}},
		want: []services.Service{
			entry(services.ClusterIP, services.Socket, "10.96.0.10:80", here4, there4),
			entry(services.NodePort, services.Socket, "192.0.2.1:30080", here4, there4),
			entry(services.NodePort, services.Uplink, "192.0.2.1:30080", here4, there4),
			entry(services.ExternalIP, services.Socket, "203.0.113.7:80", here4, there4),
			entry(services.ExternalIP, services.Uplink, "203.0.113.7:80", here4, there4),
			entry(services.LoadBalancer, services.Socket, "203.0.113.50:80", here4, there4),
			entry(services.LoadBalancer, services.Uplink, "203.0.113.50:80", here4, there4),
			entry(services.ClusterIP, services.Socket, "[fd00:10:96::10]:80", here6, there6),
			entry(services.NodePort, services.Socket, "[fd00:192::1]:30080", here6, there6),
			entry(services.ExternalIP, services.Socket, "[fd00::7]:80", here6, there6),
			entry(services.LoadBalancer, services.Socket, "[fd00::50]:80", here6, there6),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			node := n1
			if tc.node != nil {
				node = *tc.node
			}
			got := Compile(Snapshot{Services: []*corev1.Service{tc.service}, EndpointSlices: tc.slices}, node, tc.proxy)
			services.SortServices(tc.want)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// withIngress gives a LoadBalancer Service its ingress IPs.
func withIngress(svc *corev1.Service, ips ...string) *corev1.Service {
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return svc
}

// A hostPort is served in the family of the pod address it reaches, on
// the node's addresses of that family or its hostIP if of that family;
// an IPv4-mapped hostIP is the IPv4 address.
func TestCompileHostPortFamilies(t *testing.T) {
	node := Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("fd00:192::1")}}
	pod4, pod6 := netip.MustParseAddr("10.0.1.7"), netip.MustParseAddr("fd00:10:244:1::7")
	on := func(ip string, port uint16) ipam.PortMapping {
		pm := ipam.PortMapping{HostPort: port, ContainerPort: 80, Protocol: "tcp"}
		if ip != "" {
			pm.HostIP = netip.MustParseAddr(ip)
		}
		return pm
	}
	// A dual-stack pod's hostPorts are one per address (Self.of).
	both := func(pm ipam.PortMapping) []HostPort {
		return []HostPort{{Pod: "app/hp", Backend: pod4, PortMapping: pm}, {Pod: "app/hp", Backend: pod6, PortMapping: pm}}
	}
	node.HostPorts = slices.Concat(both(on("", 8080)), both(on("::1", 8081)), both(on("fd00:192::1", 8082)),
		both(on("::ffff:192.0.2.1", 8083)), both(on("fd00:9::9", 8084)), both(on("0.0.0.0", 8085)), both(on("::", 8086)))
	var got []string
	for _, s := range Compile(Snapshot{}, node, Proxying{Replace: true, UplinkIPv4: true}) {
		got = append(got, fmt.Sprintf("%s %s -> %s", s.Scope, netip.AddrPortFrom(s.VIP, s.Port), s.Backends[0].Addr.Addr()))
	}
	// Each on the node's addresses of the backend's family or its hostIP
	// of that family (an unspecified one: every address of its family
	// only); loopback at the socket only; the IPv4-mapped hostIP as IPv4;
	// a hostIP not the node's nowhere; IPv6 at the socket only.
	want := []string{
		"socket 192.0.2.1:8080 -> 10.0.1.7", "uplink 192.0.2.1:8080 -> 10.0.1.7", "socket 192.0.2.1:8083 -> 10.0.1.7", "uplink 192.0.2.1:8083 -> 10.0.1.7",
		"socket 192.0.2.1:8085 -> 10.0.1.7", "uplink 192.0.2.1:8085 -> 10.0.1.7",
		"socket [::1]:8081 -> fd00:10:244:1::7", "socket [fd00:192::1]:8080 -> fd00:10:244:1::7", "socket [fd00:192::1]:8082 -> fd00:10:244:1::7",
		"socket [fd00:192::1]:8086 -> fd00:10:244:1::7",
	}
	if slices.Sort(got); !reflect.DeepEqual(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(slices.Sorted(slices.Values(want)), "\n"))
	}
}

// With the uplink translating both families, each family's external
// frontends get uplink entries, with the loadBalancerSourceRanges of
// their family (ranges of the other family only admit no client of
// this one); direct server return in both.
func TestCompileUplinkPerFamily(t *testing.T) {
	svc := withIngress(web(withFamilies(corev1.IPFamilyPolicyRequireDualStack, v4, v6), nodePort, func(s *corev1.ServiceSpec) {
		s.Type = corev1.ServiceTypeLoadBalancer
		s.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8::/32", "::ffff:192.0.2.0/120"}
	}), "203.0.113.50", "fd00::50")
	here4, here6 := backend("10.0.1.1", 8080, "n1", true), backend("fd00:10:244:1::1", 8080, "n1", true)
	node := Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("fd00:192::1")}}
	snap := Snapshot{Services: []*corev1.Service{svc}, EndpointSlices: []*discoveryv1.EndpointSlice{
		slice("web-4", "web", http, ep("10.0.1.1", "n1", ready)), slice6("web-6", "web", http, ep("fd00:10:244:1::1", "n1", ready))}}
	uplink := map[string]services.Service{}
	for _, s := range Compile(snap, node, Proxying{Replace: true, DSR: true, UplinkIPv4: true, UplinkIPv6: true}) {
		if s.Scope == services.Uplink {
			uplink[fmt.Sprintf("%s %s", s.Frontend, netip.AddrPortFrom(s.VIP, s.Port))] = s
		}
	}
	for key, want := range map[string]struct {
		backend services.Backend
		ranges  string
		dsr     bool
	}{
		"NodePort 192.0.2.1:30080":     {here4, "[]", true},
		"NodePort [fd00:192::1]:30080": {here6, "[]", true},
		"LoadBalancer 203.0.113.50:80": {here4, "[198.51.100.0/24]", true},
		"LoadBalancer [fd00::50]:80":   {here6, "[2001:db8::/32]", true},
	} {
		s, ok := uplink[key]
		if !ok {
			t.Errorf("no uplink entry %s among %v", key, slices.Collect(maps.Keys(uplink)))
			continue
		}
		if len(s.Backends) != 1 || s.Backends[0] != want.backend || fmt.Sprint(s.SourceRanges) != want.ranges || s.DSR != want.dsr {
			t.Errorf("%s: backends %v, ranges %v, DSR %v; want %v, %s, %v", key, s.Backends, s.SourceRanges, s.DSR, want.backend, want.ranges, want.dsr)
		}
	}
	if len(uplink) != 4 {
		t.Errorf("%d uplink entries, want 4: %v", len(uplink), slices.Collect(maps.Keys(uplink)))
	}
	svc.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
	for _, s := range Compile(snap, node, Proxying{Replace: true, UplinkIPv4: true, UplinkIPv6: true}) {
		if s.Scope == services.Uplink && s.Frontend == services.LoadBalancer && s.VIP.Is6() && fmt.Sprint(s.SourceRanges) != "[::/128]" {
			t.Errorf("IPv4 ranges only: the IPv6 load balancer IP admits %v, want no client ([::/128])", s.SourceRanges)
		}
	}
}
