package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

var (
	cidr = netip.MustParsePrefix("10.244.1.0/24")
	gw   = netip.MustParseAddr("10.244.1.1")
)

func open(t *testing.T, path string) *Pool {
	t.Helper()
	p, dropped, err := Open(path, []netip.Prefix{cidr}, gw)
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
		if !cidr.Contains(a.IPs[0]) || a.IPs[0] == gw || a.IPs[0] == cidr.Addr() {
			t.Fatalf("%s got unusable address %s", a.Key, a.IPs[0])
		}
		if k, dup := seen[a.IPs[0]]; dup {
			t.Fatalf("%s given to %s and %s", a.IPs[0], k, a.Key)
		}
		seen[a.IPs[0]] = a.Key
	}
	again := open(t, path)
	for _, a := range got {
		b, ok := again.Get(a.Key)
		if !ok || b.IPs[0] != a.IPs[0] {
			t.Fatalf("after restart %s has %v (ok=%v), want %s", a.Key, b.IPs[0], ok, a.IPs[0])
		}
	}
	// A new allocation after the restart must not reuse a live address.
	a, err := again.Allocate(Attachment{Key: key(1000)})
	if err != nil {
		t.Fatal(err)
	}
	if _, dup := seen[a.IPs[0]]; dup {
		t.Fatalf("after restart %s was handed out again", a.IPs[0])
	}
}

func TestExhaustionAndReservedAddresses(t *testing.T) {
	small := netip.MustParsePrefix("10.0.0.0/29") // .1 gateway, .0/.7 network/broadcast: 5 usable
	p, _, err := Open(filepath.Join(t.TempDir(), "s.json"), []netip.Prefix{small}, netip.MustParseAddr("10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for i := 0; i < 5; i++ {
		a, err := p.Allocate(Attachment{Key: key(i)})
		if err != nil {
			t.Fatal(err)
		}
		got[a.IPs[0].String()] = true
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
	if a, _ := p.Get(key(1)); a.IPs[0] != first.IPs[0] || len(p.List()) != 1 {
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
	if b.IPs[0] == a.IPs[0] {
		t.Fatalf("freed %s handed out again at once", a.IPs[0])
	}
}

func TestOpenDropsAttachmentsOutsideANewCIDRAndRejectsCorruptState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.json")
	p := open(t, path)
	if _, err := p.Allocate(Attachment{Key: key(1), HostIface: "onc1"}); err != nil {
		t.Fatal(err)
	}
	other := netip.MustParsePrefix("10.244.9.0/24")
	q, dropped, err := Open(path, []netip.Prefix{other}, netip.MustParseAddr("10.244.9.1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 || dropped[0].HostIface != "onc1" || len(q.List()) != 0 {
		t.Fatalf("dropped = %v, left = %v", dropped, q.List())
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, []netip.Prefix{cidr}, gw); err == nil {
		t.Fatal("corrupt state file accepted")
	}
}

var (
	cidr6 = netip.MustParsePrefix("fd00:10:244:1::/64")
	gw6   = netip.MustParseAddr("fd00:10:244:1::1")
)

// A dual-stack node gives every attachment one address of each family,
// none twice and none reserved, and keeps them across a restart.
func TestDualStackAllocations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	cidrs := []netip.Prefix{cidr6, cidr} // the cluster's family order: IPv6 first
	p, _, err := Open(path, cidrs, gw, gw6)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]bool{}
	var got []Attachment
	for i := range 50 {
		a, err := p.Allocate(Attachment{Key: key(i)})
		if err != nil {
			t.Fatal(err)
		}
		if len(a.IPs) != 2 || !cidr6.Contains(a.IPs[0]) || !cidr.Contains(a.IPs[1]) || a.IPv4() != a.IPs[1] {
			t.Fatalf("%s got %v, want an IPv6 then an IPv4 address", a.Key, a.IPs)
		}
		for _, ip := range a.IPs {
			if seen[ip] || ip == gw || ip == gw6 || ip == cidr6.Addr() {
				t.Fatalf("%s got %s: taken, reserved or the subnet's", a.Key, ip)
			}
			seen[ip] = true
		}
		got = append(got, a)
	}
	// An agent before IPv6 reads the IPv4 CIDR and addresses ("cidr",
	// "ip"), whatever the family order.
	var old struct {
		CIDR        netip.Prefix
		Attachments []struct{ IP netip.Addr }
	}
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &old); err != nil {
		t.Fatal(err)
	}
	if old.CIDR != cidr || len(old.Attachments) != 50 || !cidr.Contains(old.Attachments[0].IP) {
		t.Fatalf("what an agent before IPv6 reads: %+v", old)
	}
	if _, _, err := p.Release(key(3)); err != nil {
		t.Fatal(err)
	}
	again, dropped, err := Open(path, cidrs, gw, gw6)
	if err != nil || len(dropped) != 0 {
		t.Fatalf("reopen: dropped %v, err %v", dropped, err)
	}
	for i, a := range got {
		b, ok := again.Get(a.Key)
		if ok != (i != 3) || ok && !slices.Equal(b.IPs, a.IPs) {
			t.Fatalf("after restart %s has %v (ok=%v), want %v", a.Key, b.IPs, ok, a.IPs)
		}
	}
	// Allocation goes on after the last addresses, not into the freed ones.
	c, err := again.Allocate(Attachment{Key: key(100)})
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(c.IPs, func(ip netip.Addr) bool { return seen[ip] }) {
		t.Fatalf("after restart %v handed out again", c.IPs)
	}
}

// An agent before IPv6 wrote only "ip" and one CIDR: the file reads, a node
// turned dual-stack keeps its pods' IPv4 addresses (their IPv6 comes with
// their next sandbox), and the file the new agent writes still has what
// the old one reads.
func TestStateOfAnAgentBeforeIPv6(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	old := `{"cidr": "10.244.1.0/24", "last": "10.244.1.7", "attachments": [
	  {"containerID": "c1", "ifname": "eth0", "ip": "10.244.1.7", "netns": "/var/run/netns/x", "hostIface": "onc1", "created": "2026-01-01T00:00:00Z"}]}`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	p, dropped, err := Open(path, []netip.Prefix{cidr, cidr6}, gw, gw6)
	if err != nil || len(dropped) != 0 {
		t.Fatalf("open: dropped %v, err %v", dropped, err)
	}
	a, ok := p.Get(key(1))
	if !ok || !slices.Equal(a.IPs, []netip.Addr{netip.MustParseAddr("10.244.1.7")}) || a.HostIface != "onc1" {
		t.Fatalf("the old attachment reads as %+v (ok=%v)", a, ok)
	}
	b, err := p.Allocate(Attachment{Key: key(2)})
	if err != nil {
		t.Fatal(err)
	}
	if b.IPs[0] != netip.MustParseAddr("10.244.1.8") || !cidr6.Contains(b.IPs[1]) {
		t.Fatalf("a new pod got %v, want 10.244.1.8 (after the old last) and an IPv6 address", b.IPs)
	}
	var st struct {
		CIDR        netip.Prefix
		Last        netip.Addr
		Attachments []struct{ IP netip.Addr }
	}
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	if st.CIDR != cidr || st.Last != b.IPs[0] || len(st.Attachments) != 2 || st.Attachments[1].IP != b.IPs[0] {
		t.Fatalf("what an old agent reads: %+v", st)
	}
}

func TestOpenRefusesBadCIDRs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.json")
	for _, cidrs := range [][]netip.Prefix{
		nil,
		{netip.MustParsePrefix("10.0.0.0/31")},
		{netip.MustParsePrefix("fd00::/124")},
		{cidr, netip.MustParsePrefix("10.9.0.0/24")},
		{cidr6, netip.MustParsePrefix("fd01::/64")},
		{netip.MustParsePrefix("::ffff:10.0.0.0/120")},
	} {
		if _, _, err := Open(path, cidrs); err == nil {
			t.Errorf("Open accepted %v", cidrs)
		}
	}
}

// A small IPv6 CIDR runs out like an IPv4 one (no broadcast address in
// IPv6: its last address is a pod's).
func TestIPv6Exhaustion(t *testing.T) {
	small := netip.MustParsePrefix("fd00::/120")
	p, _, err := Open(filepath.Join(t.TempDir(), "e.json"), []netip.Prefix{small}, netip.MustParseAddr("fd00::1"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 254 { // 256 minus the subnet's address and the gateway
		if _, err := p.Allocate(Attachment{Key: key(i)}); err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
	}
	if _, err := p.Allocate(Attachment{Key: key(999)}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("allocation past the end: err = %v, want ErrExhausted", err)
	}
}

// At follows every change (allocation, update, release, a reopened
// pool), and a reader never waits for a change's write of the file.
func TestAtFollowsChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "at.json")
	p := open(t, path)
	a, err := p.Allocate(Attachment{Key: key(1), K8sNamespace: "app", K8sName: "web"})
	if err != nil {
		t.Fatal(err)
	}
	ip := a.IPs[0]
	if got, ok := p.At(ip); !ok || got.K8sName != "web" {
		t.Fatalf("after the allocation: %+v, %v", got, ok)
	}
	a.MAC = "02:00:00:00:00:01"
	if err := p.Update(a); err != nil {
		t.Fatal(err)
	}
	if got, _ := p.At(ip); got.MAC != a.MAC {
		t.Fatalf("after the update: %+v", got)
	}
	if got, ok := open(t, path).At(ip); !ok || got.K8sName != "web" {
		t.Fatalf("reopened: %+v, %v", got, ok)
	}
	p.mu.Lock() // a change under way
	done := make(chan bool)
	go func() { _, ok := p.At(ip); done <- ok }()
	select {
	case ok := <-done:
		if !ok {
			t.Error("the attachment not found during a change")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("At waited for a change")
	}
	p.mu.Unlock()
	if _, _, err := p.Release(key(1)); err != nil {
		t.Fatal(err)
	}
	if got, ok := p.At(ip); ok {
		t.Fatalf("after the release: %+v", got)
	}
}
