package policybench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onc-net/onc/internal/netns"

	"github.com/onc-net/onc/agent/policy"
	dppolicy "github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/lab/bench"
)

// ProgramOptions are the programming measurements to make.
type ProgramOptions struct {
	Pods     []int // cluster sizes
	Policies []int // NetworkPolicy counts
	// ClusterPolicies are ClusterNetworkPolicy counts (none: 0); every
	// pods × policies × cluster policies is measured.
	ClusterPolicies []int
	Changes         int // changes of one policy timed per point
	Log             io.Writer
}

// Stat is the median and range of some timings, in milliseconds.
type Stat = bench.Stat

// Timing is one programming pass split into its parts, in milliseconds:
// Compile (agent/policy.Incremental, as the agent's watcher compiles: the
// whole node's ruleset the first time, then what the change affects),
// Apply (datapath/policy: set elements, the nft transaction and nft's run
// of it) and Revoke (conntrack for the changed pods; the throwaway
// namespace has no connections, so this is its floor).
// ApplyNoop, not part of Total, is Apply of the same ruleset once more:
// the enforcer's own work (every local pod's set elements and their
// fingerprints, the diff) without an nft run, so Apply - ApplyNoop is
// about what nft and the kernel take.
type Timing struct {
	Compile   float64 `json:"compileMs"`
	Apply     float64 `json:"applyMs"`
	Revoke    float64 `json:"revokeMs"`
	Total     float64 `json:"totalMs"`
	ApplyNoop float64 `json:"applyNoopMs"`
}

// ChangeTiming is the timings of the changes of one policy.
type ChangeTiming struct {
	Total       Stat `json:"totalMs"`
	Compile     Stat `json:"compileMs"`
	Apply       Stat `json:"applyMs"`
	Revoke      Stat `json:"revokeMs"`
	ApplyNoop   Stat `json:"applyNoopMs"`
	PodsChanged int  `json:"podsChanged"` // local pods whose rules each change rewrote
}

// Memory is what one programmed node holds. Go heap figures are live
// bytes after a GC (runtime.MemStats.HeapAlloc): the snapshot as the
// informers would hold it (trimmed objects), the compiled ruleset, what
// the incremental compiler keeps between changes (its parsed policies,
// resolved peers and each local pod's rules: the ruleset and more), and
// what the enforcer keeps (its record of the table: each direction's
// compiled set elements); CompileAlloc is what one full Compile allocates
// in all (garbage included). Kernel figures are counted in the nft table.
type Memory struct {
	SnapshotBytes     uint64 `json:"snapshotBytes"`
	RulesetBytes      uint64 `json:"rulesetBytes"`
	CompilerBytes     uint64 `json:"compilerBytes"`
	EnforcerBytes     uint64 `json:"enforcerBytes"`
	CompileAllocBytes uint64 `json:"compileAllocBytes"`
	Chains            int    `json:"nftChains"`
	Rules             int    `json:"nftRules"`
	Sets              int    `json:"nftSets"`
	SetElements       int    `json:"nftSetElements"` // in the pods' peer sets and the interface sets
	MapElements       int    `json:"nftMapElements"` // interface → chain jumps
	Counters          int    `json:"nftCounters"`
}

// Resync is one resync of the ruleset last applied, unchanged
// (Enforcer.Apply with checkKernel), as the agent runs it every --resync
// once its compile is skipped for unchanged inputs: wall time, the CPU of
// this process and of the nft commands it ran, and whether it committed an
// nft transaction.
type Resync struct {
	Ms        float64 `json:"ms"`
	CPUMs     float64 `json:"cpuMs"`
	Committed bool    `json:"committed"`
}

// ProgramRow is one cluster size and policy count.
type ProgramRow struct {
	Pods            int `json:"pods"`
	Policies        int `json:"policies"`
	ClusterPolicies int `json:"clusterPolicies,omitempty"`
	LocalPods       int `json:"localPods"`
	// Local pods isolated in each direction, and the compiled rules of all
	// local pods (dppolicy.Rule, peers resolved).
	IsolatedIngress int          `json:"isolatedIngress"`
	IsolatedEgress  int          `json:"isolatedEgress"`
	CompiledRules   int          `json:"compiledRules"`
	Initial         Timing       `json:"initial"`
	Change          ChangeTiming `json:"change"` // of np-0
	// ClusterChange is the changes of cnp-0, with ClusterPolicies.
	ClusterChange *ChangeTiming `json:"clusterChange,omitempty"`
	// Resync with nothing committed to nftables since the last change
	// (Quiet), and after another program committed (Foreign: a rewrite).
	Quiet   Resync `json:"resyncQuiet"`
	Foreign Resync `json:"resyncForeign"`
	Memory  Memory `json:"memory"`
	Error   string `json:"error,omitempty"`
}

// Program measures every point of o.Pods × o.Policies ×
// o.ClusterPolicies, each in a fresh network namespace removed
// afterwards. A point that fails is reported in its row; Program carries
// on with the next.
func Program(ctx context.Context, o ProgramOptions) []ProgramRow {
	prefix := netnsPrefix()
	clusterPolicies := o.ClusterPolicies
	if len(clusterPolicies) == 0 {
		clusterPolicies = []int{0}
	}
	var rows []ProgramRow
	for _, n := range o.Pods {
		for _, p := range o.Policies {
			for _, cp := range clusterPolicies {
				if ctx.Err() != nil {
					return rows
				}
				start := time.Now()
				point := fmt.Sprintf("%5d pods × %4d policies × %4d cluster policies", n, p, cp)
				row, err := programPoint(ctx, fmt.Sprintf("%s-%dx%dx%d", prefix, n, p, cp), n, p, cp, o.Changes)
				if err != nil {
					row.Error = err.Error()
					fmt.Fprintf(o.Log, "program %s: FAILED: %v\n", point, err)
				} else {
					fmt.Fprintf(o.Log, "program %s: initial %.0f ms (compile %.0f, apply %.0f), change median %.1f ms (%.1f–%.1f)%s, %d set elements; %.1fs\n",
						point, row.Initial.Total, row.Initial.Compile, row.Initial.Apply, row.Change.Total.Median, row.Change.Total.Min, row.Change.Total.Max,
						clusterChangeLog(row.ClusterChange), row.Memory.SetElements, time.Since(start).Seconds())
				}
				rows = append(rows, row)
			}
		}
	}
	return rows
}

func clusterChangeLog(c *ChangeTiming) string {
	if c == nil {
		return ""
	}
	return fmt.Sprintf(", cluster policy change median %.1f ms (%.1f–%.1f)", c.Total.Median, c.Total.Min, c.Total.Max)
}

// netnsPrefix names this run's namespaces: "oncpb-" and 6 hex digits.
func netnsPrefix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "oncpb-" + hex.EncodeToString(b)
}

// heap is the Go heap in use after a full GC.
func heap() runtime.MemStats {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func programPoint(ctx context.Context, nsName string, pods, policies, clusterPolicies, changes int) (row ProgramRow, err error) {
	row = ProgramRow{Pods: pods, Policies: policies, ClusterPolicies: clusterPolicies}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", nsName).CombinedOutput(); err != nil {
		return row, fmt.Errorf("ip netns add %s: %w: %s", nsName, err, strings.TrimSpace(string(out)))
	}
	defer func() {
		// Not ctx: the namespace goes even when the run is interrupted.
		if out, derr := exec.Command("ip", "netns", "del", nsName).CombinedOutput(); derr != nil {
			err = errors.Join(err, fmt.Errorf("ip netns del %s: %w: %s", nsName, derr, strings.TrimSpace(string(out))))
		}
	}()
	ns, err := netns.Open("/run/netns/" + nsName)
	if err != nil {
		return row, err
	}
	defer ns.Close()

	m0 := heap()
	c := NewCluster(pods, policies)
	c.AddClusterPolicies(clusterPolicies)
	m1 := heap()
	row.LocalPods = len(c.Local)
	row.Memory.SnapshotBytes = sub(m1.HeapAlloc, m0.HeapAlloc)

	var rs dppolicy.Ruleset
	var inc policy.Incremental // the agent's compiler: each pass compiles what changed since the last
	var e *dppolicy.Enforcer
	hosts := []netip.Addr{netip.MustParseAddr("172.31.0.1"), netip.MustParseAddr("10.244.0.1")}
	// One pass: Compile, then Apply and Revoke in the namespace (nft and
	// conntrack act in the calling thread's).
	pass := func(rebuild bool) (t Timing, changed []string, err error) {
		t0 := time.Now()
		rs = inc.Compile(c.Snapshot, c.Local)
		t1 := time.Now()
		err = netns.Do(ns, func() error {
			if e == nil {
				if e, err = dppolicy.NewEnforcer(0); err != nil {
					return err
				}
				t1 = time.Now() // not the enforcer's start-up
			}
			if changed, err = e.Apply(rs, rebuild); err != nil {
				return err
			}
			t2 := time.Now()
			if _, err = e.Revoke(rs, changed, hosts, nil); err != nil {
				return fmt.Errorf("revoke: %w", err)
			}
			t3 := time.Now()
			again, err := e.Apply(rs, false)
			if err != nil {
				return fmt.Errorf("apply again: %w", err)
			}
			if len(again) > 0 {
				return fmt.Errorf("applying the same ruleset again changed %d pods", len(again))
			}
			t = Timing{Compile: ms(t1.Sub(t0)), Apply: ms(t2.Sub(t1)), Revoke: ms(t3.Sub(t2)), Total: ms(t3.Sub(t0)), ApplyNoop: ms(time.Since(t3))}
			return nil
		})
		return t, changed, err
	}

	// The allocations of one full Compile, and the ruleset it leaves.
	before := heap()
	rs = policy.Compile(c.Snapshot, c.Local)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	row.Memory.CompileAllocBytes = after.TotalAlloc - before.TotalAlloc
	row.Memory.RulesetBytes = sub(heap().HeapAlloc, before.HeapAlloc)
	rs = dppolicy.Ruleset{}
	// What an incremental compiler keeps, on a throwaway one (the passes'
	// keeps as much).
	row.Memory.CompilerBytes = func() uint64 {
		before := heap()
		var probe policy.Incremental
		probe.Compile(c.Snapshot, c.Local)
		live := heap()
		runtime.KeepAlive(&probe)
		return sub(live.HeapAlloc, before.HeapAlloc)
	}()

	if row.Initial, _, err = pass(true); err != nil {
		return row, fmt.Errorf("initial programming: %w", err)
	}
	for _, p := range rs.Pods {
		if p.Ingress != nil {
			row.IsolatedIngress++
			row.CompiledRules += len(p.Ingress.Rules)
		}
		if p.Egress != nil {
			row.IsolatedEgress++
			row.CompiledRules += len(p.Egress.Rules)
		}
	}
	// The enforcer's record: what the heap holds besides the snapshot and
	// the compiler's state (the ruleset's rules are the compiler's).
	rs = dppolicy.Ruleset{}
	row.Memory.EnforcerBytes = sub(heap().HeapAlloc, m1.HeapAlloc+row.Memory.CompilerBytes)

	if err := countTable(ctx, nsName, &row.Memory); err != nil {
		return row, err
	}

	// Changes: np-0, then cnp-0, alternates between its changed and its
	// original form.
	changeOf := func(set func(changed bool)) (ct ChangeTiming, err error) {
		var total, compile, apply, revoke, noop []float64
		for k := 1; k <= changes && ctx.Err() == nil; k++ {
			set(k%2 == 1)
			t, changed, err := pass(false)
			if err != nil {
				return ct, fmt.Errorf("change %d: %w", k, err)
			}
			if len(changed) == 0 {
				return ct, fmt.Errorf("change %d rewrote no pod's rules", k)
			}
			ct.PodsChanged = len(changed)
			total, compile, apply, revoke = append(total, t.Total), append(compile, t.Compile), append(apply, t.Apply), append(revoke, t.Revoke)
			noop = append(noop, t.ApplyNoop)
		}
		ct.Total, ct.Compile, ct.Apply, ct.Revoke = bench.StatOf(total), bench.StatOf(compile), bench.StatOf(apply), bench.StatOf(revoke)
		ct.ApplyNoop = bench.StatOf(noop)
		return ct, nil
	}
	if policies > 0 {
		orig, changedNP := c.Snapshot.Policies[0], Changed(c)
		row.Change, err = changeOf(func(changed bool) {
			c.Snapshot.Policies[0] = orig
			if changed {
				c.Snapshot.Policies[0] = changedNP
			}
		})
		if err != nil {
			return row, fmt.Errorf("policy %w", err)
		}
	}
	if clusterPolicies > 0 {
		i := slices.IndexFunc(c.Snapshot.ClusterPolicies, func(p *policy.ClusterNetworkPolicy) bool { return p.Name == "cnp-0" })
		orig, changedCNP := c.Snapshot.ClusterPolicies[i], ChangedClusterPolicy(c)
		ct, err := changeOf(func(changed bool) {
			c.Snapshot.ClusterPolicies[i] = orig
			if changed {
				c.Snapshot.ClusterPolicies[i] = changedCNP
			}
		})
		if err != nil {
			return row, fmt.Errorf("cluster policy %w", err)
		}
		row.ClusterChange = &ct
	}
	rs = inc.Compile(c.Snapshot, c.Local) // the ruleset last applied
	if err := netns.Do(ns, func() error { return resyncs(e, rs, &row) }); err != nil {
		return row, fmt.Errorf("resync: %w", err)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(rs)
	return row, nil
}

// resyncs measures a resync of rs with nothing committed to nftables since
// its Apply, and one after another program's commit (a table of its own),
// which rewrites; in the calling thread's namespace.
func resyncs(e *dppolicy.Enforcer, rs dppolicy.Ruleset, row *ProgramRow) error {
	resync := func() (r Resync, err error) {
		gen, err := dppolicy.RulesetGeneration()
		if err != nil {
			return r, err
		}
		cpu0, t0 := cpuTime(), time.Now()
		if _, err := e.Apply(rs, true); err != nil {
			return r, err
		}
		r.Ms, r.CPUMs = ms(time.Since(t0)), ms(cpuTime()-cpu0)
		after, err := dppolicy.RulesetGeneration()
		r.Committed = after != gen
		return r, err
	}
	var err error
	if row.Quiet, err = resync(); err != nil {
		return err
	}
	if out, err := exec.Command("nft", "add", "table", "ip", "onc-bench-other").CombinedOutput(); err != nil {
		return fmt.Errorf("another program's commit: %w: %s", err, strings.TrimSpace(string(out)))
	}
	row.Foreign, err = resync()
	return err
}

// cpuTime is the CPU this process and its waited-for children (nft) used.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + children.Utime.Nano() + children.Stime.Nano())
}

// countTable counts the nft table's chains, rules, sets, elements and
// counters in netns.
func countTable(ctx context.Context, netns string, m *Memory) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", netns, "nft", "-j", "list", "table", "inet", dppolicy.Table).Output()
	if err != nil {
		return fmt.Errorf("nft list table: %w", err)
	}
	var list struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return fmt.Errorf("nft -j list table: %w", err)
	}
	var withElems struct {
		Elem []json.RawMessage `json:"elem"`
	}
	for _, obj := range list.Nftables {
		for kind, raw := range obj {
			switch kind {
			case "chain":
				m.Chains++
			case "rule":
				m.Rules++
			case "counter":
				m.Counters++
			case "set", "map":
				withElems.Elem = nil
				if err := json.Unmarshal(raw, &withElems); err != nil {
					return fmt.Errorf("nft -j: %s: %w", kind, err)
				}
				if kind == "set" {
					m.Sets++
					m.SetElements += len(withElems.Elem)
				} else {
					m.MapElements += len(withElems.Elem)
				}
			}
		}
	}
	return nil
}
