package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReportMediansRatiosAndShape(t *testing.T) {
	var samples []Sample
	add := func(cfg string, vals ...float64) {
		for _, v := range vals {
			samples = append(samples, Sample{Test: "TCP_RR", Config: cfg, Value: v, Unit: "Trans/s", CPU: 10, CPUUnit: "usec/Tran"})
		}
	}
	add("fast", 132, 120, 900) // an outlier must not move the median
	add("bare", 100, 100, 100)
	add("slow", 80, 90, 70)
	r := NewReport(samples, 3, 5*time.Second, "6.18")

	if len(r.Results) != 3 || r.Results[0].Config != "bare" || r.Results[2].Config != "fast" {
		t.Fatalf("results not in bare, slow, fast order: %+v", r.Results)
	}
	fast := r.Results[2]
	if fast.Median != 132 || fast.Min != 120 || fast.Max != 900 || fast.N != 3 {
		t.Fatalf("fast summary %+v", fast)
	}
	if len(r.Ratios) != 1 || r.Ratios[0].FastOnSlow != 132.0/80 || r.Ratios[0].FastOnBare != 1.32 || r.Ratios[0].SlowOnBare != 0.8 {
		t.Fatalf("ratios %+v", r.Ratios)
	}

	results := jsonResults(t, r)
	for _, k := range []string{"test", "config", "median", "min", "max", "unit"} {
		if _, ok := results[0][k]; !ok {
			t.Fatalf("latest.json result lacks %q: %v", k, results[0])
		}
	}
	markdown(t, r, "| TCP_RR | 1.65 | 1.32 | 0.80 |")
	var svg strings.Builder
	r.SVG(&svg)
	if !strings.HasPrefix(svg.String(), "<svg") || strings.Count(svg.String(), "<rect") < 3 {
		t.Fatal("chart has no bars")
	}
}

// The Service section's ratios pair each repetition's runs: the median of
// the per-repetition ratios, not the ratio of the medians.
func TestPairedRatio(t *testing.T) {
	var samples []Sample
	add := func(rep int, cfg string, v float64) {
		samples = append(samples, Sample{Test: "TCP_RR", Config: cfg, Rep: rep, Value: v})
	}
	// rep:        1    2    3    4 (no podip: unpaired)
	for i, v := range []float64{100, 300, 150, 999} {
		add(i+1, SockLB, v)
	}
	for i, v := range []float64{100, 200, 400} {
		add(i+1, PodIP, v)
	}
	add(1, SockLB+"x", 1) // another config: ignored
	samples = append(samples, Sample{Test: "TCP_CRR", Config: PodIP, Rep: 4, Value: 1})

	got := PairedRatio(samples, "TCP_RR", SockLB, PodIP)
	// Ratios 1, 1.5, 0.375; the ratio of the medians would be 150/200,
	// pairing sorted values 0.75.
	if want := (Stat{Median: 1, Min: 0.375, Max: 1.5, N: 3}); spread(got) != want {
		t.Fatalf("paired ratio %+v, want %+v", got, want)
	}
	if got := PairedRatio(samples, "TCP_STREAM", SockLB, PodIP); got.N != 0 {
		t.Fatalf("no samples: %+v", got)
	}
}

func TestReportServices(t *testing.T) {
	var samples []Sample
	add := func(test, cfg string, vals ...float64) {
		for i, v := range vals {
			samples = append(samples, Sample{Test: test, Config: cfg, Rep: i + 1, Value: v, Unit: "Trans/s"})
		}
	}
	add("TCP_RR", PodIP, 100, 200, 100)
	add("TCP_RR", SockLB, 97, 190, 110)   // ratios 0.97, 0.95, 1.1: median 0.97, at the bar
	add("TCP_RR", KubeProxy, 50, 100, 60) // socket LB ÷ kube-proxy 1.94, 1.9, 1.83
	add("TCP_CRR", PodIP, 10, 10, 10)
	add("TCP_CRR", SockLB, 10, 11, 9)
	add("TCP_CRR", KubeProxy, 10, 10, 10) // socket LB ÷ kube-proxy median 1: not ahead
	add("TCP_RR", "fast", 300, 300, 300)
	r := NewReport(samples, 3, 5*time.Second, "6.18")

	var configs []string
	for _, s := range r.Results {
		configs = append(configs, s.Test+" "+s.Config)
	}
	if want := []string{"TCP_RR fast", "TCP_RR " + SockLB, "TCP_RR " + KubeProxy, "TCP_RR " + PodIP,
		"TCP_CRR " + SockLB, "TCP_CRR " + KubeProxy, "TCP_CRR " + PodIP}; strings.Join(configs, ",") != strings.Join(want, ",") {
		t.Fatalf("results in order %v, want %v", configs, want)
	}
	if len(r.Ratios) != 1 || r.Ratios[0].Test != "TCP_RR" {
		t.Fatalf("pod-to-pod ratios for the Service tests: %+v", r.Ratios)
	}
	if len(r.ServiceRatios) != 2 {
		t.Fatalf("service ratios %+v", r.ServiceRatios)
	}
	rr := r.ServiceRatios[0]
	if rr.Test != "TCP_RR" || spread(rr.SockLBOnPodIP) != (Stat{Median: 0.97, Min: 0.95, Max: 1.1, N: 3}) ||
		rr.SockLBOnKubeProxy.Median != 1.9 || rr.KubeProxyOnPodIP.Median != 0.5 {
		t.Fatalf("TCP_RR service ratios %+v", rr)
	}
	b := r.ServiceBar
	if b == nil || len(b.Checks) != 3 {
		t.Fatalf("bar %+v", b)
	}
	if !b.Checks[0].Met || !b.Checks[1].Met || b.Checks[2].Met || b.Met {
		t.Fatalf("bar: ≥ 0.97 at 0.97 is met, > 1 at 1 is not, so the bar is not: %+v", b)
	}
	markdown(t, r,
		"| TCP_RR | 0.970 [0.950 – 1.100] (0.950 – 1.100, n = 3) | 1.900 [1.833 – 1.940] (1.833 – 1.940, n = 3) | 0.500 [0.500 – 0.600] (0.500 – 0.600, n = 3) |",
		"- TCP_RR service-socklb ÷ service-podip = 0.970 [0.950 – 1.100] (0.950 – 1.100, n = 3), want ≥ 0.97: met by the median, undecided by the 95 % interval",
		"- TCP_CRR service-socklb ÷ service-kubeproxy = 1.000 [0.900 – 1.100] (0.900 – 1.100, n = 3), want > 1: **not met** by the median, undecided by the 95 % interval",
		"**Bar not met.**")
	var buf bytes.Buffer
	if err := r.JSON(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"config": "service-kubeproxy"`) {
		t.Fatalf("latest.json has no service-kubeproxy result:\n%s", buf.String())
	}
	var svg strings.Builder
	r.SVG(&svg)
	if !strings.Contains(svg.String(), "TCP_RR Service") || !strings.Contains(svg.String(), "TCP_RR service-socklb 1.10") {
		t.Fatal("chart has no Service group relative to the pod IP")
	}
}

// intranodeSamples are reps of TCP_RR latencies (µs) or TCP_STREAM
// throughputs at one size, as RunIntranode records them.
func intranodeSamples(test, cfg string, size int, vals ...float64) []Sample {
	var out []Sample
	for i, v := range vals {
		s := Sample{Test: test, Config: cfg, Rep: i + 1, Size: size, Value: v, Unit: "10^6bits/s"}
		if test == "TCP_RR" {
			s.Value, s.LatencyUS, s.Unit = 1e6/v, v, "Trans/s"
		}
		out = append(out, s)
	}
	return out
}

func TestReportIntranode(t *testing.T) {
	samples := slices.Concat(
		[]Sample{{Test: "TCP_RR", Config: "fast", Rep: 1, Value: 300}},
		intranodeSamples("TCP_STREAM", IntraStack, 64, 1000, 1000, 1000),
		intranodeSamples("TCP_STREAM", IntraBypass, 64, 800, 900, 1100), // 0.9: lower
		intranodeSamples("TCP_RR", IntraBypass, 16384, 70, 100, 80),
		intranodeSamples("TCP_RR", IntraStack, 16384, 100, 200, 100), // 0.7: above the bar
		intranodeSamples("TCP_RR", IntraStack, 64, 100, 100, 100),
		intranodeSamples("TCP_RR", IntraBypass, 64, 60, 50, 70), // 0.6: at the bar
		intranodeSamples("TCP_STREAM", IntraStack, 16384, 1000, 2000, 1000),
		intranodeSamples("TCP_STREAM", IntraBypass, 16384, 3000, 5000, 2000), // 2.5
	)
	r := NewReport(samples, 3, 5*time.Second, "6.18")

	var rows []string
	for _, s := range r.Results {
		rows = append(rows, fmt.Sprintf("%s %d %s n=%d", s.Test, s.Size, s.Config, s.N))
	}
	want := []string{"TCP_RR 0 fast n=1",
		"TCP_RR 64 intranode-stack n=3", "TCP_RR 64 intranode-bypass n=3", "TCP_RR 16384 intranode-stack n=3", "TCP_RR 16384 intranode-bypass n=3",
		"TCP_STREAM 64 intranode-stack n=3", "TCP_STREAM 64 intranode-bypass n=3", "TCP_STREAM 16384 intranode-stack n=3", "TCP_STREAM 16384 intranode-bypass n=3"}
	if !slices.Equal(rows, want) {
		t.Fatalf("results\n%v\nwant (grouped by test, size, config)\n%v", rows, want)
	}
	if s := r.Results[4]; s.LatencyUS != 80 || s.Median != 1e6/80 || s.Min != 1e6/100 {
		t.Fatalf("TCP_RR 16 KiB bypass: latency %v µs, %v (%v – %v) Trans/s; want the median latency 80 µs", s.LatencyUS, s.Median, s.Min, s.Max)
	}
	if s := r.Results[5]; s.LatencyUS != 0 {
		t.Fatalf("TCP_STREAM has a latency: %+v", s)
	}
	if len(r.Ratios) != 1 || r.Ratios[0].Test != "TCP_RR" {
		t.Fatalf("pod-to-pod ratios for the intra-node tests: %+v", r.Ratios)
	}
	if want := []IntranodeRatio{
		{Size: 64, Latency: Stat{Median: 0.6, Min: 0.5, Max: 0.7, N: 3}, Throughput: Stat{Median: 0.9, Min: 0.8, Max: 1.1, N: 3}},
		{Size: 16384, Latency: Stat{Median: 0.7, Min: 0.5, Max: 0.8, N: 3}, Throughput: Stat{Median: 2.5, Min: 2, Max: 3, N: 3}},
	}; !slices.EqualFunc(r.IntranodeRatios, want, func(a, b IntranodeRatio) bool {
		return a.Size == b.Size && spread(a.Latency) == b.Latency && spread(a.Throughput) == b.Throughput
	}) {
		t.Fatalf("intra-node ratios\n%+v\nwant\n%+v", r.IntranodeRatios, want)
	}
	b := r.IntranodeBar
	if b == nil || len(b.Checks) != 2 || !b.Checks[0].Met || b.Checks[1].Met || b.Met {
		t.Fatalf("bar: ≤ 0.6 at 0.6 is met, at 0.7 not, so the bar is not: %+v", b)
	}
	if r.ServiceBar != nil {
		t.Fatalf("a Service bar without Service rows: %+v", r.ServiceBar)
	}

	results := jsonResults(t, r)
	if _, ok := results[0]["size"]; ok {
		t.Fatalf("a pod-to-pod result has a size: %v", results[0])
	}
	if got := results[2]; got["config"] != IntraBypass || got["size"] != 64.0 || got["latency_us"] != 60.0 {
		t.Fatalf("latest.json TCP_RR 64 B bypass result %v, want config, size and latency_us", got)
	}

	md := markdown(t, r,
		"| TCP_RR | 64 B | intranode-bypass | 16666.7 | 14285.7 – 20000.0 | Trans/s | 60.0 |",
		"| 16 KiB | 0.700 [0.500 – 0.800] (0.500 – 0.800, n = 3) | 2.500 [2.000 – 3.000] (2.000 – 3.000, n = 3) |",
		"**The bypass's TCP_STREAM throughput is lower than the stack's at 64 B (0.90 ×).**",
		"- TCP_RR 64 B latency intranode-bypass ÷ intranode-stack = 0.600 [0.500 – 0.700] (0.500 – 0.700, n = 3), want ≤ 0.6: met by the median, undecided by the 95 % interval",
		"- TCP_RR 16 KiB latency intranode-bypass ÷ intranode-stack = 0.700 [0.500 – 0.800] (0.500 – 0.800, n = 3), want ≤ 0.6: **not met** by the median, undecided by the 95 % interval",
		"**Bar not met.**")
	if strings.Contains(md, "| TCP_RR | intranode-") {
		t.Fatalf("intra-node rows in the pod-to-pod table, without their size:\n%s", md)
	}
	var svg strings.Builder
	r.SVG(&svg)
	for _, want := range []string{"TCP_RR 64 B intranode-bypass ÷ stack 0.600", "TCP_STREAM 16 KiB intranode-bypass ÷ stack 2.500", ">16 KiB</text>"} {
		if !strings.Contains(svg.String(), want) {
			t.Fatalf("chart lacks %q:\n%s", want, svg.String())
		}
	}
	if n := strings.Count(svg.String(), "<g "); n != 3 {
		t.Fatalf("chart has %d panels, want 3 (pod to pod, intra-node latency and throughput)", n)
	}
}

func TestReportIntranodeBarMet(t *testing.T) {
	samples := slices.Concat(
		intranodeSamples("TCP_RR", IntraStack, 1, 100, 100, 100),
		intranodeSamples("TCP_RR", IntraBypass, 1, 40, 50, 30),
		intranodeSamples("TCP_STREAM", IntraStack, 1, 100, 100, 100),
		intranodeSamples("TCP_STREAM", IntraBypass, 1, 100, 120, 90), // median 1: not lower
	)
	r := NewReport(samples, 3, 5*time.Second, "6.18")
	if b := r.IntranodeBar; b == nil || len(b.Checks) != 1 || !b.Met {
		t.Fatalf("bar at 0.4 not met: %+v", b)
	}
	md := markdown(t, r, "**Bar met.**", "The bypass's TCP_STREAM throughput is not lower than the stack's at any size measured.")
	if strings.Contains(md, "| test | config |") {
		t.Fatalf("an empty pod-to-pod table:\n%s", md)
	}

	// Without TCP_RR the bar is not measured, so not met.
	r = NewReport(samples[6:], 3, 5*time.Second, "6.18")
	markdown(t, r, "**Bar not met: not all of it was measured.**")
	if r.IntranodeBar.Met {
		t.Fatalf("bar without TCP_RR met: %+v", r.IntranodeBar)
	}
	var svg strings.Builder
	r.SVG(&svg)
	if n := strings.Count(svg.String(), "<g "); n != 1 || !strings.Contains(svg.String(), "TCP_STREAM throughput") {
		t.Fatalf("chart without TCP_RR has %d panels, want the throughput one:\n%s", n, svg.String())
	}
}

// A run that failed, or failed its path check (the bypass carried too
// little), is a row with its reason: counted in no median or ratio, and
// listed; the other runs of its size still give their ratio.
func TestReportIntranodeFailedRun(t *testing.T) {
	bypass := intranodeSamples("TCP_STREAM", IntraBypass, 16384, 2000, 3000, 9999)
	bypass[2].Error = "the bypass carried 46 bytes of the ≈100 netperf moved"
	samples := slices.Concat(intranodeSamples("TCP_STREAM", IntraStack, 16384, 1000, 1000, 1000), bypass)
	r := NewReport(samples, 3, 5*time.Second, "6.18")
	if s := r.Results[1]; s.Config != IntraBypass || s.N != 2 || s.Failed != 1 || s.Max != 3000 {
		t.Fatalf("bypass result %+v; want 2 runs counted, 1 failed, the failed value nowhere", s)
	}
	if x := r.IntranodeRatios[0].Throughput; x.N != 2 || x.Median != 2.5 {
		t.Fatalf("throughput ratio %+v; want the two good repetitions' (2, 3)", x)
	}
	markdown(t, r, "| TCP_STREAM | 16 KiB | intranode-bypass (1 of 3 runs failed) |",
		"| 3 | TCP_STREAM | 16 KiB intranode-bypass | the bypass carried 46 bytes of the ≈100 netperf moved |")
}

// The intra-node rows' netperf options, and the bytes a run moved that
// the bypass must have carried at least half of.
func TestIntranodeRun(t *testing.T) {
	if got := sizeOpts("TCP_RR", 64); !slices.Equal(got, []string{"-r", "64,64"}) {
		t.Fatalf("TCP_RR: %v", got)
	}
	if got := sizeOpts("TCP_STREAM", 16384); !slices.Equal(got, []string{"-m", "16384"}) {
		t.Fatalf("TCP_STREAM: %v", got)
	}
	if got := bytesMoved(Sample{Test: "TCP_RR", Size: 64, Value: 1000}, 2*time.Second); got != 256000 {
		t.Fatalf("TCP_RR of 64 B at 1000 Trans/s for 2 s moved %v bytes, want 256000", got)
	}
	if got := bytesMoved(Sample{Test: "TCP_STREAM", Size: 64, Value: 8}, 2*time.Second); got != 2e6 {
		t.Fatalf("TCP_STREAM at 8 Mb/s for 2 s moved %v bytes, want 2e6", got)
	}
}

// The pinned stream row is netperf's TCP_STREAM with both ends' buffers
// pinned; the plain row leaves them to the kernel's autotuning.
func TestNetperfTest(t *testing.T) {
	name, opts := netperfTest(PinnedStream)
	if name != "TCP_STREAM" || !slices.Equal(opts, []string{"-m", "65536", "-s", "4M", "-S", "4M"}) {
		t.Fatalf("%s: netperf -t %s %v", PinnedStream, name, opts)
	}
	name, opts = netperfTest("TCP_STREAM")
	if name != "TCP_STREAM" || slices.Contains(opts, "-s") || slices.Contains(opts, "-S") {
		t.Fatalf("TCP_STREAM: netperf -t %s %v", name, opts)
	}
	if name, opts = netperfTest("UDP_RR"); name != "UDP_RR" || opts != nil {
		t.Fatalf("UDP_RR: netperf -t %s %v", name, opts)
	}
}

// markdown is r's latest.md; t fails unless it holds every want.
func markdown(t *testing.T, r Report, want ...string) string {
	t.Helper()
	var md strings.Builder
	r.Markdown(&md)
	for _, w := range want {
		if !strings.Contains(md.String(), w) {
			t.Fatalf("markdown lacks %q:\n%s", w, md.String())
		}
	}
	return md.String()
}

// jsonResults are the results of r's latest.json, decoded as maps.
func jsonResults(t *testing.T, r Report) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	if err := r.JSON(&buf); err != nil {
		t.Fatal(err)
	}
	var shape struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(buf.Bytes(), &shape); err != nil {
		t.Fatal(err)
	}
	return shape.Results
}

// spread is s without its interval, for comparing medians and ranges.
func spread(s Stat) Stat {
	s.Lo, s.Hi = 0, 0
	return s
}

func TestMedianInterval(t *testing.T) {
	v := []float64{0.91, 0.93, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0, 1.02, 1.05}
	s := StatOf(v)
	if !(s.Lo <= s.Median && s.Median <= s.Hi) || s.Lo < s.Min || s.Hi > s.Max || s.Lo == s.Hi {
		t.Fatalf("interval [%v, %v] around median %v of %v", s.Lo, s.Hi, s.Median, v)
	}
	if again := StatOf(v); again != s {
		t.Fatalf("the same samples gave another interval: %+v, then %+v", s, again)
	}
	// The middle 95 % of resampled medians leaves out the extremes.
	if s.Lo == s.Min || s.Hi == s.Max {
		t.Fatalf("interval [%v, %v] reaches the range [%v, %v]", s.Lo, s.Hi, s.Min, s.Max)
	}
	if c := StatOf([]float64{2, 2, 2}); c.Lo != 2 || c.Hi != 2 {
		t.Fatalf("constant samples: interval [%v, %v]", c.Lo, c.Hi)
	}
}

func TestConfidence(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		op     string
		want   Confidence
	}{
		{0.92, 0.97, "≥", Met},
		{0.85, 0.95, "≥", Undecided},
		{0.70, 0.85, "≥", NotMet},
		{0.50, 0.55, "≤", Met},
		{0.55, 0.65, "≤", Undecided},
		{1.00, 1.10, ">", Undecided}, // 1 is not above 1
	} {
		if got := confidence(Stat{N: 10, Lo: c.lo, Hi: c.hi}, c.op, map[string]float64{"≥": 0.9, "≤": 0.6, ">": 1}[c.op]); got != c.want {
			t.Errorf("[%v, %v] %s: %s, want %s", c.lo, c.hi, c.op, got, c.want)
		}
	}
	if got := confidence(Stat{}, "≥", 1); got != Unmeasured {
		t.Errorf("no samples: %s", got)
	}
	if got := confidence(Stat{N: 3, Lo: 2, Hi: 3}, "≥", 1); got != Undecided {
		t.Errorf("three samples decided: %s", got)
	}
}

func TestOverheadRemoved(t *testing.T) {
	var samples []Sample
	add := func(rep int, cfg string, value, cpu float64) {
		samples = append(samples, Sample{Test: "TCP_RR", Config: cfg, Rep: rep, Value: value, CPU: cpu})
	}
	// Rates: the overlay costs 20 of 100; the fast path wins back 18, 20, 10.
	// CPU: the overlay adds 10 of 10; the fast path saves 9, 10, 5.
	for rep, fast := range []float64{98, 100, 90} {
		add(rep+1, "bare", 100, 10)
		add(rep+1, "slow", 80, 20)
		add(rep+1, "fast", fast, 20-(fast-80)/2)
	}
	add(4, "bare", 100, 10) // the overlay cost nothing: says nothing
	add(4, "slow", 100, 10)
	add(4, "fast", 100, 10)
	add(5, "bare", 100, 10) // noise: slow beat bare, no overhead to remove
	add(5, "slow", 101, 9)
	add(5, "fast", 150, 5)
	for rep, v := range []float64{80, 80, 72, 100, 75} {
		add(rep+1, "flannel", v, 20)
	}
	r := NewReport(samples, 5, time.Second, "test")
	x := r.Ratios[0]
	if got := spread(x.OverheadRemoved); got != (Stat{Median: 0.9, Min: 0.5, Max: 1, N: 3}) {
		t.Fatalf("overhead removed by rate %+v", got)
	}
	if got := spread(x.OverheadRemovedCPU); got != (Stat{Median: 0.9, Min: 0.5, Max: 1, N: 3}) {
		t.Fatalf("overhead removed by CPU %+v", got)
	}
	if x.PairedFastOnBare.Median != 1 || x.PairedFastOnSlow.N != 5 {
		t.Fatalf("paired fast ÷ bare %+v, fast ÷ slow %+v", x.PairedFastOnBare, x.PairedFastOnSlow)
	}
	if got := x.PairedFastOnFlannel; got.Median != 1.25 || got.Min != 1 || got.Max != 2 || got.N != 5 {
		t.Fatalf("paired fast ÷ flannel %+v", got)
	}
	for _, res := range r.Results {
		if res.Config == "fast" && !(res.Lo < res.Hi && res.Lo <= res.Median && res.Median <= res.Hi) {
			t.Fatalf("fast row without its interval: %+v", res)
		}
	}
	b := r.PodBar
	if b == nil || len(b.Checks) != len(podBar) || !b.Checks[0].Met || b.Checks[0].Confidence != Undecided || b.Checks[2].Confidence != Unmeasured || b.Met {
		t.Fatalf("pod bar %+v", b)
	}
	markdown(t, r,
		"| TCP_RR | 0.900 [",
		"- TCP_RR overhead removed (rate) = 0.900 [",
		"want ≥ 0.9: met by the median, undecided by the 95 % interval",
		"- UDP_RR overhead removed (rate) = –, want ≥ 0.9: not measured",
		"- TCP_RR paired fast ÷ flannel = 1.250 [",
		"- REDIS_GET paired fast ÷ bare = –, want ≥ 0.95: not measured",
		"By the 95 % intervals, of 9 checks: ")
}

func TestParseRedis(t *testing.T) {
	out := []byte(`"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","75471.70","0.345","0.096","0.335","0.503","0.615","1.031"
"GET","78616.35","0.331","0.088","0.327","0.471","0.567","0.943"
`)
	got, err := parseRedis(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Sample{{Test: "REDIS_SET", Value: 75471.70, Unit: "requests/s"}, {Test: "REDIS_GET", Value: 78616.35, Unit: "requests/s"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
	for _, bad := range []string{
		"",                        // nothing
		`"SET","75471.70"` + "\n", // no header
		`"test","rps"` + "\n" + `"SET","0"` + "\n",   // no rate
		`"test","rps"` + "\n" + `"SET","1.5"` + "\n", // GET missing
	} {
		if _, err := parseRedis([]byte(bad)); err == nil {
			t.Errorf("parseRedis(%q) gave no error", bad)
		}
	}
}

// The flow-record rows: records on ÷ off paired per repetition, without
// and with the policy, judged against the bar on every test; the agent's
// memory is reported as measured, or why not.
func TestReportFlows(t *testing.T) {
	var samples []Sample
	add := func(test, cfg string, vals ...float64) {
		for i, v := range vals {
			samples = append(samples, Sample{Test: test, Config: cfg, Rep: i + 1, Value: v, Unit: "Trans/s"})
		}
	}
	add("TCP_RR", FlowsOff, 100, 100, 100)
	add("TCP_RR", FlowsOn, 99, 98, 101)
	add("TCP_RR", FlowsOffPolicy, 100, 100, 100)
	add("TCP_RR", FlowsOnPolicy, 98, 99, 100)
	add("TCP_CRR", FlowsOff, 100, 100, 100)
	add("TCP_CRR", FlowsOn, 99, 97, 98)
	add("TCP_CRR", FlowsOffPolicy, 100, 100, 100)
	add("TCP_CRR", FlowsOnPolicy, 90, 96, 95) // 0.95: below the bar
	r := NewReport(samples, 3, 5*time.Second, "6.18")
	r.FlowsMemory = &FlowsMemory{Held: 8192, Buffer: 8192, BurstSeconds: 10, RSSOnKiB: 61440, RSSOffKiB: 51200}
	if len(r.FlowsRatios) != 2 || r.FlowsRatios[0].Test != "TCP_RR" || r.FlowsRatios[0].OnOff.Median != 0.99 ||
		r.FlowsRatios[1].OnOffPolicy.Median != 0.95 || r.FlowsRatios[1].PolicyOnNoPolicy.Median != 95.0/98 {
		t.Fatalf("flows ratios %+v", r.FlowsRatios)
	}
	if b := r.FlowsBar; b == nil || len(b.Checks) != 4 || b.Met || !b.Checks[0].Met || b.Checks[3].Met {
		t.Fatalf("flows bar %+v: want 4 checks, TCP_CRR with the policy not met", b)
	}
	markdown(t, r, "## Flow records on versus off", "| TCP_CRR | 0.980 [", "the store holding 8192 records (of 8192): 60.0 MiB; records off after the same: 50.0 MiB (+10.0 MiB)")
	if strings.Contains(markdown(t, r), "| TCP_RR Service") {
		t.Fatal("flow rows taken for Service rows")
	}
	var svg strings.Builder
	r.SVG(&svg)
	if !strings.Contains(svg.String(), "TCP_CRR flow records") {
		t.Fatalf("chart lacks the flow-record groups:\n%s", svg.String())
	}
	r.FlowsMemory = &FlowsMemory{Error: "pid 7: no VmRSS"}
	markdown(t, r, "Agent memory: not measured: pid 7: no VmRSS")
}
