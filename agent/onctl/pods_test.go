package onctl_test

import (
	"context"
	"strings"
	"testing"

	apiv1 "github.com/onc-net/onc/api/v1"
)

// podsAgent answers onctl pods, stats and policy from fixed responses.
type podsAgent struct {
	apiv1.UnimplementedAgentServer
	pods   *apiv1.ListPodsResponse
	stats  *apiv1.GetStatsResponse
	policy *apiv1.ListPolicyResponse
	asked  *apiv1.ListPolicyRequest // the last ListPolicy request
}

func (a *podsAgent) ListPods(context.Context, *apiv1.ListPodsRequest) (*apiv1.ListPodsResponse, error) {
	return a.pods, nil
}

func (a *podsAgent) GetStats(context.Context, *apiv1.GetStatsRequest) (*apiv1.GetStatsResponse, error) {
	return a.stats, nil
}

func (a *podsAgent) ListPolicy(_ context.Context, req *apiv1.ListPolicyRequest) (*apiv1.ListPolicyResponse, error) {
	a.asked = req
	return a.policy, nil
}

// A dual-stack pod shows both its addresses; an older agent that sends
// only ip still shows it. Counters show their family.
func TestOnctlShowsEveryFamily(t *testing.T) {
	sock := serve(t, &podsAgent{
		pods: &apiv1.ListPodsResponse{Pods: []*apiv1.Pod{
			{ContainerId: "c1", Ifname: "eth0", Ip: "10.244.1.2", Ips: []string{"10.244.1.2", "fd00:10:244:1::2"}},
			{ContainerId: "c2", Ifname: "eth0", Ip: "10.244.1.3"},
		}},
		stats: &apiv1.GetStatsResponse{Counters: []*apiv1.Counter{
			{Program: "egress", Name: "hit", Family: "ipv4", Value: 5},
			{Program: "egress", Name: "hit", Family: "ipv6", Value: 3},
			{Program: "overlay", Name: "drop_from_pod", Value: 1},
		}},
		policy: &apiv1.ListPolicyResponse{Pods: []*apiv1.PolicyPod{
			{Key: "ns/a", Ip: "10.244.1.2", Ips: []string{"10.244.1.2", "fd00:10:244:1::2"}, Ingress: &apiv1.PolicyDirection{}, Egress: &apiv1.PolicyDirection{}},
		}},
	})
	expectOutputs(t, sock, []onctlCase{
		{[]string{"pods"}, []string{"10.244.1.2,fd00:10:244:1::2  c1", "10.244.1.3                   c2"}},
		{[]string{"stats"}, []string{"egress   hit            ipv4    5", "egress   hit            ipv6    3", "overlay  drop_from_pod  -       1"}},
		{[]string{"policy"}, []string{"ns/a  10.244.1.2,fd00:10:244:1::2"}},
	})
}

// onctl policy shows audited policies apart from enforcing ones, with
// what they would have done: would-deny where nothing enforcing judges
// the direction, would-allow where something does (a NetworkPolicy that
// isolates it, or ClusterNetworkPolicy rules alone).
func TestOnctlPolicyShowsAudit(t *testing.T) {
	rule := &apiv1.PolicyRule{Policy: "ns/try", Peers: []string{"10.244.2.0/24"}, Ports: []string{"TCP/80"}}
	sock := serve(t, &podsAgent{policy: &apiv1.ListPolicyResponse{Pods: []*apiv1.PolicyPod{{Key: "ns/a", Ip: "10.244.1.2",
		Ingress: &apiv1.PolicyDirection{AuditPolicies: []string{"ns/try"}, AuditRules: []*apiv1.PolicyRule{rule}, WouldDeny: 17},
		Egress: &apiv1.PolicyDirection{Isolated: true, Policies: []string{"ns/deny"}, Denied: 5,
			AuditPolicies: []string{"ns/try-egress"}, WouldAllow: 3}}}}})
	expectOutputs(t, sock, []onctlCase{
		{[]string{"policy"}, []string{"open; audited by ns/try", "isolated by ns/deny; audited by ns/try-egress"}},
		{[]string{"policy", "ns/a"}, []string{
			"Ingress: open; 0 connections allowed, 0 denied\n  audited by ns/try (not enforced): would deny 17\n",
			"  ns/try  0     10.244.2.0/24  TCP/80",
			"Egress: isolated by ns/deny; 0 connections allowed, 5 denied\n  no rule: every connection is denied\n" +
				"  audited by ns/try-egress (not enforced): would allow 3 of the denied; the enforcing rules decide, so audit reports no would-deny here\n" +
				"  no rule: audit would allow nothing more\n"}},
	})
	tiered := serve(t, &podsAgent{policy: &apiv1.ListPolicyResponse{Pods: []*apiv1.PolicyPod{{Key: "ns/b", Ip: "10.244.1.3",
		Ingress: &apiv1.PolicyDirection{Denied: 4, WouldAllow: 2, AuditPolicies: []string{"ns/try"},
			Admin: []*apiv1.PolicyRule{{Policy: "deny-all", Action: "Deny", Peers: []string{"0.0.0.0/0"}}}}, Egress: &apiv1.PolicyDirection{}}}}})
	expectOutputs(t, tiered, []onctlCase{
		{[]string{"policy", "ns/b"}, []string{"audited by ns/try (not enforced): would allow 2 of the denied"}},
	})
}

// onctlCase is onctl's arguments and lines its output must hold.
type onctlCase struct{ args, want []string }

// expectOutputs runs onctl against sock for each case and checks its
// output.
func expectOutputs(t *testing.T, sock string, cases []onctlCase) {
	t.Helper()
	for _, c := range cases {
		out, err := run(append([]string{"-s", sock}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("onctl %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

// onctl policy shows each direction's tiers in the order they judge:
// Admin's ClusterNetworkPolicy rules, the NetworkPolicies where they
// isolate the pod, Baseline's (not reached where they do), and with
// --peer and --port the decision the agent names; the summary names the
// ClusterNetworkPolicies of each tier.
func TestOnctlPolicyShowsTiers(t *testing.T) {
	deny := &apiv1.PolicyRule{Policy: "deny-all", Priority: 10, Name: "no-egress", Action: "Deny", Peers: []string{"0.0.0.0/0"}, Ports: []string{"TCP/25"}}
	base := &apiv1.PolicyRule{Policy: "base", Priority: 5, Index: 1, Action: "Accept", Peers: []string{"10.244.0.0/16"}}
	np := &apiv1.PolicyRule{Policy: "ns/web", Peers: []string{"10.244.2.0/24"}, Ports: []string{"TCP/80"}}
	agent := &podsAgent{policy: &apiv1.ListPolicyResponse{Pods: []*apiv1.PolicyPod{{Key: "ns/a", Ip: "10.244.1.2",
		Ingress: &apiv1.PolicyDirection{Isolated: true, Policies: []string{"ns/web"}, Rules: []*apiv1.PolicyRule{np}, Admin: []*apiv1.PolicyRule{deny}, Baseline: []*apiv1.PolicyRule{base},
			Decision: &apiv1.PolicyDecision{Allowed: true, Tier: "NetworkPolicy", Policies: []string{"ns/web"}, Detail: "allowed by NetworkPolicy ns/web ingress rule 0"}},
		Egress: &apiv1.PolicyDirection{Admin: []*apiv1.PolicyRule{deny}, Baseline: []*apiv1.PolicyRule{base},
			Decision: &apiv1.PolicyDecision{Tier: "Admin", Policies: []string{"deny-all"}, Detail: `denied by ClusterNetworkPolicy deny-all (Admin, priority 10) egress rule 0 "no-egress"`}},
	}}}}
	sock := serve(t, agent)
	expectOutputs(t, sock, []onctlCase{
		{[]string{"policy"}, []string{"isolated by ns/web; admin deny-all; baseline base  no NetworkPolicy; admin deny-all; baseline base"}},
		{[]string{"policy", "ns/a", "--peer", "10.244.2.7", "--port", "tcp/80"}, []string{
			"Ingress: isolated by ns/web; admin deny-all; baseline base; 0 connections allowed, 0 denied\n" +
				"  Admin (ClusterNetworkPolicy, judged first):\n" +
				"    POLICY    PRIORITY  RULE  NAME       ACTION  FROM       PORTS\n" +
				"    deny-all  10        0     no-egress  Deny    0.0.0.0/0  TCP/25\n" +
				"  NetworkPolicy (what Admin passes on or leaves):\n" +
				"  POLICY  RULE  FROM           PORTS\n" +
				"  ns/web  0     10.244.2.0/24  TCP/80\n" +
				"  Baseline (ClusterNetworkPolicy): not reached, NetworkPolicy isolates the pod here\n" +
				"    POLICY  PRIORITY  RULE  NAME  ACTION  FROM           PORTS\n" +
				"    base    5         1     -     Accept  10.244.0.0/16  all\n" +
				"  => ALLOWED: allowed by NetworkPolicy ns/web ingress rule 0\n",
			"Egress: no NetworkPolicy; admin deny-all; baseline base; 0 connections allowed, 0 denied\n" +
				"  Admin (ClusterNetworkPolicy, judged first):\n",
			"  NetworkPolicy: none isolates the pod here\n" +
				"  Baseline (ClusterNetworkPolicy, judges what Admin passes on or leaves; what it leaves is allowed):\n" +
				"    POLICY  PRIORITY  RULE  NAME  ACTION  TO             PORTS\n" +
				"    base    5         1     -     Accept  10.244.0.0/16  all\n" +
				`  => DENIED: denied by ClusterNetworkPolicy deny-all (Admin, priority 10) egress rule 0 "no-egress"` + "\n"}},
	})
	if q := agent.asked; q.Pod != "ns/a" || q.Peer != "10.244.2.7" || q.Port != 80 || q.Protocol != "TCP" {
		t.Errorf("asked %v, want ns/a's decision on 10.244.2.7 TCP/80", q)
	}
	for _, args := range [][]string{
		{"policy", "--peer", "10.244.2.7", "--port", "80"}, // no pod
		{"policy", "ns/a", "--peer", "10.244.2.7"},         // no port
		{"policy", "ns/a", "--port", "80"},                 // no peer
		{"policy", "ns/a", "--peer", "10.244.2.7", "--port", "TCP/0"},
		{"policy", "ns/a", "--peer", "10.244.2.7", "--port", "http"},
	} {
		agent.asked = nil
		if _, err := run(append([]string{"-s", sock}, args...)...); err == nil || agent.asked != nil {
			t.Errorf("onctl %v: %v (asked %v), want refused before asking", args, err, agent.asked)
		}
	}
}
