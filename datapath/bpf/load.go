package bpf

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"
)

// LoadPinned loads one feature's object (spec, its constants set) into
// objs, a bpf2go Objects struct, with its maps pinned by name in dir. The
// programs are always new; the maps an earlier agent pinned there are
// adopted, so what they hold (flows, Services, sockets) carries on. Maps
// named in shared are another feature's, used as they are (see
// FlowCache).
//
// When a pinned map does not fit this version (an upgrade changed its
// layout), every map of the object is replaced, so none is read with
// another's assumptions: beforeReplace (if not nil) runs first, with the
// old pins in place, then they are removed and the object loaded with new,
// empty maps. Programs an earlier agent attached keep the old maps until
// their links are given the new programs. A verifier error is reported
// with its full log.
func LoadPinned(what string, spec *ebpf.CollectionSpec, dir string, objs any, shared map[string]*ebpf.Map, beforeReplace func() error) error {
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}, MapReplacements: shared}
	err := spec.LoadAndAssign(objs, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		slog.Warn("pinned eBPF maps do not fit this version; replacing them", "feature", what, "dir", dir, "err", err)
		if beforeReplace != nil {
			if err := beforeReplace(); err != nil {
				return fmt.Errorf("load %s: before replacing its maps: %w", what, err)
			}
		}
		if err := RemoveMapPins(dir, spec); err != nil {
			return fmt.Errorf("load %s: %w", what, err)
		}
		err = spec.LoadAndAssign(objs, opts)
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("load %s: %+v", what, ve)
	}
	if err != nil {
		return fmt.Errorf("load %s: %w", what, err)
	}
	return nil
}

// FlowCache is the fast path's flow cache (include/flow_cache.h) as
// another feature's programs share it: loaded with these maps, they judge
// a flow as the fast path does, and one eviction reaches both.
// EgressHooks is the fast path's table of programs its egress program
// passes packets on to (include/fastpath.h); Mark is the skb->mark bit
// netfilter sets on ESTABLISHED packets the cache may learn.
type FlowCache struct {
	Filter, Local, Config, EgressHooks *ebpf.Map
	Mark                               uint32
}

// EgressHookUplinkLB is the uplink load balancer's slot in
// FlowCache.EgressHooks (EGRESS_HOOK_UPLINK_LB).
const EgressHookUplinkLB = 0

// flowCacheMaps are the maps of include/flow_cache.h.
var flowCacheMaps = []string{FastpathMapOncFilter, FastpathMapOncLocal, FastpathMapOncCfg}

// Share makes spec, an object that includes flow_cache.h, use c's maps:
// it returns the replacements for LoadPinned, and unpins the spec's own
// copies, so that neither loading nor removing the object touches the
// fast path's pins. With c nil the object gets private, empty maps: it
// never finds a flow established.
func (c *FlowCache) Share(spec *ebpf.CollectionSpec) (map[string]*ebpf.Map, error) {
	for _, name := range flowCacheMaps {
		m, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("object has no flow cache map %s", name)
		}
		m.Pinning = ebpf.PinNone
	}
	if c == nil {
		return nil, nil
	}
	return map[string]*ebpf.Map{
		FastpathMapOncFilter: c.Filter, FastpathMapOncLocal: c.Local, FastpathMapOncCfg: c.Config,
	}, nil
}
