//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPv6 Services from outside the cluster, balanced on node 0's uplink
// (slow path), with the agents replacing kube-proxy, in a dual-stack lab
// (IPv4 tunnels) and in an IPv6 one (IPv6 tunnels): from the external
// client's IPv6 address to node 0's IPv6 NodePort and
// to an IPv6 externalIP routed to node 0, TCP and UDP, reaching a backend
// on node 0 (which sees the client) and one on node 1 (which sees node
// 0's IPv6 gateway: SNAT), the replies from the frontend;
// externalTrafficPolicy Local keeps to node 0's backend and the client's
// address; a Service without endpoints is refused at once. Node 0's IPv6
// uplink counters show the path.
func TestServicesFromOutsideIPv6(t *testing.T) {
	t.Run("dual", func(t *testing.T) { servicesFromOutsideIPv6(t, lab.IPFamilyDual) })
	t.Run("ipv6", func(t *testing.T) { servicesFromOutsideIPv6(t, lab.IPFamilyIPv6) })
}

func servicesFromOutsideIPv6(t *testing.T, labFamily string) {
	ctx := context.Background()
	l, kube := serviceLab(t, lab.Options{Nodes: 2, ExternalClient: true, IPFamily: labFamily, AgentArgs: []string{"--kube-proxy-replacement"}})
	families := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	policy := corev1.IPFamilyPolicyRequireDualStack
	if labFamily == lab.IPFamilyIPv6 {
		families, policy = []corev1.IPFamily{corev1.IPv6Protocol}, corev1.IPFamilyPolicySingleStack
	}
	var backends []*lab.Pod
	for i := range l.Nodes {
		p, err := l.AddPodSpec(ctx, l.Nodes[i], lab.PodSpec{Namespace: svcNS, Name: fmt.Sprintf("web-%d", i), Labels: map[string]string{"app": "web"}})
		if err != nil {
			t.Fatal(err)
		}
		serveWhoSawOn(listenOn(t, p.Netns, "tcp6", 8080), p.Name)
		answerUDP(listenPacketOn(t, p.Netns, "udp6", 8053), p.Name)
		backends = append(backends, p)
	}
	node0, client := l.Nodes[0], l.ExternalClient
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
	writeSlice(t, kube, "web", discoveryv1.AddressTypeIPv6, backends, nil)
	nodePort := netip.AddrPortFrom(node0.IPv6, 30080)
	fronts := []netip.AddrPort{nodePort, netip.AddrPortFrom(extIP, 80)}
	for _, f := range fronts {
		if s := waitFrontend(t, node0, f, "TCP", "uplink", 2); s.Dsr {
			t.Fatalf("%s: %+v, want SNAT", f, s)
		}
	}
	var gateway netip.Addr // node 0's IPv6 one, its masquerade source on the overlay
	for _, c := range nodeStatus(t, node0).PodCidrs {
		if p := netip.MustParsePrefix(c); p.Addr().Is6() {
			gateway = p.Addr().Next()
		}
	}
	counters := func() map[string]uint64 { return lbCounters(t, node0) }
	// reversed6 counts the replies given their frontend's address, on the
	// slow path or the fast: a connection to the local backend opens on
	// the fast path once the agent opened the pod (uplink6_open), and
	// then none of its replies takes the stack.
	reversed6 := func(c map[string]uint64) uint64 {
		return c["uplink6_reversed"] + c["uplink6_fast_reply"] + c["uplink6_fast_from_remote"]
	}

	t.Run("TCPToLocalAndRemote", func(t *testing.T) {
		for _, front := range fronts {
			before := counters()
			seen := map[string]int{}
			for range 20 {
				name, saw, from, err := askTCP(client, front)
				if err != nil || from != front.String() {
					t.Fatalf("TCP to %s from outside: reply from %s, %v", front, from, err)
				}
				seen[name]++
				// The local backend sees the client, the remote one node 0's
				// IPv6 gateway address (masqueraded over the overlay).
				want := lab.ExternalClientIPv6.String()
				if name == backends[1].Name {
					want = gateway.String()
				}
				if saw != want {
					t.Fatalf("%s saw the client as %s, want %s", name, saw, want)
				}
			}
			if seen[backends[0].Name] == 0 || seen[backends[1].Name] == 0 {
				t.Fatalf("%s: backends reached %v; want both", front, seen)
			}
			after := counters()
			if d := after["uplink6_new_flow"] - before["uplink6_new_flow"]; d != 20 {
				t.Errorf("%s: uplink6_new_flow grew by %d, want 20", front, d)
			}
			if d := reversed6(after) - reversed6(before); d < 20 {
				t.Errorf("%s: replies reversed grew by %d (uplink6_reversed, uplink6_fast_reply, uplink6_fast_from_remote), want ≥ 20", front, d)
			}
			if after["uplink_new_flow"] != before["uplink_new_flow"] {
				t.Errorf("%s: the IPv4 counters moved", front)
			}
		}
	})

	t.Run("UDP", func(t *testing.T) {
		udp := netip.AddrPortFrom(node0.IPv6, 30053)
		seen := map[string]int{}
		for range 20 {
			name, from, err := askUDP(client, udp)
			if err != nil || from != udp.String() {
				t.Fatalf("UDP to %s from outside: reply from %s, %v", udp, from, err)
			}
			seen[name]++
		}
		if len(seen) != 2 {
			t.Errorf("backends reached: %v; want both", seen)
		}
	})

	// An established flow to node 0's backend skips node 0's stack both
	// ways once ip6tables saw it so (node 0's IPv6 fast counters take
	// its datagrams), until a policy shuts its client out: then not one
	// more datagram reaches the pod.
	t.Run("FastPathToALocalBackend", func(t *testing.T) {
		udp := netip.AddrPortFrom(node0.IPv6, 30053)
		var ask func() error
		var from netip.AddrPort
		testutil.WaitFor(t, "a flow to node 0's backend", 10*time.Second, func() bool {
			ask, from = dialUDP(t, client, udp, backends[0].Name)
			return ask() == nil
		})
		fastExchanges(t, node0, from, ask, counters, "uplink6_fast_to_pod", "uplink6_fast_reply")
		revoke(t, kube, ask, func() uint64 { return counters()["uplink6_fast_to_pod"] })
	})

	// A flow to node 1's backend skips node 0's stack both ways once
	// conntrack holds it established and masqueraded: sent over the
	// overlay (IPv4 tunnels in the dual-stack lab, IPv6 ones in the IPv6
	// lab) with its masqueraded source, the replies decapsulated and
	// reversed on the uplink; node 1 carries it on its fast path too. A
	// policy at node 1 then shuts it out there.
	t.Run("FastPathToAnotherNode", func(t *testing.T) {
		udp := netip.AddrPortFrom(node0.IPv6, 30053)
		var ask func() error
		var from netip.AddrPort
		testutil.WaitFor(t, "a flow to node 1's backend", 10*time.Second, func() bool {
			ask, from = dialUDP(t, client, udp, backends[1].Name)
			return ask() == nil
		})
		fastExchanges(t, node0, from, ask, counters, "uplink6_fast_to_remote", "uplink6_fast_from_remote")
		before1 := stats(t, l.Nodes[1])
		for range 30 {
			if err := ask(); err != nil {
				t.Fatalf("exchange: %v", err)
			}
		}
		after1 := stats(t, l.Nodes[1])
		for _, c := range []string{"ingress6_hit", "egress6_hit"} {
			if d := after1[c] - before1[c]; d < 30 {
				t.Errorf("node 1's %s grew by %d over 30 exchanges, want ≥ 30", c, d)
			}
		}
		revoke(t, kube, ask, func() uint64 { return stats(t, l.Nodes[1])["ingress6_hit"] })
	})

	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
		cur, err := kube.CoreV1().Services(svcNS).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		if _, err := kube.CoreV1().Services(svcNS).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFrontend(t, node0, nodePort, "TCP", "uplink", 1)
		for range 10 {
			name, saw, _, err := askTCP(client, nodePort)
			if err != nil || name != backends[0].Name || saw != lab.ExternalClientIPv6.String() {
				t.Fatalf("externalTrafficPolicy Local: %s saw %s (%v); want %s seeing %s", name, saw, err, backends[0].Name, lab.ExternalClientIPv6)
			}
		}
	})

	// Every backend now on node 0 (externalTrafficPolicy Local), none
	// isolated by a policy: each TCP connection from outside opens, runs
	// and closes on node 0's fast path, and conntrack never sees it.
	t.Run("ConnectionsOpenOnTheFastPath", func(t *testing.T) {
		const n = 20
		be := backends[0].IPv6
		// The agent opens a pod again only after the rules that stopped
		// isolating it (the revocations above) took effect.
		testutil.WaitFor(t, "node 0's backend open on the fast path", 10*time.Second, func() bool {
			was := counters()["uplink6_open"]
			_, _, _, err := askTCP(client, nodePort)
			return err == nil && counters()["uplink6_open"] > was
		})
		conntrackTCP(t, node0, "-D", be, 8080, "-f", "ipv6")
		before := counters()
		for range n {
			if name, _, _, err := askTCP(client, nodePort); err != nil || name != backends[0].Name {
				t.Fatalf("TCP to %s from outside: %s (%v); want %s", nodePort, name, err, backends[0].Name)
			}
		}
		after := counters()
		if d := after["uplink6_open"] - before["uplink6_open"]; d != n {
			t.Errorf("uplink6_open grew by %d over %d connections, want %d", d, n, n)
		}
		if d := after["uplink6_reversed"] - before["uplink6_reversed"]; d != 0 {
			t.Errorf("uplink6_reversed grew by %d: replies took the stack", d)
		}
		if lines := conntrackTo(t, node0, be, 8080, "-f", "ipv6"); len(lines) != 0 {
			t.Errorf("node 0's conntrack saw connections the fast path opened: %q", lines)
		}
	})

	t.Run("NoEndpointsRefused", func(t *testing.T) {
		empty := nodePortService("empty", 30090, 30055)
		empty.Spec.IPFamilyPolicy, empty.Spec.IPFamilies = &policy, families
		if _, err := kube.CoreV1().Services(svcNS).Create(ctx, empty, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		front := netip.AddrPortFrom(node0.IPv6, 30090)
		waitFrontend(t, node0, front, "TCP", "uplink", 0)
		start := time.Now()
		if _, _, _, err := askTCP(client, front); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Fatalf("TCP to %s without endpoints: %v after %v, want ECONNREFUSED at once", front, err, time.Since(start))
		}
	})
}
