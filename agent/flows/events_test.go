package flows

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/fastpath"
	dpflows "github.com/onc-net/onc/datapath/flows"
)

var (
	clientPod  = netip.MustParseAddr("10.244.1.5")
	backendPod = netip.MustParseAddr("10.244.2.7")
	nodeB      = netip.MustParseAddr("192.0.2.2")
	clusterIP  = netip.MustParseAddrPort("10.96.0.10:80")
	outside    = netip.MustParseAddrPort("203.0.113.9:40000")
)

// fakeResolver knows one local pod (netns 7), two cluster pods, a node,
// and a Service at clusterIP (socket LB) and at nodeB:30080 (uplink).
// hostNetns is the fake node's own network namespace cookie.
const hostNetns = 1

func fakeResolver() Resolver {
	pods := map[netip.Addr]Endpoint{
		clientPod:  {Kind: KindPod, Namespace: "app", Name: "client", Node: "a"},
		backendPod: {Kind: KindPod, Namespace: "app", Name: "web-1", Node: "b"},
		// A host-network pod's address is its node's: the pod wins.
		nodeB: {Kind: KindPod, Namespace: "kube-system", Name: "hostnet", Node: "b"},
	}
	return Resolver{
		HostNetns:  hostNetns,
		PodOfNetns: func(c uint64) (netip.Addr, bool) { return clientPod, c == 7 },
		Pod:        func(a netip.Addr) (Endpoint, bool) { e, ok := pods[a]; return e, ok },
		Node: func(a netip.Addr) (string, bool) {
			return "b", a == nodeB || a == netip.MustParseAddr("192.0.2.3")
		},
		Service: func(uplink bool, vip netip.AddrPort, proto uint8) (string, string, bool) {
			if !uplink && vip == clusterIP && proto == 6 {
				return "app", "web:http", true
			}
			if uplink && vip == netip.MustParseAddrPort("192.0.2.3:30080") {
				return "app", "web:http", true
			}
			return "", "", false
		},
	}
}

func recordOf(t *testing.T, e dpflows.Event) Record {
	t.Helper()
	s := NewStore(4)
	NewEventRecorder(s, "a", fakeResolver()).Event(e)
	rs := s.List(Filter{})
	if len(rs) != 1 {
		t.Fatalf("event %+v gave %d records", e, len(rs))
	}
	return rs[0]
}

// A translation names the client pod by its namespace, the Service by
// its frontend and the backend pod by its address.
func TestTranslateRecord(t *testing.T) {
	r := recordOf(t, dpflows.Event{Time: time.Unix(1, 0), Class: "translate", Proto: 6, Netns: 7, Dst: clusterIP,
		Via: netip.AddrPortFrom(backendPod, 8080), Suppressed: 2})
	if r.Event != EventTranslate || r.Verdict != VerdictTranslated || r.Path != PathSocketLB || r.Suppressed != 2 {
		t.Errorf("record %+v", r)
	}
	if got := r.Src.String(); got != "app/client (10.244.1.5:0)" {
		t.Errorf("source %s, want the client pod", got)
	}
	if got := r.Dst.String(); got != "service app/web:http (10.96.0.10:80)" {
		t.Errorf("destination %s, want the Service", got)
	}
	if got := r.Translated.String(); got != "app/web-1 (10.244.2.7:8080)" {
		t.Errorf("translated %s, want the backend pod", got)
	}
	// The host's namespace is the node; one the agent does not know is
	// named by its cookie, never as the node's.
	r = recordOf(t, dpflows.Event{Class: "refuse", Reason: "connect_refused", Proto: 6, Netns: hostNetns, Dst: clusterIP})
	if r.Event != EventRefuse || r.Verdict != VerdictRefused || r.Reason != "connect_refused" || r.Src.Kind != KindNode || r.Src.Name != "a" {
		t.Errorf("refusal from the host: %+v", r)
	}
	r = recordOf(t, dpflows.Event{Class: "refuse", Reason: "connect_refused", Proto: 6, Netns: 99, Dst: clusterIP})
	if r.Src.Kind != KindUnknown || r.Src.String() != "netns 99" {
		t.Errorf("refusal from a namespace the agent does not know: %+v, want netns 99", r.Src)
	}
}

// Addresses resolve to a pod first, then a node, then stay addresses;
// a drop's path follows its counters.
func TestResolutionOrder(t *testing.T) {
	r := recordOf(t, dpflows.Event{Class: "drop", Reason: "overlay_drop_inner_source", Counters: "onc_stat", Proto: 6,
		Src: netip.AddrPortFrom(nodeB, 1), Dst: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.3"), 2), Via: outside})
	if r.Src.Kind != KindPod || r.Src.Name != "hostnet" {
		t.Errorf("source %+v: a pod's address is the pod's first", r.Src)
	}
	if r.Dst.Kind != KindNode || r.Dst.Name != "b" {
		t.Errorf("destination %+v: a node's address not named", r.Dst)
	}
	if r.Translated.Kind != KindIP || r.Translated.Addr != outside {
		t.Errorf("sender %+v: an unknown address is itself", r.Translated)
	}
	if r.Path != PathFast || r.Verdict != VerdictDropped {
		t.Errorf("path %s verdict %s, want fast and dropped", r.Path, r.Verdict)
	}
	r = recordOf(t, dpflows.Event{Class: "drop", Reason: "uplink_spoofed", Counters: "lb_uplink_stat", Src: outside, Dst: clusterIP})
	if r.Path != PathUplinkLB || r.Translated.Kind != "" {
		t.Errorf("an uplink drop: path %s, third end %+v", r.Path, r.Translated)
	}
	// The uplink's translation: the frontend is the uplink's Service.
	r = recordOf(t, dpflows.Event{Class: "uplink", Proto: 6, Src: outside, Dst: netip.MustParseAddrPort("192.0.2.3:30080"), Via: netip.AddrPortFrom(backendPod, 8080)})
	if r.Path != PathUplinkLB || r.Event != EventTranslate || r.Dst.Kind != KindService || r.Src.Kind != KindIP || r.Translated.Name != "web-1" {
		t.Errorf("an uplink translation: %+v", r)
	}
}

// open and learn are the fast path's; a class this agent does not know
// records nothing.
func TestFastPathRecordsAndUnknownClasses(t *testing.T) {
	r := recordOf(t, dpflows.Event{Class: "learn", Proto: 17, Src: netip.AddrPortFrom(clientPod, 5353), Dst: netip.AddrPortFrom(backendPod, 53)})
	if r.Event != EventLearn || r.Verdict != VerdictCached || r.Path != PathFast || r.Src.Name != "client" || r.Dst.Name != "web-1" {
		t.Errorf("learn: %+v", r)
	}
	s := NewStore(4)
	NewEventRecorder(s, "a", Resolver{}).Event(dpflows.Event{Class: "class 9"})
	if n := len(s.List(Filter{})); n != 0 {
		t.Errorf("an unknown class gave %d records", n)
	}
}

// The bypass's pairing names both pods, client first; a fallback the
// direction that fell back and why.
func TestBypassRecords(t *testing.T) {
	client, server := netip.AddrPortFrom(clientPod, 41000), netip.AddrPortFrom(backendPod, 8080)
	r := recordOf(t, dpflows.Event{Class: "pair", Proto: 6, Src: client, Dst: server})
	if r.Event != EventPair || r.Verdict != VerdictBypassed || r.Path != PathBypass || r.Src.Name != "client" || r.Src.Addr != client ||
		r.Dst.Name != "web-1" || r.Dst.Addr != server || r.Reason != "" {
		t.Errorf("pair: %+v", r)
	}
	r = recordOf(t, dpflows.Event{Class: "fallback", Reason: "fallback_peer_full", Counters: "bp_stat", Proto: 6, Src: server, Dst: client})
	if r.Event != EventFallback || r.Verdict != VerdictToStack || r.Path != PathBypass || r.Src.Name != "web-1" || r.Dst.Name != "client" ||
		r.Reason != "fallback_peer_full" {
		t.Errorf("fallback: %+v", r)
	}
}

// The filters take the new verdicts and events, and refuse others by
// name.
func TestEventFilters(t *testing.T) {
	s := NewStore(8)
	rc := NewEventRecorder(s, "a", fakeResolver())
	rc.Event(dpflows.Event{Class: "translate", Netns: 7, Dst: clusterIP, Via: netip.AddrPortFrom(backendPod, 80)})
	rc.Event(dpflows.Event{Class: "open", Src: netip.AddrPortFrom(clientPod, 1), Dst: netip.AddrPortFrom(backendPod, 80)})
	for _, c := range []struct {
		verdict, event string
		want           int
	}{{"translated", "", 1}, {"", "open", 1}, {"cached", "translate", 0}, {"", "", 2}} {
		f, err := ParseFilter("app/web-1", "", c.verdict, c.event, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(s.List(f)); n != c.want {
			t.Errorf("verdict %q event %q: %d records, want %d", c.verdict, c.event, n, c.want)
		}
	}
	if _, err := ParseFilter("", "", "", "forget", time.Time{}); err == nil {
		t.Error("event forget accepted: no record has it")
	}
	if r := s.List(Filter{Event: "translate"}); r[0].Suppressed != 0 || rc.Suppressed() != 0 {
		t.Error("suppressed counted with none held back")
	}
}

// evicted is the eviction of the client's flow to the backend, for why.
func evicted(port uint16, why fastpath.EvictReason) fastpath.Eviction {
	return fastpath.Eviction{Local: netip.AddrPortFrom(clientPod, port), Remote: netip.AddrPortFrom(backendPod, 80), Proto: 6, Why: why}
}

// drain records what Evicted queued, as RecordEvictions does.
func drain(r *EventRecorder) {
	for len(r.evicted) > 0 {
		r.recordEviction(<-r.evicted)
	}
}

// Every eviction is an evict record of both pods, saying why: a policy
// change, a flush, a changed underlay, a peer or a pod that went. Evicted,
// under the fast path's lock, names nothing: the names come after.
func TestEvictedRecords(t *testing.T) {
	s := NewStore(16)
	res := fakeResolver()
	pod := res.Pod
	naming := false
	res.Pod = func(a netip.Addr) (Endpoint, bool) {
		if !naming {
			t.Fatal("an eviction named under the fast path's lock")
		}
		return pod(a)
	}
	r := NewEventRecorder(s, "a", res)
	for why := range evictReasons {
		r.Evicted(evicted(40000+uint16(why), why))
	}
	if n := len(s.List(Filter{})); n != 0 {
		t.Fatalf("%d records before the queue was read", n)
	}
	naming = true
	drain(r)
	f, err := ParseFilter("app/web-1", "", "evicted", "evict", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	rs := s.List(f)
	for why, reason := range map[fastpath.EvictReason]string{
		fastpath.EvictPolicy: "NetworkPolicy change", fastpath.EvictFlush: "flushed", fastpath.EvictUnderlay: "underlay changed",
		fastpath.EvictPeer: "peer node left", fastpath.EvictPod: "local pod went",
	} {
		i := slices.IndexFunc(rs, func(r Record) bool { return r.Src.Addr.Port() == 40000+uint16(why) })
		if i < 0 || !strings.Contains(rs[i].Reason, reason) || rs[i].Path != PathFast || rs[i].Src.Name != "client" || rs[i].Dst.Name != "web-1" || rs[i].Proto != 6 {
			t.Errorf("eviction %d: records %+v, want one of client and web-1 saying %q", why, rs, reason)
		}
	}
	if len(rs) != len(evictReasons) {
		t.Errorf("%d records, want %d", len(rs), len(evictReasons))
	}
}

// One policy change evicting many flows makes at most evictsPerSecond
// records a second; the next says how many were held back.
func TestEvictRecordsAreBounded(t *testing.T) {
	s := NewStore(1024)
	r := NewEventRecorder(s, "a", Resolver{})
	now := time.Unix(100, 0)
	r.now = func() time.Time { return now }
	for i := range evictsPerSecond + 50 {
		r.Evicted(evicted(uint16(i), fastpath.EvictPolicy))
	}
	drain(r)
	if n := len(s.List(Filter{})); n != evictsPerSecond || r.Suppressed() != 50 {
		t.Fatalf("%d records, %d suppressed; want %d and 50", n, r.Suppressed(), evictsPerSecond)
	}
	now = now.Add(time.Second)
	r.Evicted(evicted(1, fastpath.EvictPolicy))
	drain(r)
	rs := s.List(Filter{})
	if len(rs) != evictsPerSecond+1 || rs[len(rs)-1].Suppressed != 50 {
		t.Fatalf("a second later: %d records, the last %+v; want it to carry suppressed 50", len(rs), rs[len(rs)-1])
	}
}

// With the queue full (its reader behind), evictions are counted, not
// waited for.
func TestEvictQueueFullCounts(t *testing.T) {
	r := NewEventRecorder(NewStore(8), "a", Resolver{})
	r.evicted = make(chan eviction, 1)
	for i := range 3 {
		r.Evicted(evicted(uint16(i), fastpath.EvictFlush))
	}
	if r.Suppressed() != 2 || len(r.evicted) != 1 {
		t.Fatalf("%d suppressed, %d queued; want 2 and 1", r.Suppressed(), len(r.evicted))
	}
}

// An event the reader could not decode is counted (onc_flows_lost_total)
// and records nothing.
func TestUndecodableEventsCounted(t *testing.T) {
	s := NewStore(8)
	r := NewEventRecorder(s, "a", Resolver{})
	for range 3 {
		r.undecodable(errors.New("a record of 40 bytes, want 88"))
	}
	if r.Lost() != 3 || len(s.List(Filter{})) != 0 {
		t.Fatalf("lost %d, %d records; want 3 and none", r.Lost(), len(s.List(Filter{})))
	}
}
