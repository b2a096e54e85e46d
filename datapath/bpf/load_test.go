//go:build privileged

package bpf_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// pinDir is a private bpffs, one agent's.
func pinDir(t *testing.T) string {
	testutil.Privileged(t)
	dir := t.TempDir()
	testutil.Must(t, bpf.EnsurePinDir(dir))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// pinnedID is the id of the map pinned at dir/name, and its value size.
func pinnedID(t *testing.T, dir, name string) (ebpf.MapID, uint32) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
	testutil.Must(t, err)
	defer m.Close()
	info, err := m.Info()
	testutil.Must(t, err)
	id, _ := info.ID()
	return id, m.ValueSize()
}

// An agent of this version on the pins of a v0 agent (one object per
// attach point): the socket LB's and the bypass's maps have the layout
// they had, so they are adopted with what they hold; the fast path's
// config lost the static settings, so every fast-path map is replaced,
// and the v0 programs keep the old maps until their links get new ones.
func TestLoadPinnedOnV0Pins(t *testing.T) {
	dir := pinDir(t)
	var v0 []*ebpf.Collection
	for _, name := range []string{bpftest.V0EgressFast, bpftest.V0LearnIngress, bpftest.V0SockConnect4,
		bpftest.V0SockGetpeername4, bpftest.V0SockOps, bpftest.V0SkMsg} {
		v0 = append(v0, bpftest.LoadV0(t, name, dir))
	}
	// What the v0 agent had written: a flow, a Service, a pod.
	testutil.Must(t, v0[0].Maps["onc_filter"].Put(bpf.FastpathFlowKey{Proto: 6}, bpf.FastpathFlowVal{Egress: 1, Ingress: 1}))
	testutil.Must(t, v0[2].Maps["onc_lb_svc"].Put(bpf.ServicesLbSvcKey{Port: 80, Proto: 6}, bpf.ServicesLbSvc{Id: 1, Count: 1}))
	testutil.Must(t, v0[4].Maps["onc_bp_pods"].Put(uint32(7), uint64(42)))

	load := func(spec func() (*ebpf.CollectionSpec, error), objs any, beforeReplace func() error) (*ebpf.CollectionSpec, map[string]ebpf.MapID) {
		t.Helper()
		s, err := spec()
		testutil.Must(t, err)
		before := map[string]ebpf.MapID{}
		for name := range s.Maps {
			// A map new since v0 (the uplink's flows, say) is created.
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil && s.Maps[name].Pinning == ebpf.PinByName {
				before[name], _ = pinnedID(t, dir, name)
			}
		}
		testutil.Must(t, bpf.LoadPinned(t.Name(), s, dir, objs, nil, beforeReplace))
		return s, before
	}

	var fp bpf.FastpathObjects
	oldConfigSize := uint32(0)
	spec, before := load(bpf.LoadFastpath, &fp, func() error {
		_, oldConfigSize = pinnedID(t, dir, bpf.FastpathMapOncCfg)
		return nil
	})
	defer fp.Close()
	if oldConfigSize != 28 {
		t.Fatalf("before the fast path's maps were replaced, the pinned config held %d bytes, want v0's 28", oldConfigSize)
	}
	for name := range before {
		id, size := pinnedID(t, dir, name)
		if id == before[name] {
			t.Errorf("fast-path map %s adopted, want every one replaced", name)
		}
		if size != spec.Maps[name].ValueSize {
			t.Errorf("fast-path map %s pinned with %d-byte values, want %d", name, size, spec.Maps[name].ValueSize)
		}
	}
	if n := bpftest.Entries(t, fp.OncFilter); n != 0 {
		t.Errorf("the new flow cache holds %d flows, want none", n)
	}
	var old [28]byte
	testutil.Must(t, v0[0].Maps["onc_cfg"].Lookup(uint32(0), &old)) // still there for the v0 programs

	var lb bpf.ServicesObjects
	_, before = load(bpf.LoadServices, &lb, func() error { t.Error("the socket LB's maps were replaced"); return nil })
	defer lb.Close()
	var bp bpf.BypassObjects
	_, bpBefore := load(bpf.LoadBypass, &bp, func() error { t.Error("the bypass's maps were replaced"); return nil })
	defer bp.Close()
	for name, id := range bpBefore {
		before[name] = id
	}
	for name, id := range before {
		if now, _ := pinnedID(t, dir, name); now != id {
			t.Errorf("map %s replaced, want the v0 agent's adopted", name)
		}
	}
	var svc bpf.ServicesLbSvc
	testutil.Must(t, lb.OncLbSvc.Lookup(bpf.ServicesLbSvcKey{Port: 80, Proto: 6}, &svc))
	var cookie uint64
	testutil.Must(t, bp.OncBpPods.Lookup(uint32(7), &cookie))
	if svc.Id != 1 || cookie != 42 {
		t.Errorf("adopted maps hold service %+v and pod cookie %d, want what the v0 agent wrote", svc, cookie)
	}
}
