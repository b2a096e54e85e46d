package flows

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onc-net/onc/datapath/fastpath"
	dpflows "github.com/onc-net/onc/datapath/flows"
)

// More kinds of endpoint, for the eBPF programs' records.
const (
	KindNode    = "node"    // a node's address
	KindService = "service" // a Service's frontend: Name is name:port-name
)

// The eBPF programs' events and verdicts (docs/observability.md).
const (
	EventRefuse    = "refuse"    // the socket LB refused a connect or sendmsg: no backend
	EventTranslate = "translate" // a load balancer gave a flow a backend
	EventOpen      = "open"      // a connection opened on the fast path
	EventLearn     = "learn"     // a flow became usable on the fast path
	EventEvict     = "evict"     // the agent took a flow off the fast path
	EventPair      = "pair"      // the bypass paired a connection between two pods of the node
	EventFallback  = "fallback"  // a bypassed direction went to the stack for good

	VerdictRefused    = "refused"
	VerdictTranslated = "translated"
	VerdictCached     = "cached"
	VerdictEvicted    = "evicted"
	VerdictBypassed   = "bypassed"
	VerdictToStack    = "to-stack"

	PathFast     = "fast"      // the fast path's programs (tc)
	PathSocketLB = "socket-lb" // the socket LB (cgroup socket calls)
	PathUplinkLB = "uplink-lb" // the uplink LB (tc of the uplink)
	PathBypass   = "bypass"    // the intra-node bypass (sockops, sk_msg)
)

// Verdicts and Events are what a filter may ask for.
var (
	Verdicts = []string{VerdictDenied, VerdictAllowed, VerdictDropped, AuditWouldDeny, AuditWouldAllow, VerdictRefused, VerdictTranslated, VerdictCached, VerdictEvicted,
		VerdictBypassed, VerdictToStack}
	Events = []string{EventPolicy, EventDrop, EventRefuse, EventTranslate, EventOpen, EventLearn, EventEvict, EventPair, EventFallback}
)

// Resolver names the ends of the eBPF programs' events, in this order: a
// local pod by its network namespace (socket calls), a pod of the cluster
// by address, a node by address, a Service by frontend; else the address.
// A nil func knows nothing.
type Resolver struct {
	PodOfNetns func(cookie uint64) (netip.Addr, bool)
	HostNetns  uint64 // the cookie of the node's own network namespace; 0: unknown
	Pod        func(netip.Addr) (Endpoint, bool)
	Node       func(netip.Addr) (name string, ok bool)
	// Service names (namespace, name:port-name) the frontend vip of
	// proto, of the uplink's Services or the socket LB's.
	Service func(uplink bool, vip netip.AddrPort, proto uint8) (namespace, name string, ok bool)
}

// EventRecorder turns the eBPF programs' events (datapath/flows), and the
// agent's evictions from the fast path, into records.
type EventRecorder struct {
	store *Store
	node  string
	res   Resolver
	// suppressed is how many events the programs' budget held back, as the
	// events that came after them said, and evict records held back.
	suppressed atomic.Uint64
	// bad counts the records the reader could not decode; badLogged is
	// when one was last logged (unix ns).
	bad       atomic.Uint64
	badLogged atomic.Int64

	now func() time.Time
	mu  sync.Mutex
	// The evict records of the second from evictSince: evicts queued,
	// evictHeld held back since the last one queued.
	evictSince        time.Time
	evicts, evictHeld uint32
	// evicted are the evictions queued for RecordEvictions to name.
	evicted chan eviction
}

// eviction is a flow the fast path let go, as queued: when, and how many
// were held back before it.
type eviction struct {
	fastpath.Eviction
	time time.Time
	held uint32
}

// evictsPerSecond bounds the evict records: one policy change or flush
// may take thousands of flows off the fast path, which would push the
// other informational records out of the buffer.
const evictsPerSecond = 100

// NewEventRecorder records into store for node.
func NewEventRecorder(store *Store, node string, res Resolver) *EventRecorder {
	return &EventRecorder{store: store, node: node, res: res, now: time.Now, evicted: make(chan eviction, evictsPerSecond)}
}

// Suppressed is how many events the programs held back, as far as the
// events recorded since say.
func (r *EventRecorder) Suppressed() uint64 { return r.suppressed.Load() }

// Run records the events of rd until ctx ends.
func (r *EventRecorder) Run(ctx context.Context, rd *dpflows.EventReader) error {
	return rd.Run(ctx, r.Event, r.undecodable)
}

// undecodable counts a record the reader could not decode, and logs the
// first of each minute.
func (r *EventRecorder) undecodable(err error) {
	if n := r.bad.Add(1); n == 1 || r.now().Sub(time.Unix(0, r.badLogged.Load())) >= time.Minute {
		r.badLogged.Store(r.now().UnixNano())
		slog.Warn("flow records: an eBPF event the agent cannot decode (skipped)", "err", err, "total", n)
	}
}

// Lost is how many events the agent read but could not decode.
func (r *EventRecorder) Lost() uint64 { return r.bad.Load() }

// Event records one event of the programs.
func (r *EventRecorder) Event(e dpflows.Event) {
	rec := Record{Time: e.Time, Node: r.node, Proto: e.Proto, Suppressed: e.Suppressed, Reason: e.Reason}
	r.suppressed.Add(uint64(e.Suppressed))
	switch e.Class {
	case "drop":
		rec.Event, rec.Verdict, rec.Path, rec.Cause = EventDrop, VerdictDropped, pathOfCounters(e.Counters), e.Reason
		rec.Src, rec.Dst = r.endpoint(e.Src), r.endpoint(e.Dst)
		if e.Via.IsValid() {
			rec.Translated = r.endpoint(e.Via) // the node that sent the frame
		}
	case "refuse":
		rec.Event, rec.Verdict, rec.Path = EventRefuse, VerdictRefused, PathSocketLB
		rec.Src, rec.Dst = r.socket(e.Netns), r.frontend(false, e.Dst, e.Proto)
	case "translate":
		rec.Event, rec.Verdict, rec.Path = EventTranslate, VerdictTranslated, PathSocketLB
		rec.Src, rec.Dst, rec.Translated = r.socket(e.Netns), r.frontend(false, e.Dst, e.Proto), r.endpoint(e.Via)
	case "uplink":
		rec.Event, rec.Verdict, rec.Path = EventTranslate, VerdictTranslated, PathUplinkLB
		rec.Src, rec.Dst, rec.Translated = r.endpoint(e.Src), r.frontend(true, e.Dst, e.Proto), r.endpoint(e.Via)
	default:
		c, ok := endToEnd[e.Class]
		if !ok {
			return // a class of a newer object than this agent: nothing to say
		}
		rec.Event, rec.Verdict, rec.Path = c.event, c.verdict, c.path
		rec.Src, rec.Dst = r.endpoint(e.Src), r.endpoint(e.Dst)
	}
	r.store.Add(rec)
}

// endToEnd are the event classes whose records are the event, verdict
// and path of the class between the two ends the event names: a pair's
// client and server, a fallback's sender and receiver.
var endToEnd = map[string]struct{ event, verdict, path string }{
	"open":     {EventOpen, VerdictCached, PathFast},
	"learn":    {EventLearn, VerdictCached, PathFast},
	"pair":     {EventPair, VerdictBypassed, PathBypass},
	"fallback": {EventFallback, VerdictToStack, PathBypass},
}

// Evicted queues a flow the fast path let go (datapath/fastpath
// OnEvict), for RecordEvictions to name and record: it runs under the
// fast path's lock, so it names nothing and never waits. Past
// evictsPerSecond a second, or with the queue full, it counts instead,
// in the next record's Suppressed.
func (r *EventRecorder) Evicted(e fastpath.Eviction) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.evictSince) >= time.Second {
		r.evictSince, r.evicts = now, 0
	}
	if r.evicts < evictsPerSecond {
		select {
		case r.evicted <- eviction{Eviction: e, time: now, held: r.evictHeld}:
			r.evicts++
			r.evictHeld = 0
			return
		default:
		}
	}
	r.evictHeld++
	r.suppressed.Add(1)
}

// evictReasons say why a flow left the fast path.
var evictReasons = map[fastpath.EvictReason]string{
	fastpath.EvictPolicy:   "a NetworkPolicy change revoked it",
	fastpath.EvictFlush:    "the fast path's cache was flushed (onctl cache flush, or the fast path switched on)",
	fastpath.EvictUnderlay: "the underlay changed: its node's learned header went, until the slow path learns it again",
	fastpath.EvictPeer:     "its peer node left the fast path, or changed",
	fastpath.EvictPod:      "its local pod went",
}

// RecordEvictions names and records the evictions Evicted queued, until
// ctx ends.
func (r *EventRecorder) RecordEvictions(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-r.evicted:
			r.recordEviction(e)
		}
	}
}

// recordEviction names the ends of a queued eviction and records it.
func (r *EventRecorder) recordEviction(e eviction) {
	r.store.Add(Record{Time: e.time, Node: r.node, Event: EventEvict, Verdict: VerdictEvicted, Path: PathFast, Suppressed: e.held,
		Proto: e.Proto, Src: r.endpoint(e.Local), Dst: r.endpoint(e.Remote), Reason: evictReasons[e.Why]})
}

// pathOfCounters is the path whose counters a drop's reason is of.
func pathOfCounters(counters string) string {
	switch counters {
	case "onc_stat":
		return PathFast
	case "lb_stat", "lb6_stat":
		return PathSocketLB
	}
	return PathUplinkLB
}

// endpoint names a: a pod, a node, or the address.
func (r *EventRecorder) endpoint(a netip.AddrPort) Endpoint {
	if r.res.Pod != nil {
		if e, ok := r.res.Pod(a.Addr()); ok {
			e.Addr = a
			return e
		}
	}
	if r.res.Node != nil {
		if name, ok := r.res.Node(a.Addr()); ok {
			return Endpoint{Kind: KindNode, Name: name, Addr: a}
		}
	}
	return Endpoint{Kind: KindIP, Addr: a}
}

// frontend names vip: a Service, else as endpoint.
func (r *EventRecorder) frontend(uplink bool, vip netip.AddrPort, proto uint8) Endpoint {
	if r.res.Service != nil {
		if ns, name, ok := r.res.Service(uplink, vip, proto); ok {
			return Endpoint{Kind: KindService, Namespace: ns, Name: name, Addr: vip}
		}
	}
	return r.endpoint(vip)
}

// socket names the caller of a socket call by its network namespace: a
// local pod, this node (the host's), or the namespace's cookie for one
// the agent does not know (a pod not registered with the socket LB yet,
// say, after an agent restart).
func (r *EventRecorder) socket(netns uint64) Endpoint {
	if r.res.PodOfNetns != nil {
		if a, ok := r.res.PodOfNetns(netns); ok {
			return r.endpoint(netip.AddrPortFrom(a, 0))
		}
	}
	if netns == r.res.HostNetns || r.res.HostNetns == 0 {
		return Endpoint{Kind: KindNode, Name: r.node}
	}
	return Endpoint{Kind: KindUnknown, Name: fmt.Sprintf("netns %d", netns)}
}

// ClusterPod names the pod of the cluster with address ip, as the
// policy records do.
func (r *Recorder) ClusterPod(ip netip.Addr) (Endpoint, bool) { return r.clusterPod(ip) }
