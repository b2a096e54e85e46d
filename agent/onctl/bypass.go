package onctl

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/spf13/cobra"
)

// untilRestart is what a runtime switch of the bypass lasts.
const untilRestart = "until the agent restarts; then its --bypass and --bypass-min-size (ConfigMap keys bypass, bypass-min-size) apply again"

func bypassCommand(o *options) *cobra.Command {
	set := func(mode string, minSize uint32) error {
		return o.run(show(apiv1.AgentClient.SetBypass, &apiv1.SetBypassRequest{Mode: mode, MinSize: minSize}, printBypassSet))
	}
	c := &cobra.Command{Use: "bypass", Short: "The intra-node bypass: its setting, the connections between this node's pods it carries, its counters",
		Long: "The intra-node bypass carries TCP between two pods of this node past both TCP/IP stacks (docs/bypass.md).\n" +
			"Without a subcommand it shows the setting, the connections in its map and its counters; on, off and size N\n" +
			"switch it " + untilRestart + ".",
		Args: cobra.NoArgs,
		RunE: o.runE(show(apiv1.AgentClient.ListBypass, &apiv1.ListBypassRequest{}, printBypass))}
	c.AddCommand(
		&cobra.Command{Use: "on", Short: "Bypass every TCP connection between two pods of this node, until the agent restarts", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return set("on", 0) }},
		&cobra.Command{Use: "off", Short: "Bypass nothing (open connections send by the stack from their next message), until the agent restarts", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return set("off", 0) }},
		&cobra.Command{Use: "size N", Short: "Bypass a direction of a connection when its first message is at least N bytes, until the agent restarts",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				n, err := strconv.ParseUint(args[0], 10, 32)
				if err != nil {
					return fmt.Errorf("size %q: want a number of bytes", args[0])
				}
				return set("size", uint32(n))
			}},
	)
	return c
}

// bypassState is the bypass's line in onctl status and bypass.
func bypassState(b *apiv1.BypassState) string {
	switch {
	case b.GetStatus() != "":
		return "unavailable: " + b.Status
	case b.GetMode() == "" || b.Mode == "off":
		return orDash(b.GetMode())
	}
	setting := b.Mode
	if b.Mode == "size" {
		setting = fmt.Sprintf("size ≥ %d B", b.MinSize)
	}
	return fmt.Sprintf("%s (attached to cgroup %s)", setting, b.Cgroup)
}

func printBypass(o *options, resp *apiv1.ListBypassResponse) error {
	fmt.Fprintf(o.out, "Bypass: %s\n", bypassState(resp.State))
	if resp.State.GetStatus() != "" {
		return nil // unavailable: nothing more to show
	}
	var rows [][]string
	for _, c := range resp.Conns {
		rows = append(rows, []string{orDash(c.ClientPod), c.Client, orDash(c.ServerPod), c.Server, yesNo(c.Paired),
			fmt.Sprintf("%.0fs", c.AgeSeconds)})
	}
	fmt.Fprintln(o.out)
	if err := o.table([]string{"CLIENT POD", "CLIENT", "SERVER POD", "SERVER", "PAIRED", "AGE"}, rows); err != nil {
		return err
	}
	fmt.Fprintln(o.out)
	return o.table(nil, bypassCounters(resp.Counters))
}

// bypassCounters lays the counters out a line per kind: messages and
// bytes sent past the stacks, and by them; why sends fell back to the
// stack; the sockets recorded or skipped (every other counter).
func bypassCounters(cs []*apiv1.Counter) [][]string {
	prefixes := []string{"redirected_", "stack_", "fallback_"}
	lines := make([][]string, len(prefixes)+1)
	for _, c := range cs {
		i := slices.IndexFunc(prefixes, func(p string) bool { return strings.HasPrefix(c.Name, p) })
		if i < 0 {
			i = len(prefixes)
		}
		lines[i] = append(lines[i], fmt.Sprintf("%s=%d", c.Name, c.Value))
	}
	var rows [][]string
	for _, l := range lines {
		if len(l) == 0 {
			continue
		}
		label := ""
		if len(rows) == 0 {
			label = "Counters:"
		}
		rows = append(rows, []string{label, strings.Join(l, " ")})
	}
	return rows
}

func printBypassSet(o *options, resp *apiv1.ListBypassResponse) error {
	_, err := fmt.Fprintf(o.out, "bypass: %s %s\n", bypassState(resp.State), untilRestart)
	return err
}
