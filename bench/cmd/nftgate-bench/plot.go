package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// proxierColors keeps each proxier's colour the same in every panel.
var proxierColors = map[string]color.Color{
	proxNftgate:    color.RGBA{R: 0x1b, G: 0x9e, B: 0x77, A: 0xff},
	proxKPNFTables: color.RGBA{R: 0xd9, G: 0x5f, B: 0x02, A: 0xff},
	proxKPIPTables: color.RGBA{R: 0x75, G: 0x70, B: 0xb3, A: 0xff},
}

// panel is one chart: a value of each result against N.
type panel struct {
	title, unit string
	log         bool
	value       func(Result) float64
}

var panels = []panel{
	{"Endpoint change p50", "ms", true, func(r Result) float64 { return r.ChangeP50Ms }},
	{"Cold start", "s", true, func(r Result) float64 { return r.ColdStartSeconds }},
	{"Resident memory", "MiB", false, func(r Result) float64 { return r.RSSMiB }},
}

// Plot draws the panels side by side into a PNG file at path, one line
// per proxier.
func (r *Report) Plot(path string) (err error) {
	// gonum/plot panics on axis ranges it cannot draw; a bad plot must not
	// take the measurements with it.
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("plot %s: %v", path, v)
		}
	}()
	var sizes []int
	for _, res := range r.Results {
		sizes = append(sizes, res.Services)
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	logX := len(sizes) > 1

	row := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.X.Label.Text = "Services (N)"
		p.Y.Label.Text = pn.unit
		if logX {
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = sizeTicks(sizes)
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, res := range r.Results {
			if res.TimedOut != "" && pn.title != "Cold start" {
				continue
			}
			v := max(pn.value(res), 1e-3) // a log axis cannot show zero
			lo, hi = min(lo, v), max(hi, v)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
		for _, name := range allProxiers {
			var xys plotter.XYs
			for _, res := range r.Results {
				if res.Proxier != name || (res.TimedOut != "" && pn.title != "Cold start") {
					continue // a lower bound only: shown on the cold start panel
				}
				v := pn.value(res)
				if pn.log {
					v = max(v, 1e-3)
				}
				xys = append(xys, plotter.XY{X: float64(res.Services), Y: v})
			}
			if len(xys) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = proxierColors[name], proxierColors[name]
			line.Width = vg.Points(2)
			points.Shape = draw.CircleGlyph{}
			p.Add(line, points)
			p.Legend.Add(name, line, points)
		}
		// Fixed ranges with room for the legend above the lines; they
		// also keep a single point drawable.
		if pn.log {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			p.Y.Min, p.Y.Max = lo/2, hi*8
		} else {
			p.Y.Min, p.Y.Max = 0, hi*1.4
		}
		if logX {
			p.X.Min, p.X.Max = float64(sizes[0])/1.5, float64(sizes[len(sizes)-1])*1.5
		}
		row[i] = p
	}

	return saveRow(path, row)
}

// saveRow draws plots side by side, 5 inches each, into a PNG file at
// path.
func saveRow(path string, row []*plot.Plot) error {
	w, h := vg.Length(len(row))*5*vg.Inch, 5*vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// sizeTicks labels exactly the sizes measured.
type sizeTicks []int

func (s sizeTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for _, n := range s {
		ts = append(ts, plot.Tick{Value: float64(n), Label: thousands(n)})
	}
	return ts
}
