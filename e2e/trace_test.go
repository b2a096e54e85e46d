//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/onc-net/onc/agent/peer"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/onc-net/onc/lab"
)

// checkTrace: for every cell of a truth-table step, onctl trace on the
// source's node (through the agent API it calls) gives the verdict the
// oracle gives and the probe met (got, or again for a retried one); a
// denial names the policies that isolate the pod in the direction that
// denied it, and an allowance by policy names one that selects the pod.
// It returns how many cells disagree.
func (c *policyCluster) checkTrace(t *testing.T, s policyStep, cells []cell, got, again map[cell]outcome) int {
	t.Helper()
	clients := map[*lab.Node]apiv1.AgentClient{}
	for _, n := range c.l.Nodes {
		clients[n] = agent(t, n)
	}
	bad, remote := 0, 0
	for _, ce := range cells {
		out, retried := again[ce]
		if !retried {
			out = got[ce]
		}
		resp, err := clients[c.node(ce.src)].Trace(context.Background(), &apiv1.TraceRequest{Source: ce.src.addr(ce.fam).String(),
			Destination: ce.dst.key(), Port: uint32(ce.k.port), Protocol: string(ce.k.proto)})
		if err != nil {
			t.Fatalf("step %q: trace %s → %s %s: %v", s.name, ce.src.key(), ce.dst.key(), ce.k, err)
		}
		if len(resp.Paths) != 1 {
			t.Fatalf("step %q: trace %s → %s %s: %d paths, want 1", s.name, ce.src.key(), ce.dst.key(), ce.k, len(resp.Paths))
		}
		p := resp.Paths[0]
		if c.node(ce.src) != c.node(ce.dst) {
			remote++
		}
		traced, oracle, met := p.Verdict == "allowed", c.allowed(s.pols, ce), out.err == nil
		problem := ""
		switch in := ingressHop(p); {
		case traced != oracle || traced != met:
			problem = fmt.Sprintf("trace says %s, the oracle %v, the probe %v", p.Verdict, oracle, out.err)
		case c.node(ce.src) != c.node(ce.dst) && in.GetBasis() != "enforced":
			problem = fmt.Sprintf("the ingress hop on %s is %q, not that node's own answer", c.node(ce.dst).Name, in.GetBasis())
		case strings.Contains(in.GetDetail(), "computes otherwise"):
			problem = "the two nodes' answers differ"
		default:
			problem = c.traceNames(s.pols, ce, p)
		}
		if problem != "" {
			bad++
			var hops []string
			for _, h := range p.Hops {
				hops = append(hops, fmt.Sprintf("%s %s %s: %s", h.Node, h.Step, h.Verdict, h.Detail))
			}
			t.Errorf("step %q, %s %s → %s %s: %s\n  %s", s.name, ce.fam, ce.src.key(), ce.dst.key(), ce.k, problem, strings.Join(hops, "\n  "))
		}
	}
	t.Logf("step %q: traced %d %s probes (%d to another node's pod), %d disagree", s.name, len(cells), cells[0].fam, remote, bad)
	return bad
}

// ingressHop is p's ingress-policy hop, nil if none.
func ingressHop(p *apiv1.TracePath) *apiv1.TraceHop {
	for _, h := range p.Hops {
		if h.Step == "ingress-policy" {
			return h
		}
	}
	return nil
}

// traceNames checks the policies p's policy hops name against the
// oracle's, the ClusterNetworkPolicy that decided or the NetworkPolicies
// that isolate: "" when right, else what is wrong.
func (c *policyCluster) traceNames(pols []*networkingv1.NetworkPolicy, ce cell, p *apiv1.TracePath) string {
	for _, h := range p.Hops {
		ingress := h.Step == "ingress-policy"
		if !ingress && h.Step != "egress-policy" {
			continue
		}
		pod := ce.src
		if ingress {
			pod = ce.dst
		}
		if h.Node != c.node(pod).Name {
			return fmt.Sprintf("%s decided on %s, want %s's node %s", h.Step, h.Node, pod.key(), c.node(pod).Name)
		}
		if d := c.decide(pols, ce, ingress); d.tier == "Admin" || d.tier == "Baseline" {
			if h.Tier != d.tier || !slices.Equal(h.Policies, []string{d.policy}) || h.Rule < 0 {
				return fmt.Sprintf("%s decided by %s %v rule %d, want a rule of %s %s", h.Step, h.Tier, h.Policies, h.Rule, d.tier, d.policy)
			}
			continue
		}
		isolating := c.isolatedBy(pols, pod, ingress)
		switch h.Verdict {
		case "denied":
			if !slices.Equal(h.Policies, isolating) {
				return fmt.Sprintf("%s denied by %v, want the isolating %v", h.Step, h.Policies, isolating)
			}
		case "allowed":
			if len(isolating) == 0 && len(h.Policies) == 0 {
				continue // only ClusterNetworkPolicy rules judge it, and none matched
			}
			if len(h.Policies) != 1 || !slices.Contains(isolating, h.Policies[0]) || h.Rule < 0 {
				return fmt.Sprintf("%s allowed by %v rule %d, want a rule of one of %v", h.Step, h.Policies, h.Rule, isolating)
			}
		case "not-isolated":
			if len(isolating) > 0 {
				return fmt.Sprintf("%s not isolated, but %v isolate %s", h.Step, isolating, pod.key())
			}
		default:
			return fmt.Sprintf("%s: verdict %q", h.Step, h.Verdict)
		}
	}
	return ""
}

// trace: the onctl binary prints a trace, in JSON and as a table, and
// refuses a source of another node naming that node. (The verdicts are
// checked against the oracle and the probes in every truth table.)
func (c *policyCluster) trace(t *testing.T) {
	a, b := c.pod("x/a"), c.pod("x/b")
	na := c.node(a)
	c.set(t, []*networkingv1.NetworkPolicy{netpol("x", "b-from-a-tcp-80", sel("app", "b"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")}), port("TCP", 80)), nil)})
	var resp apiv1.TraceResponse
	c.onctlJSON(t, na, &resp, "trace", a.key(), b.key()+":80/tcp")
	if len(resp.Paths) != 1 || resp.Paths[0].Verdict != "allowed" || resp.Source.GetName() != "a" || resp.Destination.GetIp() != b.lp.IP.String() {
		t.Fatalf("onctl trace %s %s:80: %v", a.key(), b.key(), &resp)
	}
	onctl := filepath.Join(c.l.BinDir, "onctl")
	out, err := exec.Command(onctl, "--socket", na.AgentSocket(), "trace", a.key(), b.key()+":81").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "=> DENIED") || !strings.Contains(string(out), "default deny: ingress isolated by x/b-from-a-tcp-80") {
		t.Errorf("onctl trace %s %s:81: %v\n%s", a.key(), b.key(), err, out)
	}
	out, err = exec.Command(onctl, "--socket", na.AgentSocket(), "trace", b.key(), a.key()+":80").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "FailedPrecondition") || !strings.Contains(string(out), c.node(b).Name) {
		t.Errorf("onctl trace from %s (of %s) on %s: %v, %s; want FailedPrecondition naming its node", b.key(), c.node(b).Name, na.Name, err, out)
	}
	c.traceProbe(t)
	c.tracePeers(t)
}

// traceProbe: onctl trace --probe makes a real connection from the source
// pod; what it meets agrees with the trace, whether the packet is allowed,
// denied on another node (then that node's flow record of the probe, from
// its agent, is in the answer) or denied on this one (then this node's
// is), in TCP and UDP.
func (c *policyCluster) traceProbe(t *testing.T) {
	xa, xb, xc := c.pod("x/a"), c.pod("x/b"), c.pod("x/c")
	if c.node(xa) != c.node(xc) || c.node(xa) == c.node(xb) || c.node(c.pod("y/a")) == c.node(xc) {
		t.Fatal("the test wants x/a and x/c on one node, x/b and y/a on the other")
	}
	c.set(t, []*networkingv1.NetworkPolicy{
		netpol("x", "b-from-a-tcp-80", sel("app", "b"), ingressOnly,
			ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")}), port("TCP", 80)), nil),
		netpol("x", "a-from-b", sel("app", "a"), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "b")})), nil)})
	for _, tc := range []struct {
		src, dst, outcome string
		deniedBy          string // the policy a record of the probe names
		deniedOn          string // the pod whose node recorded it
	}{
		{"x/a", "x/b:80/tcp", "connected", "", ""},
		{"x/a", "x/b:81/tcp", "timed-out", "x/b-from-a-tcp-80", "x/b"},
		{"x/c", "x/a:80/tcp", "timed-out", "x/a-from-b", "x/a"},
		{"x/c", "y/a:80/udp", "replied", "", ""},
		{"x/a", "x/b:80/udp", "no-reply", "x/b-from-a-tcp-80", "x/b"},
	} {
		var resp apiv1.TraceResponse
		c.onctlJSON(t, c.node(c.pod(tc.src)), &resp, "trace", "--probe", tc.src, tc.dst)
		p := resp.Probe
		if p.GetOutcome() != tc.outcome || p.GetAgreement() != "agrees" {
			t.Errorf("trace --probe %s %s: %s, %s (%s); want %s, agrees", tc.src, tc.dst, p.GetOutcome(), p.GetAgreement(), p.GetDetail(), tc.outcome)
			continue
		}
		if tc.deniedBy == "" {
			continue
		}
		on := c.node(c.pod(tc.deniedOn)).Name
		denied := slices.ContainsFunc(p.Records, func(r *apiv1.FlowRecord) bool {
			return r.Node == on && r.Verdict == "denied" && slices.Equal(r.Policies, []string{tc.deniedBy}) && r.Source.GetPort() != 0
		})
		if !denied || !strings.Contains(p.Detail, on+" DENIED ingress") {
			t.Errorf("trace --probe %s %s: no record of %s denying the probe by %s in %v (%s)", tc.src, tc.dst, on, tc.deniedBy, p.Records, p.Detail)
		}
	}
}

// tracePeers: a node's agent answers another's questions (the peer API)
// only about that one's own pods: asked from x/a's node, with its own key,
// x/b's node answers about x/a's packet, refuses one from x/b
// (PERMISSION_DENIED), and refuses a key no node record pins at the
// handshake.
func (c *policyCluster) tracePeers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := k8sstore.New(ctx, k8sstore.Options{Config: c.l.APIServer.RESTConfig(), Agent: true})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	records, err := store.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var nodes peer.Nodes
	nodes.Set(records)
	xa, xb := c.pod("x/a"), c.pod("x/b")
	na, nb := c.node(xa), c.node(xb)
	id, err := peer.LoadIdentity(filepath.Join(na.Dir, "state")) // the agent's own key
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := nodes.Node(na.Name); rec.PeerPin != id.Pin {
		t.Fatalf("%s's record pins %q, its agent's key is %q", na.Name, rec.PeerPin, id.Pin)
	}
	from := func(id peer.Identity) *peer.Client {
		cl := peer.NewClient(id, &nodes, peer.DefaultPort, nil).WithDialer(func(ctx context.Context, addr string) (conn net.Conn, err error) {
			err = lab.InNetns(na.Netns, func() (err error) {
				conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				return err
			})
			return conn, err
		})
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	ask := func(cl *peer.Client, src *tpod) (*apiv1.TraceIngressResponse, error) {
		return cl.TraceIngress(ctx, nb.Name, &apiv1.TraceIngressRequest{Source: src.lp.IP.String(), Destination: xb.lp.IP.String(), Port: 80, Protocol: "TCP"})
	}
	if resp, err := ask(from(id), xa); err != nil || resp.Node != nb.Name || resp.Ingress.GetBasis() != "enforced" || resp.Forwarding.GetVerdict() != "delivered" {
		t.Errorf("%s asking %s about %s: %v, %v", na.Name, nb.Name, xa.key(), resp, err)
	}
	if _, err := ask(from(id), xb); status.Code(err) != codes.PermissionDenied {
		t.Errorf("%s asking %s about %s, not its pod: %v; want PermissionDenied", na.Name, nb.Name, xb.key(), err)
	}
	stranger, err := peer.LoadIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ask(from(stranger), xa); status.Code(err) != codes.Unavailable {
		t.Errorf("a key no record pins: %v; want Unavailable (refused at the handshake)", err)
	}
}
