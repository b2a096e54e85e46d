package flows

import (
	"cmp"
	"slices"
	"sync"
)

// CausePolicy is the cause of a pod's policy denials (PodDrops).
const CausePolicy = "policy"

// PodDrops counts the dropped packets the records of a store name, by
// local pod and cause, for onc_pod_drops_total: the pod chains' denials
// (CausePolicy), the policy table's drops before any pod's rules (spoof,
// invalid, nosyn) and the eBPF programs' drops (their counter's name).
// Only this node's pods are counted, and only while they are attached
// (Keep), so the counts stay bounded by its pods.
type PodDrops struct {
	node   string
	mu     sync.Mutex
	counts map[podRef]map[string]uint64
}

type podRef struct{ namespace, name string }

// PodDrop is one pod's drops by cause, and their total.
type PodDrop struct {
	Namespace, Name string
	Causes          map[string]uint64
	Total           uint64
}

// NewPodDrops counts the drops of node's pods in the records added to
// store from now on.
func NewPodDrops(store *Store, node string) *PodDrops {
	d := &PodDrops{node: node, counts: map[podRef]map[string]uint64{}}
	store.Tap(d.count)
	return d
}

// count counts r if it is a drop of a local pod (a store tap: it must not
// block).
func (d *PodDrops) count(r *Record) {
	var pod *Endpoint
	cause := r.Cause
	switch {
	case r.Event == EventPolicy && r.Verdict == VerdictDenied: // would-allow records too: real drops
		pod, cause = &r.Src, CausePolicy
		if r.Direction == "ingress" {
			pod = &r.Dst
		}
	case r.Event == EventDrop:
		pod = &r.Src
		if !d.local(pod) {
			pod = &r.Dst
		}
	default:
		return
	}
	if !d.local(pod) || cause == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ref := podRef{pod.Namespace, pod.Name}
	if d.counts[ref] == nil {
		d.counts[ref] = map[string]uint64{}
	}
	d.counts[ref][cause]++
}

func (d *PodDrops) local(e *Endpoint) bool { return e.Kind == KindPod && e.Node == d.node }

// Keep forgets the pods attached does not hold (namespace/name): they
// left this node.
func (d *PodDrops) Keep(attached func(namespace, name string) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ref := range d.counts {
		if !attached(ref.namespace, ref.name) {
			delete(d.counts, ref)
		}
	}
}

// Top is the n pods with the most drops, most first (by name on a tie).
func (d *PodDrops) Top(n int) []PodDrop {
	d.mu.Lock()
	all := make([]PodDrop, 0, len(d.counts))
	for ref, causes := range d.counts {
		p := PodDrop{Namespace: ref.namespace, Name: ref.name, Causes: make(map[string]uint64, len(causes))}
		for c, v := range causes {
			p.Causes[c], p.Total = v, p.Total+v
		}
		all = append(all, p)
	}
	d.mu.Unlock()
	slices.SortFunc(all, func(a, b PodDrop) int {
		return cmp.Or(cmp.Compare(b.Total, a.Total), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return all[:min(n, len(all))]
}
