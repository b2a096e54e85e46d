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
