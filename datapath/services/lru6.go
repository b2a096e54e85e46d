package services

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// The IPv6 maps the programs write, the sockets' reverse translation and
// affinity and the uplink's flows and affinity, are preallocated LRU
// hashes: at their full size (include/services.h, services_uplink6.h) they
// take about 64 MB of kernel memory whether any IPv6 socket or client uses
// them or not. A node whose cluster has no IPv6 pods (Options.IPv6 false)
// loads them at lru6Small entries. (The agent's IPv6 tables, hashes that
// allocate entries as they fill, keep their size: an empty one still
// holds its bucket array.)
var lru6Maps = []string{bpf.ServicesMapOncLb6Revnat, bpf.ServicesMapOncLb6Aff, bpf.ServicesMapOncLb6Flows, bpf.ServicesMapOncLb6UplinkAff}

// lru6Small is those maps' size on a node without IPv6 pods. There they
// hold nothing: an IPv6 Service has endpoints only in IPv6 EndpointSlices,
// which list IPv6 pods. The exception is IPv6 endpoints that are no pod's
// (a selectorless Service's, hostNetwork pods' on IPv6 node addresses) in
// a cluster whose pods are IPv4: the host's sockets and clients outside
// still reach them, through these maps (Sync warns). The kernel takes any size from 1 for a
// common LRU hash (it rounds up only a BPF_F_NO_COMMON_LRU one, to a
// multiple of the possible CPUs), but a common LRU moves free entries to a
// CPU, and evicts when none is free, in batches of up to 128
// (LOCAL_FREE_TARGET; newer kernels scale that down for small maps): one
// insert into a full map of 128 entries or fewer can evict every entry not
// looked up lately. Two batches' worth never empties at once, and costs
// about 30 KB a map.
const lru6Small = 256

// sizeLRU6 sizes the IPv6 LRU maps in spec for a node with or without IPv6
// pods, and removes the pins of those an earlier agent loaded at the other
// size (the node's cluster gained or lost IPv6 pods since), which would
// not load: cilium/ebpf reuses a pinned map only if its size matches, and
// bpf.LoadPinned would otherwise replace every map of the object, the
// IPv4 ones included, losing their sockets' reverse entries. Replacing
// just these loses nothing that matters: going to the full size they held
// nothing (see lru6Small); going to the small one the cluster has no IPv6
// pods any more, so what they held points at backends that are gone.
// Pins of the same size are left for LoadPinned to adopt, contents and
// all; a pin that differs in more than its size (an upgrade changed the
// layout) too, so that LoadPinned replaces the object's maps together.
func sizeLRU6(spec *ebpf.CollectionSpec, pinDir string, ipv6 bool) error {
	for _, name := range lru6Maps {
		ms, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("services object has no map %s", name)
		}
		if !ipv6 {
			ms.MaxEntries = lru6Small
		}
		pin := filepath.Join(pinDir, name)
		m, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			continue // none pinned (or unreadable): LoadPinned decides
		}
		pinned := m.MaxEntries()
		resized := ms.Copy()
		resized.MaxEntries = pinned
		fits := resized.Compatible(m) == nil
		m.Close()
		if pinned == ms.MaxEntries || !fits {
			continue
		}
		slog.Info("replacing a pinned IPv6 map of another size", "map", name, "entries", pinned, "want", ms.MaxEntries, "ipv6", ipv6)
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("resize %s: %w", name, err)
		}
	}
	return nil
}
