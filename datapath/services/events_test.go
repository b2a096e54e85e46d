//go:build privileged

package services

// The flow events of the socket LB (include/flows.h): a translation names
// the client's namespace, the frontend and the backend; a refusal names
// its counter, once a second per namespace and Service.

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/testutil"
)

// openLBWithEvents loads the fast path with events on and the services
// object sharing its maps, as the agent does, attached to cgroup, and
// reads the events.
func openLBWithEvents(t *testing.T, cgroup string) (*LB, *bpftest.Events) {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	fp, err := fastpath.Open(fastpath.Options{PinDir: dir, VNI: 1, Port: vxlanPort, Mark: fastPathMark,
		NodeIP: dsrNode0, PodCIDR: dsrPods0, EventsPerSecond: 1000})
	testutil.Must(t, err)
	t.Cleanup(func() { fp.Close() })
	lb, err := Open(Options{PinDir: dir, Cgroup: cgroup, IPv6: true, FlowCache: fp.FlowCache()})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	testutil.Must(t, lb.Attach())

	return lb, bpftest.ReadEvents(t, fp.Events())
}

func TestTranslationEvents(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb, ev := openLBWithEvents(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, netip.MustParseAddr("10.244.0.5"), b.path))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP, backends...), service(svcPort, UDP, backends...)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	res := b.client("tcp", svc, 3)
	evs := ev.Collect("translate")
	if len(evs) != len(res) {
		t.Fatalf("%d translate events for %d connections: %+v", len(evs), len(res), evs)
	}
	for i, e := range evs {
		if e.Netns != b.cookie || e.Dst != svc || e.Proto != unix.IPPROTO_TCP || !isBackend(e.Via.String(), svcPort) || e.Via.String() != res[i].Served {
			t.Errorf("event %+v, want netns %d to %s, the backend that served (%s)", e, b.cookie, svc, res[i].Served)
		}
	}

	// One unconnected UDP socket sending three datagrams: one event.
	b.client("udp3", svc, 1)
	if evs := ev.Collect("translate"); len(evs) != 1 || evs[0].Proto != unix.IPPROTO_UDP {
		t.Fatalf("a UDP socket's three datagrams gave translate events %+v, want one", evs)
	}
}

func TestRefusalEvents(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb, ev := openLBWithEvents(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnHost(b.cookie))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)
	b.client("tcp", svc, 3)
	evs := ev.Collect("refuse")
	if len(evs) != 1 || evs[0].Reason != "connect_refused" || evs[0].Netns != b.cookie || evs[0].Dst != svc {
		t.Fatalf("three refused connects gave %+v, want one refuse event (connect_refused, netns %d, to %s)", evs, b.cookie, svc)
	}
}
