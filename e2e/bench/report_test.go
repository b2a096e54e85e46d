package bench

import (
	"bytes"
	"encoding/json"
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
	for _, k := range []string{"test", "config", "median", "min", "max", "unit"} {
		if _, ok := shape.Results[0][k]; !ok {
			t.Fatalf("latest.json result lacks %q: %s", k, buf.String())
		}
	}
	var md, svg strings.Builder
	r.Markdown(&md)
	r.SVG(&svg)
	if !strings.Contains(md.String(), "| TCP_RR | 1.65 | 1.32 | 0.80 |") {
		t.Fatalf("markdown ratios:\n%s", md.String())
	}
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
	if want := (Stat{Median: 1, Min: 0.375, Max: 1.5, N: 3}); got != want {
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
	if rr.Test != "TCP_RR" || rr.SockLBOnPodIP != (Stat{Median: 0.97, Min: 0.95, Max: 1.1, N: 3}) ||
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
	var md strings.Builder
	r.Markdown(&md)
	for _, want := range []string{
		"| TCP_RR | 0.970 (0.950 – 1.100, n = 3) | 1.900 (1.833 – 1.940, n = 3) | 0.500 (0.500 – 0.600, n = 3) |",
		"- TCP_RR service-socklb ÷ service-podip = 0.970 (0.950 – 1.100, n = 3), want ≥ 0.97: met",
		"- TCP_CRR service-socklb ÷ service-kubeproxy = 1.000 (0.900 – 1.100, n = 3), want > 1: **not met**",
		"**Bar not met.**",
	} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("markdown lacks %q:\n%s", want, md.String())
		}
	}
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
