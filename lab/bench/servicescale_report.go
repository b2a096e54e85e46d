package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// ScaleNote is said in every Services scale report.
const ScaleNote = "Absolute numbers from a shared 2-core VM are noise until measured on a quiet machine. " +
	"The sizes run one after another, minutes apart, so the TCP_CRR ratio at N ÷ at the smallest N is not paired: " +
	"its interval resamples the two sets apart."

// ScaleReport is what bench-results/services-scale.json holds.
type ScaleReport struct {
	Date      string       `json:"date"`
	Kernel    string       `json:"kernel"`
	CPUs      int          `json:"cpus"`
	Note      string       `json:"note"`
	Endpoints int          `json:"endpoints"` // of each fake Service
	Reps      int          `json:"reps"`
	Duration  string       `json:"duration"`
	Rows      []ScaleRow   `json:"rows"`
	Ratios    []ScaleRatio `json:"ratios"`
	Bar       *BarVerdict  `json:"bar,omitempty"`
}

// ScaleRatio is one proxy's TCP_CRR at N Services ÷ at Base, the smallest
// N measured.
type ScaleRatio struct {
	Proxy    string `json:"proxy"`
	Services int    `json:"services"`
	Base     int    `json:"base"`
	CRR      Stat   `json:"crr"`
}

// Issue 27's bar for ONC at BarServices Services.
const (
	BarServices   = 10000
	BarProgramS   = 10.0
	BarCRRAtScale = 0.97
)

// NewScaleReport adds the ratios and the bar to rows.
func NewScaleReport(rows []ScaleRow) ScaleReport {
	r := ScaleReport{Note: ScaleNote, Rows: rows}
	values := func(row ScaleRow) []float64 {
		var v []float64
		for _, s := range row.Samples {
			if s.Error == "" {
				v = append(v, s.Value)
			}
		}
		return v
	}
	for _, p := range Proxies {
		var base *ScaleRow
		for i, row := range rows {
			if row.Proxy != p || row.Error != "" {
				continue
			}
			if base == nil || row.Services < base.Services {
				base = &rows[i]
			}
		}
		for _, row := range rows {
			if base != nil && row.Proxy == p && row.Error == "" && row.Services != base.Services {
				r.Ratios = append(r.Ratios, ScaleRatio{Proxy: p, Services: row.Services, Base: base.Services, CRR: RatioOfMedians(values(row), values(*base))})
			}
		}
	}
	r.Bar = &BarVerdict{Met: true}
	var program, crr Stat
	for _, row := range rows {
		if row.Proxy == ProxyONC && row.Services == BarServices && row.Error == "" {
			program = Stat{Median: row.ProgramS, Min: row.ProgramS, Max: row.ProgramS, N: 1, Lo: row.ProgramS, Hi: row.ProgramS}
		}
	}
	for _, x := range r.Ratios {
		if x.Proxy == ProxyONC && x.Services == BarServices {
			crr = x.CRR
		}
	}
	what := strconv.Itoa(BarServices) + " Services"
	r.Bar.add(BarCheck{Test: "programming", Ratio: ProxyONC + " seconds at " + what, Stat: program}, "≤", BarProgramS)
	r.Bar.add(BarCheck{Test: "TCP_CRR", Ratio: ProxyONC + " at " + what + " ÷ at the smallest N", Stat: crr}, "≥", BarCRRAtScale)
	return r
}

// JSON writes the report.
func (r ScaleReport) JSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// Markdown writes the report's tables.
func (r ScaleReport) Markdown(w io.Writer) {
	fmt.Fprintf(w, "# Services at scale\n\nRun %s, kernel %s, %d CPUs; %d TCP_CRR runs of %s per proxy and size.\n\n**Machine.** %s\n\n",
		r.Date, r.Kernel, r.CPUs, r.Reps, r.Duration, r.Note)
	fmt.Fprintf(w, "N ClusterIP Services in one namespace, all but one with %d endpoints at addresses no pod holds, written as EndpointSlices; "+
		"the other (`%s`) has the netserver pod on node 1 as its backend. "+
		"`%s`: ONC's kube-proxy replacement; `%s`, `%s`: real kube-proxy in that mode on both nodes, ONC's socket LB off. "+
		"Programming: node 0's agent (or kube-proxy, its rules removed first) restarted with the N Services in the API, until it has programmed all N "+
		"(the agent's onctl services, each with its endpoints; kube-proxy's KUBE-SERVICES rules, or its service-ips map's elements), polled every 250 ms. "+
		"Memory: resident, after programming; kube-proxy's rules in the kernel are counted in neither. "+
		"TCP_CRR: from the client pod on node 0 to the ClusterIP, each run path-checked (ONC's socket LB translated; kube-proxy's rule matched; "+
		"netfilter translated with no iptables rule, kube-proxy's nftables table having no counters).\n\n", r.Endpoints, svcName, ProxyONC, ProxyIPTables, ProxyNFTables)
	fmt.Fprintln(w, "| Services | proxy | programming s | agent RSS MB | kube-proxy RSS MB | TCP_CRR Trans/s | failed runs |")
	fmt.Fprintln(w, "| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
	rows := slices.Clone(r.Rows)
	slices.SortStableFunc(rows, func(a, b ScaleRow) int {
		if a.Services != b.Services {
			return a.Services - b.Services
		}
		return slices.Index(Proxies, a.Proxy) - slices.Index(Proxies, b.Proxy)
	})
	for _, x := range rows {
		if x.Error != "" {
			fmt.Fprintf(w, "| %d | %s | failed: %s ||||||\n", x.Services, x.Proxy, oneLine(x.Error))
			continue
		}
		failed := 0
		for _, s := range x.Samples {
			if s.Error != "" {
				failed++
			}
		}
		kp := "–"
		if x.KubeProxyRSSMB > 0 {
			kp = fmt.Sprintf("%.1f", x.KubeProxyRSSMB)
		}
		fmt.Fprintf(w, "| %d | %s | %.2f | %.1f | %s | %s | %d |\n", x.Services, x.Proxy, x.ProgramS, x.AgentRSSMB, kp, x.CRR, failed)
	}
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "TCP_CRR at N ÷ at the smallest N: ratio of medians [bootstrap 95 % interval, the two sets resampled apart] (extreme ratios, n).")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| proxy | Services | ÷ Services | TCP_CRR ratio |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
		for _, x := range r.Ratios {
			fmt.Fprintf(w, "| %s | %d | %d | %s |\n", x.Proxy, x.Services, x.Base, x.CRR)
		}
	}
	r.Bar.markdown(w)
	var failed []Sample
	for _, x := range r.Rows {
		for _, s := range x.Samples {
			if s.Error != "" {
				failed = append(failed, s)
			}
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "\n## Failed runs\n\n| rep | config | reason |\n| ---: | --- | --- |\n")
		for _, s := range failed {
			fmt.Fprintf(w, "| %d | %s | %s |\n", s.Rep, s.Config, oneLine(s.Error))
		}
	}
}

// SVG draws the programming time by size, each proxy a bar (dashed: the
// bar's 10 s).
func (r ScaleReport) SVG(w io.Writer) {
	colors := map[string]string{ProxyONC: "#1e88e5", ProxyIPTables: "#fb8c00", ProxyNFTables: "#8d6e63"}
	c := Chart{Title: "Services at scale: programming time (s) by number of Services, " + r.Date, YMin: BarProgramS * 1.2, Ref: BarProgramS}
	for _, p := range Proxies {
		c.Series = append(c.Series, Series{Name: p, Color: colors[p]})
	}
	for _, x := range r.Rows {
		if x.Error != "" {
			continue
		}
		label := strconv.Itoa(x.Services)
		i := slices.IndexFunc(c.Groups, func(g Group) bool { return g.Label == label })
		if i < 0 {
			c.Groups = append(c.Groups, Group{Label: label})
			i = len(c.Groups) - 1
		}
		c.Groups[i].Bars = append(c.Groups[i].Bars, Bar{Series: x.Proxy, Value: x.ProgramS, Label: fmt.Sprintf("%.1f", x.ProgramS),
			Title: fmt.Sprintf("%s, %d Services: %.2f s", x.Proxy, x.Services, x.ProgramS)})
	}
	c.SVG(w)
}
