package services

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// warned records the events a watcher records.
type warned struct {
	sources
	events []string // reason: message
}

func (w *warned) Warn(_ *corev1.Service, reason, message string) {
	w.events = append(w.events, reason+": "+message)
}

// Without kube-proxy each port or frontend nobody serves is evented once
// while it lasts, SCTP as ProtocolNotSupported and an IPv6 frontend of the
// uplink as IPFamilyNotSupported, each with its own reason; an IPv6
// cluster IP is served, so it is evented as nothing. Beside kube-proxy
// nothing is.
func TestUnservedEvents(t *testing.T) {
	svc := web(nodePort, func(s *corev1.ServiceSpec) {
		s.Ports = append(s.Ports, svcPort("assoc", corev1.ProtocolSCTP, 9999))
		s.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		s.ClusterIPs = []string{s.ClusterIP, "fd00:10:96::10"}
		s.ExternalIPs = []string{"fd00::7"}
	})
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "fd00:192::1"}}}}
	snap := Snapshot{Services: []*corev1.Service{svc}, Node: node}
	in := &warned{}
	w := &Watcher{inputs: in, node: Self{Name: "n1", KubeProxyReplacement: true}}
	proxy := Proxying{Replace: true, UplinkIPv4: true}
	w.reportUnserved(snap, proxy)
	w.reportUnserved(snap, proxy)
	want := []string{
		"IPFamilyNotSupported: port app/web:http/TCP on externalIP fd00::7 is not served by ONC on node n1: " + UnservedIPv6Uplink,
		"IPFamilyNotSupported: port app/web:http/TCP on NodePort 30080 of the node's IPv6 addresses is not served by ONC on node n1: " + UnservedIPv6Uplink,
		"ProtocolNotSupported: port app/web:assoc/SCTP is not served by ONC on node n1: " + UnservedSCTP,
	}
	if strings.Join(in.events, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(in.events, "\n"), strings.Join(want, "\n"))
	}
	if len(w.unserved) != 3 {
		t.Fatalf("onctl lists %q, want 3 lines", w.unserved)
	}

	beside := &warned{}
	w = &Watcher{inputs: beside, node: Self{Name: "n1"}}
	w.reportUnserved(snap, Proxying{})
	if len(beside.events) != 0 || len(w.unserved) != 0 {
		t.Fatalf("beside kube-proxy: events %q, listed %q", beside.events, w.unserved)
	}
}

// The node's NodePort and hostPort addresses: its tunnel endpoint, of
// either family, and the InternalIPs of its Node of both families, once
// each, sorted.
func TestNodeAddressesOfEitherUnderlay(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.0.2.9"}, {Type: corev1.NodeInternalIP, Address: "fd00:172::9"}}}}
	for _, c := range []struct {
		ip   string
		want string
	}{{"fd00:172::9", "[192.0.2.9 fd00:172::9]"}, {"192.0.2.1", "[192.0.2.1 192.0.2.9 fd00:172::9]"}} {
		got := Self{Name: "n1", IP: netip.MustParseAddr(c.ip)}.of(node, nil).Addresses
		if fmt.Sprint(got) != c.want {
			t.Errorf("node at %s: NodePort addresses %v, want %s", c.ip, got, c.want)
		}
	}
}

// uplinkOnly is a Datapath whose uplink translates the given families;
// KubeProxy reads nothing else.
type uplinkOnly struct {
	Datapath
	ipv4, ipv6 bool
}

func (d uplinkOnly) UplinkErr() error             { return nil }
func (d uplinkOnly) UplinkFamilies() (bool, bool) { return d.ipv4, d.ipv6 }

// onctl status names the families whose clients outside a remote backend
// answers directly: each the uplink translates, IPv6 as IPv4.
func TestKubeProxyNamesTheDSRFamilies(t *testing.T) {
	for _, c := range []struct {
		ipv4, ipv6, dsr bool
		want            string
	}{
		{true, true, true, "answer IPv4 and IPv6 clients outside directly (DSR)"},
		{false, true, true, "answer IPv6 clients outside directly (DSR)"},
		{true, false, true, "answer IPv4 clients outside directly (DSR)"},
		{true, true, false, ""},
	} {
		got := KubeProxy(uplinkOnly{ipv4: c.ipv4, ipv6: c.ipv6}, Proxying{Replace: true, DSR: c.dsr})
		if c.want == "" && strings.Contains(got, "DSR") || c.want != "" && !strings.HasSuffix(got, c.want) {
			t.Errorf("IPv4 %v, IPv6 %v, DSR %v: %q, want it to end %q", c.ipv4, c.ipv6, c.dsr, got, c.want)
		}
	}
}
