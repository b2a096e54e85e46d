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
// adopted, so what they hold (flows, Services, sockets) carries on.
//
// When a pinned map does not fit this version (an upgrade changed its
// layout), every map of the object is replaced, so none is read with
// another's assumptions: beforeReplace (if not nil) runs first, with the
// old pins in place, then they are removed and the object loaded with new,
// empty maps. Programs an earlier agent attached keep the old maps until
// their links are given the new programs. A verifier error is reported
// with its full log.
func LoadPinned(what string, spec *ebpf.CollectionSpec, dir string, objs any, beforeReplace func() error) error {
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
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
