//go:build privileged

package fastpath

// The flow events the fast path's programs emit (include/flows.h), read
// back from the ring as the agent reads them.

import (
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	dpflows "github.com/onc-net/onc/datapath/flows"
	"github.com/onc-net/onc/internal/testutil"
)

func evStat(t *testing.T, d *Datapath, name string) uint64 {
	return bpftest.Counter(t, d.EventStats, name)
}

// onOneCPU keeps the test's thread on one CPU: the budget is per CPU.
func onOneCPU(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	var set unix.CPUSet
	testutil.Must(t, unix.SchedGetaffinity(0, &set))
	cpu := 0
	for !set.IsSet(cpu) {
		cpu++
	}
	var one unix.CPUSet
	one.Set(cpu)
	testutil.Must(t, unix.SchedSetaffinity(0, &one))
	t.Cleanup(func() { _ = unix.SchedSetaffinity(0, &set) })
}

// A frame the overlay guard drops gives one drop event naming the inner
// flow, the reason (the counter's name) and the node that sent it; the
// same flow again within the second gives none, another flow one.
func TestGuardDropEmitsOneEventPerFlow(t *testing.T) {
	d := openWith(t, Options{EventsPerSecond: 1000})
	established(t, d)
	ev := bpftest.ReadEvents(t, d.Events())
	forged := func(sport uint16) []byte {
		return vxlan(frame(vtepLocal, vtepPeer, otherPod, localPod, unix.IPPROTO_TCP, sport, 40000, 0, 10), peerNode, localNode, 1)
	}
	for range 3 {
		if ret, _ := run(t, d.progs.OncIngressFast, forged(80), 0); ret != actShot {
			t.Fatalf("verdict %d: the guard let a forged inner source on", ret)
		}
	}
	evs := ev.Collect("")
	if len(evs) != 1 {
		t.Fatalf("%d events for one flow dropped three times, want 1: %+v", len(evs), evs)
	}
	e := evs[0]
	want := dpflows.Event{Class: "drop", Reason: "overlay_drop_inner_source", Counters: "onc_stat", Proto: unix.IPPROTO_TCP,
		Src: netip.AddrPortFrom(otherPod, 80), Dst: netip.AddrPortFrom(localPod, 40000), Via: netip.AddrPortFrom(peerNode, 0), Ifindex: loIndex}
	got := e
	got.Time = time.Time{}
	if got != want {
		t.Fatalf("event %+v, want %+v", got, want)
	}
	if age := time.Since(e.Time); age < 0 || age > 5*time.Second {
		t.Errorf("event time %v is %v from now", e.Time, age)
	}
	if n := evStat(t, d, "deduped"); n != 2 {
		t.Errorf("deduped %d, want 2", n)
	}
	run(t, d.progs.OncIngressFast, forged(81), 0)
	if evs := ev.Collect(""); len(evs) != 1 || evs[0].Src.Port() != 81 {
		t.Fatalf("another flow's drop: %+v, want one event from port 81", evs)
	}
}

// The budget lets a burst of twice the rate through, holds back the rest
// and counts them in the next event it lets through. What it holds back
// costs no dedupe: nothing is written to onc_ev_seen for them, so a flood
// past the budget never touches the shared LRU.
func TestEventBudgetSuppressesAndCounts(t *testing.T) {
	onOneCPU(t)
	const rate, burst, extra = 1, 2, 5 // EventConstants: the burst is twice the rate
	d := openWith(t, Options{EventsPerSecond: rate})
	established(t, d)
	ev := bpftest.ReadEvents(t, d.Events())
	forged := func(sport uint16) []byte {
		return vxlan(frame(vtepLocal, vtepPeer, otherPod, localPod, unix.IPPROTO_TCP, sport, 40000, 0, 10), peerNode, localNode, 1)
	}
	for i := range burst + extra {
		run(t, d.progs.OncIngressFast, forged(uint16(1000+i)), 0) // a flow each: no dedupe
	}
	if evs := ev.Collect(""); len(evs) != burst {
		t.Fatalf("%d events of %d drops, want the burst of %d", len(evs), burst+extra, burst)
	}
	if n := evStat(t, d, "suppressed"); n != extra {
		t.Fatalf("suppressed %d, want %d", n, extra)
	}
	if n := bpftest.Entries(t, d.maps.OncEvSeen); n != burst {
		t.Fatalf("%d dedupe entries after %d drops of which %d emitted, want only the emitted ones", n, burst+extra, burst)
	}
	// A flow the budget held back, again: still held back, not deduped.
	run(t, d.progs.OncIngressFast, forged(1000+burst), 0)
	if n := evStat(t, d, "deduped"); n != 0 || bpftest.Entries(t, d.maps.OncEvSeen) != burst {
		t.Fatalf("a held-back flow again: deduped %d, %d dedupe entries; want none looked up, none written", n, bpftest.Entries(t, d.maps.OncEvSeen))
	}
	time.Sleep(time.Second / rate * 3 / 2) // a token back
	run(t, d.progs.OncIngressFast, forged(2000), 0)
	evs := ev.Collect("")
	if len(evs) != 1 || evs[0].Suppressed != extra+1 {
		t.Fatalf("after a pause: %+v, want one event carrying suppressed %d", evs, extra+1)
	}
}

// A drop the dedupe stops spends none of the budget: a flow dropped again
// and again within its second leaves the burst to other flows.
func TestDedupedDropsSpendNoBudget(t *testing.T) {
	onOneCPU(t)
	const rate, burst = 1, 2
	d := openWith(t, Options{EventsPerSecond: rate})
	established(t, d)
	ev := bpftest.ReadEvents(t, d.Events())
	forged := func(sport uint16) []byte {
		return vxlan(frame(vtepLocal, vtepPeer, otherPod, localPod, unix.IPPROTO_TCP, sport, 40000, 0, 10), peerNode, localNode, 1)
	}
	for range 10 {
		run(t, d.progs.OncIngressFast, forged(1000), 0)
	}
	run(t, d.progs.OncIngressFast, forged(1001), 0)
	evs := ev.Collect("")
	if len(evs) != burst || evs[0].Src.Port() != 1000 || evs[1].Src.Port() != 1001 {
		t.Fatalf("events %+v, want one for each of the two flows", evs)
	}
	if n, s := evStat(t, d, "deduped"), evStat(t, d, "suppressed"); n != 9 || s != 0 {
		t.Fatalf("deduped %d, suppressed %d; want 9 and none", n, s)
	}
}

// Events off (a zero rate), the ring stays empty.
func TestNoEventsWithoutABudget(t *testing.T) {
	d := open(t)
	established(t, d)
	ev := bpftest.ReadEvents(t, d.Events())
	// A frame the guard drops: an event site, reached.
	if ret, _ := run(t, d.progs.OncIngressFast, vxlan(frame(vtepLocal, vtepPeer, otherPod, localPod, unix.IPPROTO_TCP, 80, 40000, 0, 10), peerNode, localNode, 1), 0); ret != actShot {
		t.Fatalf("verdict %d: the forged frame was not dropped, so no event site ran", ret)
	}
	if evs := ev.Collect(""); len(evs) != 0 || evStat(t, d, "emitted") != 0 {
		t.Fatalf("events with none asked for: %+v", evs)
	}
}

// A connection the fast path opens gives an open event; a flow learned
// both ways gives one learn event, at the write that completes it.
func TestOpenAndLearnEvents(t *testing.T) {
	d := openWith(t, Options{ConnSetup: SetupEveryPod, EventsPerSecond: 1000})
	established(t, d)
	ev := bpftest.ReadEvents(t, d.Events())
	if ret, _ := run(t, d.progs.OncEgressFast, podSends(clientPort, 80, syn), 0); ret != actRedirect {
		t.Fatalf("verdict %d: the SYN did not open on the fast path", ret)
	}
	evs := ev.Collect("")
	if len(evs) != 1 || evs[0].Class != "open" || evs[0].Src != netip.AddrPortFrom(localPod, clientPort) || evs[0].Dst != netip.AddrPortFrom(remotePod, 80) {
		t.Fatalf("open events %+v, want one from %s:%d to %s:80", evs, localPod, clientPort, remotePod)
	}

	out := vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_UDP, 40000, 53, 0, 10), localNode, peerNode, 1)
	back := frame(podMAC, hostMAC, remotePod, localPod, unix.IPPROTO_UDP, 53, 40000, 0, 10)
	run(t, d.progs.OncLearnEgress, out, mark)
	if evs := ev.Collect(""); len(evs) != 0 {
		t.Fatalf("a flow learned one way only gave events %+v", evs)
	}
	run(t, d.progs.OncLearnIngress, back, mark)
	run(t, d.progs.OncLearnIngress, back, mark) // known: nothing written
	evs = ev.Collect("")
	if len(evs) != 1 || evs[0].Class != "learn" || evs[0].Proto != unix.IPPROTO_UDP ||
		evs[0].Src != netip.AddrPortFrom(localPod, 40000) || evs[0].Dst != netip.AddrPortFrom(remotePod, 53) {
		t.Fatalf("learn events %+v, want one from %s:40000 to %s:53", evs, localPod, remotePod)
	}
}

// An agent of a version without flow events left pins without their maps:
// the upgrade adopts the others (the learned flows stay) and creates the
// events' beside them.
func TestUpgradeAddsTheFlowEventMaps(t *testing.T) {
	old := open(t)
	established(t, old)
	testutil.Must(t, old.Close())
	events := []string{bpf.FastpathMapOncEvents, bpf.FastpathMapOncEvBudget, bpf.FastpathMapOncEvSeen, bpf.FastpathMapOncEvStats}
	for _, m := range events {
		testutil.Must(t, os.Remove(filepath.Join(old.opts.PinDir, m)))
	}
	o := old.opts
	o.EventsPerSecond = 1000
	d, err := Open(o)
	testutil.Must(t, err)
	t.Cleanup(func() { d.Close() })
	if flows, err := d.Flows(); err != nil || len(flows) != 1 {
		t.Fatalf("flows %v (%v) after the upgrade, want the learned one adopted", flows, err)
	}
	for _, m := range events {
		if _, err := os.Stat(filepath.Join(o.PinDir, m)); err != nil {
			t.Fatalf("%s not pinned after the upgrade: %v", m, err)
		}
	}
	ev := bpftest.ReadEvents(t, d.Events())
	run(t, d.progs.OncIngressFast, vxlan(frame(vtepLocal, vtepPeer, otherPod, localPod, unix.IPPROTO_TCP, 80, 40000, 0, 10), peerNode, localNode, 1), 0)
	if evs := ev.Collect(""); len(evs) != 1 || evs[0].Reason != "overlay_drop_inner_source" {
		t.Fatalf("events after the upgrade: %+v, want the guard's drop", evs)
	}
}
