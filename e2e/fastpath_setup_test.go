//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
)

// cachedFlow is node n's filter entry between local and remote, if any.
func cachedFlow(t *testing.T, n *lab.Node, local, remote netip.AddrPort) *apiv1.FlowEntry {
	t.Helper()
	resp, err := agent(t, n).ListCache(context.Background(), &apiv1.ListCacheRequest{Table: "filter"})
	if err != nil {
		t.Fatalf("%s: cache list filter: %v", n.Name, err)
	}
	for _, f := range resp.Filter {
		if f.Local == local.String() && f.Remote == remote.String() {
			return f
		}
	}
	return nil
}

// TestConnectionSetup: on an etcd cluster (no NetworkPolicy, so every pod
// is open), short TCP connections between pods of two nodes open, run and
// close on the fast path on both nodes, and conntrack never sees them.
// Switched off on one node, the fast path hands a live connection over to
// conntrack on both (the other node's peer leaves its fast path), and the
// slow path carries it on to a clean close.
func TestConnectionSetup(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) { connectionSetup(t, lab.IPFamilyIPv4) })
	t.Run("IPv6", func(t *testing.T) { connectionSetup(t, lab.IPFamilyIPv6) })
	t.Run("IPv6OverIPv4", func(t *testing.T) { connectionSetup(t, lab.IPFamilyDual) })
}

// connectionSetup is TestConnectionSetup in a lab of ipFamily: IPv4; IPv6
// (IPv6 pods in IPv6 tunnels, counted in the IPv6 counters); or dual,
// over the pods' IPv6 addresses in IPv4 tunnels.
func connectionSetup(t *testing.T, ipFamily string) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1, IPFamily: ipFamily})
	a, b := l.Nodes[0].Pods[0], l.Nodes[1].Pods[0]
	server := b.IP
	if ipFamily == lab.IPFamilyDual {
		server = b.IPv6 // IPv6 over the IPv4 tunnel
	}
	n1, n2 := l.Nodes[0], l.Nodes[1]
	// A counter of the family's: egress_open, or egress6_open in IPv6.
	counter := func(program, rest string) string {
		if server.Is6() {
			program += "6"
		}
		return program + "_" + rest
	}
	bypasstest.ServeEcho(listenOn(t, b.Netns, "tcp"+family(server), 9600))
	st, err := n1.Status(context.Background())
	if err != nil || st.FastPathConnectionSetup != "every pod (no NetworkPolicy)" {
		t.Fatalf("%s status: connection setup %q (%v); want every pod, on an etcd cluster", n1.Name, st.GetFastPathConnectionSetup(), err)
	}
	// A first connection teaches each node the header to the other.
	if _, err := lab.Probe(a.Netns, "tcp", server, 9600, 3*time.Second); err != nil {
		t.Fatal(err)
	}

	before1, before2 := settled(t, n1), settled(t, n2)
	const conns = 200
	for i := range conns {
		if _, err := lab.Probe(a.Netns, "tcp", server, 9600, 3*time.Second); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	after1, after2 := settled(t, n1), settled(t, n2)
	delta := func(after, before map[string]uint64, c string) uint64 { return after[c] - before[c] }
	for _, c := range []struct {
		node string
		name string
		got  uint64
	}{
		{n1.Name, counter("egress", "open"), delta(after1, before1, counter("egress", "open"))},
		{n2.Name, counter("ingress", "open"), delta(after2, before2, counter("ingress", "open"))},
	} {
		if c.got != conns {
			t.Errorf("%s: %s grew by %d over %d connections; want every SYN to open on the fast path", c.node, c.name, c.got, conns)
		}
	}
	for _, n := range []struct {
		name          string
		before, after map[string]uint64
	}{{n1.Name, before1, after1}, {n2.Name, before2, after2}} {
		if slow := delta(n.after, n.before, counter("egress", "miss_tcp_flags")) + delta(n.after, n.before, counter("ingress", "miss_tcp_flags")); slow != 0 {
			t.Errorf("%s: %d SYN, FIN or RST took the slow path; want none", n.name, slow)
		}
		if e := delta(n.after, n.before, counter("egress", "error")) + delta(n.after, n.before, counter("ingress", "error")); e != 0 {
			t.Errorf("%s: %d fast-path errors", n.name, e)
		}
	}
	for _, n := range l.Nodes {
		if ct := conntrackTo(t, n, server, 9600); len(ct) > 1 { // the first connection's, closing
			t.Errorf("%s: conntrack saw connections the fast path opened:\n%s", n.Name, strings.Join(ct, "\n"))
		}
	}

	// A live connection, handed over when n1's fast path goes off.
	c := dial(t, a.Netns, "tcp"+family(server), server, 9600)
	if err := rr(c, 50); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort(c.LocalAddr().String())
	serverEnd := netip.AddrPortFrom(server, 9600)
	if f := cachedFlow(t, n1, client, serverEnd); f == nil || f.OpenedBy != "local" {
		t.Fatalf("%s: the connection's flow is %v; want one the local pod opened on the fast path", n1.Name, f)
	}
	if f := cachedFlow(t, n2, serverEnd, client); f == nil || f.OpenedBy != "remote" {
		t.Fatalf("%s: the connection's flow is %v; want one the remote pod opened on the fast path", n2.Name, f)
	}
	setFastPath(t, n1, false)
	defer setFastPath(t, n1, true)
	waitPeerFlag(t, n2, n1.Name, false)
	want := fmt.Sprintf("src=%s dst=%s sport=%d dport=9600", client.Addr(), server, client.Port())
	for _, n := range l.Nodes {
		testutil.WaitFor(t, n.Name+" hands the connection over to conntrack", 5*time.Second, func() bool {
			for _, line := range conntrackTo(t, n, server, 9600) {
				if strings.Contains(line, "ESTABLISHED") && strings.Contains(line, want) {
					return true
				}
			}
			return false
		})
	}
	if err := rr(c, 50); err != nil {
		t.Fatalf("the connection broke after the hand-over: %v", err)
	}
	// The close goes through conntrack now, which has the connection: the
	// server reads the client's FIN, and its own reaches the client.
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the server's close did not arrive (%d bytes read): %v", n, err)
	}
}
