package flows

import (
	"fmt"
	"net/netip"
	"strings"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/l4"
	"github.com/onc-net/onc/datapath/policy"
)

// Decision is a direction's verdict on a connection (policy.Direction's
// Judge) with its deciding rule named, as flow records, onctl trace and
// onctl policy say it: one wording, so that a trace's words are the ones
// its probe's records show.
type Decision struct {
	policy.Verdict
	// Tier is the tier that decided (FlowRecord.tier): "" when nothing did
	// (no NetworkPolicy isolates the direction and no ClusterNetworkPolicy
	// rule matches).
	Tier string
	// Policies are the deciding policy, or the isolating ones of
	// NetworkPolicy's default deny; Rule the deciding rule's index, nil
	// for none.
	Policies []string
	Rule     *int
	Reason   string
}

// Judge is d's decision on a new connection with peer on proto/port, in
// direction way (ingress, egress); what is the connection in the words of
// a default deny ("this", or the peer and port). A nil d (no policy of any
// tier applies) allows.
func Judge(d *policy.Direction, way string, peer netip.Addr, proto policy.Proto, port uint16, what string) Decision {
	if d == nil {
		return Decision{Verdict: policy.Verdict{Allowed: true}, Reason: fmt.Sprintf("no policy isolates the pod's %s: allowed", way)}
	}
	v := d.Judge(peer, proto, port)
	dec := Decision{Verdict: v, Tier: v.Tier.String()}
	switch {
	case v.Tier != policy.TierNetworkPolicy:
		r := tierRule(d, v.Tier, v.Policy, v.Index)
		dec.Policies, dec.Rule = []string{v.Policy}, &r.Index
		verdict := "denied"
		if v.Allowed {
			verdict = "allowed"
		}
		dec.Reason = fmt.Sprintf("%s by %s", verdict, describeTierRule(r, v.Tier, way))
		if v.Action == policy.Pass {
			dec.Reason += " (Pass: no tier judges after Baseline)"
		}
	case v.Policy != "":
		index := v.Index
		dec.Policies, dec.Rule = []string{v.Policy}, &index
		kind := ""
		if d.Tiered() {
			kind = "NetworkPolicy "
		}
		dec.Reason = fmt.Sprintf("allowed by %s%s %s rule %d", kind, v.Policy, way, v.Index)
	case !v.Allowed:
		dec.Policies = d.Policies
		dec.Reason = fmt.Sprintf("default deny: %s isolated by %s, and no rule of theirs allows %s", way, strings.Join(d.Policies, ", "), what)
	default:
		dec.Tier = ""
		dec.Reason = fmt.Sprintf("allowed: no NetworkPolicy isolates the pod's %s, and no ClusterNetworkPolicy rule matches", way)
	}
	if v.Passed != nil {
		dec.Reason += fmt.Sprintf(" (%s passed it on)", describeTierRule(*v.Passed, policy.TierAdmin, way))
	}
	return dec
}

// tierRule is the rule of d's tier t that Judge named by policy and index.
func tierRule(d *policy.Direction, t policy.Tier, name string, index int) policy.TierRule {
	rules := d.Admin
	if t == policy.TierBaseline {
		rules = d.Baseline
	}
	for _, r := range rules {
		if r.Policy == name && r.Index == index {
			return r
		}
	}
	return policy.TierRule{Policy: name, Index: index}
}

// describeTierRule names a ClusterNetworkPolicy rule: its policy, tier
// and priority, direction, index and name.
func describeTierRule(r policy.TierRule, t policy.Tier, way string) string {
	s := fmt.Sprintf("ClusterNetworkPolicy %s (%s, priority %d) %s rule %d", r.Policy, t, r.Priority, way, r.Index)
	if r.Name != "" {
		s += fmt.Sprintf(" %q", r.Name)
	}
	return s
}

// API is the decision as onctl policy shows it (PolicyDecision).
func (d Decision) API() *apiv1.PolicyDecision {
	out := &apiv1.PolicyDecision{Allowed: d.Allowed, Tier: d.Tier, Policies: d.Policies, Rule: -1, RuleName: d.Name, Detail: d.Reason}
	if d.Rule != nil {
		out.Rule = int32(*d.Rule)
	}
	return out
}

// PeerQuery is onctl policy's --peer and --port: a connection whose
// deciding rule each direction of the pod names.
type PeerQuery struct {
	Peer  netip.Addr
	Proto policy.Proto
	Port  uint16
}

// ParsePeerQuery reads req's query; nil when it asks none.
func ParsePeerQuery(req *apiv1.ListPolicyRequest) (*PeerQuery, error) {
	if req.Peer == "" {
		if req.Port != 0 || req.Protocol != "" {
			return nil, fmt.Errorf("port %s/%d: give the peer too", req.Protocol, req.Port)
		}
		return nil, nil
	}
	if req.Pod == "" {
		return nil, fmt.Errorf("peer %s: give the pod whose rules judge it", req.Peer)
	}
	peer, err := netip.ParseAddr(req.Peer)
	if err != nil {
		return nil, fmt.Errorf("peer %q: an address", req.Peer)
	}
	q := &PeerQuery{Peer: peer.Unmap(), Proto: l4.TCP}
	if req.Protocol != "" {
		var ok bool
		if q.Proto, ok = l4.ParseProto(req.Protocol); !ok {
			return nil, fmt.Errorf("protocol %q: must be TCP, UDP or SCTP", req.Protocol)
		}
	}
	if req.Port < 1 || req.Port > 65535 {
		return nil, fmt.Errorf("port %d: must be 1-65535", req.Port)
	}
	q.Port = uint16(req.Port)
	return q, nil
}

// Decide sets the decision of each of p's directions in pp (onctl policy's
// answer for p) on the connection q asks about.
func (q *PeerQuery) Decide(p *policy.Pod, pp *apiv1.PolicyPod) {
	what := fmt.Sprintf("%s %s port %d", q.Peer, q.Proto, q.Port)
	pp.Ingress.Decision = Judge(p.Ingress, "ingress", q.Peer, q.Proto, q.Port, what).API()
	pp.Egress.Decision = Judge(p.Egress, "egress", q.Peer, q.Proto, q.Port, what).API()
}
