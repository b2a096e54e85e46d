package lab

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	apiv1 "github.com/onc-net/onc/api/v1"
)

// Policy reads onctl policy of one pod of the node, by key: the response
// holds that pod, with both directions.
func (n *Node) Policy(ctx context.Context, key string) (*apiv1.ListPolicyResponse, error) {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := c.ListPolicy(ctx, &apiv1.ListPolicyRequest{Pod: key})
	if err != nil {
		return nil, fmt.Errorf("%s: onctl policy %s: %w", n.Name, key, err)
	}
	if len(resp.Pods) != 1 || resp.Pods[0].Ingress == nil || resp.Pods[0].Egress == nil {
		return nil, fmt.Errorf("%s: onctl policy %s: no such pod", n.Name, key)
	}
	return resp, nil
}

// Stats reads a node's fast-path counters, as onctl stats shows them, by
// "program_name": egress_hit, ingress_miss_flow, learn_egress, ... (see
// CounterKey for IPv6's).
func (n *Node) Stats(ctx context.Context) (map[string]uint64, error) {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := c.GetStats(ctx, &apiv1.GetStatsRequest{})
	if err != nil {
		return nil, fmt.Errorf("fast-path counters of %s: %w", n.Name, err)
	}
	out := map[string]uint64{}
	for _, ctr := range resp.Counters {
		out[CounterKey(ctr.Family, ctr.Program, ctr.Name)] = ctr.Value
	}
	return out, nil
}

// CounterKey is how Node.Stats names a fast-path counter: program_name as
// onctl stats shows them (egress_hit, learn_known), the program suffixed
// 6 for IPv6 packets' (egress6_hit, ingress6_miss_flow).
func CounterKey(family, program, name string) string {
	if family == "ipv6" {
		program += "6"
	}
	return program + "_" + name
}

// NodeStats are one node's fast-path counters (Node.Stats).
type NodeStats struct {
	Node     string
	Counters map[string]uint64
}

// Stats reads every node's fast-path counters, in the lab's node order.
func (l *Lab) Stats(ctx context.Context) ([]NodeStats, error) {
	var out []NodeStats
	for _, n := range l.Nodes {
		s, err := n.Stats(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, NodeStats{Node: n.Name, Counters: s})
	}
	return out, nil
}

// CounterDelta is how much one node's counter grew.
type CounterDelta struct {
	Node, Program, Counter string
	Delta                  uint64
}

// StatsDelta lists the hits, misses and errors that grew from before to
// after, node by node in after's order; within a node by program, its hits
// first. The learning programs' counts are left out: they count packets
// the misses already do. A counter that shrank (its map was made anew) is
// left out too.
func StatsDelta(before, after []NodeStats) []CounterDelta {
	base := map[string]map[string]uint64{}
	for _, s := range before {
		base[s.Node] = s.Counters
	}
	var out []CounterDelta
	for _, s := range after {
		var rows []CounterDelta
		for name, v := range s.Counters {
			prog, ctr, _ := strings.Cut(name, "_")
			if was := base[s.Node][name]; v > was && !strings.HasPrefix(prog, "learn") {
				rows = append(rows, CounterDelta{Node: s.Node, Program: prog, Counter: ctr, Delta: v - was})
			}
		}
		slices.SortFunc(rows, func(a, b CounterDelta) int {
			return cmp.Or(cmp.Compare(a.Program, b.Program), cmp.Compare(rank(a.Counter), rank(b.Counter)), cmp.Compare(a.Counter, b.Counter))
		})
		out = append(out, rows...)
	}
	return out
}

// rank puts hits before misses before errors.
func rank(counter string) int {
	switch {
	case counter == "hit":
		return 0
	case strings.HasPrefix(counter, "miss_"):
		return 1
	}
	return 2
}

// PrintStatsDelta writes deltas (StatsDelta) as a table, each node named
// once, and what they mean: how the fast path learns and hits, or that
// nothing hit.
func PrintStatsDelta(w io.Writer, deltas []CounterDelta) {
	if len(deltas) == 0 {
		fmt.Fprintln(w, "No fast-path counter moved.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPROGRAM\tCOUNTER\tDELTA")
	for i, d := range deltas {
		node := d.Node
		if i > 0 && deltas[i-1].Node == node {
			node = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", node, d.Program, d.Counter, d.Delta)
	}
	tw.Flush()
	if !slices.ContainsFunc(deltas, func(d CounterDelta) bool { return d.Counter == "hit" }) {
		fmt.Fprintln(w, "No hits: every packet took the slow path, for the reasons above (miss_disabled: the fast path is off).")
		return
	}
	fmt.Fprintln(w, "Each flow's first packets and every SYN, FIN and RST take the slow path (miss_flow, miss_tcp_flags),\n"+
		"which learns the flow; the rest of a flow between pods on different nodes is fast-path hits. The other\n"+
		"misses are traffic the fast path never carries: ICMP, pod↔pod within a node, to or from nodes (and the\n"+
		"agents' own underlay traffic).")
}
