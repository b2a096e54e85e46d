package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Report is what bench-results/latest.json holds.
type Report struct {
	Date     string    `json:"date"`
	Kernel   string    `json:"kernel"`
	Reps     int       `json:"reps"`
	Duration string    `json:"duration"`
	CPUs     string    `json:"cpus"` // netperf -T
	Results  []Summary `json:"results"`
	Ratios   []Ratio   `json:"ratios"`
	// The Service section's paired ratios and its bar (absent without it).
	ServiceRatios []ServiceRatio `json:"serviceRatios,omitempty"`
	ServiceBar    *ServiceBar    `json:"serviceBar,omitempty"`
	Samples       []Sample       `json:"samples"`
}

// Ratio of medians for one test.
type Ratio struct {
	Test       string  `json:"test"`
	FastOnSlow float64 `json:"fastOnSlow"`
	FastOnBare float64 `json:"fastOnBare"`
	SlowOnBare float64 `json:"slowOnBare"`
}

// Stat is the median and range of some values.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// StatOf is the median and range of v (zero for none).
func StatOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := slices.Sorted(slices.Values(v))
	return Stat{Median: Median(s), Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// PairedRatio is, over the repetitions that ran test on both configs, a's
// value ÷ b's: the two ran minutes apart at most, so the ratio holds on a
// shared machine even when absolute numbers drift between repetitions.
func PairedRatio(samples []Sample, test, a, b string) Stat {
	num, den := map[int]float64{}, map[int]float64{}
	for _, s := range samples {
		switch {
		case s.Test != test:
		case s.Config == a:
			num[s.Rep] = s.Value
		case s.Config == b:
			den[s.Rep] = s.Value
		}
	}
	var r []float64
	for rep, v := range num {
		if den[rep] > 0 {
			r = append(r, v/den[rep])
		}
	}
	return StatOf(r)
}

// ServiceRatio is one test's paired ratios of the Service section.
type ServiceRatio struct {
	Test              string `json:"test"`
	SockLBOnPodIP     Stat   `json:"socklbOnPodIP"`
	SockLBOnKubeProxy Stat   `json:"socklbOnKubeProxy"`
	KubeProxyOnPodIP  Stat   `json:"kubeproxyOnPodIP"`
}

// ServiceBar is the bar for Services: ClusterIP via socket LB at
// least 0.97 × the pod IP on TCP_RR, and ahead of kube-proxy on TCP_RR and
// TCP_CRR, each judged on the median of the paired ratios.
type ServiceBar struct {
	Checks []BarCheck `json:"checks"`
	Met    bool       `json:"met"` // every check measured and met
}

// BarCheck is one condition of the bar.
type BarCheck struct {
	Test  string  `json:"test"`
	Ratio string  `json:"ratio"` // "a ÷ b"
	Stat  Stat    `json:"stat"`
	Want  string  `json:"want"` // "≥ 0.97", "> 1"
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"`
}

var serviceBar = []struct {
	test, a, b string
	limit      float64
	strict     bool // ahead: above the limit, not at it
}{
	{"TCP_RR", SockLB, PodIP, 0.97, false},
	{"TCP_RR", SockLB, KubeProxy, 1, true},
	{"TCP_CRR", SockLB, KubeProxy, 1, true},
}

// NewReport summarises samples.
func NewReport(samples []Sample, reps int, d time.Duration, kernel string) Report {
	r := Report{Date: time.Now().UTC().Format(time.RFC3339), Kernel: kernel, Reps: reps, Duration: d.String(),
		Results: Summarize(samples), Samples: samples}
	med := map[string]float64{}
	var tests, svcTests []string
	for _, s := range r.Results {
		if isService(s.Config) {
			if !slices.Contains(svcTests, s.Test) {
				svcTests = append(svcTests, s.Test)
			}
		} else if !slices.Contains(tests, s.Test) {
			tests = append(tests, s.Test)
		}
		med[s.Test+"/"+s.Config] = s.Median
	}
	for _, t := range tests {
		r.Ratios = append(r.Ratios, Ratio{Test: t, FastOnSlow: div(med[t+"/fast"], med[t+"/slow"]),
			FastOnBare: div(med[t+"/fast"], med[t+"/bare"]), SlowOnBare: div(med[t+"/slow"], med[t+"/bare"])})
	}
	if len(svcTests) == 0 {
		return r
	}
	for _, t := range svcTests {
		r.ServiceRatios = append(r.ServiceRatios, ServiceRatio{Test: t, SockLBOnPodIP: PairedRatio(samples, t, SockLB, PodIP),
			SockLBOnKubeProxy: PairedRatio(samples, t, SockLB, KubeProxy), KubeProxyOnPodIP: PairedRatio(samples, t, KubeProxy, PodIP)})
	}
	r.ServiceBar = &ServiceBar{Met: true}
	for _, b := range serviceBar {
		c := BarCheck{Test: b.test, Ratio: b.a + " ÷ " + b.b, Stat: PairedRatio(samples, b.test, b.a, b.b), Want: "≥ ", Limit: b.limit}
		c.Met = c.Stat.N > 0 && c.Stat.Median >= b.limit
		if b.strict {
			c.Want, c.Met = "> ", c.Stat.N > 0 && c.Stat.Median > b.limit
		}
		c.Want += strconv.FormatFloat(b.limit, 'f', -1, 64)
		r.ServiceBar.Checks = append(r.ServiceBar.Checks, c)
		r.ServiceBar.Met = r.ServiceBar.Met && c.Met
	}
	return r
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Rendered is a report that bench-results/ holds as JSON, Markdown and SVG.
type Rendered interface {
	JSON(io.Writer) error
	Markdown(io.Writer)
	SVG(io.Writer)
}

// WriteFiles writes r as dir/stem.json, stem.md and stem.svg.
func WriteFiles(dir, stem string, r Rendered) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for ext, write := range map[string]func(io.Writer) error{
		".json": r.JSON,
		".md":   func(w io.Writer) error { r.Markdown(w); return nil },
		".svg":  func(w io.Writer) error { r.SVG(w); return nil },
	} {
		f, err := os.Create(filepath.Join(dir, stem+ext))
		if err != nil {
			return err
		}
		if err := write(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// JSON writes the report.
func (r Report) JSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// Markdown writes the tables docs/performance.md shows.
func (r Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "Run %s, kernel %s, %d interleaved repetitions of %s per test and configuration, netperf -T %q.\n\n", r.Date, r.Kernel, r.Reps, r.Duration, r.CPUs)
	fmt.Fprintln(w, "| test | config | median | min – max | unit | CPU per unit (median) |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | --- | ---: |")
	for _, s := range r.Results {
		fmt.Fprintf(w, "| %s | %s | %.1f | %.1f – %.1f | %s | %.2f %s |\n", s.Test, s.Config, s.Median, s.Min, s.Max, s.Unit, s.CPUMedian, s.CPUUnit)
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| test | fast ÷ slow | fast ÷ bare | slow ÷ bare |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
		for _, x := range r.Ratios {
			fmt.Fprintf(w, "| %s | %.2f | %.2f | %.2f |\n", x.Test, x.FastOnSlow, x.FastOnBare, x.SlowOnBare)
		}
	}
	if r.ServiceBar == nil {
		return
	}
	fmt.Fprintf(w, "\n## Services\n\n")
	fmt.Fprintf(w, "Client pod on node 0, netserver pod on node 1, fast path on, kube-proxy (iptables mode) on every node. "+
		"`%s`: to the ClusterIP, ONC's socket LB on (`--socket-lb=all`, the hybrid with kube-proxy); "+
		"`%s`: to the ClusterIP, socket LB off on the client's node, so kube-proxy translates; "+
		"`%s`: to the server pod's IP (socket LB on). Each measurement starts with the client node's flow cache and the client pod's conntrack entries flushed, "+
		"so that no config inherits another's connections. Each ratio is the median of the per-repetition paired ratios (min – max, n repetitions).\n\n",
		SockLB, KubeProxy, PodIP)
	fmt.Fprintln(w, "| test | socket LB ÷ pod IP | socket LB ÷ kube-proxy | kube-proxy ÷ pod IP |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	for _, x := range r.ServiceRatios {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", x.Test, x.SockLBOnPodIP, x.SockLBOnKubeProxy, x.KubeProxyOnPodIP)
	}
	fmt.Fprintf(w, "\nBar:\n\n")
	for _, c := range r.ServiceBar.Checks {
		verdict := "not measured"
		if c.Stat.N > 0 {
			verdict = map[bool]string{true: "met", false: "**not met**"}[c.Met]
		}
		fmt.Fprintf(w, "- %s %s = %s, want %s: %s\n", c.Test, c.Ratio, c.Stat, c.Want, verdict)
	}
	verdict := map[bool]string{true: "met", false: "not met"}[r.ServiceBar.Met]
	for _, c := range r.ServiceBar.Checks {
		if c.Stat.N == 0 {
			verdict = "not met: not all of it was measured"
		}
	}
	fmt.Fprintf(w, "\n**Bar %s.**\n", verdict)
}

// String is "median (min – max, n = N)".
func (s Stat) String() string {
	if s.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f (%.3f – %.3f, n = %d)", s.Median, s.Min, s.Max, s.N)
}

// SVG draws, per test, each config's median relative to its section's
// baseline (bars: bare underlay for the pod-to-pod rows, the pod IP for
// the Service rows) with its min–max range (whiskers).
func (r Report) SVG(w io.Writer) {
	colors := map[string]string{"bare": "#9e9e9e", "slow": "#e57373", "fast": "#43a047",
		SockLB: "#1e88e5", KubeProxy: "#fb8c00", PodIP: "#757575"}
	c := Chart{Title: "ONC: median relative to bare underlay, Services to the pod IP (whiskers: min–max), " + r.Date, YMin: 1.2}
	for _, cfg := range append(slices.Clone(Configs), ServiceConfigs...) {
		c.Series = append(c.Series, Series{Name: cfg, Color: colors[cfg]})
	}
	type group struct {
		test    string
		service bool
	}
	base := map[group]float64{}
	for _, s := range r.Results {
		if s.Config == "bare" || s.Config == PodIP {
			base[group{s.Test, isService(s.Config)}] = s.Median
		}
	}
	for _, s := range r.Results {
		label := s.Test
		if isService(s.Config) {
			label += " Service"
		}
		if len(c.Groups) == 0 || c.Groups[len(c.Groups)-1].Label != label { // Results are grouped by section and test
			c.Groups = append(c.Groups, Group{Label: label})
		}
		bv := base[group{s.Test, isService(s.Config)}]
		if bv == 0 {
			continue
		}
		g := &c.Groups[len(c.Groups)-1]
		rel := s.Median / bv
		g.Bars = append(g.Bars, Bar{Series: s.Config, Value: rel, Lo: s.Min / bv, Hi: s.Max / bv,
			Label: fmt.Sprintf("%.2f", rel), Title: fmt.Sprintf("%s %s %.2f", s.Test, s.Config, rel)})
	}
	c.SVG(w)
}
