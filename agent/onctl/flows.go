package onctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	apiv1 "github.com/onc-net/onc/api/v1"
)

func flowsCommand(o *options) *cobra.Command {
	req := &apiv1.GetFlowsRequest{}
	var since time.Duration
	c := &cobra.Command{Use: "flows", Short: "Flow records: what policy and the eBPF programs did with flows on this node (docs/observability.md)",
		Long: "Flow records of this node, oldest first: each packet a pod's NetworkPolicy denied (at most 3 at once and then\n" +
			"1 a second per connection), with both ends as namespace/pod where known and the policies that isolate the pod;\n" +
			"and the eBPF programs' events: drops by reason, Service translations (with the backend chosen), refusals,\n" +
			"fast-path open and learn, within --flows-events-rate (\"+N suppressed\": that many before were not recorded);\n" +
			"and the flows a NetworkPolicy change took off the fast path (evict).\n" +
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
	c.Flags().StringVar(&req.Verdict, "verdict", "", "records with this verdict: denied, dropped, refused, translated, cached, evicted")
	c.Flags().StringVar(&req.Event, "event", "", "records of this event: policy, drop, refuse, translate, open, learn, evict")
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
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
			if err != nil {
				return err
			}
			fmt.Fprintln(o.out, string(b))
			continue
		}
		fmt.Fprintln(o.out, flowLine(r))
	}
}

// flowLine is a record on one line: time, node, verdict, direction,
// protocol, the ends, why.
func flowLine(r *apiv1.FlowRecord) string {
	t := time.Unix(0, r.TimeUnixNano).Local().Format("15:04:05.000")
	if r.Event == "lost" {
		return fmt.Sprintf("%s %s LOST %s", t, r.Node, r.Reason)
	}
	if r.Event == "policy" {
		return fmt.Sprintf("%s %s %s %s %s %s → %s: %s", t, r.Node, strings.ToUpper(r.Verdict), r.Direction, r.Protocol,
			endpoint(r.Source), endpoint(r.Destination), r.Reason)
	}
	// The eBPF programs': the event and path for the direction, the third
	// end after the destination.
	line := fmt.Sprintf("%s %s %s %s %s %s %s → %s", t, r.Node, strings.ToUpper(r.Verdict), r.Event, r.Path, r.Protocol,
		endpoint(r.Source), endpoint(r.Destination))
	if r.Translated != nil {
		via := " ⇒ "
		if r.Event == "drop" {
			via = " from " // the node that sent the frame
		}
		line += via + endpoint(r.Translated)
	}
	if r.Reason != "" {
		line += ": " + r.Reason
	}
	if r.Suppressed > 0 {
		line += fmt.Sprintf(" (+%d suppressed)", r.Suppressed)
	}
	return line
}

func endpoint(e *apiv1.FlowEndpoint) string {
	addr := e.Ip
	if e.Port != 0 {
		addr = net.JoinHostPort(e.Ip, fmt.Sprint(e.Port))
	}
	switch e.Kind {
	case "pod":
		return fmt.Sprintf("%s/%s (%s)", e.Namespace, e.Name, addr)
	case "service":
		return fmt.Sprintf("service %s/%s (%s)", e.Namespace, e.Name, addr)
	case "node":
		if e.Ip == "" {
			return "node " + e.Name // a socket call from the node's host
		}
		return fmt.Sprintf("node %s (%s)", e.Name, addr)
	}
	return addr
}
