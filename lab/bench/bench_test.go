package bench

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/onc-net/onc/lab"
)

// The IPv6 rows reach the server's IPv6 addresses (the node's underlay
// one for bare, the pod's otherwise) and leave Flannel out; the report
// says they are IPv6.
func TestIPv6Rows(t *testing.T) {
	pod := func(ns, ip, ip6 string) *lab.Pod {
		p := &lab.Pod{Netns: ns, IP: netip.MustParseAddr(ip)}
		if ip6 != "" {
			p.IPv6 = netip.MustParseAddr(ip6)
		}
		return p
	}
	client := &lab.Node{Netns: "n1", IP: netip.MustParseAddr("172.31.251.11"), IPv6: netip.MustParseAddr("fd00:172:31:251::11"),
		Pods: []*lab.Pod{pod("p1", "10.244.0.2", "fd00:10:244::2")}, FlannelPods: []*lab.Pod{pod("f1", "10.10.0.2", "")}}
	server := &lab.Node{Netns: "n2", IP: netip.MustParseAddr("172.31.251.12"), IPv6: netip.MustParseAddr("fd00:172:31:251::12"),
		Pods: []*lab.Pod{pod("p2", "10.244.1.2", "fd00:10:244:1::2")}, FlannelPods: []*lab.Pod{pod("f2", "10.10.1.2", "")}}
	for _, c := range []struct{ cfg, family, from, to string }{
		{"bare", FamilyIPv4, "n1", "172.31.251.12"},
		{"bare", FamilyIPv6, "n1", "fd00:172:31:251::12"},
		{"fast", FamilyIPv4, "p1", "10.244.1.2"},
		{"slow", FamilyIPv6, "p1", "fd00:10:244:1::2"},
		{"fast", FamilyDual, "p1", "fd00:10:244:1::2"},
		{"bare", FamilyDual, "n1", "fd00:172:31:251::12"},
		{"flannel", "", "f1", "10.10.1.2"},
	} {
		if from, to := endpoints(client, server, c.cfg, c.family); from != c.from || to != c.to {
			t.Errorf("%s %s: %s → %s, want %s → %s", c.family, c.cfg, from, to, c.from, c.to)
		}
	}
	l := &lab.Lab{Nodes: []*lab.Node{client, server}}
	if got := (Options{Lab: l}).Configs(); !slices.Contains(got, "flannel") {
		t.Errorf("IPv4 configs %v lack flannel", got)
	}
	for family, tunnel := range map[string]string{FamilyIPv6: "in IPv6 tunnels", FamilyDual: "over the IPv4 tunnel"} {
		if got := (Options{Lab: l, Family: family}).Configs(); !slices.Equal(got, []string{"bare", "slow", "fast"}) {
			t.Errorf("%s configs %v, want bare, slow, fast", family, got)
		}
		var b bytes.Buffer
		Report{Family: family}.Markdown(&b)
		if !strings.Contains(b.String(), "rows are IPv6") || !strings.Contains(b.String(), tunnel) {
			t.Errorf("a %s report does not say its rows are IPv6 %s:\n%s", family, tunnel, b.String())
		}
	}
}
