//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/onc-net/onc/lab"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Direct server return (--load-balancer-mode dsr): from the lab's external
// client to node 0's NodePort, whose one backend is a pod on node 1. Node 0
// sends the client's packets to node 1 over the overlay itself, the
// client's address kept; node 1 answers the client from node 0's NodePort.
// No reply passes node 0, and node 0's stack never sees the flow (no
// conntrack entry). Node 1 judges the real client with NetworkPolicy, and
// carries the established flow on its fast path until a policy revokes it.
func TestServicesFromOutsideDSR(t *testing.T) {
	ctx := context.Background()
	l, kube := serviceLab(t, lab.Options{Nodes: 2, ExternalClient: true,
		AgentArgs: []string{"--kube-proxy-replacement", "--load-balancer-mode=dsr"}})
	node0, node1 := l.Nodes[0], l.Nodes[1]
	backend, err := l.AddPodSpec(ctx, node1, lab.PodSpec{Namespace: svcNS, Name: "web-1", Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	serveWhoSaw(t, backend.Netns, backend.Name)
	if _, err := kube.CoreV1().Services(svcNS).Create(ctx, nodePortService("web", 30080, 30053), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writeEndpoints(t, kube, "web", []*lab.Pod{backend}, nil)
	tcpFront, udpFront := netip.AddrPortFrom(node0.IP, 30080), netip.AddrPortFrom(node0.IP, 30053)
	if s := waitFrontend(t, node0, tcpFront, "TCP", "uplink", 1); !s.Dsr {
		t.Fatalf("onctl services: %s is not served with direct return: %+v", tcpFront, s)
	}
	client := l.ExternalClient
	clientIP := lab.ExternalClientIP.String()

	// Each side's counters say which way the packets went: node 0 sent
	// them on (dsr_sent) and reversed no reply; node 1 took them
	// (dsr_received) and gave every reply the frontend's address.
	paths := func(t *testing.T, exchange func(), packets uint64) {
		t.Helper()
		before0, before1 := lbCounters(t, node0), lbCounters(t, node1)
		exchange()
		after0, after1 := lbCounters(t, node0), lbCounters(t, node1)
		grew := func(after, before map[string]uint64, c string) uint64 { return after[c] - before[c] }
		if d := grew(after0, before0, "dsr_sent"); d < packets {
			t.Errorf("node 0's dsr_sent grew by %d, want ≥ %d", d, packets)
		}
		if d := grew(after1, before1, "dsr_received"); d < packets {
			t.Errorf("node 1's dsr_received grew by %d, want ≥ %d", d, packets)
		}
		if d := grew(after0, before0, "uplink_reversed"); d != 0 {
			t.Errorf("node 0 reversed %d replies, want none: they must not pass it", d)
		}
		if d := grew(after1, before1, "uplink_reversed") + grew(after1, before1, "uplink_fast_reply"); d < packets/2 {
			t.Errorf("node 1 gave %d replies the frontend's address, want ≥ %d", d, packets/2)
		}
		for _, c := range []map[string]uint64{after0, after1} {
			for name, v := range c {
				if strings.HasPrefix(name, "dsr_drop_") && v != 0 {
					t.Errorf("%s = %d: a DSR frame was refused", name, v)
				}
			}
		}
		if n := conntrackOf(t, node0, clientIP); n != "" {
			t.Errorf("node 0's conntrack holds the client's flows, which must not enter its stack:\n%s", n)
		}
	}

	t.Run("TCP", func(t *testing.T) {
		paths(t, func() {
			for range 20 {
				name, saw, from, err := askTCP(client, tcpFront)
				if err != nil {
					t.Fatalf("TCP to %s from outside: %v", tcpFront, err)
				}
				if from != tcpFront.String() || name != backend.Name || saw != clientIP {
					t.Fatalf("TCP to %s: %s saw %s, reply from %s; want %s seeing %s, reply from %s",
						tcpFront, name, saw, from, backend.Name, clientIP, tcpFront)
				}
			}
		}, 20*3) // SYN, ACK, FIN at least
	})

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

	// Another node's host dialling node 0's NodePort is no client node 1
	// could answer directly (it would deliver the replies to its own host):
	// node 0 masquerades it, as without DSR.
	t.Run("FromANodesHost", func(t *testing.T) {
		before := lbCounters(t, node0)["dsr_sent"]
		st, err := node0.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gw := netip.MustParsePrefix(st.PodCidr).Masked().Addr().Next()
		for range 5 {
			name, saw, from, err := askTCP(node1.Netns, tcpFront)
			if err != nil || name != backend.Name || saw != gw.String() || from != tcpFront.String() {
				t.Fatalf("from node 1's host to %s: %s saw %s, reply from %s (%v); want %s seeing node 0's gateway %s, reply from %s",
					tcpFront, name, saw, from, err, backend.Name, gw, tcpFront)
			}
		}
		if d := lbCounters(t, node0)["dsr_sent"] - before; d != 0 {
			t.Errorf("node 0 sent %d packets of a node's connection directly, want none", d)
		}
	})

	// Node 1 carries an established flow past its stack both ways, and a
	// policy at node 1 shuts it out at once.
	t.Run("FastPathUntilRevoked", func(t *testing.T) {
		ask, from := dialUDP(t, client, udpFront, backend.Name)
		counters := func() map[string]uint64 { return lbCounters(t, node1) }
		fastExchanges(t, node1, from, ask, counters, "uplink_fast_to_pod", "uplink_fast_reply")
		revoke(t, kube, ask, func() uint64 { return counters()["uplink_fast_to_pod"] })
	})

	// NetworkPolicy at node 1 judges the client's own address, which
	// direct return keeps even with externalTrafficPolicy Cluster.
	t.Run("PolicyJudgesTheClient", func(t *testing.T) {
		// Node 0's gateway address: what the backend would see without
		// DSR.
		st, err := node0.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gw := netip.MustParsePrefix(st.PodCidr).Masked().Addr().Next()
		judgesTheClient(t, kube, client, tcpFront, netip.PrefixFrom(gw, 32), backend.Name)
	})
}

// conntrackOf lists node's conntrack entries from src, "" if none.
func conntrackOf(t *testing.T, n *lab.Node, src string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.Netns, "conntrack", "-L", "-s", src).Output()
	if err != nil {
		t.Fatalf("conntrack -L on %s: %v", n.Name, err)
	}
	return strings.TrimSpace(string(out))
}
