package onctl

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	apiv1 "github.com/onc-net/onc/api/v1"
)

func traceCommand(o *options) *cobra.Command {
	var probe bool
	c := &cobra.Command{Use: "trace SRC DST[:PORT[/PROTO]]",
		Short: "What ONC does with a new connection from a pod of this node, hop by hop (docs/observability.md)",
		Long: "SRC is a pod of this node (namespace/name, or its address); DST a pod (namespace/name), or an address: a pod's,\n" +
			"a Service's frontend, or a host's. PORT is needed; PROTO is TCP (the default), UDP or SCTP. The answer is\n" +
			"the agent's state: the socket LB's translation (one path per backend), the egress policy with the rule\n" +
			"that decides, how this node forwards the packet, and the destination's ingress policy (another node's as\n" +
			"that node's agent answers it, or computed here from the cluster's policies when it cannot). Nothing is sent,\n" +
			"unless --probe: then the agent also makes one real connection from SRC's network namespace (TCP: connect,\n" +
			"no data; UDP: one datagram) and says what it met, what this node and the destination's recorded of it, and\n" +
			"whether that agrees with the trace.",
		Example: "  onctl trace x/client y/web:80\n  onctl trace 10.244.1.5 10.96.0.10:53/UDP\n  onctl trace --probe x/client y/web:80",
		Args:    cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			req, err := parseTrace(args[0], args[1])
			if err != nil {
				return err
			}
			req.Probe = probe
			return o.run(show(apiv1.AgentClient.Trace, req, printTrace))
		}}
	c.Flags().BoolVar(&probe, "probe", false, "also send a real connection from SRC and compare what it met with the trace")
	return c
}

// parseTrace reads SRC and DST[:PORT[/PROTO]], where DST is
// namespace/name or an address (IPv6 with a port in brackets:
// [fd00::1]:80). Neither names nor addresses hold a '/' of their own.
func parseTrace(src, dst string) (*apiv1.TraceRequest, error) {
	bad := fmt.Errorf("DST %q: namespace/name or an address, then :PORT[/PROTO] (an IPv6 address with a port in brackets)", dst)
	req := &apiv1.TraceRequest{Source: src}
	parts := strings.Split(dst, "/")
	var where string
	if isAddr(parts[0]) {
		where, parts = parts[0], parts[1:]
	} else if len(parts) >= 2 {
		where, parts = parts[0]+"/"+parts[1], parts[2:]
	}
	if where == "" || len(parts) > 1 {
		return nil, bad
	}
	if len(parts) == 1 {
		req.Protocol = strings.ToUpper(parts[0])
	}
	port := ""
	if ap, err := netip.ParseAddrPort(where); err == nil {
		req.Destination, port = ap.Addr().String(), strconv.Itoa(int(ap.Port()))
	} else if _, err := netip.ParseAddr(where); err == nil {
		req.Destination = where
	} else {
		req.Destination, port, _ = strings.Cut(where, ":")
	}
	if port == "" {
		return nil, fmt.Errorf("DST %q: a port is needed (DST:PORT[/PROTO])", dst)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("DST %q: port %q: a number, 1-65535", dst, port)
	}
	req.Port = uint32(n)
	return req, nil
}

// isAddr reports whether s is an address, with or without a port.
func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	_, perr := netip.ParseAddrPort(s)
	return err == nil || perr == nil
}

func printTrace(o *options, r *apiv1.TraceResponse) error {
	fmt.Fprintf(o.out, "%s %s → %s\n", r.Protocol, r.Source.Summary(), r.Destination.Summary())
	w := tabwriter.NewWriter(o.out, 0, 4, 2, ' ', 0)
	hops := func(indent string, hs []*apiv1.TraceHop) {
		for _, h := range hs {
			fmt.Fprintf(w, "%s%s\t%s\t%s\t%s\n", indent, h.Node, h.Step, h.Verdict, h.Detail)
		}
	}
	hops("", r.Hops)
	for _, p := range r.Paths {
		if len(r.Paths) > 1 || len(r.Hops) > 0 {
			fmt.Fprintf(w, "to %s:\n", p.Destination.Summary())
		}
		hops("  ", p.Hops)
		fmt.Fprintf(w, "  => %s\n", strings.ToUpper(p.Verdict))
	}
	if len(r.Paths) == 0 {
		fmt.Fprintf(w, "=> REFUSED\n")
	}
	if p := r.Probe; p != nil {
		fmt.Fprintf(w, "probe from %s: %s in %.3f s: %s\n", p.Local, strings.ToUpper(p.Outcome), p.Seconds, strings.ToUpper(p.Agreement))
		fmt.Fprintf(w, "  %s\n", p.Detail)
	}
	return w.Flush()
}
