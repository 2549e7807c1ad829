package report

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one named line.
type Series struct {
	Name string
	X, Y []float64
	// Step draws the line as a step function (a gauge sampled over time).
	Step bool
}

// Mark is a horizontal (Y) or vertical (X) reference line.
type Mark struct {
	Name     string
	X, Y     float64 // the one that is not NaN is drawn
	Vertical bool
}

// CDF plots the empirical cumulative distribution of each named sample set,
// in the order of names, x in the samples' unit (log scale when logX).
func CDF(path, title, xlabel string, names []string, samples map[string][]float64, logX bool) error {
	var series []Series
	for _, n := range names {
		s := slices.Clone(samples[n])
		if len(s) == 0 {
			continue
		}
		slices.Sort(s)
		ser := Series{Name: fmt.Sprintf("%s (n=%d)", n, len(s))}
		for i, x := range s {
			ser.X = append(ser.X, x)
			ser.Y = append(ser.Y, float64(i+1)/float64(len(s)))
		}
		series = append(series, ser)
	}
	p := newPlot(title, xlabel, "fraction of calls ≤ x")
	if logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Y.Min, p.Y.Max = 0, 1
	if err := addSeries(p, series, logX); err != nil {
		return err
	}
	return p.Save(20*vg.Centimeter, 12*vg.Centimeter, path)
}

// Lines plots series over a shared x axis with reference marks.
func Lines(path, title, xlabel, ylabel string, series []Series, marks []Mark) error {
	p := newPlot(title, xlabel, ylabel)
	if err := addSeries(p, series, false); err != nil {
		return err
	}
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range series {
		for i := range s.X {
			xmin, xmax, ymax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i]), math.Max(ymax, s.Y[i])
		}
	}
	for _, m := range marks {
		if !m.Vertical {
			ymax = math.Max(ymax, m.Y)
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	ymax *= 1.1
	if ymax == 0 {
		ymax = 1
	}
	p.Y.Min, p.Y.Max = 0, ymax
	for i, m := range marks {
		var pts plotter.XYs
		if m.Vertical {
			pts = segment(m.X, 0, m.X, ymax)
		} else {
			pts = segment(xmin, m.Y, xmax, m.Y)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: uint8(40 + 50*(i%3))}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Width = vg.Points(1)
		p.Add(l)
		if m.Name != "" {
			p.Legend.Add(m.Name, l)
		}
	}
	return p.Save(20*vg.Centimeter, 12*vg.Centimeter, path)
}

func newPlot(title, xlabel, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	return p
}

func addSeries(p *plot.Plot, series []Series, logX bool) error {
	for i, s := range series {
		var pts plotter.XYs
		for j := range s.X {
			if logX && s.X[j] <= 0 {
				continue
			}
			pts = append(pts, plotter.XY{
				X: s.X[j],
				Y: s.Y[j],
			})
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.Name, err)
		}
		if s.Step {
			l.StepStyle = plotter.PostStep
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		l.Dashes = plotutil.Dashes(i / 7)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	p.Legend.ThumbnailWidth = 0.6 * vg.Centimeter
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Legend.Padding = vg.Points(1)
	return nil
}

// segment is the line from (x0, y0) to (x1, y1).
func segment(x0, y0, x1, y1 float64) plotter.XYs {
	pts := make(plotter.XYs, 2)
	pts[0].X, pts[0].Y = x0, y0
	pts[1].X, pts[1].Y = x1, y1
	return pts
}
