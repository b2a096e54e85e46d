package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
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
	const width, height, left, top, barW, gap = 720, 360, 60, 40, 40, 30
	colors := map[string]string{"bare": "#9e9e9e", "slow": "#e57373", "fast": "#43a047"}
	bare := map[string]float64{}
	maxRel := 1.2
	for _, s := range r.Results {
		if s.Config == "bare" {
			bare[s.Test] = s.Median
		}
	}
	for _, s := range r.Results {
		if b := bare[s.Test]; b > 0 && s.Max/b > maxRel {
			maxRel = s.Max / b
		}
	}
	plotH := float64(height - top - 50)
	y := func(rel float64) float64 { return float64(top) + plotH*(1-rel/maxRel) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">ONC: median relative to bare underlay (whiskers: min–max), %s</text>`+"\n", left, r.Date)
	for _, g := range []float64{0, 0.25, 0.5, 0.75, 1, 1.25} {
		if g > maxRel {
			break
		}
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.2f</text>`+"\n",
			left, width-10, y(g), y(g), left-5, y(g)+4, g)
	}
	x := left + 10
	var test string
	for _, s := range r.Results {
		if s.Test != test {
			if test != "" {
				x += gap
			}
			test = s.Test
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x, height-25, s.Test)
		}
		bv := bare[s.Test]
		if bv == 0 {
			continue
		}
		rel, lo, hi := s.Median/bv, s.Min/bv, s.Max/bv
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="%s"><title>%s %s %.2f</title></rect>`+"\n",
			x, y(rel), barW, y(0)-y(rel), colors[s.Config], s.Test, s.Config, rel)
		cx := x + barW/2
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#000"/>`+"\n", cx, cx, y(lo), y(hi))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="middle" font-size="10">%.2f</text>`+"\n", cx, y(hi)-4, rel)
		x += barW + 4
	}
	lx := left + 10
	for _, c := range Configs {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", lx, height-15, colors[c], lx+16, height-5, c)
		lx += 70
	}
	b.WriteString("</svg>\n")
	_, _ = io.WriteString(w, b.String())
}
