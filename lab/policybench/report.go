package policybench

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// MachineNote is said in every report.
const MachineNote = "Absolute numbers are from a shared 2-core VM and are noise: " +
	"another VM's load moves them by 2× from run to run. The TCP_CRR ratio is what holds, measured side by side " +
	"in interleaved runs; its spread (min–max of the per-repetition ratios) says how far it holds. " +
	"The programming times are single-threaded wall times on the same VM: read them against the aim with that margin."

// Report is what bench-results/policy.json holds.
type Report struct {
	Date    string       `json:"date"` // of the programming rows (and of the file)
	Kernel  string       `json:"kernel"`
	CPUs    int          `json:"cpus"`
	Note    string       `json:"note"`
	Changes int          `json:"changes"` // per programming row
	Program []ProgramRow `json:"program"`
	CRR     *CRRResult   `json:"crr,omitempty"`
}

// LoadReport reads an earlier report; a missing file is an empty one.
func LoadReport(path string) (Report, error) {
	var r Report
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// Merge replaces the rows of the same size and policy counts by rows, and
// keeps the others, sorted.
func (r *Report) Merge(rows []ProgramRow) {
	for _, row := range rows {
		r.Program = slices.DeleteFunc(r.Program, func(x ProgramRow) bool { return x.point() == row.point() })
		r.Program = append(r.Program, row)
	}
	slices.SortFunc(r.Program, func(a, b ProgramRow) int {
		return cmp.Or(cmp.Compare(a.Pods, b.Pods), cmp.Compare(a.Policies, b.Policies), cmp.Compare(a.ClusterPolicies, b.ClusterPolicies))
	})
}

// point is what a row measured: pods, policies and cluster policies.
func (x ProgramRow) point() [3]int { return [3]int{x.Pods, x.Policies, x.ClusterPolicies} }

// is reports whether the row measured that point and did not fail.
func (x ProgramRow) is(pods, policies, clusterPolicies int) bool {
	return x.point() == [3]int{pods, policies, clusterPolicies} && x.Error == ""
}

// WriteFiles writes r as dir/policy.json and dir/policy.md.
func (r Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "policy.md"))
	if err != nil {
		return err
	}
	r.Markdown(f)
	return f.Close()
}

func mib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

func rangeMs(s Stat) string {
	if s.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f (%.1f – %.1f)", s.Median, s.Min, s.Max)
}

// Markdown writes the report's tables.
func (r Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "# NetworkPolicy benchmark\n\nRun %s, kernel %s, %d CPUs.\n\n**Machine.** %s\n\n", r.Date, r.Kernel, r.CPUs, r.Note)
	if len(r.Program) > 0 {
		fmt.Fprintf(w, "## Rule programming\n\n")
		fmt.Fprintf(w, "A synthetic cluster (lab/policybench: 10 namespaces, 20 apps, 3 tiers, named container ports; policies of 8 shapes: "+
			"podSelector, namespaceSelector, both, ipBlock with except, numeric, named and endPort ports, ingress and egress; "+
			"ClusterNetworkPolicies, where a row has them, of 4 shapes: Admin Deny, Accept and Pass, Baseline Deny, by namespace and by pod, each selecting a third to a twentieth of the pods). "+
			"The node under test holds min(pods, %d) local pods, a full node at kubelet's default max-pods. "+
			"Each row runs in a fresh network namespace: the initial programming is the agent's compile of the whole node (agent/policy.Incremental's first, a full Compile), "+
			"then policy.Enforcer.Apply rebuilding the nft table (one transaction) and Revoke; a change is one policy (np-0) "+
			"alternating between two versions (other peers, one more port), %d times, each an incremental compile (the local pods np-0 selects) and an incremental Apply. "+
			"Times in ms; change: median (min – max). Revoke acts on an empty conntrack table here, so it is its floor. "+
			"Apply is netpol's own work (every local pod's set elements and fingerprints, the diff) plus nft's run of the transaction; "+
			"\"no-op apply\" is Apply of the same ruleset again, netpol's work alone with no nft run, so apply − no-op apply is about what nft and the kernel take.\n\n", MaxLocalPods, r.Changes)
		fmt.Fprintln(w, "| pods | policies | cluster policies | local | isolated in / eg | compiled rules | initial total | initial compile | initial apply | change total | change compile | change apply | change no-op apply | change revoke | pods changed |")
		fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, x := range r.Program {
			if x.Error != "" {
				fmt.Fprintf(w, "| %d | %d | %d | %d | failed: %s |||||||||||\n", x.Pods, x.Policies, x.ClusterPolicies, x.LocalPods, x.Error)
				continue
			}
			fmt.Fprintf(w, "| %d | %d | %d | %d | %d / %d | %d | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %d |\n",
				x.Pods, x.Policies, x.ClusterPolicies, x.LocalPods, x.IsolatedIngress, x.IsolatedEgress, x.CompiledRules,
				x.Initial.Total, x.Initial.Compile, x.Initial.Apply,
				rangeMs(x.Change.Total), rangeMs(x.Change.Compile), rangeMs(x.Change.Apply), rangeMs(x.Change.ApplyNoop),
				rangeMs(x.Change.Revoke), x.Change.PodsChanged)
		}
		clusterChanges(w, r.Program)
		fmt.Fprintf(w, "\n### Resync\n\n"+
			"A resync of the ruleset last applied, unchanged (Enforcer.Apply with checkKernel; the agent's incremental compile of unchanged inputs recompiles nothing): "+
			"quiet, with nothing committed to nftables since the last change (one netlink request for nftables' generation), and after another program's commit "+
			"(the table may have drifted: rewritten whole, as every resync did before). Wall time and CPU in ms (this process and its nft commands), "+
			"and whether it committed an nft transaction.\n\n")
		fmt.Fprintln(w, "| pods | policies | cluster policies | quiet ms | quiet CPU ms | quiet committed | after another commit ms | CPU ms | committed |")
		fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |")
		for _, x := range r.Program {
			if x.Error != "" {
				continue
			}
			fmt.Fprintf(w, "| %d | %d | %d | %.1f | %.1f | %v | %.1f | %.1f | %v |\n", x.Pods, x.Policies, x.ClusterPolicies,
				x.Quiet.Ms, x.Quiet.CPUMs, x.Quiet.Committed, x.Foreign.Ms, x.Foreign.CPUMs, x.Foreign.Committed)
		}
		for _, x := range r.Program {
			if x.is(5000, 1000, 0) {
				verdict := "met"
				if x.Quiet.CPUMs > 100 || x.Quiet.Committed {
					verdict = "not met"
				}
				fmt.Fprintf(w, "\n**Bar: at 5,000 pods × 1,000 policies a resync with no drift costs ≤ 100 ms of CPU and commits no nft transaction: %s** "+
					"(%.1f ms of CPU, committed: %v; after another program's commit, a rewrite: %.1f ms, committed: %v).\n",
					verdict, x.Quiet.CPUMs, x.Quiet.Committed, x.Foreign.CPUMs, x.Foreign.Committed)
			}
		}
		fmt.Fprintf(w, "\n### Memory\n\n"+
			"Go heap: live bytes after a GC (HeapAlloc deltas) of the snapshot (the objects as the agent's informers hold them, trimmed), "+
			"the compiled ruleset of the local pods, what the incremental compiler keeps between changes (parsed policies, resolved peers, each local pod's rules: the ruleset included), and what the enforcer keeps (its record of the table: each direction's compiled set elements); "+
			"\"compile allocs\" is all one full Compile allocates, garbage included. "+
			"Kernel: objects counted in `nft -j list table inet onc-policy` (set elements: the pods' peer sets and the interface sets; "+
			"map elements: interface → pod chain). The kernel's own bytes for them are not measured.\n\n")
		fmt.Fprintln(w, "| pods | policies | cluster policies | snapshot MiB | ruleset MiB | compiler MiB | enforcer MiB | compile allocs MiB | nft chains | nft rules | nft sets | nft set elements | nft map elements | nft counters |")
		fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, x := range r.Program {
			if x.Error != "" {
				continue
			}
			m := x.Memory
			fmt.Fprintf(w, "| %d | %d | %d | %s | %s | %s | %s | %s | %d | %d | %d | %d | %d | %d |\n", x.Pods, x.Policies, x.ClusterPolicies,
				mib(m.SnapshotBytes), mib(m.RulesetBytes), mib(m.CompilerBytes), mib(m.EnforcerBytes), mib(m.CompileAllocBytes),
				m.Chains, m.Rules, m.Sets, m.SetElements, m.MapElements, m.Counters)
		}
		for _, x := range r.Program {
			if x.is(1000, 1000, 0) {
				verdict := "met"
				if x.Change.Total.Median >= 1000 {
					verdict = "not met"
				}
				fmt.Fprintf(w, "\n**Aim: a change in under 1 s at 1,000 pods × 1,000 policies: %s** (median %.1f ms, max %.1f ms).\n",
					verdict, x.Change.Total.Median, x.Change.Total.Max)
			}
		}
		for _, x := range r.Program {
			if x.is(5000, 1000, 0) {
				verdict := "met"
				if x.Change.Total.Median > 200 {
					verdict = "not met"
				}
				fmt.Fprintf(w, "\n**Bar: a change in ≤ 200 ms at 5,000 pods × 1,000 policies: %s** (median %.1f ms: compile %.1f, apply %.1f, revoke %.1f; max %.1f ms).\n",
					verdict, x.Change.Total.Median, x.Change.Compile.Median, x.Change.Apply.Median, x.Change.Revoke.Median, x.Change.Total.Max)
			}
		}
		fmt.Fprintln(w)
	}
	if c := r.CRR; c != nil {
		fmt.Fprintf(w, "## TCP_CRR: no policy vs %s, slow path and fast path\n\n", c.policies())
		if c.Date != "" {
			fmt.Fprintf(w, "Run %s.\n\n", c.Date)
		}
		fmt.Fprintf(w, "A 2-node lab in Kubernetes mode (real kube-apiserver), client and server pods on different nodes; "+
			"netperf TCP_CRR from client to server, %d repetitions of %s, netperf -T %q, the two policy configurations adjacent in each repetition (ABBA…), "+
			"and in each the fast path off (\"no-policy\", \"policy\") and on (\"-fast\"), back to back, switched on both nodes (`SetFastPath`). "+
			"A fast run is checked to have taken the fast path (the client node's fast path carried, opened or learned its connections; with the policies, which isolate both pods, "+
			"`egress_open` did not: their connections open through the stack), a slow run not. "+
			"\"policy\": %d NetworkPolicies in the pods' namespace, each selecting both the client and the server in both directions "+
			"with peers of their own (ipBlocks, namespace and pod selectors, ports), one also allowing client → server on netperf's control and data ports "+
			"(named ports on the ingress side), so every connection passes the client's egress and the server's ingress chain "+
			"(server ingress: %d compiled rules, client egress: %d). ",
			c.Reps, c.Duration, c.CPUs, c.Policies, c.ServerRules, c.ClientRules)
		if c.ClusterPolicies > 0 {
			fmt.Fprintf(w, "Beside them, %d ClusterNetworkPolicies of the Admin tier (BenchClusterPolicy), each with the client and the server as subjects and one rule each way "+
				"(Deny or Accept of the peers' pods on a TCP port of its own, Accept or Deny of a /24 of its own on TCP 443), before and after the first, "+
				"which passes client → server on netperf's ports to the NetworkPolicies: every connection is judged through both tiers "+
				"(server ingress: %d Admin rules, client egress: %d). ", c.ClusterPolicies, c.ServerAdminRules, c.ClientAdminRules)
		}
		fmt.Fprintf(w, "\"no policy\": the same agents with policy on and no policy of either kind (the nft table is there, no pod is isolated). "+
			"The policies are created and deleted through the API between runs.\n\n")
		if c.Error != "" {
			fmt.Fprintf(w, "**Failed:** %s\n\n", c.Error)
		}
		if c.Ratio.N > 0 {
			fmt.Fprintln(w, "| config | median Trans/s | min – max |")
			fmt.Fprintln(w, "| --- | ---: | ---: |")
			fmt.Fprintf(w, "| no policy | %.1f | %.1f – %.1f |\n", c.NoPolicy.Median, c.NoPolicy.Min, c.NoPolicy.Max)
			fmt.Fprintf(w, "| %s | %.1f | %.1f – %.1f |\n", c.policies(), c.WithPolicy.Median, c.WithPolicy.Min, c.WithPolicy.Max)
			fmt.Fprintf(w, "| no policy, fast path | %.1f | %.1f – %.1f |\n", c.NoPolicyFast.Median, c.NoPolicyFast.Min, c.NoPolicyFast.Max)
			fmt.Fprintf(w, "| %s, fast path | %.1f | %.1f – %.1f |\n\n", c.policies(), c.WithPolicyFast.Median, c.WithPolicyFast.Min, c.WithPolicyFast.Max)
			fmt.Fprintf(w, "Fast path ÷ slow path, median of the per-repetition ratios [95 %% interval] (min – max): no policy %s; %s %s.\n\n",
				c.FastRatioNoPolicy, c.policies(), c.FastRatioPolicy)
			fmt.Fprintln(w, "| ratio policy ÷ no policy | median of per-rep ratios | min – max | ratio of medians | cost |")
			fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
			fmt.Fprintf(w, "| TCP_CRR | %.3f | %.3f – %.3f | %.3f | %.1f %% |\n\n", c.Ratio.Median, c.Ratio.Min, c.Ratio.Max, c.RatioOfMeds, c.CostPercent)
			verdict := "met"
			if c.CostPercent > 5 {
				verdict = "not met"
			}
			fmt.Fprintf(w, "**Aim: CRR cost within 5 %% of no policy: %s** (median cost %.1f %%; per-repetition ratios %.3f – %.3f).\n\n",
				verdict, c.CostPercent, c.Ratio.Min, c.Ratio.Max)
			fmt.Fprintln(w, "| rep | config | Trans/s | CPU µs/Tr | connections judged by the server's rules | client node's fast path: packets, connections opened, flows learned |")
			fmt.Fprintln(w, "| ---: | --- | ---: | ---: | ---: | ---: |")
			for _, s := range c.Samples {
				if s.Error != "" {
					fmt.Fprintf(w, "| %d | %s | failed: %s | | | |\n", s.Rep, s.Config, s.Error)
					continue
				}
				fmt.Fprintf(w, "| %d | %s | %.1f | %.1f | %d | %d, %d, %d |\n", s.Rep, s.Config, s.Value, s.CPU, s.Allowed, s.FastHits, s.FastOpens, s.FastLearned)
			}
			if len(c.ProgramSeconds) > 0 {
				fmt.Fprintf(w, "\nCreating the %s through the API until both agents enforced them took %s s (each time).\n", c.policies(), secs(c.ProgramSeconds))
			}
		}
	}
}

// clusterChanges is the table of the rows with ClusterNetworkPolicies:
// a change of cnp-0 (and of np-0 beside it), and issue 30's bar.
func clusterChanges(w io.Writer, rows []ProgramRow) {
	var tiered []ProgramRow
	for _, x := range rows {
		if x.ClusterChange != nil && x.Error == "" {
			tiered = append(tiered, x)
		}
	}
	if len(tiered) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### A ClusterNetworkPolicy's change\n\n"+
		"In the rows with ClusterNetworkPolicies, cnp-0 (Admin, its subjects the namespaces of one team: two fifths of the pods) alternates between "+
		"denying the env=dev namespaces its port and accepting them there and on TCP 2000, over the NetworkPolicies that isolate its subjects; "+
		"timed as np-0's change is (the table above, with the ClusterNetworkPolicies in place). Times in ms: median (min – max).\n\n")
	fmt.Fprintln(w, "| pods | policies | cluster policies | change total | change compile | change apply | change no-op apply | change revoke | pods changed |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range tiered {
		c := x.ClusterChange
		fmt.Fprintf(w, "| %d | %d | %d | %s | %s | %s | %s | %s | %d |\n", x.Pods, x.Policies, x.ClusterPolicies,
			rangeMs(c.Total), rangeMs(c.Compile), rangeMs(c.Apply), rangeMs(c.ApplyNoop), rangeMs(c.Revoke), c.PodsChanged)
	}
	for _, x := range tiered {
		if x.is(1000, 1000, 1000) {
			verdict := "met"
			if x.Change.Total.Median > 200 || x.ClusterChange.Total.Median > 200 {
				verdict = "not met"
			}
			fmt.Fprintf(w, "\n**Bar: a change in ≤ 200 ms at 1,000 pods × 1,000 NetworkPolicies × 1,000 ClusterNetworkPolicies: %s** "+
				"(a NetworkPolicy's: median %.1f ms, max %.1f; a ClusterNetworkPolicy's: median %.1f ms, max %.1f, %d pods rewritten).\n",
				verdict, x.Change.Total.Median, x.Change.Total.Max, x.ClusterChange.Total.Median, x.ClusterChange.Total.Max, x.ClusterChange.PodsChanged)
		}
	}
}

// policies names the policy configuration.
func (c *CRRResult) policies() string {
	if c.ClusterPolicies == 0 {
		return fmt.Sprintf("%d policies", c.Policies)
	}
	return fmt.Sprintf("%d policies + %d cluster policies", c.Policies, c.ClusterPolicies)
}

func secs(v []float64) string {
	s := ""
	for i, x := range v {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%.1f", x)
	}
	return s
}
