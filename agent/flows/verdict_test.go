package flows

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/policy"
)

// onctl policy POD --peer ADDR --port N: each direction of the pod names
// the rule that decides a connection with ADDR, as a record would; a
// query without a pod, a peer or a valid port is refused.
func TestPeerQuery(t *testing.T) {
	for _, req := range []*apiv1.ListPolicyRequest{
		{Peer: "10.244.1.7", Port: 80},                               // no pod
		{Pod: "x/b", Port: 80},                                       // no peer
		{Pod: "x/b", Protocol: "UDP"},                                // no peer
		{Pod: "x/b", Peer: "web", Port: 80},                          // not an address
		{Pod: "x/b", Peer: "10.244.1.7"},                             // no port
		{Pod: "x/b", Peer: "10.244.1.7", Port: 70000},                // out of range
		{Pod: "x/b", Peer: "10.244.1.7", Port: 80, Protocol: "ICMP"}, // not a port's protocol
	} {
		if q, err := ParsePeerQuery(req); err == nil {
			t.Errorf("%v: %+v, want refused", req, q)
		}
	}
	if q, err := ParsePeerQuery(&apiv1.ListPolicyRequest{Pod: "x/b"}); q != nil || err != nil {
		t.Errorf("no query: %+v, %v; want none", q, err)
	}
	q, err := ParsePeerQuery(&apiv1.ListPolicyRequest{Pod: "x/b", Peer: "::ffff:10.244.1.7", Port: 53, Protocol: "udp"})
	if err != nil || q.Peer != netip.MustParseAddr("10.244.1.7") || q.Proto != policy.UDP || q.Port != 53 {
		t.Fatalf("query %+v, %v; want 10.244.1.7 UDP/53", q, err)
	}
	deny := policy.TierRule{Policy: "no-dns", Priority: 3, Name: "dns", Action: policy.Deny, Peers: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Ports: []policy.PortRange{{Proto: policy.UDP, First: 53, Last: 53}}}
	pod := &policy.Pod{Key: "x/b", Egress: &policy.Direction{ClusterOnly: true, Admin: []policy.TierRule{deny}}}
	pp := &apiv1.PolicyPod{Key: "x/b", Ingress: &apiv1.PolicyDirection{}, Egress: &apiv1.PolicyDirection{}}
	q.Decide(pod, pp)
	if in := pp.Ingress.Decision; in == nil || !in.Allowed || in.Tier != "" || in.Rule != -1 || !strings.Contains(in.Detail, "no policy isolates the pod's ingress") {
		t.Errorf("ingress (no policy): %v", in)
	}
	if eg := pp.Egress.Decision; eg == nil || eg.Allowed || eg.Tier != "Admin" || eg.Rule != 0 || eg.RuleName != "dns" || !slices.Equal(eg.Policies, []string{"no-dns"}) ||
		eg.Detail != `denied by ClusterNetworkPolicy no-dns (Admin, priority 3) egress rule 0 "dns"` {
		t.Errorf("egress (Admin deny): %v", eg)
	}
}
