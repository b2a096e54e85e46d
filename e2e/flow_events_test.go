//go:build e2e

package e2e

import (
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
)

// flowEvents (TestServices): the eBPF programs' flow records on the
// client's node. A ClusterIP connection from a pod gives a translate
// record naming the client pod, the Service and the backend pod chosen; a
// connection to a pod of the other node, learned by the fast path, a
// learn record of both pods; a pod sending to a node's VXLAN port, a drop
// record with the guard's reason; onctl cache flush, an evict record of
// that flow saying so. Each within a second or so (the reader polls the
// ring every 100 ms).
func (c *serviceCluster) flowEvents(t *testing.T) {
	remote, client, node := c.backends[1], c.clients[0], c.l.Nodes[0] // remote on node 1
	// The earlier tests' flows go first, and their evict records (at most
	// 100 a second) with them: the flush below then evicts this test's.
	flushed := c.flush(t, node)
	vip := c.service(t, "events", false, remote)
	conn := dialGreeted(t, client, vip, remote)
	if err := rr(conn, 20); err != nil { // the flow is learned both ways
		t.Fatal(err)
	}

	pod := func(p *lab.Pod, ip netip.Addr, port uint32) *apiv1.FlowEndpoint {
		return &apiv1.FlowEndpoint{Kind: "pod", Namespace: svcNS, Name: p.Name, Node: p.Node, Ip: ip.String(), Port: port}
	}
	tr := waitRecord(t, c.l, node, "translate", func(r *apiv1.FlowRecord) bool {
		return r.Source.GetName() == client.Name && r.Destination.GetIp() == vip.String()
	})
	want := &apiv1.FlowRecord{Event: "translate", Verdict: "translated", Path: "socket-lb", Protocol: "TCP",
		Source:      pod(client, client.IP, 0),
		Destination: &apiv1.FlowEndpoint{Kind: "service", Namespace: svcNS, Name: "events:http", Ip: vip.String(), Port: 80},
		Translated:  pod(remote, remote.IP, 8080)}
	sameRecord(t, tr, want)

	// The fast path carries the flow: learned from the slow path, or, with
	// connection setup on the fast path (no policy isolates either pod),
	// opened on it at its SYN, which learns nothing later.
	local := netip.MustParseAddrPort(conn.LocalAddr().String())
	cached := waitRecord(t, c.l, node, "", func(r *apiv1.FlowRecord) bool {
		return (r.Event == "learn" || r.Event == "open") && r.Source.GetPort() == uint32(local.Port())
	})
	sameRecord(t, cached, &apiv1.FlowRecord{Event: cached.Event, Verdict: "cached", Path: "fast", Protocol: "TCP",
		Source: pod(client, client.IP, uint32(local.Port())), Destination: pod(remote, remote.IP, 8080)})

	time.Sleep(time.Until(flushed.Add(time.Second)))
	c.flush(t, node)
	evict := waitRecord(t, c.l, node, "evict", func(r *apiv1.FlowRecord) bool { return r.Source.GetPort() == uint32(local.Port()) })
	sameRecord(t, evict, &apiv1.FlowRecord{Event: "evict", Verdict: "evicted", Path: "fast", Protocol: "TCP",
		Reason: "the fast path's cache was flushed (onctl cache flush, or the fast path switched on)",
		Source: pod(client, client.IP, uint32(local.Port())), Destination: pod(remote, remote.IP, 8080)})

	// A pod sending to node 1's VXLAN port: the guard drops it at the pod.
	other := c.l.Nodes[1]
	if err := lab.InNetns(client.Netns, func() error {
		u, err := net.Dial("udp", netip.AddrPortFrom(c.l.TunnelIP(other), vxlanPort).String())
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte("not a frame of a peer's"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	drop := waitRecord(t, c.l, node, "drop", func(r *apiv1.FlowRecord) bool { return r.Source.GetName() == client.Name })
	if drop.Reason != "overlay_drop_from_pod" || drop.Path != "fast" || drop.Verdict != "dropped" ||
		drop.Destination.GetKind() != "node" || drop.Destination.GetName() != other.Name || drop.Destination.GetPort() != vxlanPort {
		t.Errorf("drop record %v, want overlay_drop_from_pod on the fast path, to node %s:%d", drop, other.Name, vxlanPort)
	}
}

// flush runs onctl cache flush on n, and says when.
func (c *serviceCluster) flush(t *testing.T, n *lab.Node) time.Time {
	t.Helper()
	if out, err := exec.Command(filepath.Join(c.l.BinDir, "onctl"), "--socket", n.AgentSocket(), "cache", "flush").CombinedOutput(); err != nil {
		t.Fatalf("onctl cache flush on %s: %v: %s", n.Name, err, out)
	}
	return time.Now()
}

// waitRecord waits up to 2 s for a record of event on node n of lab l
// that match selects, made by this test's connections.
func waitRecord(t *testing.T, l *lab.Lab, n *lab.Node, event string, match func(*apiv1.FlowRecord) bool) *apiv1.FlowRecord {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, r := range onctlFlowRecords(t, l, n, "--event", event) {
			if match(r) {
				return r
			}
		}
	}
	t.Fatalf("onctl flows --event %s on %s: no such record; it has %v", event, n.Name, onctlFlowRecords(t, l, n))
	return nil
}

// sameRecord compares r with want in the fields want sets: its own time,
// node and count of suppressed records are r's.
func sameRecord(t *testing.T, r, want *apiv1.FlowRecord) {
	t.Helper()
	want.TimeUnixNano, want.Node, want.Suppressed = r.TimeUnixNano, r.Node, r.Suppressed
	if got, w := protojson.Format(r), protojson.Format(want); got != w {
		t.Errorf("record:\n%s\nwant:\n%s", got, w)
	}
}
