package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Chart is a grouped bar chart, optionally with whiskers per bar and a
// dashed reference line: latest.svg (netperf, in panels) and scale.svg
// (the scale bed) are both drawn with it.
type Chart struct {
	Title  string
	Series []Series // the legend, in order; bars take their colour from it
	Groups []Group
	YMin   float64 // the y axis reaches at least this
	Ref    float64 // a dashed line at this value (0: none)
}

// Series is one colour of bars.
type Series struct{ Name, Color string }

// Group is bars side by side under one label.
type Group struct {
	Label string
	Bars  []Bar
}

// Bar is one value of a series.
type Bar struct {
	Series string
	Value  float64
	Lo, Hi float64 // a whisker from Lo to Hi (none if both are 0)
	Label  string  // printed above the bar
	Title  string  // shown on hover
}

// chartHeight is one chart's, or one panel's.
const chartHeight = 360

// SVG draws the chart.
func (c Chart) SVG(w io.Writer) { Panels(w, c) }

// Panels draws charts one above the other in one SVG.
func Panels(w io.Writer, charts ...Chart) {
	var b strings.Builder
	width := 0
	for i, c := range charts {
		fmt.Fprintf(&b, `<g transform="translate(0,%d)">`+"\n", i*chartHeight)
		width = max(width, c.draw(&b))
		b.WriteString("</g>\n")
	}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, len(charts)*chartHeight)
	_, _ = io.WriteString(w, b.String())
	_, _ = io.WriteString(w, "</svg>\n")
}

// draw writes the chart's elements to b and returns its width.
func (c Chart) draw(b *strings.Builder) int {
	const height, left, top, barW, gap = chartHeight, 60, 40, 40, 30
	colors := map[string]string{}
	for _, s := range c.Series {
		colors[s.Name] = s.Color
	}
	maxY, width := max(c.YMin, c.Ref*1.1), left+10
	for _, g := range c.Groups {
		for _, b := range g.Bars {
			maxY = max(maxY, b.Value, b.Hi)
		}
		width += len(g.Bars)*(barW+4) + gap
	}
	width = max(width, 720, left+10+len(c.Series)*legendW(c.Series))
	if maxY <= 0 {
		maxY = 1
	}
	plotH := float64(height - top - 50)
	y := func(v float64) float64 { return float64(top) + plotH*(1-v/maxY) }
	fmt.Fprintf(b, `<text x="%d" y="20" font-size="14">%s</text>`+"\n", left, esc(c.Title))
	step := tickStep(maxY)
	for g := 0.0; g <= maxY+1e-9; g += step {
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, width-10, y(g), y(g), left-5, y(g)+4, tickLabel(g, step))
	}
	if c.Ref > 0 {
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="6,4"/>`+"\n", left, width-10, y(c.Ref), y(c.Ref))
	}
	x := left + 10
	for _, g := range c.Groups {
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", x, height-25, esc(g.Label))
		for _, bar := range g.Bars {
			v := max(bar.Value, 0)
			fmt.Fprintf(b, `<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
				x, y(v), barW, y(0)-y(v), colors[bar.Series], esc(bar.Title))
			cx, labelY := x+barW/2, y(v)-4
			if bar.Lo != 0 || bar.Hi != 0 {
				fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#000"/>`+"\n", cx, cx, y(bar.Lo), y(bar.Hi))
				labelY = y(bar.Hi) - 4
			}
			fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="middle" font-size="10">%s</text>`+"\n", cx, labelY, esc(bar.Label))
			x += barW + 4
		}
		x += gap
	}
	lx := left + 10
	for _, s := range c.Series {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", lx, height-15, s.Color, lx+16, height-5, esc(s.Name))
		lx += legendW(c.Series)
	}
	return width
}

// legendW is the room one legend entry takes: its longest name's.
func legendW(series []Series) int {
	n := 0
	for _, s := range series {
		n = max(n, len([]rune(s.Name)))
	}
	return max(70, 24+7*n)
}

// tickStep is a round step that gives 4 to 10 gridlines up to maxY.
func tickStep(maxY float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(maxY)))
	for _, m := range []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10} {
		if s := m * mag; maxY/s <= 10 && maxY/s >= 4 {
			return s
		}
	}
	return mag
}

func tickLabel(v, step float64) string {
	if step < 1 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

var esc = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace
