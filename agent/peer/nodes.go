package peer

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/onc-net/onc/datastore"
)

// Nodes are the node records as the agent last read them: who a pinned
// key is, and what a node's key must be.
type Nodes struct {
	mu     sync.RWMutex
	byName map[string]datastore.Node
	byPin  map[string][]string // pin → the nodes whose records pin it
}

// Set replaces the records.
func (d *Nodes) Set(nodes []datastore.Node) {
	byName, byPin := map[string]datastore.Node{}, map[string][]string{}
	for _, n := range nodes {
		byName[n.Name] = n
		if n.PeerPin != "" {
			byPin[n.PeerPin] = append(byPin[n.PeerPin], n.Name)
		}
	}
	d.mu.Lock()
	d.byName, d.byPin = byName, byPin
	d.mu.Unlock()
}

// Node is the record of the node named name.
func (d *Nodes) Node(name string) (datastore.Node, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n, ok := d.byName[name]
	return n, ok
}

// Pinning is the node whose record pins pin. A pin two records hold
// names neither: a node may write any pin into its own record, even
// another's, and must not make that one's questions its own.
func (d *Nodes) Pinning(pin string) (datastore.Node, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	names := d.byPin[pin]
	if len(names) != 1 {
		return datastore.Node{}, false
	}
	return d.byName[names[0]], true
}

// SpeaksFor reports whether node n may ask about packets from src: one
// in its pod CIDRs (the controller's to give), or its own address. A
// node writes its address into its record itself, so that counts only
// when no other record claims it and it lies in no node's pod CIDR: a
// node naming another's address, or a pod's, speaks for neither. A node
// speaks only for its own pods.
func (d *Nodes) SpeaksFor(n datastore.Node, src netip.Addr) bool {
	src = src.Unmap()
	inCIDRs := func(n datastore.Node) bool {
		return slices.ContainsFunc(n.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(src) })
	}
	if inCIDRs(n) {
		return true
	}
	if src != n.IP {
		return false
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, o := range d.byName {
		if o.Name != n.Name && (o.IP == src || inCIDRs(o)) {
			return false
		}
	}
	return true
}
