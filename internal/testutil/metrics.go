package testutil

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// ParseMetrics parses a /metrics body with the Prometheus text parser and
// fails t if it does not parse or `promtool check metrics` says anything
// about it.
func ParseMetrics(t testing.TB, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	var p expfmt.TextParser
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("metrics do not parse: %v\n%s", err, body)
	}
	promtool, err := exec.LookPath("promtool")
	Require(t, err == nil, "promtool not installed (make prereqs)")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	return families
}

// ScrapeMetrics GETs url (a /metrics endpoint this process can reach) and
// parses it as ParseMetrics does.
func ScrapeMetrics(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return ParseMetrics(t, body)
}

// MetricValue is the value of the counter or gauge of family whose labels
// are labels (all of them, in any order); ok false if there is none.
func MetricValue(families map[string]*dto.MetricFamily, family string, labels map[string]string) (v float64, ok bool) {
	f := families[family]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if want, has := labels[l.GetName()]; !has || want != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}
