package onctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	apiv1 "github.com/onc-net/onc/api/v1"
)

func flowsCommand(o *options) *cobra.Command {
	req := &apiv1.GetFlowsRequest{}
	var since time.Duration
	c := &cobra.Command{Use: "flows", Short: "Flow records: policy verdicts, drops, Service translations and fast-path events on this node (docs/observability.md)",
		Long: "Flow records of this node, oldest first, with both ends as namespace/pod where known: each packet a pod's\n" +
			"policy denied (at most 3 at once and then 1 a second per connection) with the deciding rule: a ClusterNetworkPolicy's\n" +
			"(its tier, Admin or Baseline, priority, rule index and name) or the default deny of the NetworkPolicies isolating\n" +
			"the pod; each new connection a pod's policy allowed (at most 200 at once and then 100 a second per pod and\n" +
			"direction) with the policy and rule that allowed it; each packet dropped before any pod's rules (a spoofed\n" +
			"source, conntrack state invalid, a new TCP connection without a SYN), as denied ones are limited; what audited\n" +
			"policies (annotation onc.io/policy-mode: audit) would change, as an audit beside the verdict: allowed (audit:\n" +
			"would-deny), a packet let through that they would deny; denied (audit: would-allow), a packet denied that one of\n" +
			"them would allow (--verdict would-deny and would-allow select those; denied and allowed include them); and the eBPF\n" +
			"programs' events: drops by reason, Service translations (with the backend chosen), refusals, fast-path open and\n" +
			"learn, the bypass's pairings and fallbacks to the stack, within --flows-events-rate (\"+N suppressed\": that many\n" +
			"before were not recorded), and the flows the agent took off the fast path, saying why: a NetworkPolicy change, a\n" +
			"flush, a changed underlay, a peer or pod that went (evict).\n" +
			"--follow then prints each new record as it comes, until interrupted. -o json prints one JSON object per line.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if since < 0 {
				return fmt.Errorf("--since %v: a duration back from now, e.g. 5m", since)
			}
			if since > 0 {
				req.SinceUnixNano = time.Now().Add(-since).UnixNano()
			}
			timeout := o.timeout
			if req.Follow {
				timeout = 0
			}
			return o.runFor(timeout, func(ctx context.Context, c apiv1.AgentClient, o *options) error { return printFlows(ctx, c, o, req) })
		}}
	c.Flags().BoolVarP(&req.Follow, "follow", "f", false, "then print each new record as it comes")
	c.Flags().StringVar(&req.Pod, "pod", "", "records with this pod (namespace/name) at either end")
	c.Flags().StringVarP(&req.Namespace, "namespace", "n", "", "records with a pod of this namespace at either end")
	c.Flags().StringVar(&req.Verdict, "verdict", "", "records with this verdict: denied, allowed, dropped, refused, translated, cached, evicted, bypassed, to-stack; or this audit: would-deny, would-allow")
	c.Flags().StringVar(&req.Event, "event", "", "records of this event: policy, drop, refuse, translate, open, learn, evict, pair, fallback")
	c.Flags().DurationVar(&since, "since", 0, "records of the last DURATION only (e.g. 5m)")
	return c
}

func printFlows(ctx context.Context, c apiv1.AgentClient, o *options, req *apiv1.GetFlowsRequest) error {
	stream, err := c.GetFlows(ctx, req)
	if err != nil {
		return err
	}
	for {
		r, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
		if o.output == "json" {
			b, err := r.JSON()
			if err != nil {
				return err
			}
			fmt.Fprintln(o.out, string(b))
			continue
		}
		fmt.Fprintln(o.out, flowLine(r))
	}
}

// flowLine is a record on one line: time, then its summary.
func flowLine(r *apiv1.FlowRecord) string {
	return time.Unix(0, r.TimeUnixNano).Local().Format("15:04:05.000") + " " + r.Summary()
}
