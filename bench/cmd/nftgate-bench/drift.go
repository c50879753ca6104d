package main

// The drift phase: another program changes nftgate's tables under traffic
// (`nft flush ruleset`, or the canary's dispatch element deleted) while a
// client connects to the canary every --drift-interval, and the gap from
// the change to the first answered connection is measured. nftgate
// repairs on the kernel's nf_tables notifications; without them traffic
// would wait for the next reconcile.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// DriftConfig is the drift phase's command line.
type DriftConfig struct {
	// Repeats is how many times each kind of drift is measured; 0 skips
	// the phase.
	Repeats int
	// Interval is the time between two connection attempts.
	Interval time.Duration
	// Gap is the deliberate pause between traffic being back and the
	// next drift: longer than nftgate's min_repair_interval (1 s), so
	// each repair runs at once rather than being held back.
	Gap time.Duration
}

func driftFlags(fs *flag.FlagSet, c *DriftConfig) (check func() error) {
	fs.IntVar(&c.Repeats, "drift", 5, "times each drift (nft flush ruleset; the canary's map element deleted) is measured under traffic, for nftgate; 0 skips the phase")
	fs.DurationVar(&c.Interval, "drift-interval", 10*time.Millisecond, "time between the client's connection attempts during the drift phase")
	fs.DurationVar(&c.Gap, "drift-gap", 1500*time.Millisecond, "pause before each drift, longer than nftgate's min_repair_interval")
	return func() error {
		switch {
		case c.Repeats < 0:
			return fmt.Errorf("--drift: %d: want zero or more", c.Repeats)
		case c.Interval < time.Millisecond:
			return fmt.Errorf("--drift-interval: %v: want at least 1ms", c.Interval)
		case c.Gap < 0:
			return fmt.Errorf("--drift-gap: %v: want zero or more", c.Gap)
		}
		return nil
	}
}

// The kinds of drift, in the order measured.
const (
	driftFlush   = "flush"
	driftElement = "element"
)

var driftKinds = []string{driftFlush, driftElement}

// driftLabels describe the kinds in the report.
var driftLabels = map[string]string{
	driftFlush:   "`nft flush ruleset`",
	driftElement: "the canary's service-ips element deleted",
}

// DriftResult is the drift phase of one proxier at one size.
type DriftResult struct {
	IntervalMs float64     `json:"interval_ms"`
	Kinds      []DriftKind `json:"kinds"`
}

// DriftKind is one kind of drift, measured Repeats times.
type DriftKind struct {
	Kind string `json:"kind"`
	// GapsMs: from the moment the nft command exited (the kernel had
	// committed the change) to the start of the first connection
	// attempt after it that was answered.
	GapsMs   []float64 `json:"gaps_ms"`
	MedianMs float64   `json:"median_ms"`
	MaxMs    float64   `json:"max_ms"`
	// Failed counts the attempts that were not answered, per drift.
	Failed []int `json:"failed"`
	// RepairedMs: from the same moment to the end of the sync that
	// repaired the drift (nftgate's last sync time), which may come after
	// the canary answers: a repair after a flush serves one table after
	// another.
	RepairedMs       []float64 `json:"repaired_ms,omitempty"`
	RepairedMedianMs float64   `json:"repaired_median_ms,omitempty"`
}

func (e *Env) driftFor(name string) bool {
	return e.Cfg.Drift.Repeats > 0 && name == proxNftgate
}

// driftProbe is one connection attempt.
type driftProbe struct {
	start time.Time
	ok    bool
}

// driftProber starts a connection attempt to dst from the client every
// interval until stopped, each attempt in a goroutine of its own so that
// one waiting for its timeout does not hold back the next, and keeps every
// attempt.
type driftProber struct {
	mu       sync.Mutex
	probes   []driftProbe
	last     error
	stop     chan struct{}
	done     chan struct{}
	inflight sync.WaitGroup
}

// driftAttemptTimeout bounds one attempt: a SYN lost while the rules are
// gone is not retransmitted within it (the first retransmission is after
// 1 s), so the attempt fails and a later one measures the repair.
const driftAttemptTimeout = 100 * time.Millisecond

func (e *Env) startDriftProber(dst netip.AddrPort, interval time.Duration) *driftProber {
	p := &driftProber{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			p.inflight.Add(1)
			go func() {
				defer p.inflight.Done()
				start := time.Now()
				_, err := e.dial(dst, driftAttemptTimeout)
				p.mu.Lock()
				p.probes = append(p.probes, driftProbe{start, err == nil})
				if err != nil {
					p.last = err
				}
				p.mu.Unlock()
			}()
			select {
			case <-p.stop:
				p.inflight.Wait()
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *driftProber) close() { close(p.stop); <-p.done }

// answeredSince returns the start of the first answered attempt that
// started at t or later, and how many attempts since t were not answered.
func (p *driftProber) answeredSince(t time.Time) (time.Time, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Attempts finish out of order: the first answered is the one that
	// started first, and an attempt started before it may still be
	// waiting for its timeout, so the answer counts once those are over.
	var first time.Time
	for _, pr := range p.probes {
		if pr.ok && !pr.start.Before(t) && (first.IsZero() || pr.start.Before(first)) {
			first = pr.start
		}
	}
	if !first.IsZero() && time.Since(first) < driftAttemptTimeout+50*time.Millisecond {
		first = time.Time{} // earlier attempts may still be in flight
	}
	failed := 0
	for _, pr := range p.probes {
		if !pr.ok && !pr.start.Before(t) && (first.IsZero() || pr.start.Before(first)) {
			failed++
		}
	}
	if first.IsZero() {
		return time.Time{}, failed, fmt.Errorf("no answer since %s (%d attempts failed, last: %v)", t.Format("15:04:05.000"), failed, p.last)
	}
	return first, failed, nil
}

// shardsArg is the --shards value passed to nftgate, 0 for its default.
func shardsArg(args []string) int {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--shards=")
		if !ok && a == "--shards" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// loggedShards is the shard count the first full sync of the last
// nftgate started logged (shards "auto" chooses it from the Services), 0
// when none is logged. The log holds every run of the bench's sizes, each
// after a line "=== " (Start).
func loggedShards(log []byte) int {
	if i := bytes.LastIndex(log, []byte("\n=== ")); i >= 0 {
		log = log[i+1:]
	}
	for line := range bytes.Lines(log) {
		if !bytes.Contains(line, []byte(`msg="full sync"`)) {
			continue
		}
		if m := shardsLogged.FindSubmatch(line); m != nil {
			n, _ := strconv.Atoi(string(m[1]))
			return n
		}
		return 0
	}
	return 0
}

var shardsLogged = regexp.MustCompile(` shards=(\d+)`)

// driftCommand is the nft command of a kind of drift; shards is the
// shard count nftgate runs with (0: the one --shards says, or the
// default).
func (e *Env) driftCommand(kind string, shards int) []string {
	if kind == driftFlush {
		return []string{"flush", "ruleset"}
	}
	table := ruleset.Config{Table: "nftgate", Shards: cmp.Or(shards, shardsArg(e.Cfg.NftgateArgs))}.
		TableOf(model.NewServiceKey(namespace, canaryName))
	return []string{"delete", "element", "ip", table, ruleset.MapServiceIPs,
		fmt.Sprintf("{ %s . tcp . %d }", canaryIP, servicePort)}
}

// measureDrift runs the drift phase against a running proxier.
func (e *Env) measureDrift(ctx context.Context, proc *Proc, p *Proxier, n int) (*DriftResult, error) {
	c := e.Cfg.Drift
	dst := netip.AddrPortFrom(canaryIP, servicePort)
	pr := e.startDriftProber(dst, c.Interval)
	defer pr.close()
	waitAnswered := func(since time.Time) (time.Time, int, error) {
		wctx, cancel := context.WithTimeout(ctx, e.Cfg.Timeout)
		defer cancel()
		var back time.Time
		var failed int
		err := lab.Eventually(wctx, func() error {
			if err := proc.Exited(); err != nil {
				return err
			}
			var err error
			back, failed, err = pr.answeredSince(since)
			return err
		})
		return back, failed, err
	}
	// A gateway up for a minute has read its counters (the traffic
	// history's step) and knows which Services carry traffic now, which a
	// repair after a flush serves first: those that counted the most new
	// connections between its last two readings. The bench reads them
	// here, as the page or a scrape would, until a second reading after
	// the canary answered counts its connections (an answer is the last
	// reading, refreshed behind it when older than a second or ten times
	// what it took; 404: counters off, nothing to read).
	answered, _, err := waitAnswered(time.Now())
	if err != nil {
		return nil, fmt.Errorf("the canary before the drifts: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, e.Cfg.Timeout)
	var firstRead time.Time // the first reading after the canary answered
	err = lab.Eventually(wctx, func() error {
		code, body, err := httpGet(ctx, e, "http://"+nftgateListen+"/api/v1/traffic")
		switch {
		case err != nil:
			return fmt.Errorf("GET /api/v1/traffic: %w", err)
		case code == http.StatusNotFound:
			return nil
		case code != http.StatusOK:
			return fmt.Errorf("GET /api/v1/traffic: %d %.200s", code, body)
		}
		var t struct {
			ReadAt time.Time `json:"readAt"`
			Ports  []struct {
				Namespace, Name string
				NewConnections  uint64 `json:"newConnections"`
			} `json:"ports"`
		}
		if err := json.Unmarshal([]byte(body), &t); err != nil {
			return fmt.Errorf("GET /api/v1/traffic: %w", err)
		}
		if firstRead.IsZero() && t.ReadAt.After(answered) {
			firstRead = t.ReadAt
		}
		if firstRead.IsZero() || !t.ReadAt.After(firstRead) {
			return fmt.Errorf("GET /api/v1/traffic: no second reading since the canary answered (%s) yet", answered.Format("15:04:05.000"))
		}
		for _, p := range t.Ports {
			if p.Namespace == namespace && p.Name == canaryName && p.NewConnections > 0 {
				return nil
			}
		}
		return fmt.Errorf("GET /api/v1/traffic: no new connection of %s/%s counted yet", namespace, canaryName)
	})
	cancel()
	if err != nil {
		return nil, err
	}
	res := &DriftResult{IntervalMs: float64(c.Interval) / float64(time.Millisecond)}
	for _, kind := range driftKinds {
		k := DriftKind{Kind: kind}
		log, _ := os.ReadFile(proc.LogPath)
		args := e.driftCommand(kind, loggedShards(log))
		for i := range c.Repeats {
			if _, _, err := waitAnswered(time.Now()); err != nil {
				return res, fmt.Errorf("drift %s %d: the canary before it: %w", kind, i+1, err)
			}
			// A deliberate pause, not a wait for readiness: the repair
			// of the drift before must be min_repair_interval ago.
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(c.Gap):
			}
			syncs, err := scrapeSyncMetrics(ctx, e, p)
			if err != nil {
				return res, fmt.Errorf("drift %s %d: before it: %w", kind, i+1, err)
			}
			sent := time.Now()
			if out, err := e.Topo.Gateway.Command(ctx, "nft", args...).CombinedOutput(); err != nil {
				return res, fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
			}
			// The kernel committed the change before nft exited.
			at := time.Now()
			back, failed, err := waitAnswered(at)
			if err != nil {
				return res, fmt.Errorf("drift %s %d: traffic did not come back: %w", kind, i+1, err)
			}
			gap := float64(back.Sub(at)) / float64(time.Millisecond)
			// The next drift waits for this one's repair to be over: the
			// canary may answer before the repair has served every table.
			done, err := e.waitSyncAfter(ctx, proc, p, syncs.Syncs, sent)
			if err != nil {
				return res, fmt.Errorf("drift %s %d: the repair: %w", kind, i+1, err)
			}
			// A repair can end before nft's exit is seen here: 0.
			repaired := max(0, float64(done.Sub(at))/float64(time.Millisecond))
			k.GapsMs, k.Failed, k.RepairedMs = append(k.GapsMs, gap), append(k.Failed, failed), append(k.RepairedMs, repaired)
			logf("nftgate N=%d: drift %s %d: first answered connection %.0f ms after it (%d attempts failed), repaired after %.0f ms", n, kind, i+1, gap, failed, repaired)
		}
		k.MedianMs, k.MaxMs = percentile(k.GapsMs, 50), percentile(k.GapsMs, 100)
		k.RepairedMedianMs = percentile(k.RepairedMs, 50)
		res.Kinds = append(res.Kinds, k)
	}
	return res, nil
}

// waitSyncAfter waits until p has recorded a sync beyond the count of
// syncs before that ended after since (the repair of a drift made at
// since: no other change comes meanwhile), and returns the time p
// recorded for it.
func (e *Env) waitSyncAfter(ctx context.Context, proc *Proc, p *Proxier, before float64, since time.Time) (time.Time, error) {
	wctx, cancel := context.WithTimeout(ctx, e.Cfg.Timeout)
	defer cancel()
	var last time.Time
	err := lab.Eventually(wctx, func() error {
		if err := proc.Exited(); err != nil {
			return err
		}
		body, err := scrapeMetrics(wctx, e, p)
		if err != nil {
			return err
		}
		if n := metricSum(body, p.MetricPrefix+"sync_proxy_rules_duration_seconds_count"); n <= before {
			return fmt.Errorf("%v syncs, none since the drift", n)
		}
		s := metricSum(body, p.MetricPrefix+"sync_proxy_rules_last_timestamp_seconds")
		if last = time.Unix(0, int64(s*1e9)); !last.After(since) {
			return fmt.Errorf("the last sync ended at %s, before the drift", last.Format("15:04:05.000"))
		}
		return nil
	})
	return last, err
}

// DriftMarkdown is the report's drift section; empty when the phase did
// not run.
func (r *Report) DriftMarkdown() string {
	var b strings.Builder
	for _, res := range r.Results {
		if res.Drift == nil {
			continue
		}
		if b.Len() == 0 {
			fmt.Fprintf(&b, "\n## Drift under traffic\n\n"+
				"Another program changes nftgate's tables while the client connects to the canary every %.0f ms "+
				"(each attempt in parallel with the others, 100 ms bound); the gap runs from the nft command's exit (the kernel has committed the change) "+
				"to the start of the first answered attempt after it; *repaired* runs to the end of the sync that repaired it (every table back). "+
				"Each drift waits for the repair of the one before and a pause longer than `min_repair_interval`. Plot: drift.png.\n\n"+
				"| Proxier | N | drift | gap median | max | repaired (median) | runs | attempts failed (median) |\n|---|---:|---|---:|---:|---:|---:|---:|\n",
				res.Drift.IntervalMs)
		}
		for _, k := range res.Drift.Kinds {
			failed := make([]float64, len(k.Failed))
			for i, f := range k.Failed {
				failed[i] = float64(f)
			}
			repaired := "–"
			if len(k.RepairedMs) > 0 {
				repaired = millis(k.RepairedMedianMs)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d | %.0f |\n", res.Proxier, thousands(res.Services),
				driftLabels[k.Kind], millis(k.MedianMs), millis(k.MaxMs), repaired, len(k.GapsMs), percentile(failed, 50))
		}
	}
	return b.String()
}

// driftColors keep each kind's colour in the plot.
var driftColors = map[string]color.Color{
	driftFlush:   color.RGBA{R: 0x1b, G: 0x9e, B: 0x77, A: 0xff},
	driftElement: color.RGBA{R: 0xd9, G: 0x5f, B: 0x02, A: 0xff},
}

// PlotDrift draws the drift gaps against N into a PNG at path: every
// measured gap as a point, the medians joined by a line, one colour per
// kind of drift. It writes nothing when no result has a drift phase.
func (r *Report) PlotDrift(path string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("plot %s: %v", path, v)
		}
	}()
	var sizes []int
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, res := range r.Results {
		if res.Drift == nil {
			continue
		}
		sizes = append(sizes, res.Services)
		for _, k := range res.Drift.Kinds {
			for _, g := range k.GapsMs {
				g = max(g, 1)
				lo, hi = min(lo, g), max(hi, g)
			}
		}
	}
	if len(sizes) == 0 || math.IsInf(lo, 1) {
		return nil
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	p := plot.New()
	p.Title.Text = "nftgate: drift under traffic, change to first answered connection"
	p.X.Label.Text = "Services (N)"
	p.Y.Label.Text = "ms"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, sizeTicks(sizes)
	p.X.Min, p.X.Max = float64(sizes[0])/1.5, float64(sizes[len(sizes)-1])*1.5
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = lo/2, hi*8
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	for _, kind := range driftKinds {
		var medians, all plotter.XYs
		for _, res := range r.Results {
			if res.Drift == nil {
				continue
			}
			for _, k := range res.Drift.Kinds {
				if k.Kind != kind || len(k.GapsMs) == 0 {
					continue
				}
				x := float64(res.Services)
				medians = append(medians, plotter.XY{X: x, Y: max(k.MedianMs, 1)})
				for _, g := range k.GapsMs {
					all = append(all, plotter.XY{X: x, Y: max(g, 1)})
				}
			}
		}
		if len(medians) == 0 {
			continue
		}
		line, err := plotter.NewLine(medians)
		if err != nil {
			return err
		}
		points, err := plotter.NewScatter(all)
		if err != nil {
			return err
		}
		line.Color, points.Color = driftColors[kind], driftColors[kind]
		line.Width = vg.Points(2)
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(strings.ReplaceAll(driftLabels[kind], "`", "")+" (median; points: each run)", line, points)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
