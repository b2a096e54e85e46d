//go:build privileged

package services

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
)

var podIP = netip.MustParseAddr("10.244.0.5")

// backendOf is the backend address a client's reply came from.
func backendOf(t *testing.T, r clientRes) netip.Addr {
	t.Helper()
	ap, err := netip.ParseAddrPort(r.Served)
	if r.Err != "" || err != nil {
		t.Fatalf("no reply from a backend: %+v", r)
	}
	return ap.Addr()
}

func without(all []netip.Addr, gone netip.Addr) []netip.Addr {
	return slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return a == gone })
}

// A connected UDP socket whose backend leaves the Service, or whose
// Service goes, is ended: its next call fails with ECONNABORTED, and a new
// socket reaches a backend still there.
func TestConnectedUDPSocketEndsWhenItsBackendLeaves(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, podIP, b.path))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, UDP, backends...)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	first, release := b.hold("udphold", svc)
	left := backendOf(t, first)
	rest := without(backends, left)
	testutil.Must(t, lb.Sync([]Service{service(svcPort, UDP, rest...)}, false))
	if r := release(); r.Err != "ECONNABORTED" {
		t.Fatalf("a socket connected to %s, which left: %+v, want ECONNABORTED", left, r)
	}
	checkAll(t, "a new socket", b.client("udpconn", svc, 10), func(r clientRes) bool {
		return r.Err == "" && r.Peer == svc.String() && isBackend(r.Served, svcPort) &&
			r.Served != netip.AddrPortFrom(left, svcPort).String()
	})
	if got := counter(t, lb, "udp_destroyed"); got != 1 {
		t.Fatalf("udp_destroyed %d, want 1", got)
	}

	first, release = b.hold("udphold", svc)
	backendOf(t, first)
	testutil.Must(t, lb.Sync(nil, false))
	if r := release(); r.Err != "ECONNABORTED" {
		t.Fatalf("a socket of a Service removed: %+v, want ECONNABORTED", r)
	}
	if n := bpftest.Entries(t, lb.maps.OncLbRevnat); n != 0 {
		t.Fatalf("%d reverse entries left by ended sockets", n)
	}
	if n := bpftest.Entries(t, lb.maps.OncLbGone); n != 0 {
		t.Fatalf("%d backends left listed as gone", n)
	}
}

// Only sockets translated to the backend for the Service it left are
// ended: not one the application connected to the pod IP itself, not one
// of another Service that keeps the backend, and no TCP socket.
func TestOnlyTranslatedUDPSocketsOfThatServiceEnd(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, podIP, b.path))
	x := backends[0]
	be := netip.AddrPortFrom(x, svcPort)
	udp := service(svcPort, UDP, x)
	// Another Service on the same backend address and port.
	other := Service{Name: "default/other:p", VIP: vip, Port: otherPort, Proto: UDP,
		Backends: []Backend{{Addr: be, Ready: true}}}
	tcp := service(svcPort, TCP, x)
	testutil.Must(t, lb.Sync([]Service{udp, other, tcp}, false))
	svc, otherSvc := netip.AddrPortFrom(vip, svcPort), netip.AddrPortFrom(vip, otherPort)

	ended, releaseEnded := b.hold("udphold", svc)
	direct, releaseDirect := b.hold("udphold", be)
	shared, releaseShared := b.hold("udphold", otherSvc)
	stream, releaseStream := b.hold("hold", svc)
	for _, r := range []clientRes{ended, direct, shared, stream} {
		if r.Err != "" || r.Served != be.String() {
			t.Fatalf("before the backend left: %+v, want served by %s", r, be)
		}
	}

	testutil.Must(t, lb.Sync([]Service{service(svcPort, UDP), other, service(svcPort, TCP)}, false))
	if r := releaseEnded(); r.Err != "ECONNABORTED" {
		t.Errorf("the translated socket: %+v, want ECONNABORTED", r)
	}
	if r := releaseDirect(); r.Err != "" || r.Peer != be.String() || r.Served != be.String() {
		t.Errorf("a socket connected to the pod IP: %+v, want it still served by %s", r, be)
	}
	if r := releaseShared(); r.Err != "" || r.Peer != otherSvc.String() || r.Served != be.String() {
		t.Errorf("a socket of the other Service: %+v, want it still served by %s as %s", r, be, otherSvc)
	}
	if r := releaseStream(); r.Err != "" || r.Peer != svc.String() {
		t.Errorf("a TCP socket: %+v, want it still connected to %s", r, svc)
	}
	if got := counter(t, lb, "udp_destroyed"); got != 1 {
		t.Fatalf("udp_destroyed %d, want 1", got)
	}
}

// A namespace the iterator cannot run in fails the Sync, not the Services
// written, and the sockets are ended on a later Sync.
func TestEndingIsRetriedOnTheNextSync(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	// Owned by an earlier agent: this one does not know its path yet.
	testutil.Must(t, lb.maps.OncLbNetns.Put(b.cookie, uint32(1)))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, UDP, backends...)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	first, release := b.hold("udphold", svc)
	left := backendOf(t, first)
	rest := []Service{service(svcPort, UDP, without(backends, left)...)}
	if err := lb.Sync(rest, false); err == nil || !strings.Contains(err.Error(), "path is not known") {
		t.Fatalf("Sync with a namespace of unknown path: %v, want its error", err)
	}
	if got := counter(t, lb, "udp_destroyed"); got != 0 {
		t.Fatalf("udp_destroyed %d before the namespace is known", got)
	}
	checkAll(t, "a new socket, the Service written all the same", b.client("udpconn", svc, 10), func(r clientRes) bool {
		return r.Err == "" && isBackend(r.Served, svcPort) && r.Served != netip.AddrPortFrom(left, svcPort).String()
	})

	testutil.Must(t, lb.OwnPod(b.cookie, podIP, b.path))
	testutil.Must(t, lb.Sync(rest, false))
	if r := release(); r.Err != "ECONNABORTED" {
		t.Fatalf("after the retry: %+v, want ECONNABORTED", r)
	}
}
