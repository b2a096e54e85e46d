package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

var (
	cidr = netip.MustParsePrefix("10.244.1.0/24")
	gw   = netip.MustParseAddr("10.244.1.1")
)

func open(t *testing.T, path string) *Pool {
	t.Helper()
	p, dropped, err := Open(path, cidr, gw)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 0 {
		t.Fatalf("dropped %v", dropped)
	}
	return p
}

func key(i int) Key { return Key{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"} }

func TestConcurrentAllocationsAreUniqueAndSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	p := open(t, path)
	const n = 100
	got := make([]Attachment, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if got[i], err = p.Allocate(Attachment{Key: key(i), HostIface: "h"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]Key{}
	for _, a := range got {
		if !cidr.Contains(a.IP) || a.IP == gw || a.IP == cidr.Addr() {
			t.Fatalf("%s got unusable address %s", a.Key, a.IP)
		}
		if k, dup := seen[a.IP]; dup {
			t.Fatalf("%s given to %s and %s", a.IP, k, a.Key)
		}
		seen[a.IP] = a.Key
	}
	again := open(t, path)
	for _, a := range got {
		b, ok := again.Get(a.Key)
		if !ok || b.IP != a.IP {
			t.Fatalf("after restart %s has %v (ok=%v), want %s", a.Key, b.IP, ok, a.IP)
		}
	}
	// A new allocation after the restart must not reuse a live address.
	a, err := again.Allocate(Attachment{Key: key(1000)})
	if err != nil {
		t.Fatal(err)
	}
	if _, dup := seen[a.IP]; dup {
		t.Fatalf("after restart %s was handed out again", a.IP)
	}
}

func TestExhaustionAndReservedAddresses(t *testing.T) {
	small := netip.MustParsePrefix("10.0.0.0/29") // .1 gateway, .0/.7 network/broadcast: 5 usable
	p, _, err := Open(filepath.Join(t.TempDir(), "s.json"), small, netip.MustParseAddr("10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for i := 0; i < 5; i++ {
		a, err := p.Allocate(Attachment{Key: key(i)})
		if err != nil {
			t.Fatal(err)
		}
		got[a.IP.String()] = true
	}
	for _, bad := range []string{"10.0.0.0", "10.0.0.1", "10.0.0.7"} {
		if got[bad] {
			t.Fatalf("reserved address %s handed out", bad)
		}
	}
	if _, err := p.Allocate(Attachment{Key: key(5)}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("6th allocation: err = %v, want ErrExhausted", err)
	}
	if _, _, err := p.Release(key(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Allocate(Attachment{Key: key(5)}); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

func TestDuplicateKeyIsRejected(t *testing.T) {
	p := open(t, filepath.Join(t.TempDir(), "d.json"))
	first, err := p.Allocate(Attachment{Key: key(1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Allocate(Attachment{Key: key(1)}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: err = %v, want ErrExists", err)
	}
	if a, _ := p.Get(key(1)); a.IP != first.IP || len(p.List()) != 1 {
		t.Fatal("a rejected duplicate changed the pool")
	}
}

func TestFreedAddressIsReusedLast(t *testing.T) {
	p := open(t, filepath.Join(t.TempDir(), "r.json"))
	a, _ := p.Allocate(Attachment{Key: key(1)})
	if _, had, _ := p.Release(key(1)); !had {
		t.Fatal("release of a live attachment reported none")
	}
	if _, had, err := p.Release(key(1)); had || err != nil {
		t.Fatalf("second release: had=%v err=%v", had, err)
	}
	b, _ := p.Allocate(Attachment{Key: key(2)})
	if b.IP == a.IP {
		t.Fatalf("freed %s handed out again at once", a.IP)
	}
}

func TestOpenDropsAttachmentsOutsideANewCIDRAndRejectsCorruptState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.json")
	p := open(t, path)
	if _, err := p.Allocate(Attachment{Key: key(1), HostIface: "onc1"}); err != nil {
		t.Fatal(err)
	}
	other := netip.MustParsePrefix("10.244.9.0/24")
	q, dropped, err := Open(path, other, netip.MustParseAddr("10.244.9.1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 || dropped[0].HostIface != "onc1" || len(q.List()) != 0 {
		t.Fatalf("dropped = %v, left = %v", dropped, q.List())
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, cidr, gw); err == nil {
		t.Fatal("corrupt state file accepted")
	}
}
