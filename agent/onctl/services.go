package onctl

import (
	"fmt"
	"strings"

	apiv1 "github.com/onc-net/onc/api/v1"
)

func socketLBState(st *apiv1.NodeStatus) string {
	if st.SocketLbCgroup == "" {
		return orDash(st.SocketLb)
	}
	return fmt.Sprintf("%s (attached to cgroup %s)", st.SocketLb, st.SocketLbCgroup)
}

func printServices(o *options, resp *apiv1.ListServicesResponse) error {
	var rows, affinity [][]string
	for _, s := range resp.Services {
		aff := "-"
		if s.AffinitySeconds > 0 {
			aff = fmt.Sprintf("ClientIP %ds", s.AffinitySeconds)
		}
		rows = append(rows, []string{s.Vip + "/" + s.Proto, s.Frontend, scope(s), s.Name, backends(s), aff,
			fmt.Sprint(s.Translated), fmt.Sprint(s.Refused)})
		for _, a := range s.Affinity {
			affinity = append(affinity, []string{s.Vip + "/" + s.Proto, a.Client, a.Backend, fmt.Sprintf("%.0fs", a.AgeSeconds)})
		}
	}
	if err := o.table([]string{"FRONTEND", "TYPE", "FOR", "NAME", "BACKENDS", "AFFINITY", "TRANSLATED", "REFUSED"}, rows); err != nil {
		return err
	}
	if len(affinity) > 0 {
		fmt.Fprintln(o.out)
		if err := o.table([]string{"AFFINITY OF", "CLIENT", "BACKEND", "LAST USE"}, affinity); err != nil {
			return err
		}
	}
	var counters []string
	for _, c := range resp.Counters {
		counters = append(counters, fmt.Sprintf("%s=%d", c.Name, c.Value))
	}
	gen := watcherState(&apiv1.Watcher{Applied: resp.Applied, Seen: resp.Seen, LastError: resp.LastError})
	kubeProxy := "beside ONC (NodePorts, externalIPs, load balancer IPs are kube-proxy's)"
	if resp.KubeProxyReplacement {
		kubeProxy = "replaced by ONC"
	}
	if _, err := fmt.Fprintf(o.out, "\nSocket LB: %s, cgroup %s; %s\nKube-proxy: %s\nCounters:  %s\n", resp.Mode, resp.Cgroup, gen,
		kubeProxy, strings.Join(counters, " ")); err != nil {
		return err
	}
	for _, u := range resp.Unserved {
		if _, err := fmt.Fprintf(o.out, "Not served: %s\n", u); err != nil {
			return err
		}
	}
	return nil
}

// scope says whose connections an entry serves: this node's sockets, or
// clients outside on the uplink, with what applies to them.
func scope(s *apiv1.BalancedService) string {
	if s.Scope != "uplink" {
		return "this node"
	}
	out := "outside"
	if s.KeepClient {
		out += ", client kept"
	}
	if s.Dsr {
		out += ", direct return"
	}
	if len(s.SourceRanges) > 0 {
		out += ", from " + strings.Join(s.SourceRanges, " ")
	}
	return out
}

// backends lists addresses with the pod and node behind each; a backend
// used only because none is ready is marked terminating.
func backends(s *apiv1.BalancedService) string {
	bs := s.Backends
	switch {
	case len(bs) == 0 && s.DropWhenEmpty:
		return "none here: packets dropped"
	case len(bs) == 0:
		return "none: connections refused"
	}
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Addr
		if b.Pod != "" || b.Node != "" {
			out[i] += " (" + orDash(b.Pod) + " on " + orDash(b.Node) + ")"
		}
		if !b.Ready {
			out[i] += " terminating"
		}
	}
	return strings.Join(out, ", ")
}
