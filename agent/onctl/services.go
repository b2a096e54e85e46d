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
		rows = append(rows, []string{s.Vip + "/" + s.Proto, s.Name, backends(s.Backends), aff,
			fmt.Sprint(s.Translated), fmt.Sprint(s.Refused)})
		for _, a := range s.Affinity {
			affinity = append(affinity, []string{s.Vip + "/" + s.Proto, a.Client, a.Backend, fmt.Sprintf("%.0fs", a.AgeSeconds)})
		}
	}
	if err := o.table([]string{"SERVICE", "NAME", "BACKENDS", "AFFINITY", "TRANSLATED", "REFUSED"}, rows); err != nil {
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
	_, err := fmt.Fprintf(o.out, "\nSocket LB: %s, cgroup %s; %s\nCounters:  %s\n", resp.Mode, resp.Cgroup, gen, strings.Join(counters, " "))
	return err
}

// backends lists addresses with the pod and node behind each; a backend
// used only because none is ready is marked terminating.
func backends(bs []*apiv1.ServiceBackend) string {
	if len(bs) == 0 {
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
