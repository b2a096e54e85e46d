package peer

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dto "github.com/prometheus/client_model/go"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datastore"
)

func TestIdentityPersists(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	again, err := LoadIdentity(dir)
	if err != nil || again.Pin != a.Pin || len(a.Pin) != 44 {
		t.Fatalf("after a restart: pin %q, %v; want the same %q", again.Pin, err, a.Pin)
	}
	other, err := LoadIdentity(t.TempDir())
	if err != nil || other.Pin == a.Pin {
		t.Fatalf("another node's pin %q, %v; want its own", other.Pin, err)
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIdentity(dir); err == nil {
		t.Fatal("a corrupt key was taken (or replaced)")
	}
}

func TestPinningAndSpeaksFor(t *testing.T) {
	a := datastore.Node{NodeSpec: datastore.NodeSpec{Name: "a", IP: netip.MustParseAddr("192.0.2.1"), PeerPin: "pa"},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	b := datastore.Node{NodeSpec: datastore.NodeSpec{Name: "b", IP: netip.MustParseAddr("192.0.2.2"), PeerPin: "pb"}}
	var d Nodes
	d.Set([]datastore.Node{a, b})
	if n, ok := d.Pinning("pa"); !ok || n.Name != "a" {
		t.Errorf("Pinning(pa) = %v, %v", n.Name, ok)
	}
	if _, ok := d.Pinning("px"); ok {
		t.Error("an unpinned key names a node")
	}
	// c copies a's pin into its own record: a's key then names nobody.
	c := datastore.Node{NodeSpec: datastore.NodeSpec{Name: "c", PeerPin: "pa"}}
	d.Set([]datastore.Node{a, b, c})
	if n, ok := d.Pinning("pa"); ok {
		t.Errorf("a pin two records hold names %s", n.Name)
	}
	for src, want := range map[string]bool{"10.244.1.7": true, "::ffff:10.244.1.7": true, "fd00:10:244:1::9": true, "192.0.2.1": true,
		"10.244.2.7": false, "192.0.2.2": false, "fd00:10:244:2::9": false} {
		if got := d.SpeaksFor(a, netip.MustParseAddr(src)); got != want {
			t.Errorf("SpeaksFor(a, %s) = %v, want %v", src, got, want)
		}
	}
	// A record names b's address, or one of a's pods', as its node's: it
	// speaks for neither (nor does b for its own while another claims it).
	for i, e := range []datastore.Node{
		{NodeSpec: datastore.NodeSpec{Name: "e", IP: netip.MustParseAddr("192.0.2.2")}},
		{NodeSpec: datastore.NodeSpec{Name: "e", IP: netip.MustParseAddr("10.244.1.7")}},
	} {
		d.Set([]datastore.Node{a, b, e})
		if d.SpeaksFor(e, e.IP) {
			t.Errorf("%s claiming %s speaks for it", e.Name, e.IP)
		}
		if i == 0 && d.SpeaksFor(b, b.IP) {
			t.Error("b speaks for its address while e's record claims it too")
		}
	}
	if !d.SpeaksFor(a, netip.MustParseAddr("10.244.1.7")) {
		t.Error("a no longer speaks for its pod when another record names the pod's address")
	}
}

// agentOf is one node of the loopback test: its identity, record and the
// questions its server answered.
type agentOf struct {
	id       Identity
	rec      datastore.Node
	answered atomic.Int32
	counts   *Counts // its server's and its client's questions
}

// twoNodes serves the peer API of nodes a (127.0.0.1) and b (127.0.0.2)
// on one port, each knowing both records and taking burst questions of
// each node at once and then one a second, and returns the port.
func twoNodes(t *testing.T, nodes *Nodes, burst int) (a, b *agentOf, port int) {
	a, b = &agentOf{}, &agentOf{}
	var err error
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	for i, ag := range []*agentOf{a, b} {
		name := string(rune('a' + i))
		ag.counts = NewCounts()
		if ag.id, err = LoadIdentity(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		ag.rec = datastore.Node{NodeSpec: datastore.NodeSpec{Name: name, IP: netip.AddrFrom4([4]byte{127, 0, 0, byte(1 + i)}), PeerPin: ag.id.Pin},
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(1 + i), 0}), 24)}}
		if i == 1 {
			if l, err = Listen(ag.rec.IP, port); err != nil {
				t.Fatal(err)
			}
		}
		srv := newServer(ag.id, nodes, func(_ context.Context, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
			ag.answered.Add(1)
			return &apiv1.TraceIngressResponse{Node: name}, nil
		}, ag.counts, 1, burst)
		go func(l net.Listener) { _ = srv.Serve(l) }(l) // this node's listener, not the variable's next value
		t.Cleanup(srv.Stop)
	}
	nodes.Set([]datastore.Node{a.rec, b.rec})
	return a, b, port
}

func ask(t *testing.T, c *Client, node, src string) (*apiv1.TraceIngressResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.TraceIngress(ctx, node, &apiv1.TraceIngressRequest{Source: src, Destination: "10.244.2.9", Port: 80})
}

// dialCounter counts a client's connections.
func dialCounter(n *atomic.Int32) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		n.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// count is side's questions with code in c.
func count(t *testing.T, c *Counts, side string, code codes.Code) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.questions.WithLabelValues(side, code.String()).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestPeerOverLoopback(t *testing.T) {
	var nodes Nodes
	a, b, port := twoNodes(t, &nodes, Burst)
	var dialsA atomic.Int32
	fromA := NewClient(a.id, &nodes, port, a.counts).WithDialer(dialCounter(&dialsA))
	fromB := NewClient(b.id, &nodes, port, b.counts)
	t.Cleanup(func() { _ = fromA.Close(); _ = fromB.Close() })

	// Each answers the other about the asker's own pods and address.
	if resp, err := ask(t, fromA, "b", "10.244.1.5"); err != nil || resp.Node != "b" {
		t.Fatalf("a asking b about its pod: %v, %v", resp, err)
	}
	if resp, err := ask(t, fromA, "b", "127.0.0.1"); err != nil || resp.Node != "b" {
		t.Fatalf("a asking b about its own address: %v, %v", resp, err)
	}
	if resp, err := ask(t, fromB, "a", "10.244.2.5"); err != nil || resp.Node != "a" {
		t.Fatalf("b asking a about its pod: %v, %v", resp, err)
	}
	// One connection for a's two questions to b.
	if n := dialsA.Load(); n != 1 {
		t.Errorf("a connected to b %d times for two questions, want once", n)
	}

	// A source a does not speak for: refused before any answer.
	before := b.answered.Load()
	for _, src := range []string{"10.244.2.7", "127.0.0.2", "10.9.9.9"} {
		if _, err := ask(t, fromA, "b", src); status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "node a asks") {
			t.Errorf("a asking about %s: %v; want PermissionDenied naming a", src, err)
		}
	}
	if _, err := ask(t, fromA, "b", "junk"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a bad source: %v; want InvalidArgument", err)
	}

	// A key no record pins is refused at the handshake: the server never
	// sees a question.
	stranger, err := LoadIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fromStranger := NewClient(stranger, &nodes, port, nil)
	if _, err := ask(t, fromStranger, "b", "10.244.1.5"); status.Code(err) != codes.Unavailable {
		t.Errorf("an unpinned key: %v; want Unavailable (refused at the handshake)", err)
	}
	_ = fromStranger.Close() // before it tries again
	// So is a's key once another record pins it too: at the question on
	// a's open connection, at the handshake on a new one.
	nodes.Set([]datastore.Node{a.rec, b.rec, {NodeSpec: datastore.NodeSpec{Name: "c", IP: netip.MustParseAddr("127.0.0.3"), PeerPin: a.id.Pin}}})
	if _, err := ask(t, fromA, "b", "10.244.1.5"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a's key pinned twice, on its open connection: %v; want Unauthenticated", err)
	}
	fresh := NewClient(a.id, &nodes, port, nil)
	if _, err := ask(t, fresh, "b", "10.244.1.5"); status.Code(err) != codes.Unavailable {
		t.Errorf("a's key pinned twice, on a new connection: %v; want Unavailable", err)
	}
	_ = fresh.Close()
	if n := b.answered.Load(); n != before {
		t.Errorf("b answered %d refused questions", n-before)
	}
	// b counted what it answered and refused (three keys refused, at two
	// handshakes and one question; a handshake may be tried again before
	// its client closes), a what it asked.
	if got := count(t, b.counts, sideAnswered, codes.Unauthenticated); got < 3 {
		t.Errorf("answered Unauthenticated: %v, want at least 3", got)
	}
	for _, c := range []struct {
		counts *Counts
		side   string
		code   codes.Code
		want   float64
	}{
		{b.counts, sideAnswered, codes.OK, 2}, {b.counts, sideAnswered, codes.PermissionDenied, 3},
		{b.counts, sideAnswered, codes.InvalidArgument, 1},
		{a.counts, sideAsked, codes.OK, 2}, {a.counts, sideAsked, codes.PermissionDenied, 3}, {a.counts, sideAsked, codes.Unauthenticated, 1},
	} {
		if got := count(t, c.counts, c.side, c.code); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.side, c.code, got, c.want)
		}
	}

	// The client takes an answer only from the key the record pins: b's
	// record pinning another key, b is not believed.
	// b's record pinning another key, b is not believed, though a had a
	// connection to it.
	nodes.Set([]datastore.Node{a.rec, b.rec})
	if _, err := ask(t, fromA, "b", "10.244.1.5"); err != nil {
		t.Fatalf("a asking b again: %v", err)
	}
	nodes.Set([]datastore.Node{a.rec, {NodeSpec: datastore.NodeSpec{Name: "b", IP: b.rec.IP, PeerPin: stranger.Pin}, PodCIDRs: b.rec.PodCIDRs}})
	if _, err := ask(t, fromA, "b", "10.244.1.5"); err == nil || !strings.Contains(err.Error(), "its record pins") {
		t.Errorf("b's key where its record pins another: %v; want refused", err)
	}
	nodes.Set([]datastore.Node{a.rec, {NodeSpec: datastore.NodeSpec{Name: "b", IP: b.rec.IP}, PodCIDRs: b.rec.PodCIDRs}})
	if _, err := ask(t, fromA, "b", "10.244.1.5"); err == nil || !strings.Contains(err.Error(), "pins no peer key") {
		t.Errorf("b without a pin: %v; want not asked", err)
	}
}

func TestPeerRateLimit(t *testing.T) {
	var nodes Nodes
	const burst = 5
	a, b, port := twoNodes(t, &nodes, burst)
	fromA, fromB := NewClient(a.id, &nodes, port, nil), NewClient(b.id, &nodes, port, nil)
	defer fromA.Close()
	defer fromB.Close()
	// Faster than the rate refills, from a few goroutines, until refused.
	var ok, exhausted atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for exhausted.Load() == 0 && ok.Load() < 10*burst {
				_, err := ask(t, fromA, "b", "10.244.1.5")
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.ResourceExhausted:
					exhausted.Add(1)
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() < burst || exhausted.Load() == 0 {
		t.Errorf("%d answered, %d RESOURCE_EXHAUSTED; want at least %d answered, then refusals", ok.Load(), exhausted.Load(), burst)
	}
	// Per asker: b's own budget is untouched.
	if _, err := ask(t, fromB, "a", "10.244.2.5"); err != nil {
		t.Errorf("b after a's flood: %v", err)
	}
}
