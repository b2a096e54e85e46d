//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab/labtest"
	"github.com/onc-net/onc/lab/scale"
)

// 200 simulated peers (the scale bed's simulator: records, liveness
// heartbeats, on Kubernetes their Nodes) at steady state: over 30 s, with
// every peer's heartbeat renewed several times, the agent makes no kernel
// write for peers (peer_kernel_writes, counted at the datapath seam) and
// its peers watcher sees no signal, and every peer stays programmed. Then
// one peer's node IP changes: its FDB entry follows within seconds, with
// exactly the writes that one peer needs. On each datastore.
func TestScaleSteadyStateWritesNothing(t *testing.T) {
	for _, ds := range []string{"etcd", "kubernetes"} {
		t.Run(ds, func(t *testing.T) { scaleSteadyState(t, ds) })
	}
}

func scaleSteadyState(t *testing.T, datastore string) {
	const peers, window = 200, 30 * time.Second
	ctx := context.Background()
	l := labtest.Lab(t, scale.LabOptions(datastore))
	n := l.Nodes[0]
	// A 10 s TTL renews every 3 s (Kubernetes) or 3.3 s (etcd): four
	// times as many heartbeats as the default TTL, none of which may wake
	// the agent.
	sim, err := scale.NewSim(ctx, l, scale.SimOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close) // before the lab goes
	names, err := sim.Add(ctx, peers)
	if err != nil {
		t.Fatal(err)
	}
	// On Kubernetes each allocation is a few API requests, paced by the
	// controller's client limits (--kube-api-qps).
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := sim.WaitAllocated(wctx, names, nil); err != nil {
		t.Fatal(err)
	}
	k, err := scale.OpenKernel(n.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	agent := func() scale.AgentState {
		t.Helper()
		st, err := scale.ReadAgent(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	routes := func() int {
		t.Helper()
		r, err := k.PeerRoutes()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	testutil.WaitFor(t, "the agent to program every peer", time.Minute, func() bool { return agent().Peers == peers && routes() == peers })
	if err := sim.WaitAlive(wctx); err != nil {
		t.Fatal(err)
	}
	if err := scale.Settle(ctx, n, 3*time.Second, time.Minute); err != nil {
		t.Fatal(err)
	}
	if st, err := n.Status(ctx); err != nil || !st.FastPath {
		t.Fatalf("fast path not on (%v): its peer and host maps must be counted too", err)
	}

	wc, err := scale.NewWriteCounter(l)
	if err != nil {
		t.Fatal(err)
	}
	w0, err := wc.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := agent()
	time.Sleep(window)
	after := agent()
	w1, err := wc.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Half what the leases need: proof they ran, with room for a slow machine.
	if hb, want := wc.Heartbeats(w1)-wc.Heartbeats(w0), scale.HeartbeatRate(datastore, peers, sim.TTL())*window.Seconds()/2; hb < want {
		t.Fatalf("%.0f heartbeats in %s, want at least %.0f: the simulated peers' heartbeats did not run", hb, window, want)
	}
	if d := after.KernelWrites - before.KernelWrites; d != 0 {
		t.Errorf("%d kernel writes for peers in %s of steady state, want 0", d, window)
	}
	if d := after.PeersSeen - before.PeersSeen; d != 0 {
		t.Errorf("the peers watcher saw %d signals in %s of steady state, want 0 (heartbeats must not wake it)", d, window)
	}
	if after.Peers != peers || routes() != peers {
		t.Errorf("after the window: %d peers programmed, %d routes; want %d", after.Peers, routes(), peers)
	}

	name := names[0]
	spec, _ := sim.Spec(name)
	before = agent()
	ip, err := sim.Readdress(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the FDB entry of "+name+" to point at "+ip.String(), 5*time.Second, func() bool {
		got, err := k.FDB(spec.VTEPMAC)
		return err == nil && got == ip
	})
	if err := scale.Settle(ctx, n, 2*time.Second, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The overlay rewrites the FDB entry (1) and moves the peer-host route
	// from the old node address to the new (2); its neighbour and pod CIDR
	// route do not change. The fast path's host map adds the new address
	// and deletes the old (2), and the peer map's entry for the CIDR now
	// names another node IP: it is deleted (evicting what was learned
	// towards the old one) and put again (2). The overlay guard's IPv4
	// sender map adds the new address's three entries (the endpoint alone,
	// with the pod CIDR, with the node address) and deletes the old
	// address's three (6); its IPv6 map, the endpoint alone (2).
	const want = 15
	if d := agent().KernelWrites - before.KernelWrites; d != want {
		t.Errorf("%d kernel writes to readdress one peer, want %d", d, want)
	}
}
