// Package flows keeps the flow records of this node (docs/observability.md):
// what the datapath reported about single packets (datapath/flows),
// resolved to the pods, nodes and policies they concern, in a buffer of the
// last N records that onctl flows reads and follows.
package flows

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kinds of endpoint.
const (
	KindPod = "pod" // a pod the agent knows, of this node or another
	KindIP  = "ip"  // an address of no pod the agent knows: a node, a host outside, a pod it has not seen
	// KindUnknown is a socket call's network namespace the agent does not
	// know; Name is "netns <cookie>".
	KindUnknown = "unknown"
)

// Endpoint is one end of a flow.
type Endpoint struct {
	Kind      string
	Namespace string // pods
	Name      string // pods
	Node      string // the node a pod runs on
	Addr      netip.AddrPort
}

// String is "ns/name (ip:port)" for a pod, "node name (ip:port)" or
// "service ns/name (ip:port)" for those, the address otherwise.
func (e Endpoint) String() string {
	switch e.Kind {
	case KindPod:
		return fmt.Sprintf("%s/%s (%s)", e.Namespace, e.Name, e.Addr)
	case KindNode:
		return fmt.Sprintf("node %s (%s)", e.Name, e.Addr)
	case KindService:
		return fmt.Sprintf("service %s/%s (%s)", e.Namespace, e.Name, e.Addr)
	case KindUnknown:
		return e.Name
	}
	return e.Addr.String()
}

// Events and verdicts of records.
const (
	EventPolicy    = "policy" // a pod's policy chain's verdict on a packet
	EventDrop      = "drop"   // a drop: by a check before any pod's rules, or by an eBPF program
	EventLost      = "lost"   // records this follower did not get: it fell behind
	VerdictDenied  = "denied"
	VerdictAllowed = "allowed" // a new connection
	VerdictDropped = "dropped"
	// Audits of policy records (Record.Audit; policies annotated
	// onc.io/policy-mode: audit): allowed, and audited policies would
	// deny it; denied, and an audited policy would allow it. A filter's
	// verdict may name one: it selects the records with that audit.
	AuditWouldDeny  = "would-deny"
	AuditWouldAllow = "would-allow"
)

// Record is one flow record.
type Record struct {
	Time      time.Time
	Node      string // the node that recorded it
	Event     string
	Verdict   string
	Direction string // ingress or egress: of the local pod whose policy decided
	Proto     uint8
	Src, Dst  Endpoint
	// Reason says why, in words; Policies are the policies it names.
	Reason   string
	Policies []string
	Rule     *int   // the index of the deciding rule in its policy's list; nil: none
	Path     string // the datapath that saw it: slow (the kernel's stack and netfilter), or events.go's
	// Tier decided a policy record's verdict (Decision.Tier); RuleName is
	// the deciding ClusterNetworkPolicy rule's name.
	Tier, RuleName string
	// Translated is the third end of an eBPF program's record (events.go),
	// zero for none; Suppressed how many of its class were held back.
	Translated Endpoint
	Suppressed uint32
	// Audit is what audited policies would have done with a policy
	// record's packet (AuditWouldDeny, AuditWouldAllow), "" for none: a
	// field of its own, so that the verdict is what happened.
	Audit string
	// Cause names a drop's cause in a word, for the metrics (PodDrops):
	// the policy table's (spoof, invalid, nosyn) or an eBPF program's
	// counter; not sent.
	Cause string
}

// Filter selects records; its zero value selects every one.
type Filter struct {
	Pod       string // namespace/name: either end, or the backend chosen
	Namespace string // either end's, or the backend's
	Verdict   string
	Event     string
	Since     time.Time
	// Source: records whose source is this address and port (invalid:
	// any), checked before a record is copied out.
	Source netip.AddrPort
}

// Match reports whether f selects r.
func (f Filter) Match(r *Record) bool {
	ends := [3]Endpoint{r.Src, r.Dst, r.Translated}
	switch {
	case f.Verdict != "" && r.Verdict != f.Verdict && r.Audit != f.Verdict:
		return false
	case f.Event != "" && r.Event != f.Event:
		return false
	case !f.Since.IsZero() && r.Time.Before(f.Since):
		return false
	case f.Source.IsValid() && r.Src.Addr != f.Source:
		return false
	case f.Pod != "" && !matchEnds(ends, func(e Endpoint) bool { return e.Kind == KindPod && e.Namespace+"/"+e.Name == f.Pod }):
		return false
	case f.Namespace != "" && !matchEnds(ends, func(e Endpoint) bool { return e.Kind == KindPod && e.Namespace == f.Namespace }):
		return false
	}
	return true
}

// matchEnds says whether fn holds for an end: either, or the backend a
// load balancer chose.
func matchEnds(ends [3]Endpoint, fn func(Endpoint) bool) bool {
	return fn(ends[0]) || fn(ends[1]) || fn(ends[2])
}

// ParseFilter checks a request's filter fields.
func ParseFilter(pod, namespace, verdict, event string, since time.Time) (Filter, error) {
	if pod != "" && strings.Count(pod, "/") != 1 {
		return Filter{}, fmt.Errorf("pod %q: give namespace/name", pod)
	}
	if verdict != "" && !slices.Contains(Verdicts, verdict) {
		return Filter{}, fmt.Errorf("verdict %q: the records have %s", verdict, strings.Join(Verdicts, ", "))
	}
	if event != "" && !slices.Contains(Events, event) {
		return Filter{}, fmt.Errorf("event %q: the records have %s", event, strings.Join(Events, ", "))
	}
	return Filter{Pod: pod, Namespace: namespace, Verdict: verdict, Event: event, Since: since}, nil
}

// followBuffer is how many records a follower may be behind before it
// loses some.
const followBuffer = 1024

// A family of records shares the store with the others (Store): policy
// verdicts, datapath drops and refusals, and the high-rate informational
// records of the eBPF programs and the agent's evictions.
type family uint8

const (
	famInfo   family = iota // translate, open, learn, evict: up to thousands a second
	famDrop                 // drop, refuse
	famPolicy               // the pod chains' verdicts
	families
)

// familyOf is the family of an event; events this store does not know
// are informational.
func familyOf(event string) family {
	switch event {
	case EventPolicy:
		return famPolicy
	case EventDrop, EventRefuse:
		return famDrop
	}
	return famInfo
}

// shares are each family's part of the store, in eighths: a family at or
// under its part never loses a record to another's.
var shares = [families]int{famInfo: 2, famDrop: 2, famPolicy: 4}

// slot is one place of the store: a record, when it was added (seq), and
// the next slot of its family (-1: none).
type slot struct {
	r    Record
	seq  uint64
	next int32
}

// queue is a family's records: the slots from head (the oldest) to tail.
type queue struct {
	head, tail int32
	n          int
	share      int
}

// Store holds the last records in a fixed array of slots shared by the
// families of records: appending never allocates beyond a record's own
// strings, and memory is bounded by the size. A family may fill the
// space the others leave; once the store is full, a new record takes
// the slot of the oldest record of the family most over its share (the
// informational ones first on a tie), so that a flood of open records
// never pushes a denial out. No writer ever waits for a reader.
type Store struct {
	mu        sync.Mutex
	slots     []slot
	used      int // slots handed out so far: the rest are free
	queues    [families]queue
	added     uint64
	followers map[*follower]bool
	taps      []func(*Record)
}

type follower struct {
	f    Filter
	ch   chan Record
	lost int // records not queued since the last one sent: the channel was full
}

// NewStore keeps the last size records.
func NewStore(size int) *Store {
	s := &Store{slots: make([]slot, size), followers: map[*follower]bool{}}
	left := size
	for f := families - 1; f > 0; f-- {
		s.queues[f].share = size * shares[f] / 8
		left -= s.queues[f].share
	}
	s.queues[famInfo].share = left
	for f := range s.queues {
		s.queues[f].head, s.queues[f].tail = -1, -1
	}
	return s
}

// Add stores r, dropping the oldest record of the family most over its
// share when full, and hands it to the followers it matches.
func (s *Store) Add(r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put(r)
	s.added++
	for _, tap := range s.taps {
		tap(&r)
	}
	for fl := range s.followers {
		if !fl.f.Match(&r) {
			continue
		}
		if fl.lost > 0 {
			select {
			case fl.ch <- lostRecord(fl.lost, r.Node):
				fl.lost = 0
			default:
				fl.lost++
				continue
			}
		}
		select {
		case fl.ch <- r:
		default:
			fl.lost++
		}
	}
}

// put stores r in a free slot, or in the oldest of the family most over
// its share counting r (s.mu held).
func (s *Store) put(r Record) {
	if len(s.slots) == 0 {
		return
	}
	f := familyOf(r.Event)
	i := int32(s.used)
	if s.used < len(s.slots) {
		s.used++
	} else {
		victim, over := famInfo, -len(s.slots)
		for g := range families {
			o := s.queues[g].n - s.queues[g].share
			if g == f {
				o++
			}
			if s.queues[g].n > 0 && o > over {
				victim, over = g, o
			}
		}
		q := &s.queues[victim]
		i = q.head
		q.head, q.n = s.slots[i].next, q.n-1
		if q.head < 0 {
			q.tail = -1
		}
	}
	s.slots[i] = slot{r: r, seq: s.added, next: -1}
	q := &s.queues[f]
	if q.tail >= 0 {
		s.slots[q.tail].next = i
	} else {
		q.head = i
	}
	q.tail, q.n = i, q.n+1
}

func lostRecord(n int, node string) Record {
	return Record{Time: time.Now(), Node: node, Event: EventLost, Reason: fmt.Sprintf("%d records not sent: this reader fell behind", n)}
}

// Tap has fn called with each record added from now on, under the
// store's lock: fn must not block, nor keep r (the exporters copy it into
// their queue, or count it lost).
func (s *Store) Tap(fn func(r *Record)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taps = append(s.taps, fn)
}

// Added is how many records were ever added.
func (s *Store) Added() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.added
}

// list is the stored records f selects, oldest first: the families'
// queues merged in the order their records were added (s.mu held).
func (s *Store) list(f Filter) []Record {
	var out []Record
	var at [families]int32
	for g := range at {
		at[g] = s.queues[g].head
	}
	for {
		next := -1
		for g, i := range at {
			if i >= 0 && (next < 0 || s.slots[i].seq < s.slots[at[next]].seq) {
				next = g
			}
		}
		if next < 0 {
			return out
		}
		sl := &s.slots[at[next]]
		if f.Match(&sl.r) {
			out = append(out, sl.r)
		}
		at[next] = sl.next
	}
}

// List is the stored records f selects, oldest first.
func (s *Store) List(f Filter) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list(f)
}

// Follow sends the stored records f selects, then every new one as it
// comes, until ctx ends or send fails. A follower that falls more than
// followBuffer records behind gets an EventLost record saying how many
// it missed.
func (s *Store) Follow(ctx context.Context, f Filter, send func(Record) error) error {
	fl := &follower{f: f, ch: make(chan Record, followBuffer)}
	s.mu.Lock()
	stored := s.list(f)
	s.followers[fl] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.followers, fl)
		s.mu.Unlock()
	}()
	for _, r := range stored {
		if err := send(r); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-fl.ch:
			if err := send(r); err != nil {
				return err
			}
		}
	}
}
