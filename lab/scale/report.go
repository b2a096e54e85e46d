package scale

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/onc-net/onc/lab/bench"
)

// Row is one datastore at one scale. The first eight fields are the
// headline; a row whose run failed part-way holds what it measured before
// (Phases) and the error.
type Row struct {
	Datastore   string  `json:"datastore"`
	Nodes       int     `json:"nodes"`
	ColdS       float64 `json:"cold_s"`        // restart on a wiped node until all peers are programmed
	ChangeS     float64 `json:"change_s"`      // worst of ChangeAddS and ChangeRemoveS
	AgentCPUPct float64 `json:"agent_cpu_pct"` // steady state, % of one core
	AgentRSSMB  float64 `json:"agent_rss_mb"`  // at the end of the window
	WritesPerS  float64 `json:"writes_per_s"`  // datastore writes at steady state (see Report.Counts)
	AllocS      float64 `json:"alloc_s"`       // from the first registration until every node has a CIDR

	Date   string `json:"date"`
	Phases int    `json:"phases"` // how many of phases completed
	Error  string `json:"error,omitempty"`

	RegisterS        float64   `json:"register_s"` // registering the N nodes (AllocS starts with it)
	ConvergeS        float64   `json:"converge_s"` // from the first registration until the running agent programmed all
	ColdKernelWrites uint64    `json:"cold_kernel_writes"`
	ChangeAddS       []float64 `json:"change_add_s"`    // a node's registration until its route is in the agent's kernel
	ChangeRemoveS    []float64 `json:"change_remove_s"` // a node's removal until its route is gone

	WindowS               float64 `json:"window_s"`
	PeerKernelWritesDelta uint64  `json:"peer_kernel_writes_delta"` // over the window: must be 0
	PeersSeenDelta        uint64  `json:"peers_seen_delta"`         // over the window: must be 0
	Writes                Writes  `json:"writes"`                   // per second, by kind
	HeartbeatsPerS        float64 `json:"heartbeats_per_s"`
	HeartbeatsWantPerS    float64 `json:"heartbeats_want_per_s"` // what N nodes' leases need
	Alive                 int     `json:"alive"`                 // simulated nodes alive at the window's end
	DatastoreCPUPct       float64 `json:"datastore_cpu_pct"`     // datastore server(s) and controller, % of one core
	SimCPUPct             float64 `json:"sim_cpu_pct"`           // this process (the simulator), % of one core
	MachineBusyPct        float64 `json:"machine_busy_pct"`      // all CPUs
	Sustained             bool    `json:"sustained"`
	Evidence              string  `json:"evidence,omitempty"` // why not sustained
}

// phases of a row, in the order they run.
var phases = []string{"allocation", "cold start", "steady state", "changes"}

func (r Row) reached(phase string) bool { return slices.Index(phases, phase) < r.Phases }

// Bar is a target the issue sets for a 5,000-node cluster.
type Bar struct {
	Name   string
	Field  string // the Row's JSON name
	Phase  string
	Format string
	value  func(Row) float64
	limit  func(nodes int) float64 // met at or below it
}

// Bars, as the issue states them.
var Bars = []Bar{
	{"cold programming of all peers ≤ 30 s", "cold_s", "cold start", "%.1f s", func(r Row) float64 { return r.ColdS }, func(int) float64 { return 30 }},
	{"one node's change on the agent ≤ 2 s", "change_s", "changes", "%.2f s", func(r Row) float64 { return r.ChangeS }, func(int) float64 { return 2 }},
	{"steady-state agent CPU < 1 % of a core", "agent_cpu_pct", "steady state", "%.2f %%", func(r Row) float64 { return r.AgentCPUPct }, func(int) float64 { return 1 }},
	{"datastore writes/s ≤ N ÷ 10", "writes_per_s", "steady state", "%.1f/s", func(r Row) float64 { return r.WritesPerS }, func(n int) float64 { return float64(n) / 10 }},
}

// Judge says whether r meets b; ok is false when r has no value for it.
func (b Bar) Judge(r Row) (met, ok bool) {
	if !r.reached(b.Phase) {
		return false, false
	}
	v, lim := b.value(r), b.limit(r.Nodes)
	if b.Field == "agent_cpu_pct" {
		return v < lim, true
	}
	return v <= lim, true
}

// Report is bench-results/scale.json.
type Report struct {
	Date   string            `json:"date"`
	Kernel string            `json:"kernel"`
	CPUs   int               `json:"cpus"`
	Window string            `json:"window"`
	Counts map[string]string `json:"counts"` // per datastore: what writes_per_s counts
	Rows   []Row             `json:"rows"`
}

// Merge adds rows, replacing earlier ones of the same datastore and N,
// and sorts them.
func (r *Report) Merge(rows []Row) {
	for _, n := range rows {
		r.Rows = slices.DeleteFunc(r.Rows, func(o Row) bool { return o.Datastore == n.Datastore && o.Nodes == n.Nodes })
		r.Rows = append(r.Rows, n)
	}
	slices.SortFunc(r.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Datastore, b.Datastore), cmp.Compare(a.Nodes, b.Nodes))
	})
}

// LoadReport reads a report written earlier; a missing file is an empty one.
func LoadReport(path string) (Report, error) {
	var r Report
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// JSON writes the report.
func (r Report) JSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// Markdown writes the tables docs/performance.md shows: the measurements,
// the bars, what each datastore sustained, what was counted.
func (r Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "Run %s, kernel %s, %d CPUs, steady-state window %s.\n\n", r.Date, r.Kernel, r.CPUs, r.Window)
	fmt.Fprintln(w, "| datastore | nodes | cold_s | change_s (add / remove, worst) | agent_cpu_pct | agent_rss_mb | writes_per_s | alloc_s | register_s | kernel writes / watcher signals in window | sustained |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, x := range r.Rows {
		cell := func(phase, format string, v ...any) string {
			if !x.reached(phase) {
				return "–"
			}
			return fmt.Sprintf(format, v...)
		}
		sustained := "yes"
		if !x.Sustained {
			sustained = "**no**"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", x.Datastore, x.Nodes,
			cell("cold start", "%.1f", x.ColdS),
			cell("changes", "%.2f (%.2f / %.2f)", x.ChangeS, slices.Max(append(x.ChangeAddS, 0)), slices.Max(append(x.ChangeRemoveS, 0))),
			cell("steady state", "%.2f", x.AgentCPUPct), cell("steady state", "%.1f", x.AgentRSSMB),
			cell("steady state", "%.1f", x.WritesPerS), cell("allocation", "%.1f", x.AllocS), cell("allocation", "%.1f", x.RegisterS),
			cell("steady state", "%d / %d", x.PeerKernelWritesDelta, x.PeersSeenDelta), sustained)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| datastore | nodes | bar (issue: for 5,000 nodes) | measured | |")
	fmt.Fprintln(w, "| --- | ---: | --- | ---: | --- |")
	for _, x := range r.Rows {
		for _, b := range Bars {
			met, ok := b.Judge(x)
			if !ok {
				fmt.Fprintf(w, "| %s | %d | %s | – | not measured |\n", x.Datastore, x.Nodes, b.Name)
				continue
			}
			verdict := "met"
			if !met {
				verdict = "**missed**"
			}
			fmt.Fprintf(w, "| %s | %d | %s | "+b.Format+" | %s |\n", x.Datastore, x.Nodes, b.Name, b.value(x), verdict)
		}
	}
	fmt.Fprintln(w)
	for _, ds := range datastores(r.Rows) {
		largest := 0
		for _, x := range r.Rows {
			if x.Datastore == ds && x.Sustained {
				largest = max(largest, x.Nodes)
			}
		}
		fmt.Fprintf(w, "- **%s**: the largest N measured that this machine sustained: %d.\n", ds, largest)
		for _, x := range r.Rows {
			if x.Datastore != ds {
				continue
			}
			fmt.Fprintf(w, "  - N = %d: ", x.Nodes)
			if x.reached("steady state") {
				fmt.Fprintf(w, "heartbeats %.1f/s of %.1f/s needed, %d of %d alive at the window's end; datastore %.1f %%, simulator %.1f %% of a core, machine %.0f %% busy; writes/s by kind: %s",
					x.HeartbeatsPerS, x.HeartbeatsWantPerS, x.Alive, x.Nodes, x.DatastoreCPUPct, x.SimCPUPct, x.MachineBusyPct, x.Writes)
			} else {
				fmt.Fprint(w, "no steady state measured")
			}
			if x.Evidence != "" {
				fmt.Fprintf(w, ". Not sustained: %s", x.Evidence)
			}
			if x.Error != "" {
				fmt.Fprintf(w, ". Failed during %s: %s", phases[min(x.Phases, len(phases)-1)], oneLine(x.Error))
			}
			fmt.Fprintln(w, ".")
		}
		if c := r.Counts[ds]; c != "" {
			fmt.Fprintf(w, "  - writes counted: %s.\n", c)
		}
	}
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func datastores(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Datastore) {
			out = append(out, r.Datastore)
		}
	}
	return out
}

// SVG draws each measurement as a share of its bar (at or under the
// dashed line at 1: met), a group per bar, a colour per datastore and N.
func (r Report) SVG(w io.Writer) {
	palette := map[string][]string{"etcd": {"#90caf9", "#1e88e5", "#0d47a1"}, "kubernetes": {"#a5d6a7", "#43a047", "#1b5e20"}}
	c := bench.Chart{Title: "ONC scale bed: measured ÷ bar (≤ 1 meets it), " + r.Date, YMin: 1.2, Ref: 1}
	seen := map[string]int{}
	for _, x := range r.Rows {
		p := palette[x.Datastore]
		if p == nil {
			p = []string{"#9e9e9e"}
		}
		c.Series = append(c.Series, bench.Series{Name: seriesName(x), Color: p[min(seen[x.Datastore], len(p)-1)]})
		seen[x.Datastore]++
	}
	for _, b := range Bars {
		g := bench.Group{Label: b.Field}
		for _, x := range r.Rows {
			if _, ok := b.Judge(x); !ok {
				continue
			}
			share := b.value(x) / b.limit(x.Nodes)
			// Clipped at 3 (the label keeps the value), so one far miss
			// does not flatten every other bar.
			g.Bars = append(g.Bars, bench.Bar{Series: seriesName(x), Value: min(share, 3), Label: fmt.Sprintf("%.2f", share),
				Title: fmt.Sprintf("%s, %s: "+b.Format+" (%s)", seriesName(x), b.Field, b.value(x), b.Name)})
		}
		c.Groups = append(c.Groups, g)
	}
	c.SVG(w)
}

func seriesName(r Row) string { return fmt.Sprintf("%s %d", r.Datastore, r.Nodes) }
