package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onc-net/onc/lab"
)

// Report is what bench-results/latest.json holds.
type Report struct {
	Date     string `json:"date"`
	Kernel   string `json:"kernel"`
	Reps     int    `json:"reps"`
	Duration string `json:"duration"`
	CPUs     string `json:"cpus"` // netperf -T
	// Family is the pod-to-pod rows' address family, "ipv4", "ipv6" or
	// "dual" (Options.Family; "" in reports from before it; "ipv6" in
	// reports before 2026-11-27 meant what "dual" means now).
	Family  string    `json:"family,omitempty"`
	Results []Summary `json:"results"`
	Ratios  []Ratio   `json:"ratios"`
	// The pod-to-pod bar (absent without pod rows).
	PodBar *BarVerdict `json:"podBar,omitempty"`
	// The Service section's paired ratios and its bar (absent without it).
	ServiceRatios []ServiceRatio `json:"serviceRatios,omitempty"`
	ServiceBar    *BarVerdict    `json:"serviceBar,omitempty"`
	// The NodePort rows' paired ratios by placement and their bar (absent
	// without them).
	NodePortRatios []NodePortRatio `json:"nodePortRatios,omitempty"`
	NodePortBar    *BarVerdict     `json:"nodePortBar,omitempty"`
	// The same bar for ONC's replacement with direct server return.
	NodePortDSRBar *BarVerdict `json:"nodePortDSRBar,omitempty"`
	// The intra-node section's paired ratios by size and its bar (absent
	// without it).
	IntranodeRatios []IntranodeRatio `json:"intranodeRatios,omitempty"`
	IntranodeBar    *BarVerdict      `json:"intranodeBar,omitempty"`
	// The flow-record rows' paired ratios, their bar and the agent's
	// memory (absent without them).
	FlowsRatios []FlowsRatio `json:"flowsRatios,omitempty"`
	FlowsBar    *BarVerdict  `json:"flowsBar,omitempty"`
	FlowsMemory *FlowsMemory `json:"flowsMemory,omitempty"`
	Samples     []Sample     `json:"samples"`
}

// Ratio of medians for one test, and its paired ratios.
type Ratio struct {
	Test       string  `json:"test"`
	FastOnSlow float64 `json:"fastOnSlow"`
	FastOnBare float64 `json:"fastOnBare"`
	SlowOnBare float64 `json:"slowOnBare"`
	// Overhead removed: of what the overlay costs (bare → slow), the share
	// the fast path wins back, (fast − slow) ÷ (bare − slow) per
	// repetition; on the rate, and on the CPU per transaction or per KB.
	OverheadRemoved    Stat `json:"overheadRemoved"`
	OverheadRemovedCPU Stat `json:"overheadRemovedCPU"`
	PairedFastOnBare   Stat `json:"pairedFastOnBare"`
	PairedFastOnSlow   Stat `json:"pairedFastOnSlow"`
	// What a user would run instead: ONC's fast path ÷ Flannel, paired.
	PairedFastOnFlannel Stat `json:"pairedFastOnFlannel"`
}

// overheadRemoved is (fast − slow) ÷ (bare − slow) of value, per
// repetition that ran all three; the same formula for a rate (higher is
// better) and for CPU per unit (lower is better). A repetition where the
// overlay cost nothing, or less than nothing (noise: slow as good as bare
// or better), has no overhead to remove; it is left out, not counted as a
// huge or negative share.
func overheadRemoved(samples []Sample, test string, value func(Sample) float64, higherBetter bool) Stat {
	by := map[int]map[string]float64{}
	for _, s := range samples {
		if s.Test != test || section(s.Config) != podSection {
			continue
		}
		if by[s.Rep] == nil {
			by[s.Rep] = map[string]float64{}
		}
		by[s.Rep][s.Config] = value(s)
	}
	var r []float64
	for _, v := range by {
		bare, bok := v["bare"]
		slow, sok := v["slow"]
		fast, fok := v["fast"]
		if bok && sok && fok && (bare > slow) == higherBetter && bare != slow {
			r = append(r, (fast-slow)/(bare-slow))
		}
	}
	return StatOf(r)
}

// podBar is the pod-to-pod bar: the overlay's cost removed on request/
// response, bulk transfer near bare metal, short connections clearly
// faster than the slow path, well ahead of Flannel, and an application
// (redis) near bare metal. A run that leaves a test or Flannel out has
// those checks "not measured", and so cannot meet the bar.
var podBar = []struct {
	test, what string
	stat       func(Ratio) Stat
	op         string
	limit      float64
}{
	{"TCP_RR", "overhead removed (rate)", func(r Ratio) Stat { return r.OverheadRemoved }, "≥", 0.9},
	{"TCP_RR", "overhead removed (CPU)", func(r Ratio) Stat { return r.OverheadRemovedCPU }, "≥", 0.9},
	{"UDP_RR", "overhead removed (rate)", func(r Ratio) Stat { return r.OverheadRemoved }, "≥", 0.9},
	{"UDP_RR", "overhead removed (CPU)", func(r Ratio) Stat { return r.OverheadRemovedCPU }, "≥", 0.9},
	{"TCP_STREAM", "paired fast ÷ bare", func(r Ratio) Stat { return r.PairedFastOnBare }, "≥", 0.9},
	{"TCP_CRR", "paired fast ÷ slow", func(r Ratio) Stat { return r.PairedFastOnSlow }, "≥", 1.1},
	{"TCP_RR", "paired fast ÷ flannel", func(r Ratio) Stat { return r.PairedFastOnFlannel }, "≥", 1.25},
	{"UDP_RR", "paired fast ÷ flannel", func(r Ratio) Stat { return r.PairedFastOnFlannel }, "≥", 1.25},
	{"REDIS_GET", "paired fast ÷ bare", func(r Ratio) Stat { return r.PairedFastOnBare }, "≥", 0.95},
}

// Stat is the median, range and the median's 95 % interval (bootstrap) of
// some values.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
	Lo     float64 `json:"ci95Lo"`
	Hi     float64 `json:"ci95Hi"`
}

// StatOf is the median, range and interval of v (zero for none).
func StatOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := slices.Sorted(slices.Values(v))
	lo, hi := medianInterval(s)
	return Stat{Median: Median(s), Min: s[0], Max: s[len(s)-1], N: len(s), Lo: lo, Hi: hi}
}

// PairedRatio is, over the repetitions that ran test on both configs, a's
// value ÷ b's: the two ran minutes apart at most, so the ratio holds on a
// shared machine even when absolute numbers drift between repetitions.
func PairedRatio(samples []Sample, test, a, b string) Stat {
	return pairedRatioOf(samples, test, a, b, func(s Sample) float64 { return s.Value })
}

// pairedRatioOf is PairedRatio of value. A failed run pairs with nothing.
func pairedRatioOf(samples []Sample, test, a, b string, value func(Sample) float64) Stat {
	num, den := map[int]float64{}, map[int]float64{}
	for _, s := range samples {
		switch {
		case s.Test != test || s.Error != "":
		case s.Config == a:
			num[s.Rep] = value(s)
		case s.Config == b:
			den[s.Rep] = value(s)
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

// NodePortRatio is one test's paired ratios of the NodePort rows at one
// placement of the backend.
type NodePortRatio struct {
	Test      string `json:"test"`
	Placement string `json:"placement"`
	// ONC's replacement ÷ kube-proxy in each mode, and nftables ÷ iptables.
	ONCOnIPTables      Stat `json:"oncOnIPTables"`
	ONCOnNFTables      Stat `json:"oncOnNFTables"`
	NFTablesOnIPTables Stat `json:"nftablesOnIPTables"`
	// ONC's replacement with direct server return ÷ kube-proxy's iptables
	// mode, and ÷ ONC's with SNAT.
	DSROnIPTables Stat `json:"dsrOnIPTables"`
	DSROnONC      Stat `json:"dsrOnONC"`
	// At the backend's node only: the reference (NodePortHost) ÷
	// kube-proxy's iptables mode, the most a proxy's ratio has room for,
	// and ONC's replacement ÷ the reference.
	HostOnIPTables Stat `json:"hostOnIPTables"`
	ONCOnHost      Stat `json:"oncOnHost"`
}

// nodePortBar is issue 27's, at each placement: TCP_RR through ONC at
// least 1.3 × kube-proxy's iptables mode and not below its nftables mode;
// TCP_CRR at least 1.1 × the iptables mode.
var nodePortBar = []struct {
	test, proxy string
	op          string
	limit       float64
}{
	{"TCP_RR", ProxyIPTables, "≥", 1.3},
	{"TCP_RR", ProxyNFTables, "≥", 1},
	{"TCP_CRR", ProxyIPTables, "≥", 1.1},
}

// IntranodeRatio is one size's paired ratios of the intra-node section.
type IntranodeRatio struct {
	Size int `json:"size"`
	// TCP_RR's mean latency and TCP_STREAM's throughput, bypass ÷ stack.
	Latency    Stat `json:"latencyBypassOnStack"`
	Throughput Stat `json:"throughputBypassOnStack"`
}

// FlowsRatio is one test's paired ratios of the flow-record rows: records
// on ÷ off, without and with the policy.
type FlowsRatio struct {
	Test             string `json:"test"`
	OnOff            Stat   `json:"onOnOff"`
	OnOffPolicy      Stat   `json:"onOnOffPolicy"`
	PolicyOnNoPolicy Stat   `json:"policyOnNoPolicy"` // records on, with the policy ÷ without
}

// BarVerdict is one of the bars, each check judged on the median of
// paired ratios. Services: ClusterIP via socket LB at least 0.97 × the pod
// IP on TCP_RR, and ahead of kube-proxy on TCP_RR and TCP_CRR. Intra-node:
// TCP_RR's latency through the bypass at most 0.6 × the stack's at every
// size.
type BarVerdict struct {
	Checks []BarCheck `json:"checks"`
	Met    bool       `json:"met"` // every check measured and met
}

// BarCheck is one condition of the bar.
type BarCheck struct {
	Test  string  `json:"test"`
	Size  int     `json:"size,omitempty"` // bytes, for the intra-node bar
	Ratio string  `json:"ratio"`          // "a ÷ b"
	Stat  Stat    `json:"stat"`
	Want  string  `json:"want"` // "≥ 0.97", "> 1", "≤ 0.6"
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"` // by the median
	// By the 95 % interval: met, not met, or undecided.
	Confidence Confidence `json:"confidence"`
}

var serviceBar = []struct {
	test, a, b string
	op         string // ahead: ">", above the limit, not at it
	limit      float64
}{
	{"TCP_RR", SockLB, PodIP, "≥", 0.97},
	{"TCP_RR", SockLB, KubeProxy, ">", 1},
	{"TCP_CRR", SockLB, KubeProxy, ">", 1},
}

// IntranodeBarLimit is the most TCP_RR's latency through the bypass may be,
// relative to the stack's, at any size.
const IntranodeBarLimit = 0.6

// add judges c's ratio against limit with op (≥, > or ≤), met only if
// measured, and records it.
func (b *BarVerdict) add(c BarCheck, op string, limit float64) {
	c.Want, c.Limit = op+" "+strconv.FormatFloat(limit, 'f', -1, 64), limit
	c.Met = c.Stat.N > 0 && meets(c.Stat.Median, op, limit)
	c.Confidence = confidence(c.Stat, op, limit)
	b.Checks = append(b.Checks, c)
	b.Met = b.Met && c.Met
}

// NewReport summarises samples.
func NewReport(samples []Sample, reps int, d time.Duration, kernel string) Report {
	r := Report{Date: time.Now().UTC().Format(time.RFC3339), Kernel: kernel, Reps: reps, Duration: d.String(),
		Results: Summarize(samples), Samples: samples}
	med := map[string]float64{}
	var tests, svcTests, npTests, flowTests []string
	var sizes []int
	for _, s := range r.Results {
		switch section(s.Config) {
		case podSection:
			if !slices.Contains(tests, s.Test) {
				tests = append(tests, s.Test)
			}
		case serviceSection:
			if !slices.Contains(svcTests, s.Test) {
				svcTests = append(svcTests, s.Test)
			}
		case nodePortSection:
			if !slices.Contains(npTests, s.Test) {
				npTests = append(npTests, s.Test)
			}
		case intranodeSection:
			if !slices.Contains(sizes, s.Size) {
				sizes = append(sizes, s.Size)
			}
		case flowsSection:
			if !slices.Contains(flowTests, s.Test) {
				flowTests = append(flowTests, s.Test)
			}
		}
		med[s.Test+"/"+s.Config] = s.Median
	}
	for _, t := range tests {
		r.Ratios = append(r.Ratios, Ratio{Test: t, FastOnSlow: div(med[t+"/fast"], med[t+"/slow"]),
			FastOnBare: div(med[t+"/fast"], med[t+"/bare"]), SlowOnBare: div(med[t+"/slow"], med[t+"/bare"]),
			OverheadRemoved:     overheadRemoved(samples, t, func(s Sample) float64 { return s.Value }, true),
			OverheadRemovedCPU:  overheadRemoved(samples, t, func(s Sample) float64 { return s.CPU }, false),
			PairedFastOnBare:    PairedRatio(samples, t, "fast", "bare"),
			PairedFastOnSlow:    PairedRatio(samples, t, "fast", "slow"),
			PairedFastOnFlannel: PairedRatio(samples, t, "fast", "flannel")})
	}
	if len(tests) > 0 {
		r.PodBar = &BarVerdict{Met: true}
		for _, b := range podBar {
			var st Stat
			for _, x := range r.Ratios {
				if x.Test == b.test {
					st = b.stat(x)
				}
			}
			r.PodBar.add(BarCheck{Test: b.test, Ratio: b.what, Stat: st}, b.op, b.limit)
		}
	}
	if len(svcTests) > 0 {
		for _, t := range svcTests {
			r.ServiceRatios = append(r.ServiceRatios, ServiceRatio{Test: t, SockLBOnPodIP: PairedRatio(samples, t, SockLB, PodIP),
				SockLBOnKubeProxy: PairedRatio(samples, t, SockLB, KubeProxy), KubeProxyOnPodIP: PairedRatio(samples, t, KubeProxy, PodIP)})
		}
		r.ServiceBar = &BarVerdict{Met: true}
		for _, b := range serviceBar {
			r.ServiceBar.add(BarCheck{Test: b.test, Ratio: b.a + " ÷ " + b.b, Stat: PairedRatio(samples, b.test, b.a, b.b)}, b.op, b.limit)
		}
	}
	if len(npTests) > 0 {
		r.NodePortBar = &BarVerdict{Met: true}
		r.NodePortDSRBar = &BarVerdict{Met: true}
		for _, pl := range NodePortPlacements {
			onc, dsr := NodePortConfig(ProxyONC, pl), NodePortConfig(ProxyONCDSR, pl)
			ipt, nft := NodePortConfig(ProxyIPTables, pl), NodePortConfig(ProxyNFTables, pl)
			for _, t := range npTests {
				x := NodePortRatio{Test: t, Placement: pl, ONCOnIPTables: PairedRatio(samples, t, onc, ipt),
					ONCOnNFTables: PairedRatio(samples, t, onc, nft), NFTablesOnIPTables: PairedRatio(samples, t, nft, ipt),
					DSROnIPTables: PairedRatio(samples, t, dsr, ipt), DSROnONC: PairedRatio(samples, t, dsr, onc)}
				if pl == SameNode {
					x.HostOnIPTables, x.ONCOnHost = PairedRatio(samples, t, NodePortHost, ipt), PairedRatio(samples, t, onc, NodePortHost)
				}
				r.NodePortRatios = append(r.NodePortRatios, x)
			}
			for _, b := range nodePortBar {
				kp := NodePortConfig(b.proxy, pl)
				r.NodePortBar.add(BarCheck{Test: b.test, Ratio: onc + " ÷ " + kp, Stat: PairedRatio(samples, b.test, onc, kp)}, b.op, b.limit)
				r.NodePortDSRBar.add(BarCheck{Test: b.test, Ratio: dsr + " ÷ " + kp, Stat: PairedRatio(samples, b.test, dsr, kp)}, b.op, b.limit)
			}
		}
	}
	if len(sizes) > 0 {
		slices.Sort(sizes)
		r.IntranodeBar = &BarVerdict{Met: true}
		for _, size := range sizes {
			at := slices.DeleteFunc(slices.Clone(samples), func(s Sample) bool { return s.Size != size })
			x := IntranodeRatio{Size: size, Latency: pairedRatioOf(at, "TCP_RR", IntraBypass, IntraStack, func(s Sample) float64 { return s.LatencyUS }),
				Throughput: PairedRatio(at, "TCP_STREAM", IntraBypass, IntraStack)}
			r.IntranodeRatios = append(r.IntranodeRatios, x)
			r.IntranodeBar.add(BarCheck{Test: "TCP_RR", Size: size, Ratio: "latency " + IntraBypass + " ÷ " + IntraStack, Stat: x.Latency}, "≤", IntranodeBarLimit)
		}
	}
	if len(flowTests) > 0 {
		r.FlowsBar = &BarVerdict{Met: true}
		for _, t := range flowTests {
			x := FlowsRatio{Test: t, OnOff: PairedRatio(samples, t, FlowsOn, FlowsOff), OnOffPolicy: PairedRatio(samples, t, FlowsOnPolicy, FlowsOffPolicy),
				PolicyOnNoPolicy: PairedRatio(samples, t, FlowsOnPolicy, FlowsOn)}
			r.FlowsRatios = append(r.FlowsRatios, x)
			r.FlowsBar.add(BarCheck{Test: t, Ratio: FlowsOn + " ÷ " + FlowsOff, Stat: x.OnOff}, "≥", FlowsBarLimit)
			r.FlowsBar.add(BarCheck{Test: t, Ratio: FlowsOnPolicy + " ÷ " + FlowsOffPolicy, Stat: x.OnOffPolicy}, "≥", FlowsBarLimit)
		}
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
	fmt.Fprintf(w, "Run %s, kernel %s, %d interleaved repetitions of %s per test and configuration, netperf -T %q.\n", r.Date, r.Kernel, r.Reps, r.Duration, r.CPUs)
	switch r.Family {
	case FamilyIPv6:
		fmt.Fprintln(w, "\nThe pod-to-pod rows are IPv6: an IPv6 lab, pods' IPv6 addresses in IPv6 tunnels, and bare between the nodes' IPv6 underlay addresses.")
	case FamilyDual:
		fmt.Fprintln(w, "\nThe pod-to-pod rows are IPv6: a dual-stack lab, pods' IPv6 addresses over the IPv4 tunnel, and bare between the nodes' IPv6 underlay addresses.")
	}
	// The intra-node rows have their own table, by size.
	rows := slices.DeleteFunc(slices.Clone(r.Results), func(s Summary) bool { return section(s.Config) == intranodeSection })
	if len(rows) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| test | config | median | min – max | unit | CPU per unit (median) |")
		fmt.Fprintln(w, "| --- | --- | ---: | ---: | --- | ---: |")
	}
	for _, s := range rows {
		cpu := "–"
		if s.CPUUnit != "" {
			cpu = fmt.Sprintf("%.2f %s", s.CPUMedian, s.CPUUnit)
		}
		cfg := s.Config
		if s.Failed > 0 {
			cfg += fmt.Sprintf(" (%d of %d runs failed)", s.Failed, s.Failed+s.N)
		}
		if s.N == 0 {
			fmt.Fprintf(w, "| %s | %s | – | – | – | – |\n", s.Test, cfg)
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %.1f | %.1f – %.1f | %s | %s |\n", s.Test, cfg, s.Median, s.Min, s.Max, s.Unit, cpu)
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| test | fast ÷ slow | fast ÷ bare | slow ÷ bare |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
		for _, x := range r.Ratios {
			fmt.Fprintf(w, "| %s | %.2f | %.2f | %.2f |\n", x.Test, x.FastOnSlow, x.FastOnBare, x.SlowOnBare)
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Overhead removed = (fast − slow) ÷ (bare − slow), per repetition: of what the overlay costs, the share the fast path wins back "+
			"(1: all of it; on CPU per unit, lower is better and the same formula holds). Each cell: median [bootstrap 95 % interval] (min – max, n).")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| test | overhead removed (rate) | overhead removed (CPU) | paired fast ÷ bare | paired fast ÷ flannel | paired fast ÷ slow |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: |")
		for _, x := range r.Ratios {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", x.Test, x.OverheadRemoved, x.OverheadRemovedCPU, x.PairedFastOnBare, x.PairedFastOnFlannel, x.PairedFastOnSlow)
		}
		r.PodBar.markdown(w)
	}
	if r.ServiceBar != nil {
		r.servicesMarkdown(w)
	}
	if r.NodePortBar != nil {
		r.nodePortMarkdown(w)
	}
	if r.IntranodeBar != nil {
		r.intranodeMarkdown(w)
	}
	if r.FlowsBar != nil {
		r.flowsMarkdown(w)
	}
	r.failedMarkdown(w)
}

func (r Report) nodePortMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## NodePort from outside the cluster\n\n")
	fmt.Fprintf(w, "Netperf from a host outside the cluster (a namespace on the underlay bridge, %s) to a NodePort Service whose one backend, "+
		"the netserver pod, runs on node 1 (a lab of its own on the bridge underlay); fast path on. "+
		"`%s`: ONC's kube-proxy replacement (`--kube-proxy-replacement`, no kube-proxy): the uplink load balancer translates, "+
		"a backend on another node seeing the node the client chose (SNAT); `%s`: the same with direct server return "+
		"(`--load-balancer-mode=dsr`): that backend's node answers the client; "+
		"`%s`, `%s`: real kube-proxy in that mode on every node, ONC's socket LB off. "+
		"`same`: the client connects to node 1, the backend's; `other`: to node 0, which forwards over the overlay. "+
		"Switching proxies removes every kube-proxy rule (`kube-proxy --cleanup`) and restarts the agents with the proxy's flags. "+
		"Each run is path-checked on the node the client connects to: ONC's uplink entry translated and netfilter did not (onc, onc-dsr), "+
		"and it sent the packets to the backend's node directly (`dsr_sent`) only with direct server return and a backend elsewhere; "+
		"kube-proxy's KUBE-NODEPORTS rule counted packets (iptables); netfilter translated (conntrack) with no iptables rule for the port (nftables, "+
		"whose rules have no counters). `host`: the outside host to a netserver on node 1 itself (its host network), no Service and no proxy, "+
		"measured beside ONC's runs: what reaching a socket of that node costs untranslated, so host ÷ iptables is about the most room "+
		"this machine leaves a proxy against kube-proxy's iptables mode (checked: ONC's uplink translated nothing). "+
		"Each ratio is the median of the per-repetition paired ratios [bootstrap 95 %% interval] (min – max, n repetitions).\n\n",
		lab.ExternalClientIP, ProxyONC, ProxyONCDSR, ProxyIPTables, ProxyNFTables)
	fmt.Fprintln(w, "| test | backend | onc ÷ iptables | onc ÷ nftables | nftables ÷ iptables | onc-dsr ÷ iptables | onc-dsr ÷ onc | host ÷ iptables | onc ÷ host |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, x := range r.NodePortRatios {
		fmt.Fprintf(w, "| %s | %s node | %s | %s | %s | %s | %s | %s | %s |\n", x.Test, x.Placement, x.ONCOnIPTables, x.ONCOnNFTables, x.NFTablesOnIPTables,
			x.DSROnIPTables, x.DSROnONC, x.HostOnIPTables, x.ONCOnHost)
	}
	fmt.Fprintf(w, "\nWith SNAT (the default):\n")
	r.NodePortBar.markdown(w)
	if r.NodePortDSRBar != nil {
		fmt.Fprintf(w, "\nWith direct server return:\n")
		r.NodePortDSRBar.markdown(w)
	}
}

// failedMarkdown lists the runs that failed, or failed their path check,
// with the reason: counted in no median or ratio, and not hidden.
func (r Report) failedMarkdown(w io.Writer) {
	var failed []Sample
	for _, s := range r.Samples {
		if s.Error != "" {
			failed = append(failed, s)
		}
	}
	if len(failed) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Failed runs\n\n%d runs failed or failed their path check; they count in no median or ratio.\n\n", len(failed))
	fmt.Fprintln(w, "| rep | test | config | reason |")
	fmt.Fprintln(w, "| ---: | --- | --- | --- |")
	for _, s := range failed {
		cfg := s.Config
		if s.Size > 0 {
			cfg = sizeLabel(s.Size) + " " + cfg
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s |\n", s.Rep, s.Test, cfg, oneLine(s.Error))
	}
}

// oneLine fits an error in a table cell: netperf's output spans lines.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if r := []rune(s); len(r) > 300 {
		s = string(r[:300]) + "…"
	}
	return s
}

func (r Report) servicesMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Services\n\n")
	fmt.Fprintf(w, "Client pod on node 0, netserver pod on node 1, fast path on, kube-proxy (iptables mode) on every node. "+
		"`%s`: to the ClusterIP, ONC's socket LB on (`--services=all`, the hybrid with kube-proxy); "+
		"`%s`: to the ClusterIP, socket LB off on the client's node, so kube-proxy translates; "+
		"`%s`: to the server pod's IP (socket LB on). Each measurement starts with the client node's flow cache and the client pod's conntrack entries flushed, "+
		"so that no config inherits another's connections. Each ratio is the median of the per-repetition paired ratios (min – max, n repetitions).\n\n",
		SockLB, KubeProxy, PodIP)
	fmt.Fprintln(w, "| test | socket LB ÷ pod IP | socket LB ÷ kube-proxy | kube-proxy ÷ pod IP |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	for _, x := range r.ServiceRatios {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", x.Test, x.SockLBOnPodIP, x.SockLBOnKubeProxy, x.KubeProxyOnPodIP)
	}
	r.ServiceBar.markdown(w)
}

func (r Report) flowsMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Flow records on versus off\n\n")
	fmt.Fprintf(w, "Client pod on node 0, netserver pod on node 1, fast path on. `%s`: the agents' defaults (flow records kept, the policy table's "+
		"NFLOG rules and the eBPF programs' events on); `%s`: both agents restarted with `--flows-buffer=0` (no store, no log rules, no events). "+
		"`-policy`: a NetworkPolicy isolates the server's ingress and allows the client, so every new connection is judged and, records on, "+
		"logged (at most 100 a second per pod chain). Each run is checked: records on, the run's connections were recorded (the server node's "+
		"allowed records with the policy, the client node's fast-path records without); off, both agents refuse `onctl flows`; with the policy, "+
		"the server's rules judged connections and denied none. Each ratio is the median of the per-repetition paired ratios "+
		"[bootstrap 95 %% interval] (min – max, n repetitions).\n\n", FlowsOn, FlowsOff)
	fmt.Fprintln(w, "| test | on ÷ off | on ÷ off, policy | policy ÷ no policy, records on |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	for _, x := range r.FlowsRatios {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", x.Test, x.OnOff, x.OnOffPolicy, x.PolicyOnNoPolicy)
	}
	if m := r.FlowsMemory; m != nil {
		fmt.Fprintln(w)
		if m.Error != "" {
			fmt.Fprintf(w, "Agent memory: not measured: %s\n", oneLine(m.Error))
		} else {
			fmt.Fprintf(w, "Agent memory (client node, VmRSS, one reading each): records on, after %.0f s of TCP_CRR, the store holding %d records "+
				"(of %d): %.1f MiB; records off after the same: %.1f MiB (%+.1f MiB).\n", m.BurstSeconds, m.Held, m.Buffer,
				float64(m.RSSOnKiB)/1024, float64(m.RSSOffKiB)/1024, float64(m.RSSOnKiB-m.RSSOffKiB)/1024)
		}
	}
	r.FlowsBar.markdown(w)
}

func (r Report) intranodeMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Intra-node: bypass versus stack\n\n")
	fmt.Fprintf(w, "Client pod and netserver pod both on node 0. `%s`: the node's bypass off, both TCP/IP stacks carry every byte; "+
		"`%s`: the bypass on, each send is queued on the peer socket's receive queue. "+
		"Size: TCP_RR's request and response, TCP_STREAM's send. TCP_RR's latency is its mean round trip (1 ÷ transactions per second, one in flight). "+
		"Each bypass run is checked to have gone through the bypass (it carried at least half the bytes netperf moved), each stack run not (it carried none); "+
		"a run that fails its check is listed under Failed runs with its reason and counts in no median or ratio. "+
		"Each ratio is the median of the per-repetition paired ratios (min – max, n repetitions).\n\n", IntraStack, IntraBypass)
	fmt.Fprintln(w, "| test | size | config | median | min – max | unit | mean latency µs (median) | CPU per unit (median) |")
	fmt.Fprintln(w, "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: |")
	for _, s := range r.Results {
		if section(s.Config) != intranodeSection {
			continue
		}
		cfg := s.Config
		if s.Failed > 0 {
			cfg += fmt.Sprintf(" (%d of %d runs failed)", s.Failed, s.Failed+s.N)
		}
		if s.N == 0 {
			fmt.Fprintf(w, "| %s | %s | %s | – | – | – | – | – |\n", s.Test, sizeLabel(s.Size), cfg)
			continue
		}
		lat := "–"
		if s.LatencyUS > 0 {
			lat = fmt.Sprintf("%.1f", s.LatencyUS)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.1f | %.1f – %.1f | %s | %s | %.2f %s |\n", s.Test, sizeLabel(s.Size), cfg, s.Median, s.Min, s.Max, s.Unit, lat, s.CPUMedian, s.CPUUnit)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| size | TCP_RR latency, bypass ÷ stack | TCP_STREAM throughput, bypass ÷ stack |")
	fmt.Fprintln(w, "| ---: | ---: | ---: |")
	for _, x := range r.IntranodeRatios {
		fmt.Fprintf(w, "| %s | %s | %s |\n", sizeLabel(x.Size), x.Latency, x.Throughput)
	}
	fmt.Fprintf(w, "\n%s\n", r.throughputLower())
	r.IntranodeBar.markdown(w)
}

// throughputLower says plainly at which sizes the bypass's TCP_STREAM
// throughput is lower than the stack's (median paired ratio below 1).
func (r Report) throughputLower() string {
	var lower []string
	measured := false
	for _, x := range r.IntranodeRatios {
		measured = measured || x.Throughput.N > 0
		if x.Throughput.N > 0 && x.Throughput.Median < 1 {
			lower = append(lower, fmt.Sprintf("%s (%.2f ×)", sizeLabel(x.Size), x.Throughput.Median))
		}
	}
	switch {
	case !measured:
		return "TCP_STREAM was not measured."
	case len(lower) == 0:
		return "The bypass's TCP_STREAM throughput is not lower than the stack's at any size measured."
	}
	return "**The bypass's TCP_STREAM throughput is lower than the stack's at " + strings.Join(lower, ", ") + ".**"
}

// sizeLabel is "64 B", or "4 KiB" for whole kibibytes.
func sizeLabel(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.Itoa(n/1024) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}

// markdown lists the checks, then how many are met, not met and
// undecided by their 95 % intervals, then the verdict.
func (b *BarVerdict) markdown(w io.Writer) {
	fmt.Fprintf(w, "\nBar:\n\n")
	count := map[Confidence]int{}
	verdict := map[bool]string{true: "met", false: "not met"}[b.Met]
	for _, c := range b.Checks {
		what := c.Test
		if c.Size > 0 {
			what += " " + sizeLabel(c.Size)
		}
		v := "not measured"
		if c.Stat.N > 0 {
			v = map[bool]string{true: "met", false: "**not met**"}[c.Met] + " by the median, " + string(c.Confidence) + " by the 95 % interval"
		} else {
			verdict = "not met: not all of it was measured"
		}
		fmt.Fprintf(w, "- %s %s = %s, want %s: %s\n", what, c.Ratio, c.Stat, c.Want, v)
		count[c.Confidence]++
	}
	fmt.Fprintf(w, "\nBy the 95 %% intervals, of %d checks: %d met with confidence, %d not met with confidence, %d undecided, %d not measured.\n",
		len(b.Checks), count[Met], count[NotMet], count[Undecided], count[Unmeasured])
	fmt.Fprintf(w, "\n**Bar %s.**\n", verdict)
}

// String is "median [95 % interval] (min – max, n = N)".
func (s Stat) String() string {
	if s.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f [%.3f – %.3f] (%.3f – %.3f, n = %d)", s.Median, s.Lo, s.Hi, s.Min, s.Max, s.N)
}

// SVG draws the pod-to-pod and Service rows relative to their sections'
// baselines, then the intra-node rows by size.
func (r Report) SVG(w io.Writer) {
	var charts []Chart
	if c := r.relativeChart(); len(c.Groups) > 0 {
		charts = append(charts, c)
	}
	Panels(w, append(charts, r.intranodeCharts()...)...)
}

// relativeChart draws, per test, each config's median relative to its
// section's baseline (bars: bare underlay for the pod-to-pod rows, the
// pod IP for the Service rows, kube-proxy's iptables mode for the NodePort
// rows at each placement) with its min–max range (whiskers).
func (r Report) relativeChart() Chart {
	colors := map[string]string{"bare": "#9e9e9e", "flannel": "#fdd835", "slow": "#e57373", "fast": "#43a047",
		SockLB: "#1e88e5", KubeProxy: "#fb8c00", PodIP: "#757575"}
	for _, pl := range NodePortPlacements {
		for p, c := range map[string]string{ProxyONC: "#1e88e5", ProxyONCDSR: "#3949ab", ProxyIPTables: "#fb8c00", ProxyNFTables: "#8d6e63"} {
			colors[NodePortConfig(p, pl)] = c
		}
	}
	colors[NodePortHost] = "#9e9e9e"
	colors[FlowsOn], colors[FlowsOff], colors[FlowsOnPolicy], colors[FlowsOffPolicy] = "#00897b", "#b0bec5", "#26a69a", "#78909c"
	c := Chart{Title: "ONC: median relative to bare underlay, Services to the pod IP, NodePorts to kube-proxy iptables, flow records on to off (whiskers: min–max), " + r.Date, YMin: 1.2}
	for _, cfg := range slices.Concat(Configs, ServiceConfigs, NodePortConfigs, []string{NodePortHost}, FlowsConfigs) {
		if slices.ContainsFunc(r.Results, func(s Summary) bool { return s.Config == cfg }) {
			c.Series = append(c.Series, Series{Name: cfg, Color: colors[cfg]})
		}
	}
	base := map[string]float64{}
	for _, s := range r.Results {
		if s.Config == baseline(s.Config) {
			base[s.Test+" "+s.Config] = s.Median
		}
	}
	for _, s := range r.Results {
		if section(s.Config) == intranodeSection {
			continue
		}
		label := s.Test
		switch section(s.Config) {
		case serviceSection:
			label += " Service"
		case nodePortSection:
			label += " NodePort " + strings.Split(s.Config, "-")[1]
		case flowsSection:
			label += " flow records"
		}
		if len(c.Groups) == 0 || c.Groups[len(c.Groups)-1].Label != label { // Results are grouped by section and test
			c.Groups = append(c.Groups, Group{Label: label})
		}
		bv := base[s.Test+" "+baseline(s.Config)]
		if bv == 0 || s.N == 0 {
			continue
		}
		g := &c.Groups[len(c.Groups)-1]
		rel := s.Median / bv
		g.Bars = append(g.Bars, Bar{Series: s.Config, Value: rel, Lo: s.Min / bv, Hi: s.Max / bv,
			Label: fmt.Sprintf("%.2f", rel), Title: fmt.Sprintf("%s %s %.2f", s.Test, s.Config, rel)})
	}
	return c
}

// baseline is the config cfg's bar in relativeChart is relative to.
func baseline(cfg string) string {
	switch section(cfg) {
	case serviceSection:
		return PodIP
	case nodePortSection:
		return NodePortConfig(ProxyIPTables, strings.Split(cfg, "-")[1])
	case flowsSection:
		if flowsIsolated(cfg) {
			return FlowsOffPolicy
		}
		return FlowsOff
	}
	return "bare"
}

// intranodeCharts are two panels, by size, of the bypass's paired ratio to
// the stack (the stack's bar: 1): TCP_RR's latency, dashed line at the
// bar, and TCP_STREAM's throughput. A test not measured has no panel.
func (r Report) intranodeCharts() []Chart {
	series := []Series{{Name: IntraStack, Color: "#e57373"}, {Name: IntraBypass, Color: "#8e24aa"}}
	var out []Chart
	for _, p := range []struct {
		test, what, ref string
		limit           float64
		ratio           func(IntranodeRatio) Stat
	}{
		{"TCP_RR", "latency", "the bar", IntranodeBarLimit, func(x IntranodeRatio) Stat { return x.Latency }},
		{"TCP_STREAM", "throughput", "1", 1, func(x IntranodeRatio) Stat { return x.Throughput }},
	} {
		c := Chart{Title: fmt.Sprintf("Intra-node %s %s, bypass ÷ stack by size (paired, min–max; dashed: %s), %s", p.test, p.what, p.ref, r.Date),
			Series: series, YMin: 1.2, Ref: p.limit}
		for _, x := range r.IntranodeRatios {
			st, size := p.ratio(x), sizeLabel(x.Size)
			if st.N == 0 {
				continue
			}
			c.Groups = append(c.Groups, Group{Label: size, Bars: []Bar{
				{Series: IntraStack, Value: 1, Label: "1", Title: p.test + " " + size + " " + IntraStack},
				{Series: IntraBypass, Value: st.Median, Lo: st.Min, Hi: st.Max, Label: fmt.Sprintf("%.2f", st.Median),
					Title: fmt.Sprintf("%s %s %s ÷ stack %s", p.test, size, IntraBypass, st)},
			}})
		}
		if len(c.Groups) > 0 {
			out = append(out, c)
		}
	}
	return out
}
