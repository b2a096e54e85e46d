// Package onctl is the operator's CLI: a gRPC client of onc-agent's
// agent.sock that prints tables or, with -o json, JSON.
package onctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/internal/cmdutil"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// DefaultSocket is where onc-agent serves agent.sock.
const DefaultSocket = "/var/run/onc/agent.sock"

type options struct {
	socket  string
	output  string
	timeout time.Duration
	out     io.Writer
}

// NewCommand builds the onctl command tree.
func NewCommand() *cobra.Command {
	o := &options{out: os.Stdout}
	root := &cobra.Command{
		Use:           "onctl",
		Short:         "Inspect the ONC agent on this node",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "table" && o.output != "json" {
				return fmt.Errorf("--output %q: must be table or json", o.output)
			}
			o.out = cmd.OutOrStdout()
			return nil
		},
	}
	root.PersistentFlags().StringVarP(&o.socket, "socket", "s", cmdutil.EnvOr("ONC_AGENT_SOCKET", DefaultSocket), "agent socket (env ONC_AGENT_SOCKET)")
	root.PersistentFlags().StringVarP(&o.output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for the agent")
	root.AddCommand(
		&cobra.Command{Use: "status", Short: "This node's agent: readiness, pod CIDR, VXLAN", Args: cobra.NoArgs,
			RunE: o.runE(show(apiv1.AgentClient.GetStatus, &apiv1.GetStatusRequest{}, printStatus))},
		&cobra.Command{Use: "ready", Short: "Exit 0 if the agent is ready (it serves CNI ADD), else print why and exit 1: a readiness probe", Args: cobra.NoArgs,
			RunE: o.runE(checkReady)},
		&cobra.Command{Use: "pods", Short: "Pods attached on this node", Args: cobra.NoArgs,
			RunE: o.runE(show(apiv1.AgentClient.ListPods, &apiv1.ListPodsRequest{}, printPods))},
		&cobra.Command{Use: "peers", Short: "Other nodes (tunnel endpoints) and whether they are programmed here", Args: cobra.NoArgs,
			RunE: o.runE(show(apiv1.AgentClient.ListPeers, &apiv1.ListPeersRequest{}, printPeers))},
		&cobra.Command{Use: "stats", Short: "Fast-path counters per program: hits, misses by reason, learn events, errors", Args: cobra.NoArgs,
			RunE: o.runE(show(apiv1.AgentClient.GetStats, &apiv1.GetStatsRequest{}, printStats))},
		&cobra.Command{Use: "fastpath on|off", Short: "Switch this node's fast path on or off (peers follow through the datastore)",
			Args: cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs), ValidArgs: []string{"on", "off"},
			RunE: func(cmd *cobra.Command, args []string) error {
				return o.run(show(apiv1.AgentClient.SetFastPath, &apiv1.SetFastPathRequest{Enabled: args[0] == "on"}, printFastPath))
			}},
		policyCommand(o),
		&cobra.Command{Use: "services", Short: "Services balanced at the socket: ClusterIP:port → backends, translation counters, ClientIP affinity", Args: cobra.NoArgs,
			RunE: o.runE(show(apiv1.AgentClient.ListServices, &apiv1.ListServicesRequest{}, printServices))},
		cacheCommand(o),
		bypassCommand(o),
		flowsCommand(o),
		traceCommand(o),
	)
	return root
}

func cacheCommand(o *options) *cobra.Command {
	c := &cobra.Command{Use: "cache", Short: "The fast path's flow cache"}
	c.AddCommand(
		&cobra.Command{Use: "list [egress|ingress|filter]", Short: "Decoded cache entries (all tables by default)",
			Args: cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs), ValidArgs: []string{"egress", "ingress", "filter"},
			RunE: func(cmd *cobra.Command, args []string) error {
				table := ""
				if len(args) == 1 {
					table = args[0]
				}
				return o.run(show(apiv1.AgentClient.ListCache, &apiv1.ListCacheRequest{Table: table}, printCache(table)))
			}},
		&cobra.Command{Use: "flush", Short: "Forget every learned entry; flows learn again through the slow path", Args: cobra.NoArgs,
			RunE: o.runE(flushCache)},
	)
	return c
}

type view func(ctx context.Context, c apiv1.AgentClient, o *options) error

func (o *options) run(v view) error { return o.runFor(o.timeout, v) }

// runFor runs v with a deadline timeout from now (0: none, for a view
// that follows the agent until interrupted).
func (o *options) runFor(timeout time.Duration, v view) error {
	if _, err := os.Stat(o.socket); err != nil {
		return fmt.Errorf("onc-agent is not reachable at %s: %w (is the agent running? set --socket)", o.socket, err)
	}
	conn, err := grpc.NewClient("unix://"+o.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if err := v(ctx, apiv1.NewAgentClient(conn), o); err != nil {
		return fmt.Errorf("agent at %s: %w", o.socket, err)
	}
	return nil
}

// runE is a subcommand's RunE that runs v, for one without arguments.
func (o *options) runE(v view) func(*cobra.Command, []string) error {
	return func(*cobra.Command, []string) error { return o.run(v) }
}

// show is how a subcommand prints: it calls rpc with req, then prints the
// answer as JSON (-o json) or with text (-o table).
func show[Req, Resp proto.Message](rpc func(apiv1.AgentClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
	req Req, text func(*options, Resp) error) view {
	return func(ctx context.Context, c apiv1.AgentClient, o *options) error {
		resp, err := rpc(c, ctx, req)
		if err != nil {
			return err
		}
		if o.output == "json" {
			return o.json(resp)
		}
		return text(o, resp)
	}
}

func (o *options) json(m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true, UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(o.out, string(b))
	return err
}

// table prints aligned columns, under header unless it is nil.
func (o *options) table(header []string, rows [][]string) error {
	w := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', 0)
	if header != nil {
		fmt.Fprintln(w, strings.Join(header, "\t"))
	}
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

// checkReady and flushCache print no JSON, so they do not go through
// show: ready is a probe (its exit code is the answer) and the agent
// answers a flush with nothing.
func checkReady(ctx context.Context, c apiv1.AgentClient, o *options) error {
	st, err := c.GetStatus(ctx, &apiv1.GetStatusRequest{})
	if err != nil {
		return err
	}
	if !st.Ready {
		return fmt.Errorf("not ready: %s", st.NotReadyReason)
	}
	fmt.Fprintln(o.out, "ready")
	return nil
}

func flushCache(ctx context.Context, c apiv1.AgentClient, o *options) error {
	_, err := c.FlushCache(ctx, &apiv1.FlushCacheRequest{})
	if err == nil && o.output == "table" {
		fmt.Fprintln(o.out, "flow cache flushed")
	}
	return err
}

func printStatus(o *options, st *apiv1.NodeStatus) error {
	ready := "yes"
	if !st.Ready {
		ready = "no: " + st.NotReadyReason
	}
	rows := [][]string{
		{"Node:", st.NodeName},
		{"Ready:", ready},
		{"Node IP:", st.NodeIp + " (uplink " + st.Uplink + ")"},
		{"Pod CIDR:", podCIDRs(st)},
		{"VXLAN:", fmt.Sprintf("%s VNI %d port %d VTEP MAC %s", st.VxlanDevice, st.Vni, st.VxlanPort, st.VtepMac)},
		{"Pod MTU:", fmt.Sprint(st.PodMtu)},
		{"Fast path:", fastPathState(st)},
		{"Pods:", fmt.Sprint(st.Pods)},
		{"Peers:", fmt.Sprint(st.Peers)},
		{"Datastore:", st.Datastore},
		{"Policy:", orDash(st.Policy)},
		{"Socket LB:", socketLBState(st)},
		{"Kube-proxy:", orDash(st.KubeProxy)},
		{"Bypass:", bypassState(st.Bypass)},
		{"Metrics:", metricsState(st)},
		{"Version:", st.Version},
		{"Up since:", time.Unix(st.StartedUnix, 0).UTC().Format(time.RFC3339)},
	}
	for i, wt := range st.Watchers {
		label := ""
		if i == 0 {
			label = "Watchers:"
		}
		rows = append(rows, []string{label, wt.Name + ": " + watcherState(wt)})
	}
	w := tabwriter.NewWriter(o.out, 0, 0, 1, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

func printPods(o *options, resp *apiv1.ListPodsResponse) error {
	var rows [][]string
	for _, p := range resp.Pods {
		pod := "-"
		if p.K8SName != "" {
			pod = p.K8SNamespace + "/" + p.K8SName
		}
		rows = append(rows, []string{addrs(p.Ips, p.Ip), short(p.ContainerId), p.Ifname, p.HostIface, p.Mac, pod, orDash(p.K8SPhase),
			time.Unix(p.CreatedUnix, 0).UTC().Format(time.RFC3339)})
	}
	return o.table([]string{"IP", "CONTAINER", "IFACE", "HOST-IFACE", "MAC", "POD", "PHASE", "CREATED"}, rows)
}

// podCIDRs describes the node's pod CIDRs, each with its gateway and
// cluster CIDR.
func podCIDRs(st *apiv1.NodeStatus) string {
	if len(st.PodCidrs) == 0 && st.PodCidr != "" { // an agent before pod_cidrs
		return st.PodCidr + " (gateway " + st.Gateway + ", cluster " + st.ClusterCidr + ")"
	}
	if len(st.PodCidrs) != len(st.Gateways) || len(st.PodCidrs) != len(st.ClusterCidrs) {
		return "malformed status: " + fmt.Sprint(st.PodCidrs, st.Gateways, st.ClusterCidrs)
	}
	var out []string
	for i, cidr := range st.PodCidrs {
		out = append(out, cidr+" (gateway "+st.Gateways[i]+", cluster "+st.ClusterCidrs[i]+")")
	}
	return orDash(strings.Join(out, ", "))
}

func printPeers(o *options, resp *apiv1.ListPeersResponse) error {
	var rows [][]string
	for _, p := range resp.Peers {
		cidrs, gws := p.PodCidrs, p.Gateways
		if len(cidrs) == 0 && p.PodCidr != "" { // an agent before pod_cidrs
			cidrs, gws = []string{p.PodCidr}, []string{p.Gateway}
		}
		rows = append(rows, []string{p.NodeName, p.NodeIp, orDash(strings.Join(cidrs, ",")), orDash(strings.Join(gws, ",")), p.VtepMac,
			yesNo(p.Alive), yesNo(p.Programmed), yesNo(p.FastPath)})
	}
	return o.table([]string{"NODE", "NODE-IP", "POD-CIDR", "GATEWAY", "VTEP-MAC", "ALIVE", "PROGRAMMED", "FAST-PATH"}, rows)
}

// watcherState says how far a watcher has applied its input.
func watcherState(w *apiv1.Watcher) string {
	s := fmt.Sprintf("applied generation %d of %d", w.Applied, w.Seen)
	if w.LastAppliedUnix != 0 {
		s += ", last at " + time.Unix(w.LastAppliedUnix, 0).UTC().Format(time.RFC3339)
	}
	if w.LastError != "" {
		s += "; failing: " + w.LastError
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// metricsState is where the agent serves its metrics, or off.
func metricsState(st *apiv1.NodeStatus) string {
	if u := st.MetricsURL(); u != "" {
		return u
	}
	return "off"
}

func fastPathState(st *apiv1.NodeStatus) string {
	switch {
	case !st.FastPathLoaded:
		return "not loaded yet (the node is not up; see the agent log)"
	case st.FastPath:
		return "on (" + st.FastPathMode + "), connection setup: " + st.FastPathConnectionSetup
	}
	return "off (" + st.FastPathMode + ")"
}

func printFastPath(o *options, st *apiv1.NodeStatus) error {
	_, err := fmt.Fprintln(o.out, "fast path:", fastPathState(st))
	return err
}

func printStats(o *options, resp *apiv1.GetStatsResponse) error {
	var rows [][]string
	for _, ctr := range resp.Counters {
		family := ctr.Family
		if family == "" {
			family = "-"
		}
		rows = append(rows, []string{ctr.Program, ctr.Name, family, fmt.Sprint(ctr.Value)})
	}
	return o.table([]string{"PROGRAM", "COUNTER", "FAMILY", "VALUE"}, rows)
}

// printCache prints the tables of the cache list asked for: table, or
// all of them under a title each.
func printCache(table string) func(*options, *apiv1.ListCacheResponse) error {
	return func(o *options, resp *apiv1.ListCacheResponse) error {
		section := func(title string, header []string, rows [][]string) error {
			if table == "" {
				fmt.Fprintf(o.out, "%s (%d)\n", title, len(rows))
			}
			if err := o.table(header, rows); err != nil {
				return err
			}
			if table == "" {
				fmt.Fprintln(o.out)
			}
			return nil
		}
		if table == "" || table == "egress" {
			var rows [][]string
			for _, e := range resp.Egress {
				rows = append(rows, []string{e.PodIp, e.NodeIp})
			}
			if err := section("Egress: remote pod -> node", []string{"POD", "NODE"}, rows); err != nil {
				return err
			}
			rows = nil
			for _, e := range resp.Encap {
				rows = append(rows, []string{e.NodeIp, e.OuterSrcIp, e.Uplink, e.OuterSrcMac, e.OuterDstMac, e.InnerSrcMac, e.InnerDstMac})
			}
			if err := section("Egress headers: node -> learned outer headers", []string{"NODE", "FROM", "UPLINK", "OUTER-SRC-MAC", "OUTER-DST-MAC", "INNER-SRC-MAC", "INNER-DST-MAC"}, rows); err != nil {
				return err
			}
		}
		if table == "" || table == "ingress" {
			var rows [][]string
			for _, e := range resp.Ingress {
				rows = append(rows, []string{e.PodIp, e.HostIface, e.PodMac, e.HostMac})
			}
			if err := section("Ingress: local pod -> veth", []string{"POD", "HOST-IFACE", "POD-MAC", "HOST-MAC"}, rows); err != nil {
				return err
			}
		}
		if table == "" || table == "filter" {
			var rows [][]string
			for _, f := range resp.Filter {
				rows = append(rows, []string{f.Proto, f.Local, f.Remote, yesNo(f.Egress), yesNo(f.Ingress), yesNo(f.Live), f.OpenedBy, yesNo(f.Closing)})
			}
			return section("Filter: flows the slow path established, or the fast path opened", []string{"PROTO", "LOCAL", "REMOTE", "EGRESS", "INGRESS", "LIVE", "OPENED-BY", "CLOSING"}, rows)
		}
		return nil
	}
}

// addrs shows a pod's addresses, comma-separated: ips, or ip from an agent
// that sends only that.
func addrs(ips []string, ip string) string {
	if len(ips) == 0 {
		return ip
	}
	return strings.Join(ips, ",")
}

func printPolicy(o *options, resp *apiv1.ListPolicyResponse) error {
	var rows [][]string
	for _, p := range resp.Pods {
		rows = append(rows, []string{p.Key, addrs(p.Ips, p.Ip), isolation(p.Ingress), isolation(p.Egress),
			fmt.Sprintf("%d/%d", p.Ingress.Allowed, p.Egress.Allowed), fmt.Sprintf("%d/%d", p.Ingress.Denied, p.Egress.Denied)})
	}
	if err := o.table([]string{"POD", "IP", "INGRESS", "EGRESS", "ALLOWED(IN/EG)", "DENIED(IN/EG)"}, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(o.out, "\nPolicy: "+policyGeneration(resp))
	return err
}

func printPodPolicy(o *options, resp *apiv1.ListPolicyResponse) error {
	p := resp.Pods[0]
	fmt.Fprintf(o.out, "Pod:     %s (%s, host interface %s)\nPolicy:  %s\n", p.Key, addrs(p.Ips, p.Ip), p.HostIface, policyGeneration(resp))
	for _, d := range []struct {
		name string
		dir  *apiv1.PolicyDirection
		peer string
	}{{"Ingress", p.Ingress, "FROM"}, {"Egress", p.Egress, "TO"}} {
		fmt.Fprintf(o.out, "\n%s: %s; %d connections allowed, %d denied\n", d.name, enforcement(d.dir), d.dir.Allowed, d.dir.Denied)
		if err := printTiers(o, d.dir, d.peer); err != nil {
			return err
		}
		if dec := d.dir.Decision; dec != nil {
			verdict := "DENIED"
			if dec.Allowed {
				verdict = "ALLOWED"
			}
			fmt.Fprintf(o.out, "  => %s: %s\n", verdict, dec.Detail)
		}
		if len(d.dir.AuditPolicies) == 0 {
			continue
		}
		// Where enforcing rules of any tier judge the direction, audited
		// policies can only allow more (docs/policy.md, Audit mode).
		none := "audit would deny every connection"
		if d.dir.Isolated || len(d.dir.Admin) > 0 || len(d.dir.Baseline) > 0 {
			fmt.Fprintf(o.out, "  audited by %s (not enforced): would allow %d of the denied; the enforcing rules decide, so audit reports no would-deny here\n",
				strings.Join(d.dir.AuditPolicies, ","), d.dir.WouldAllow)
			none = "audit would allow nothing more"
		} else {
			fmt.Fprintf(o.out, "  audited by %s (not enforced): would deny %d\n", strings.Join(d.dir.AuditPolicies, ","), d.dir.WouldDeny)
		}
		if err := printRules(o, d.dir.AuditRules, d.peer, none); err != nil {
			return err
		}
	}
	return nil
}

// printTiers prints a direction's rules in the order they judge: the
// Admin tier's, the NetworkPolicies' if they isolate it, the Baseline
// tier's. Without ClusterNetworkPolicy rules, the NetworkPolicies' alone,
// untitled.
func printTiers(o *options, d *apiv1.PolicyDirection, peer string) error {
	if len(d.Admin) == 0 && len(d.Baseline) == 0 {
		if !d.Isolated {
			return nil
		}
		return printRules(o, d.Rules, peer, "every connection is denied")
	}
	fmt.Fprintln(o.out, "  Admin (ClusterNetworkPolicy, judged first):")
	if err := printTierRules(o, d.Admin, peer); err != nil {
		return err
	}
	if d.Isolated {
		fmt.Fprintln(o.out, "  NetworkPolicy (what Admin passes on or leaves):")
		if err := printRules(o, d.Rules, peer, "every connection is denied"); err != nil {
			return err
		}
		fmt.Fprintln(o.out, "  Baseline (ClusterNetworkPolicy): not reached, NetworkPolicy isolates the pod here")
		return printTierRules(o, d.Baseline, peer)
	}
	fmt.Fprintln(o.out, "  NetworkPolicy: none isolates the pod here")
	fmt.Fprintln(o.out, "  Baseline (ClusterNetworkPolicy, judges what Admin passes on or leaves; what it leaves is allowed):")
	return printTierRules(o, d.Baseline, peer)
}

// printTierRules prints a tier's ClusterNetworkPolicy rules, indented.
func printTierRules(o *options, rules []*apiv1.PolicyRule, peer string) error {
	if len(rules) == 0 {
		_, err := fmt.Fprintln(o.out, "    no rule")
		return err
	}
	var rows [][]string
	for _, r := range rules {
		rows = append(rows, []string{r.Policy, fmt.Sprint(r.Priority), fmt.Sprint(r.Index), orDash(r.Name), r.Action, orNone(r.Peers), rulePorts(r)})
	}
	return o.table([]string{"    POLICY", "PRIORITY", "RULE", "NAME", "ACTION", peer, "PORTS"}, indent(indent(rows)))
}

// printRules prints a direction's rules, indented; none says what that
// means.
func printRules(o *options, rules []*apiv1.PolicyRule, peer, none string) error {
	if len(rules) == 0 {
		_, err := fmt.Fprintln(o.out, "  no rule: "+none)
		return err
	}
	var rows [][]string
	for _, r := range rules {
		rows = append(rows, []string{r.Policy, fmt.Sprint(r.Index), orNone(r.Peers), rulePorts(r)})
	}
	return o.table([]string{"  POLICY", "RULE", peer, "PORTS"}, indent(rows))
}

// isolation is a direction's enforcement and audit, in short.
func isolation(d *apiv1.PolicyDirection) string {
	if len(d.AuditPolicies) == 0 {
		return enforcement(d)
	}
	return enforcement(d) + "; audited by " + strings.Join(d.AuditPolicies, ",")
}

// enforcement says whether NetworkPolicy isolates a direction, and by
// which policies, then which ClusterNetworkPolicies judge it in each tier.
func enforcement(d *apiv1.PolicyDirection) string {
	s := "open"
	switch {
	case d.Isolated:
		s = "isolated by " + strings.Join(d.Policies, ",")
	case len(d.Admin) > 0 || len(d.Baseline) > 0:
		s = "no NetworkPolicy"
	}
	for _, tier := range []struct {
		name  string
		rules []*apiv1.PolicyRule
	}{{"admin", d.Admin}, {"baseline", d.Baseline}} {
		var names []string
		for _, r := range tier.rules {
			if !slices.Contains(names, r.Policy) {
				names = append(names, r.Policy)
			}
		}
		if len(names) > 0 {
			s += "; " + tier.name + " " + strings.Join(names, ",")
		}
	}
	return s
}

func policyGeneration(r *apiv1.ListPolicyResponse) string {
	return watcherState(&apiv1.Watcher{Applied: r.Applied, Seen: r.Seen, LastError: r.LastError})
}

func rulePorts(r *apiv1.PolicyRule) string {
	switch {
	case r.NoPort:
		return "none (no port applies: an unresolved named port, or an empty range)"
	case len(r.Ports) == 0:
		return "all"
	}
	return strings.Join(r.Ports, ",")
}

func orNone(peers []string) string {
	if len(peers) == 0 {
		return "nobody"
	}
	return strings.Join(peers, ",")
}

func indent(rows [][]string) [][]string {
	for _, r := range rows {
		r[0] = "  " + r[0]
	}
	return rows
}
