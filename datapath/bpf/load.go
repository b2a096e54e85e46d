package bpf

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"

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

// FlowCache is the fast path's maps (include/fastpath.h, flow_cache.h) as
// another feature's programs share them: loaded with these maps, they
// judge a flow as the fast path does, send over the overlay with its
// learned headers, and one eviction reaches both. Hooks is onc_hooks,
// where the fast path's programs pass on packets that are another
// feature's (the Hook* slots). Mark, PodNet and PodMask are the fast
// path's constants of the same names (onc_mark: the skb->mark bit
// netfilter sets on ESTABLISHED packets the cache may learn; the node's
// pod CIDR, in network order), which the sharing object gets too.
type FlowCache struct {
	Maps  map[string]*ebpf.Map // every map of the fast path's object, by name
	Hooks *ebpf.Map
	// Constants are the node's settings the fast path's headers declare
	// (volatile const), by name.
	Constants map[string]any
}

// The slots of onc_hooks (enum onc_hook).
const (
	HookPodToNoPeer    = 0
	HookOverlayToNoPod = 1
)

// NewFlowCache is the flow cache of a loaded fast path, with its
// constants.
func NewFlowCache(maps *FastpathMaps, constants map[string]any) *FlowCache {
	c := &FlowCache{Maps: map[string]*ebpf.Map{}, Hooks: maps.OncHooks, Constants: constants}
	v := reflect.ValueOf(maps).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok {
			c.Maps[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return c
}

// fastpathMapNames are the names of the fast path's maps.
var fastpathMapNames = func() map[string]bool {
	names := map[string]bool{}
	t := reflect.TypeFor[FastpathMapSpecs]()
	for i := range t.NumField() {
		names[t.Field(i).Tag.Get("ebpf")] = true
	}
	return names
}()

// Share makes spec, an object that includes the fast path's headers, use
// c's maps: it returns the replacements for LoadPinned, and unpins the
// spec's own copies, so that neither loading nor removing the object
// touches the fast path's pins. With c nil the object gets private, empty
// maps: it never finds a flow established.
func (c *FlowCache) Share(spec *ebpf.CollectionSpec) map[string]*ebpf.Map {
	shared := map[string]*ebpf.Map{}
	for name, m := range spec.Maps {
		if !fastpathMapNames[name] {
			continue
		}
		m.Pinning = ebpf.PinNone
		if c != nil {
			shared[name] = c.Maps[name]
		}
	}
	return shared
}

// SetConstants gives spec, an object that includes the fast path's
// headers, the fast path's constants.
func (c *FlowCache) SetConstants(spec *ebpf.CollectionSpec) error {
	return SetConstants(spec, c.Constants)
}

// SetConstants sets spec's constants (volatile const) by name.
func SetConstants(spec *ebpf.CollectionSpec, constants map[string]any) error {
	for name, v := range constants {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("object has no constant %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("constant %s: %w", name, err)
		}
	}
	return nil
}
