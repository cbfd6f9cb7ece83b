//go:build linux

package harness

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"}

// barChart draws groups of bars: one group per system, one bar per series.
func barChart(title, unit string, systems []string, series []string, value func(sys, ser string) float64) string {
	const w, h, left, bottom, top = 760, 360, 70, 80, 40
	maxV := 0.0
	for _, s := range systems {
		for _, ser := range series {
			if v := value(s, ser); !math.IsNaN(v) && v > maxV {
				maxV = v
			}
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="15">%s</text>`, left, html.EscapeString(title))
	plotH := float64(h - bottom - top)
	groupW := float64(w-left-20) / float64(max(1, len(systems)))
	barW := groupW * 0.8 / float64(max(1, len(series)))
	for i := 0; i <= 4; i++ {
		y := float64(top) + plotH*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.3g</text>`,
			left, y, w-20, y, left-6, y+4, maxV*float64(4-i)/4)
	}
	fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)">%s</text>`, top+int(plotH/2), top+int(plotH/2), html.EscapeString(unit))
	for i, s := range systems {
		gx := float64(left) + groupW*float64(i) + groupW*0.1
		for j, ser := range series {
			v := value(s, ser)
			if math.IsNaN(v) {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10">n/a</text>`, gx+barW*float64(j), float64(top)+plotH-4)
				continue
			}
			bh := plotH * v / maxV
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %.4g %s</title></rect>`,
				gx+barW*float64(j), float64(top)+plotH-bh, barW-2, bh, palette[j%len(palette)], html.EscapeString(s), html.EscapeString(ser), v, html.EscapeString(unit))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" transform="rotate(30 %.1f %d)">%s</text>`, gx, h-bottom+16, gx, h-bottom+16, html.EscapeString(s))
	}
	if len(series) > 1 {
		for j, ser := range series {
			fmt.Fprintf(&b, `<rect x="%d" y="30" width="10" height="10" fill="%s"/><text x="%d" y="39">%s</text>`, w-220+j*70, palette[j%len(palette)], w-206+j*70, html.EscapeString(ser))
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func writePlots(dir string, sum Summary, systems []System) error {
	var names []string
	for _, s := range systems {
		names = append(names, s.Name())
	}
	get := func(w string) func(sys, m string) float64 {
		return func(sys, m string) float64 {
			if v, ok := sum[w][sys][m]; ok {
				return v
			}
			return math.NaN()
		}
	}
	plots := map[string]string{
		"latency.svg": barChart("TCP request/response latency (lower is better)", "µs", names, []string{"p50_us", "p99_us", "p99.9_us"}, get("tcp-rr")),
	}
	for _, w := range Workloads() {
		if w.Name == "tcp-rr" || w.Name == "half-close" {
			continue
		}
		better := "higher"
		if w.Lower {
			better = "lower"
		}
		plots[w.Name+".svg"] = barChart(fmt.Sprintf("%s: %s (%s is better)", w.Name, w.Primary, better), w.Primary, names, []string{w.Primary}, get(w.Name))
	}
	for name, svg := range plots {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	return nil
}
