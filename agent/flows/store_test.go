package flows

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func rec(i int, ns string) Record {
	return Record{Time: time.Unix(int64(i), 0), Event: EventPolicy, Verdict: VerdictDenied,
		Src: Endpoint{Kind: KindPod, Namespace: ns, Name: fmt.Sprint("p", i)}, Dst: Endpoint{Kind: KindIP, Addr: netip.MustParseAddrPort("10.0.0.1:80")}}
}

func names(rs []Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Src.Name)
	}
	return out
}

// The store keeps the last records, oldest first, and the filters select
// by either end, verdict and time.
func TestStoreKeepsTheLast(t *testing.T) {
	s := NewStore(3)
	for i := range 5 {
		s.Add(rec(i, []string{"x", "y"}[i%2]))
	}
	if got := fmt.Sprint(names(s.List(Filter{}))); got != "[p2 p3 p4]" || s.Added() != 5 {
		t.Fatalf("after 5 records in a store of 3: %s (%d added), want [p2 p3 p4]", got, s.Added())
	}
	for _, c := range []struct {
		f    Filter
		want string
	}{
		{Filter{Namespace: "x"}, "[p2 p4]"},
		{Filter{Pod: "y/p3"}, "[p3]"},
		{Filter{Pod: "x/p3"}, "[]"},
		{Filter{Since: time.Unix(3, 0)}, "[p3 p4]"},
		{Filter{Verdict: VerdictDenied}, "[p2 p3 p4]"},
		{Filter{Verdict: "allowed"}, "[]"},
	} {
		if got := fmt.Sprint(names(s.List(c.f))); got != c.want {
			t.Errorf("filter %+v: %s, want %s", c.f, got, c.want)
		}
	}
	if _, err := ParseFilter("nons", "", "", "", time.Time{}); err == nil {
		t.Error("pod without a namespace accepted")
	}
	for _, v := range []string{VerdictDenied, VerdictAllowed, VerdictDropped} {
		if f, err := ParseFilter("", "", v, "", time.Time{}); err != nil || f.Verdict != v {
			t.Errorf("verdict %s: %+v, %v", v, f, err)
		}
	}
	if _, err := ParseFilter("", "", "maybe", "", time.Time{}); err == nil || !strings.Contains(err.Error(), "denied, allowed, dropped") {
		t.Errorf("verdict maybe: %v, want an error naming the verdicts records have", err)
	}
}

// A would-allow packet was denied, a would-deny one allowed: the verdict
// selects them with the others (a consumer of denials misses no real
// drop), and the audit selects them alone.
func TestFilterAuditVerdicts(t *testing.T) {
	s := NewStore(4)
	for i, v := range [][2]string{{VerdictDenied, ""}, {VerdictAllowed, AuditWouldDeny}, {VerdictDenied, AuditWouldAllow}, {VerdictAllowed, ""}} {
		r := rec(i, "x")
		r.Verdict, r.Audit = v[0], v[1]
		s.Add(r)
	}
	for verdict, want := range map[string]string{VerdictDenied: "[p0 p2]", VerdictAllowed: "[p1 p3]", AuditWouldDeny: "[p1]", AuditWouldAllow: "[p2]"} {
		f, err := ParseFilter("", "", verdict, "", time.Time{})
		if err != nil {
			t.Fatalf("verdict %s: %v", verdict, err)
		}
		if got := fmt.Sprint(names(s.List(f))); got != want {
			t.Errorf("verdict %s: %s, want %s", verdict, got, want)
		}
	}
}

// A peer's question about a probe selects the records of its source
// address and port alone, in the store (before any is copied out).
func TestFilterSource(t *testing.T) {
	s := NewStore(8)
	for i, src := range []string{"10.0.1.5:40000", "10.0.1.5:40001", "10.0.1.6:40000", "10.0.1.5:40000"} {
		r := rec(i, "x")
		r.Src.Addr = netip.MustParseAddrPort(src)
		s.Add(r)
	}
	if got := fmt.Sprint(names(s.List(Filter{Source: netip.MustParseAddrPort("10.0.1.5:40000")}))); got != "[p0 p3]" {
		t.Errorf("source 10.0.1.5:40000: %s, want [p0 p3]", got)
	}
	if got := len(s.List(Filter{})); got != 4 {
		t.Errorf("no source: %d records, want 4", got)
	}
}

// A follower gets the stored records and then new ones; one that stops
// reading never holds up a writer, and learns how many it missed.
func TestFollow(t *testing.T) {
	s := NewStore(4)
	s.Add(rec(0, "x"))
	got := make(chan Record)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Follow(ctx, Filter{Namespace: "x"}, func(r Record) error { got <- r; return nil }) }()
	if r := <-got; r.Src.Name != "p0" {
		t.Fatalf("first: %+v, want the stored p0", r)
	}
	s.Add(rec(1, "y")) // not selected
	s.Add(rec(2, "x"))
	if r := <-got; r.Src.Name != "p2" {
		t.Fatalf("then %+v, want p2", r)
	}
	// The follower stalls (nobody reads got): the writer goes on.
	added := make(chan struct{})
	go func() {
		for i := range followBuffer + 10 {
			s.Add(rec(3+i, "x"))
		}
		close(added)
	}()
	select {
	case <-added:
	case <-time.After(5 * time.Second):
		t.Fatal("a stalled follower held up the writer")
	}
	// At least followBuffer of them were queued: it reads those. Then a
	// new record finds room, and comes after at most one more queued one
	// and a lost record: together they account for every record added.
	for range followBuffer {
		<-got
	}
	s.Add(rec(9999, "x"))
	read, r := followBuffer, <-got
	if r.Event != EventLost {
		read, r = read+1, <-got
	}
	var n int
	if _, err := fmt.Sscanf(r.Reason, "%d records not sent: this reader fell behind", &n); r.Event != EventLost || err != nil || read+n != followBuffer+10 {
		t.Fatalf("after reading %d of %d records: %+v, want a lost record for the rest", read, followBuffer+10, r)
	}
	if r := <-got; r.Src.Name != "p9999" {
		t.Fatalf("after the lost record: %+v, want p9999", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A failed send ends the follow with its error.
	boom := errors.New("boom")
	if err := s.Follow(context.Background(), Filter{}, func(Record) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Follow with a failing send: %v", err)
	}
}

// A flood of the fast path's open records never pushes a denial out: the
// informational records give up their slots first, the store keeps its
// size, and the records still come oldest first across the families.
func TestStoreSharesSurviveAFlood(t *testing.T) {
	s := NewStore(8192)
	for i := range 10 {
		s.Add(rec(i, "x"))
	}
	drop := rec(10, "x")
	drop.Event, drop.Verdict = EventDrop, VerdictDropped
	s.Add(drop)
	open := Record{Event: EventOpen, Verdict: VerdictCached, Src: Endpoint{Kind: KindIP}}
	for i := range 100_000 {
		open.Time = time.Unix(int64(100+i), 0)
		s.Add(open)
	}
	if got := names(s.List(Filter{Verdict: VerdictDenied})); len(got) != 10 || got[0] != "p0" || got[9] != "p9" {
		t.Fatalf("denials after 100000 open records: %v, want p0..p9", got)
	}
	if got := s.List(Filter{Verdict: VerdictDropped}); len(got) != 1 {
		t.Fatalf("drops after the flood: %d, want 1", len(got))
	}
	all := s.List(Filter{})
	if len(all) != 8192 || all[0].Src.Name != "p0" || all[11].Event != EventOpen || all[len(all)-1].Time != open.Time {
		t.Fatalf("%d records, first %+v: want 8192, the denials first and the last open last", len(all), all[0])
	}
	// The other way round: a flood of denials keeps at least the open
	// records' share, and the drop, under its share, stays.
	for i := range 8192 {
		s.Add(rec(1000+i, "x"))
	}
	opens, denials := len(s.List(Filter{Event: EventOpen})), len(s.List(Filter{Verdict: VerdictDenied}))
	if opens < 8192*shares[famInfo]/8 || denials < 8192*shares[famPolicy]/8 || opens+denials != 8191 {
		t.Fatalf("after a flood of denials: %d open, %d denied; want each at least its share, 8191 together", opens, denials)
	}
	if got := s.List(Filter{Verdict: VerdictDropped}); len(got) != 1 {
		t.Fatalf("drops after the denials: %d, want 1", len(got))
	}
}
