//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
)

// The datastore stops for a minute: etcd (embedded in the controller) or
// the kube-apiserver. Pods keep every connection and make new ones, on the
// fast path (nodes 1 and 2) and on the slow path (node 3 runs without it).
// A pod's sandbox is recreated on a ready node and reaches the others; on
// etcd a new pod is added too. On Kubernetes a pod the agent never saw in
// the API is refused, as its policy is unknown. When the
// datastore is back every peer is alive and programmed again, and a
// controller restart then changes no node's pod CIDR.
func TestDatastoreOutage(t *testing.T) {
	for _, store := range []string{"etcd", "kubernetes"} {
		t.Run(store, func(t *testing.T) { datastoreOutage(t, store) })
	}
}

const outage = time.Minute

func datastoreOutage(t *testing.T, store string) {
	l := labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 1, Datastore: store})
	ctx := context.Background()
	n1, n2, n3 := l.Nodes[0], l.Nodes[1], l.Nodes[2]
	if err := l.RestartAgent(ctx, n3, "--fast-path=false"); err != nil {
		t.Fatal(err)
	}
	d, err := l.AddPod(ctx, n1)
	if err != nil {
		t.Fatal(err)
	}
	waitPeers(t, l)
	cidrs := podCIDRs(t, l)
	// Long-lived connections across the outage: fast path and slow path.
	a, b, c := n1.Pods[0], n2.Pods[0], n3.Pods[0]
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9600))
	bypasstest.ServeEcho(listenTCP(t, c.Netns, 9600))
	fast := exchanges(t, dial(t, a.Netns, "tcp4", b.IP, 9600), 10, func() {})
	slow := exchanges(t, dial(t, a.Netns, "tcp4", c.IP, 9600), 10, func() {})

	datastore := l.Controller // etcd is embedded in it
	if store == "kubernetes" {
		datastore = l.APIServer.Process
	}
	stop := func(sig syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(datastore.PID, sig); err != nil {
			t.Fatal(err)
		}
	}
	stop(syscall.SIGSTOP) // hung, not gone: every request waits for its timeout
	t.Cleanup(func() {
		if datastore.Alive() { // not a PID reused since
			_ = syscall.Kill(datastore.PID, syscall.SIGCONT)
		}
	})
	back := time.Now().Add(outage)
	hits := [3]uint64{stats(t, n1)["egress_hit"], stats(t, n2)["egress_hit"], stats(t, n3)["egress_hit"]}

	allPairsPass(t, l, "datastore just stopped")
	// A sandbox made meanwhile: the runtime recreates a pod's.
	if err := l.ReattachPod(ctx, n1, d); err != nil {
		t.Fatalf("CNI DEL and ADD on a ready node, datastore stopped: %v", err)
	}
	if store == "etcd" {
		// A new pod: nothing of ADD needs etcd.
		if _, err := l.AddPod(ctx, n2); err != nil {
			t.Fatalf("CNI ADD of a new pod, etcd stopped: %v", err)
		}
	} else {
		// A pod the API never showed the agent (no kubelet could have
		// one but a static pod's): its policy is unknown, so ADD fails
		// closed, naming why.
		_, err := l.AddPodSpec(ctx, n2, lab.PodSpec{WithoutObject: true})
		if err == nil || !strings.Contains(err.Error(), "not in the API") {
			t.Fatalf("CNI ADD of a pod unknown to the API, API server stopped: err = %v, want it refused", err)
		}
	}
	time.Sleep(time.Until(back.Add(-20 * time.Second)))
	allPairsPass(t, l, fmt.Sprintf("datastore stopped for %s, pods attached meanwhile", outage-20*time.Second))
	time.Sleep(time.Until(back))
	stop(syscall.SIGCONT)

	if err := fast(); err != nil {
		t.Fatalf("connection %s → %s (fast path) across the outage: %v", a.IP, b.IP, err)
	}
	if err := slow(); err != nil {
		t.Fatalf("connection %s → %s (slow path) across the outage: %v", a.IP, c.IP, err)
	}
	grew := [3]uint64{stats(t, n1)["egress_hit"] - hits[0], stats(t, n2)["egress_hit"] - hits[1], stats(t, n3)["egress_hit"] - hits[2]}
	if grew[0] == 0 || grew[1] == 0 || grew[2] != 0 {
		t.Fatalf("fast-path egress hits during the outage: %v; want nodes 1 and 2 hitting, node 3 (fast path off) not", grew)
	}

	waitPeers(t, l)
	allPairsPass(t, l, "datastore back")
	if err := l.RestartController(); err != nil {
		t.Fatal(err)
	}
	waitPeers(t, l)
	if got := podCIDRs(t, l); got != cidrs {
		t.Fatalf("pod CIDRs after the outage and a controller restart: %s, before: %s", got, cidrs)
	}
}

// waitPeers waits until every agent is ready and sees every other node
// alive and programmed.
func waitPeers(t *testing.T, l *lab.Lab) {
	t.Helper()
	for _, n := range l.Nodes {
		client := agent(t, n)
		testutil.WaitFor(t, n.Name+" ready, every peer alive and programmed", 90*time.Second, func() bool {
			st, err := client.GetStatus(context.Background(), &apiv1.GetStatusRequest{})
			if err != nil || !st.Ready {
				return false
			}
			peers, err := client.ListPeers(context.Background(), &apiv1.ListPeersRequest{})
			if err != nil || len(peers.Peers) != len(l.Nodes)-1 {
				return false
			}
			for _, p := range peers.Peers {
				if !p.Alive || !p.Programmed {
					return false
				}
			}
			return true
		})
	}
}

// podCIDRs lists every node's pod CIDR, as its agent has it.
func podCIDRs(t *testing.T, l *lab.Lab) string {
	t.Helper()
	var out []string
	for _, n := range l.Nodes {
		st, err := n.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n.Name+"="+st.PodCidr)
	}
	return strings.Join(out, " ")
}
