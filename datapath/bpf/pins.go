package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// RemoveMapPins removes the pins of an object's maps from dir: for when
// an upgrade changed a map's layout and the maps must start afresh, and
// for a feature switched off. Pins of other objects' maps in the same
// directory stay.
func RemoveMapPins(dir string, spec *ebpf.CollectionSpec) error {
	for name, m := range spec.Maps {
		if m.Pinning != ebpf.PinByName {
			continue // .rodata and the like: never pinned
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// EnsurePinDir makes dir a directory on a bpffs, mounting one if needed:
// on dir itself, or on its parent when dir cannot be created there, as
// when /sys/fs/bpf is sysfs' bare, read-only mount point. (The DaemonSet
// never gets here: a mount from its container would die with it, so its
// init container requires the node's bpffs.)
func EnsurePinDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		parent := filepath.Dir(dir)
		if onBPFFS(parent) {
			return err
		}
		if merr := unix.Mount("bpf", parent, "bpf", 0, "mode=0700"); merr != nil {
			return fmt.Errorf("%w; mounting a bpffs on %s failed too: %w", err, parent, merr)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return err
		}
	}
	if onBPFFS(dir) {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("%s is not on a bpffs and mounting one there failed: %w", dir, err)
	}
	return nil
}

func onBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.BPF_FS_MAGIC
}

// AdoptPinnedLink swaps prog into the link an earlier agent pinned at pin,
// when that link is attached where attachedHere says (atomically: no
// packet or socket call misses a program), and reports whether it did.
// Otherwise the pin is removed: unpinned and closed, a link attached
// elsewhere detaches, and the caller attaches afresh.
func AdoptPinnedLink(pin string, attachedHere func(*link.Info) bool, prog *ebpf.Program) (bool, error) {
	old, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return false, nil // none pinned (or unreadable): attach afresh
	}
	info, err := old.Info()
	if err == nil && attachedHere(info) && old.Update(prog) == nil {
		old.Close()
		return true, nil
	}
	old.Close()
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return false, nil
}
