//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/onc-net/onc/lab"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Direct server return for IPv6 frontends (--load-balancer-mode dsr), in
// the dual-stack lab (IPv6 inside the IPv4 tunnels) and in the IPv6 lab
// (IPv6 tunnels): from the external client's IPv6 address to node 0's IPv6
// NodePort and to an IPv6 externalIP routed to node 0, whose one backend
// is a pod on node 1. Node 0 sends the client's packets to node 1 itself,
// the client's address kept; node 1 answers the client from the frontend
// the client chose. No reply passes node 0, and node 0's stack never sees
// the flow. Over IPv6 tunnels, node 1's host dialling node 0's NodePort is
// masqueraded instead.
func TestServicesFromOutsideDSR6(t *testing.T) {
	t.Run("dual", func(t *testing.T) { servicesFromOutsideDSR6(t, lab.IPFamilyDual) })
	t.Run("ipv6", func(t *testing.T) { servicesFromOutsideDSR6(t, lab.IPFamilyIPv6) })
}

func servicesFromOutsideDSR6(t *testing.T, labFamily string) {
	ctx := context.Background()
	l, kube := serviceLab(t, lab.Options{Nodes: 2, ExternalClient: true, IPFamily: labFamily,
		AgentArgs: []string{"--kube-proxy-replacement", "--load-balancer-mode=dsr"}})
	families := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	policy := corev1.IPFamilyPolicyRequireDualStack
	if labFamily == lab.IPFamilyIPv6 {
		families, policy = []corev1.IPFamily{corev1.IPv6Protocol}, corev1.IPFamilyPolicySingleStack
	}
	node0, node1, client := l.Nodes[0], l.Nodes[1], l.ExternalClient
	backend, err := l.AddPodSpec(ctx, node1, lab.PodSpec{Namespace: svcNS, Name: "web-1", Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	serveWhoSawOn(listenOn(t, backend.Netns, "tcp6", 8080), backend.Name)
	answerUDP(listenPacketOn(t, backend.Netns, "udp6", 8053), backend.Name)
	extIP := netip.MustParseAddr("fd00:203::40")
	// The client's router sends the externalIP to node 0, as a cloud's
	// or a BGP speaker's route would.
	mustRun(t, []string{"ip", "-n", client, "-6", "route", "add", extIP.String() + "/128", "via", node0.IPv6.String()})
	svc := nodePortService("web", 30080, 30053)
	svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies = &policy, families
	svc.Spec.ExternalIPs = []string{extIP.String()}
	if _, err := kube.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writeSlice(t, kube, "web", discoveryv1.AddressTypeIPv6, []*lab.Pod{backend}, nil)
	tcpFronts := []netip.AddrPort{netip.AddrPortFrom(node0.IPv6, 30080), netip.AddrPortFrom(extIP, 80)}
	udpFront := netip.AddrPortFrom(node0.IPv6, 30053)
	for _, f := range tcpFronts {
		if s := waitFrontend(t, node0, f, "TCP", "uplink", 1); !s.Dsr {
			t.Fatalf("onctl services: %s is not served with direct return: %+v", f, s)
		}
	}
	clientIP := lab.ExternalClientIPv6.String()

	// Each side's counters say which way the packets went: node 0 sent
	// them on (dsr6_sent) and reversed no reply; node 1 took them
	// (dsr6_received) and gave every reply the frontend's address.
	paths := func(t *testing.T, exchange func(), packets uint64) {
		t.Helper()
		before0, before1 := lbCounters(t, node0), lbCounters(t, node1)
		exchange()
		after0, after1 := lbCounters(t, node0), lbCounters(t, node1)
		grew := func(after, before map[string]uint64, c string) uint64 { return after[c] - before[c] }
		if d := grew(after0, before0, "dsr6_sent"); d < packets {
			t.Errorf("node 0's dsr6_sent grew by %d, want ≥ %d", d, packets)
		}
		if d := grew(after1, before1, "dsr6_received"); d < packets {
			t.Errorf("node 1's dsr6_received grew by %d, want ≥ %d", d, packets)
		}
		if d := grew(after0, before0, "uplink6_reversed"); d != 0 {
			t.Errorf("node 0 reversed %d replies, want none: they must not pass it", d)
		}
		// Its replies leave by the egress function, or by the fast path's
		// reply program once the flow cache learned their flow.
		if d := grew(after1, before1, "uplink6_reversed") + grew(after1, before1, "uplink6_fast_reply"); d < packets/2 {
			t.Errorf("node 1 gave %d replies the frontend's address, want ≥ %d", d, packets/2)
		}
		for _, c := range []map[string]uint64{after0, after1} {
			for name, v := range c {
				if (strings.HasPrefix(name, "dsr6_drop_") || strings.HasPrefix(name, "dsr_drop_")) && v != 0 {
					t.Errorf("%s = %d: a DSR frame was refused", name, v)
				}
			}
		}
		out, err := exec.Command("ip", "netns", "exec", node0.Netns, "conntrack", "-L", "-f", "ipv6", "-s", clientIP).Output()
		if err != nil {
			t.Fatalf("conntrack -L on %s: %v", node0.Name, err)
		}
		if n := strings.TrimSpace(string(out)); n != "" {
			t.Errorf("node 0's conntrack holds the client's flows, which must not enter its stack:\n%s", n)
		}
	}

	for _, front := range tcpFronts {
		t.Run("TCP "+front.String(), func(t *testing.T) {
			paths(t, func() {
				for range 20 {
					name, saw, from, err := askTCP(client, front)
					if err != nil {
						t.Fatalf("TCP to %s from outside: %v", front, err)
					}
					if from != front.String() || name != backend.Name || saw != clientIP {
						t.Fatalf("TCP to %s: %s saw %s, reply from %s; want %s seeing %s, reply from %s",
							front, name, saw, from, backend.Name, clientIP, front)
					}
				}
			}, 20*3) // SYN, ACK, FIN at least
		})
	}

	t.Run("UDP", func(t *testing.T) {
		paths(t, func() {
			for range 20 {
				name, from, err := askUDP(client, udpFront)
				if err != nil || name != backend.Name || from != udpFront.String() {
					t.Fatalf("UDP to %s: answered by %s from %s (%v); want %s from %s", udpFront, name, from, err, backend.Name, udpFront)
				}
			}
		}, 20)
	})

	// Over IPv6 tunnels a node's host is a peer's endpoint, which node 1
	// could not answer directly (it would deliver the replies to its own
	// host): node 0 masquerades it, as without DSR. (Over IPv4 tunnels no
	// node's IPv6 address is known as a node's: docs/services.md.)
	if labFamily == lab.IPFamilyIPv6 {
		t.Run("FromANodesHost", func(t *testing.T) {
			var gateway netip.Addr // node 0's IPv6 one, its masquerade source on the overlay
			for _, c := range nodeStatus(t, node0).PodCidrs {
				if p := netip.MustParsePrefix(c); p.Addr().Is6() {
					gateway = p.Addr().Next()
				}
			}
			before := lbCounters(t, node0)["dsr6_sent"]
			for range 5 {
				name, saw, from, err := askTCP(node1.Netns, tcpFronts[0])
				if err != nil || name != backend.Name || saw != gateway.String() || from != tcpFronts[0].String() {
					t.Fatalf("from node 1's host to %s: %s saw %s, reply from %s (%v); want %s seeing node 0's gateway %s, reply from %s",
						tcpFronts[0], name, saw, from, err, backend.Name, gateway, tcpFronts[0])
				}
			}
			if d := lbCounters(t, node0)["dsr6_sent"] - before; d != 0 {
				t.Errorf("node 0 sent %d packets of a node's connection directly, want none", d)
			}
		})
	}
}
