package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

var seriesStyle = map[string]struct{ color, label string }{
	"A": {"#1f77b4", "A: middleware on"},
	"B": {"#ff7f0e", "B: middleware off"},
	"C": {"#2ca02c", "C: floor (Claim+Complete via pgx, no HTTP)"},
}

// chart draws two panels, throughput and p99 latency against clients, for
// A, B and C in unique mode: plain SVG, no library.
func (r *report) chart() string {
	const (
		width, height = 1030, 400
		panelW        = 400
		panelH        = 270
		top           = 80
	)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	pgVersion, _, _ := strings.Cut(r.Machine.Postgres, " ")
	title := fmt.Sprintf("POST /api/trading/orders, a new key per request (%s cores, PostgreSQL %s, %s)", r.Machine.Nproc, pgVersion, r.Machine.Date)
	fmt.Fprintf(&b, `<text x="%d" y="24" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", width/2, esc(title))
	// Legend.
	x := 150
	for _, s := range subjects {
		st := seriesStyle[s]
		fmt.Fprintf(&b, `<line x1="%d" y1="46" x2="%d" y2="46" stroke="%s" stroke-width="3"/><circle cx="%d" cy="46" r="4" fill="%s"/>`, x, x+28, st.color, x+14, st.color)
		fmt.Fprintf(&b, `<text x="%d" y="50">%s</text>`+"\n", x+34, esc(st.label))
		x += 250
	}
	r.panel(&b, 80, top, panelW, panelH, "Throughput", "requests/s", func(g *group) float64 { return g.Median.RPS })
	r.panel(&b, 80+panelW+120, top, panelW, panelH, "p99 latency", "ms", func(g *group) float64 { return g.Median.P99Ms })
	b.WriteString("</svg>\n")
	return b.String()
}

func (r *report) panel(b *strings.Builder, x0, y0, w, h int, title, unit string, value func(*group) float64) {
	maxV := 0.0
	for _, s := range subjects {
		for _, c := range levels {
			if g := r.Groups[key(s, "unique", c)]; g != nil {
				maxV = max(maxV, value(g))
			}
		}
	}
	top, step := niceScale(maxV)
	xAt := func(i int) float64 { return float64(x0) + 20 + float64(i)*float64(w-40)/float64(len(levels)-1) }
	yAt := func(v float64) float64 { return float64(y0+h) - v/top*float64(h) }

	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" font-size="14" font-weight="bold">%s</text>`+"\n", x0+w/2, y0-10, esc(title))
	for v := 0.0; v <= top+step/2; v += step {
		y := yAt(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, x0, y, x0+w, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, tick(v, step))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y0, w, h)
	for i, c := range levels {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`, xAt(i), y0+h+18, c)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">concurrent clients</text>`+"\n", x0+w/2, y0+h+38)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)">%s</text>`+"\n",
		x0-52, y0+h/2, x0-52, y0+h/2, esc(unit))
	for _, s := range subjects {
		st := seriesStyle[s]
		var pts []string
		for i, c := range levels {
			g := r.Groups[key(s, "unique", c)]
			if g == nil {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(i), yAt(value(g))))
		}
		if len(pts) == 0 {
			continue
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2.5"/>`+"\n", strings.Join(pts, " "), st.color)
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="4" fill="%s"/>`, xy[0], xy[1], st.color)
		}
		b.WriteString("\n")
	}
}

// niceScale returns an axis top and tick step (1, 2 or 5 times a power of
// ten) covering v with about five ticks.
func niceScale(v float64) (top, step float64) {
	if v <= 0 {
		return 1, 0.2
	}
	raw := v / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * p
		if step >= raw {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}

func tick(v, step float64) string {
	if step >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

func esc(s string) string { return html.EscapeString(s) }
