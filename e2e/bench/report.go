package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	Samples  []Sample  `json:"samples"`
}

// Ratio of medians for one test.
type Ratio struct {
	Test       string  `json:"test"`
	FastOnSlow float64 `json:"fastOnSlow"`
	FastOnBare float64 `json:"fastOnBare"`
	SlowOnBare float64 `json:"slowOnBare"`
}

// NewReport summarises samples.
func NewReport(samples []Sample, reps int, d time.Duration, kernel string) Report {
	r := Report{Date: time.Now().UTC().Format(time.RFC3339), Kernel: kernel, Reps: reps, Duration: d.String(),
		Results: Summarize(samples), Samples: samples}
	med := map[string]float64{}
	var tests []string
	for _, s := range r.Results {
		if len(tests) == 0 || tests[len(tests)-1] != s.Test { // Results are grouped by test
			tests = append(tests, s.Test)
		}
		med[s.Test+"/"+s.Config] = s.Median
	}
	for _, t := range tests {
		r.Ratios = append(r.Ratios, Ratio{Test: t, FastOnSlow: div(med[t+"/fast"], med[t+"/slow"]),
			FastOnBare: div(med[t+"/fast"], med[t+"/bare"]), SlowOnBare: div(med[t+"/slow"], med[t+"/bare"])})
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
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| test | fast ÷ slow | fast ÷ bare | slow ÷ bare |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	for _, x := range r.Ratios {
		fmt.Fprintf(w, "| %s | %.2f | %.2f | %.2f |\n", x.Test, x.FastOnSlow, x.FastOnBare, x.SlowOnBare)
	}
}

// SVG draws, per test, each config's median relative to bare (bars) with
// its min–max range (whiskers).
func (r Report) SVG(w io.Writer) {
	colors := map[string]string{"bare": "#9e9e9e", "slow": "#e57373", "fast": "#43a047"}
	c := Chart{Title: "ONC: median relative to bare underlay (whiskers: min–max), " + r.Date, YMin: 1.2}
	for _, cfg := range Configs {
		c.Series = append(c.Series, Series{Name: cfg, Color: colors[cfg]})
	}
	bare := map[string]float64{}
	for _, s := range r.Results {
		if s.Config == "bare" {
			bare[s.Test] = s.Median
		}
	}
	for _, s := range r.Results {
		if len(c.Groups) == 0 || c.Groups[len(c.Groups)-1].Label != s.Test { // Results are grouped by test
			c.Groups = append(c.Groups, Group{Label: s.Test})
		}
		bv := bare[s.Test]
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
