package flows

import (
	"fmt"
	"testing"
)

// The drops of this node's pods are counted by cause: denials either
// way, the policy table's and the eBPF programs' drops; allowed packets
// and other nodes' pods are not.
func TestPodDropsCounts(t *testing.T) {
	s := NewStore(16)
	d := NewPodDrops(s, "a")
	web := Endpoint{Kind: KindPod, Namespace: "app", Name: "web", Node: "a"}
	db := Endpoint{Kind: KindPod, Namespace: "app", Name: "db", Node: "a"}
	remote := Endpoint{Kind: KindPod, Namespace: "app", Name: "client", Node: "b"}
	for _, r := range []Record{
		{Event: EventPolicy, Verdict: VerdictDenied, Direction: "ingress", Src: remote, Dst: web},
		{Event: EventPolicy, Verdict: VerdictDenied, Audit: AuditWouldAllow, Direction: "egress", Src: web, Dst: remote},
		{Event: EventPolicy, Verdict: VerdictAllowed, Direction: "ingress", Src: remote, Dst: web},
		{Event: EventPolicy, Verdict: VerdictAllowed, Audit: AuditWouldDeny, Direction: "ingress", Src: remote, Dst: web},
		{Event: EventDrop, Verdict: VerdictDropped, Cause: "spoof", Src: web, Dst: Endpoint{Kind: KindIP}},
		{Event: EventDrop, Verdict: VerdictDropped, Cause: "overlay_drop_inner_source", Src: Endpoint{Kind: KindIP}, Dst: db},
		{Event: EventPolicy, Verdict: VerdictDenied, Direction: "egress", Src: remote, Dst: web}, // the other node's
		{Event: EventOpen, Verdict: VerdictCached, Src: web, Dst: db},
	} {
		s.Add(r)
	}
	top := d.Top(10)
	if got := fmt.Sprint(top); got != "[{app web map[policy:2 spoof:1] 3} {app db map[overlay_drop_inner_source:1] 1}]" {
		t.Fatalf("drops %s", got)
	}
}

// At most N pods are reported, those with the most drops; a pod that
// left the node is forgotten.
func TestPodDropsTopN(t *testing.T) {
	s := NewStore(64)
	d := NewPodDrops(s, "a")
	const n = 3
	for i := range n + 1 {
		for range i + 1 {
			s.Add(Record{Event: EventDrop, Cause: "spoof", Src: Endpoint{Kind: KindPod, Namespace: "x", Name: fmt.Sprint("p", i), Node: "a"}})
		}
	}
	top := d.Top(n)
	if got := fmt.Sprint(top); len(top) != n || got != "[{x p3 map[spoof:4] 4} {x p2 map[spoof:3] 3} {x p1 map[spoof:2] 2}]" {
		t.Fatalf("top %d of %d pods: %s", n, n+1, got)
	}
	d.Keep(func(ns, name string) bool { return name != "p3" })
	if top := d.Top(n); len(top) != n || top[0].Name != "p2" || top[n-1].Name != "p0" {
		t.Fatalf("after p3 left: %v", top)
	}
}
