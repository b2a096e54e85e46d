//go:build privileged

package services

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
)

// IPv6 at the socket: the same beds (every bed serves the IPv6 VIP and
// backends too), the connect6, sendmsg6, recvmsg6 and getpeername6 hooks.

var svc6 = netip.AddrPortFrom(vip6, svcPort)

func isBackend6(served string) bool { return isBackendOf(backends6, served, svcPort) }

// ownedBed is a balancer on a fresh cgroup and a bed whose namespace it
// acts for, as a pod's.
func ownedBed(t *testing.T) (*LB, *bed) {
	t.Helper()
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, podIP, b.path))
	return lb, b
}

// requireCounters checks the named counters' values.
func requireCounters(t *testing.T, lb *LB, want map[string]uint64) {
	t.Helper()
	for name, v := range want {
		if got := counter(t, lb, name); got != v {
			t.Errorf("%s %d, want %d", name, got, v)
		}
	}
}

// requireEmpty fails the test unless every map named is empty.
func requireEmpty(t *testing.T, when string, maps map[string]*ebpf.Map) {
	t.Helper()
	for name, m := range maps {
		if n := bpftest.Entries(t, m); n != 0 {
			t.Fatalf("%s: %d entries in %s", when, n, name)
		}
	}
}

// TCP to an IPv6 ClusterIP reaches every backend through connect6, and
// getpeername() shows the ClusterIP; another port of it and a backend
// dialled directly are left as they are.
func TestConnect6TranslatesToEveryBackend(t *testing.T) {
	lb, b := ownedBed(t)
	testutil.Must(t, lb.Sync([]Service{serviceAt(vip6, svcPort, TCP, backends6...)}, false))

	res := b.client("tcp", svc6, 30)
	checkAll(t, "balanced IPv6 connection", res, func(r clientRes) bool {
		return r.Err == "" && r.Peer == svc6.String() && isBackend6(r.Served)
	})
	if seen := served(res); len(seen) != len(backends6) {
		t.Fatalf("30 connections reached %v, want all %d backends", seen, len(backends6))
	}
	states, err := lb.Services()
	testutil.Must(t, err)
	if len(states) != 1 || states[0].VIP != vip6 || states[0].Translated != 30 {
		t.Fatalf("service counters %+v, want 30 translated for %s", states, svc6)
	}
	other := netip.AddrPortFrom(vip6, otherPort)
	checkAll(t, "another port of the ClusterIP", b.client("tcp", other, 3), func(r clientRes) bool {
		return r.Peer == other.String() && r.Served == other.String()
	})
	direct := netip.AddrPortFrom(backends6[1], svcPort)
	checkAll(t, "a backend dialled directly", b.client("tcp", direct, 3), func(r clientRes) bool {
		return r.Peer == direct.String() && r.Served == direct.String()
	})
	requireCounters(t, lb, map[string]uint64{"connect6_translated": 30, "getpeername6_reversed": 30, "released6": 30, "connect_translated": 0})
	if n := bpftest.Entries(t, lb.maps.OncLb6Revnat); n != 0 {
		t.Fatalf("%d IPv6 reverse entries after the connections closed", n)
	}
}

// UDP to an IPv6 ClusterIP, unconnected (sendmsg6) and connected
// (connect6): datagrams reach backends, and replies read as coming from
// the ClusterIP (recvmsg6).
func TestUDP6RepliesComeFromTheClusterIP(t *testing.T) {
	lb, b := ownedBed(t)
	testutil.Must(t, lb.Sync([]Service{serviceAt(vip6, svcPort, UDP, backends6...)}, false))
	for _, op := range []string{"udp", "udpconn"} {
		res := b.client(op, svc6, 30)
		checkAll(t, op, res, func(r clientRes) bool {
			return r.Err == "" && r.Peer == svc6.String() && isBackend6(r.Served)
		})
		if seen := served(res); len(seen) < 2 {
			t.Fatalf("%s: 30 sockets reached only %v", op, seen)
		}
	}
	requireCounters(t, lb, map[string]uint64{"sendmsg6_translated": 30, "connect6_translated": 30})
	if counter(t, lb, "recvmsg6_reversed") < 30 || counter(t, lb, "getpeername6_reversed") < 30 {
		t.Fatal("reverse translation counters did not rise")
	}
	if n := bpftest.Entries(t, lb.maps.OncLb6Revnat); n != 30 {
		t.Fatalf("%d IPv6 reverse entries after the clients exited, want the 30 of unconnected sockets", n)
	}
}

// An IPv6 Service without backends refuses at once, TCP and UDP.
func TestNoBackend6Refuses(t *testing.T) {
	lb, b := ownedBed(t)
	testutil.Must(t, lb.Sync([]Service{serviceAt(vip6, svcPort, TCP), serviceAt(vip6, svcPort, UDP)}, false))
	for _, op := range []string{"tcp", "udpconn", "udp"} {
		checkAll(t, op+" to an IPv6 service without backends", b.client(op, svc6, 2), func(r clientRes) bool {
			return r.Err == "ECONNREFUSED"
		})
	}
	requireCounters(t, lb, map[string]uint64{"connect6_refused": 4, "sendmsg6_refused": 2})
}

// A socket of a network namespace the agent has not registered is left
// alone in IPv6 too: translated nowhere, and not refused by a Service
// without backends, while a registered one is.
func TestUnregisteredNamespaceLeftAlone6(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	mine, stranger := newBed(t, cg), newBed(t, cg)
	testutil.Must(t, lb.OwnPod(mine.cookie, podIP, mine.path))
	empty := netip.AddrPortFrom(vip6, otherPort)
	testutil.Must(t, lb.Sync([]Service{serviceAt(vip6, svcPort, TCP, backends6...), serviceAt(vip6, otherPort, TCP)}, false))

	checkAll(t, "the registered namespace, to the empty Service", mine.client("tcp", empty, 2), func(r clientRes) bool {
		return r.Err == "ECONNREFUSED"
	})
	for _, addr := range []netip.AddrPort{svc6, empty} {
		checkAll(t, "the stranger, to "+addr.String(), stranger.client("tcp", addr, 3), func(r clientRes) bool {
			return r.Err == "" && r.Peer == addr.String() && r.Served == addr.String()
		})
	}
	if got := counter(t, lb, "connect6_translated"); got != 0 {
		t.Fatalf("connect6_translated %d: the stranger's connections were translated", got)
	}
}

// A dual-stack (AF_INET6) socket that dials an IPv4 ClusterIP
// IPv4-mapped reaches the IPv4 Service: TCP and connected UDP through
// connect6, unconnected UDP through sendmsg4 (the kernel sends such a
// datagram as IPv4); the peer and the replies read as the mapped ClusterIP.
func TestV4MappedSocketsReachTheIPv4Service(t *testing.T) {
	lb, b := ownedBed(t)
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP, backends...), service(svcPort, UDP, backends...)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)
	mapped := netip.AddrPortFrom(netip.AddrFrom16(vip.As16()), svcPort).String()
	if mapped != "[::ffff:10.96.0.10]:8080" {
		t.Fatalf("mapped %s", mapped)
	}
	for _, op := range []string{"tcp", "udpconn", "udp"} {
		res := b.mappedClient(op, svc, 20)
		checkAll(t, "AF_INET6 "+op+" to the IPv4-mapped ClusterIP", res, func(r clientRes) bool {
			return r.Err == "" && r.Peer == mapped && isBackend(r.Served, svcPort)
		})
		if seen := served(res); len(seen) < 2 {
			t.Fatalf("%s: 20 sockets reached only %v", op, seen)
		}
	}
	requireCounters(t, lb, map[string]uint64{"connect6_translated": 40, "sendmsg_translated": 20, "getpeername6_reversed": 40, "released6": 40})
	if counter(t, lb, "recvmsg6_reversed") < 20 {
		t.Error("recvmsg6 did not reverse the replies")
	}
	states, err := lb.Services()
	testutil.Must(t, err)
	var translated uint64
	for _, st := range states {
		translated += st.Translated
	}
	if translated != 60 {
		t.Errorf("the IPv4 Service's entries counted %d translations, want 60", translated)
	}
	// The IPv4 maps keyed them: the unconnected sockets' entries wait for
	// the LRU there, and the IPv6 maps hold none.
	if n4, n6 := bpftest.Entries(t, lb.maps.OncLbRevnat), bpftest.Entries(t, lb.maps.OncLb6Revnat); n4 != 20 || n6 != 0 {
		t.Fatalf("%d IPv4 and %d IPv6 reverse entries, want 20 and 0", n4, n6)
	}
}

// ClientIP affinity in IPv6: one backend per client namespace, listed
// with its client; it moves when that backend leaves.
func TestAffinity6(t *testing.T) {
	lb, b := ownedBed(t)
	s := serviceAt(vip6, svcPort, TCP, backends6...)
	s.Affinity = time.Hour
	testutil.Must(t, lb.Sync([]Service{s}, false))
	seen := served(b.client("tcp", svc6, 20))
	if len(seen) != 1 {
		t.Fatalf("affinity: 20 connections spread over %v", seen)
	}
	var first netip.AddrPort
	for k := range seen {
		first = netip.MustParseAddrPort(k)
	}
	aff, err := lb.Affinities()
	testutil.Must(t, err)
	if len(aff) != 1 || aff[0].Pod != podIP || aff[0].Backend != first || aff[0].Service != s.Key() {
		t.Fatalf("affinity entries %+v, want one for %s → %s", aff, podIP, first)
	}
	if got := counter(t, lb, "affinity_hit6"); got != 19 {
		t.Fatalf("affinity_hit6 %d, want 19", got)
	}
	s.Backends = serviceAt(vip6, svcPort, TCP, without(backends6, first.Addr())...).Backends
	testutil.Must(t, lb.Sync([]Service{s}, false))
	again := served(b.client("tcp", svc6, 10))
	if len(again) != 1 || again[first.String()] != 0 {
		t.Fatalf("after %s left: %v, want one other backend", first, again)
	}
}

// A connected UDP6 socket whose backend leaves is ended, and so is a
// dual-stack socket connected to an IPv4 Service IPv4-mapped whose
// backend leaves; new sockets reach backends still there.
func TestConnectedUDP6SocketEndsWhenItsBackendLeaves(t *testing.T) {
	lb, b := ownedBed(t)
	v4, v6 := service(svcPort, UDP, backends...), serviceAt(vip6, svcPort, UDP, backends6...)
	testutil.Must(t, lb.Sync([]Service{v4, v6}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	first6, release6 := b.hold("udphold", svc6)
	first4, release4 := b.holdReq(clientReq{Op: "udphold", Addr: svc.String(), N: 1, Mapped: true})
	left6, left4 := backendOf(t, first6), backendOf(t, first4)
	v4.Backends = service(svcPort, UDP, without(backends, left4)...).Backends
	v6.Backends = serviceAt(vip6, svcPort, UDP, without(backends6, left6)...).Backends
	testutil.Must(t, lb.Sync([]Service{v4, v6}, false))
	if r := release6(); r.Err != "ECONNABORTED" {
		t.Errorf("a UDP6 socket connected to %s, which left: %+v, want ECONNABORTED", left6, r)
	}
	if r := release4(); r.Err != "ECONNABORTED" {
		t.Errorf("a dual-stack socket connected to %s, which left: %+v, want ECONNABORTED", left4, r)
	}
	checkAll(t, "a new socket", b.client("udpconn", svc6, 10), func(r clientRes) bool {
		return r.Err == "" && r.Peer == svc6.String() && isBackend6(r.Served) &&
			r.Served != netip.AddrPortFrom(left6, svcPort).String()
	})
	if got := counter(t, lb, "udp_destroyed"); got != 2 {
		t.Fatalf("udp_destroyed %d, want 2", got)
	}
	requireEmpty(t, "after the sockets were ended", map[string]*ebpf.Map{"IPv4 gone": lb.maps.OncLbGone, "IPv6 gone": lb.maps.OncLb6Gone})
}

// Sync writes an IPv6 Service into the IPv6 maps only, repairs them when
// they drift, and leaves nothing there when it goes; what no map can hold
// (backends or source ranges of the other family) is refused.
func TestIPv6MapsSyncRepairRemove(t *testing.T) {
	lb, b := ownedBed(t)
	s := serviceAt(vip6, svcPort, TCP, backends6...)
	s.Affinity = time.Hour
	testutil.Must(t, lb.Sync([]Service{s}, false))
	p := lb.services[s.Key()]
	requireEmpty(t, "an IPv6 Service in the IPv4 maps", map[string]*ebpf.Map{"IPv4 service": lb.maps.OncLbSvc, "IPv4 backend": lb.maps.OncLbBackend})
	testutil.Must(t, lb.maps.OncLb6Backend.Delete(backendKey{SvcId: p.id, Slot: 0, Bank: p.bank}))
	testutil.Must(t, lb.maps.OncLb6Member.Delete(memberOf(p.id, s.Backends[1].Addr)))
	testutil.Must(t, lb.Sync([]Service{s}, true))
	if bk, mb := bpftest.Entries(t, lb.maps.OncLb6Backend), bpftest.Entries(t, lb.maps.OncLb6Member); bk < len(backends6) || mb != len(backends6) {
		t.Fatalf("after the repair %d backend and %d member entries, want at least %d and %d", bk, mb, len(backends6), len(backends6))
	}
	checkAll(t, "after repair", b.client("tcp", svc6, 10), func(r clientRes) bool {
		return r.Err == "" && isBackend6(r.Served)
	})
	if got := counter(t, lb, "no_slot6"); got != 0 {
		t.Fatalf("no_slot6 %d after the repair", got)
	}

	testutil.Must(t, lb.Sync(nil, false))
	requireEmpty(t, "after the Service was removed", map[string]*ebpf.Map{"service": lb.maps.OncLb6Svc, "backend": lb.maps.OncLb6Backend, "member": lb.maps.OncLb6Member})
	checkAll(t, "after the Service is removed", b.client("tcp", svc6, 2), func(r clientRes) bool {
		return r.Served == svc6.String()
	})

	mixed := serviceAt(vip6, svcPort, TCP, backends[0])
	ranges := serviceAt(vip6, svcPort, TCP, backends6[0])
	ranges.Scope, ranges.SourceRanges = Uplink, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	for _, bad := range []Service{mixed, ranges} {
		if err := lb.Sync([]Service{bad}, false); err == nil {
			t.Errorf("Sync of %+v: no error", bad)
		}
	}
}

// A restarted agent adopts the IPv6 entries an earlier one left: a
// Service deleted while no agent ran stops being balanced at the first
// Sync, and leaves nothing in the IPv6 maps.
func TestRestartRemovesIPv6ServiceGoneMeanwhile(t *testing.T) {
	lb, b := ownedBed(t)
	s := serviceAt(vip6, svcPort, TCP, backends6...)
	s.Affinity = time.Hour
	testutil.Must(t, lb.Sync([]Service{s}, false))
	lb.Close()

	again, err := Open(lb.opts)
	testutil.Must(t, err)
	defer again.Close()
	testutil.Must(t, again.Attach())
	checkAll(t, "balanced by the adopted entry", b.client("tcp", svc6, 3), func(r clientRes) bool {
		return r.Err == "" && isBackend6(r.Served)
	})
	testutil.Must(t, again.Sync(nil, false))
	checkAll(t, "after the first Sync without it", b.client("tcp", svc6, 3), func(r clientRes) bool {
		return r.Served == svc6.String()
	})
	requireEmpty(t, "after the first Sync without it", map[string]*ebpf.Map{"service": again.maps.OncLb6Svc, "backend": again.maps.OncLb6Backend, "member": again.maps.OncLb6Member})
}

// An IPv6 API server Service (KUBERNETES_SERVICE_HOST in an IPv6-primary
// cluster) is taken out of the pinned IPv6 service map before the agent's
// first API call, as an IPv4 one is.
func TestUnbalanceIPv6APIServer(t *testing.T) {
	lb, b := ownedBed(t)
	testutil.Must(t, lb.Sync([]Service{serviceAt(vip6, svcPort, TCP, backends6...), service(svcPort, TCP, backends...)}, false))
	lb.Close()
	t.Setenv("KUBERNETES_SERVICE_HOST", vip6.String())
	t.Setenv("KUBERNETES_SERVICE_PORT", "8080")
	testutil.Must(t, UnbalanceAPIServer(lb.opts.PinDir))
	checkAll(t, "the API server's IPv6 Service", b.client("tcp", svc6, 2), func(r clientRes) bool { return r.Served == svc6.String() })
	checkAll(t, "another Service", b.client("tcp", netip.AddrPortFrom(vip, svcPort), 2), func(r clientRes) bool {
		return isBackend(r.Served, svcPort)
	})
}
