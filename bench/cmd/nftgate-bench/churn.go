package main

// The churn phase: a rolling update rewrites the EndpointSlices of a set of
// churning Services at a steady rate (100/s, then 1,000/s) for a while,
// and meanwhile, about once a second, the changed Service (no part of the
// churn) moves its endpoints: the time from that write until a client's
// connection reaches the new endpoints is the figure, as in the sizes
// phase. Besides it: the proxier's CPU per second and per write, its
// resident memory, and its own sync counters over each run.

import (
	"context"
	"flag"
	"fmt"
	"image/color"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"golang.org/x/time/rate"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

const churnDir = "churn"

// minSyncInterval is each proxier's least time between two syncs with
// the settings the benchmark runs it with: nftgate's min_sync_interval
// default, kube-proxy's minSyncPeriod default. A change that arrives
// while syncs follow each other waits at most two of them plus a sync.
var minSyncInterval = map[string]time.Duration{
	proxNftgate:       50 * time.Millisecond,
	proxNftgateMaglev: 50 * time.Millisecond,
	proxKPNFTables:    time.Second,
	proxKPIPTables:    time.Second,
}

// ChurnConfig is the churn phase's command line.
type ChurnConfig struct {
	// On runs the phase after the other measurements of each proxier in
	// Proxiers, at every size.
	On bool
	// Only: the churn phase alone (no data plane, no drift), every
	// report under churn/.
	Only bool
	// Rates are the writes per second aimed at, one run each, in order.
	Rates []int
	// Duration is the length of each run.
	Duration time.Duration
	// Services is how many bulk Services churn (fewer at a size that has
	// fewer).
	Services int
	// Every is the time between two changes of the unrelated Service.
	Every    time.Duration
	Proxiers []string
}

func churnFlags(fs *flag.FlagSet, c *ChurnConfig) (check func(cfg *Config) error) {
	var rates, proxiers string
	fs.BoolVar(&c.On, "churn", false, "also run the churn phase after each proxier's other measurements (see --churn-*)")
	fs.BoolVar(&c.Only, "churn-only", false, "the churn phase alone after each cold start (no data plane, no drift); every report under churn/")
	fs.StringVar(&rates, "churn-rates", "100,1000", "comma-separated EndpointSlice writes per second aimed at, one run each")
	fs.DurationVar(&c.Duration, "churn-duration", time.Minute, "length of each churn run")
	fs.IntVar(&c.Services, "churn-services", 1000, "bulk Services whose EndpointSlices the rolling update rewrites in turn")
	fs.DurationVar(&c.Every, "churn-probe-every", time.Second, "time between two changes of the unrelated Service during a churn run")
	fs.StringVar(&proxiers, "churn-proxiers", proxNftgate+","+proxKPNFTables, "proxiers measured under churn (of those run)")
	return func(cfg *Config) error {
		c.On = c.On || c.Only
		c.Rates, c.Proxiers = nil, nil
		for _, s := range strings.Split(rates, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > 100_000 {
				return fmt.Errorf("--churn-rates: %q: want whole numbers from 1 to 100000", s)
			}
			c.Rates = append(c.Rates, n)
		}
		for _, p := range strings.Split(proxiers, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if !slices.Contains(allProxiers, p) {
				return fmt.Errorf("--churn-proxiers: %q: want one of %s", p, strings.Join(allProxiers, ", "))
			}
			c.Proxiers = append(c.Proxiers, p)
		}
		switch {
		case c.Duration < time.Second:
			return fmt.Errorf("--churn-duration: %v: want at least 1s", c.Duration)
		case c.Services < 1:
			return fmt.Errorf("--churn-services: %d: want at least 1", c.Services)
		case c.Every < 10*time.Millisecond:
			return fmt.Errorf("--churn-probe-every: %v: want at least 10ms", c.Every)
		}
		if !c.On {
			return nil
		}
		switch {
		case cfg.LoadOnly:
			return fmt.Errorf("--churn with --load-only: nothing would be measured")
		case cfg.Source != sourceAPI:
			return fmt.Errorf("--churn with --source %s: the churn is written through the API", cfg.Source)
		case len(c.Proxiers) == 0:
			return fmt.Errorf("--churn-proxiers: empty")
		}
		if c.Only {
			cfg.Proxiers = slices.DeleteFunc(cfg.Proxiers, func(p string) bool { return !slices.Contains(c.Proxiers, p) })
			cfg.Dataplane.Duration, cfg.Drift.Repeats = 0, 0
			cfg.Out = filepath.Join(cfg.Out, churnDir)
		}
		return nil
	}
}

func (e *Env) churnFor(name string) bool {
	return e.Cfg.Churn.On && slices.Contains(e.Cfg.Churn.Proxiers, name)
}

// ChurnResult is the churn phase of one proxier at one size.
type ChurnResult struct {
	// Services is how many Services churned.
	Services int        `json:"churning_services"`
	Runs     []ChurnRun `json:"runs"`
}

// ChurnRun is one rate.
type ChurnRun struct {
	TargetPerSecond int     `json:"target_writes_per_s"`
	Seconds         float64 `json:"seconds"`
	Writes          int     `json:"writes"`
	// Failed: writes the API refused after retries (counted, not
	// written).
	Failed    int     `json:"failed_writes"`
	PerSecond float64 `json:"writes_per_s"`
	// ChangeMs: from each write of the unrelated Service until a client's
	// connection reaches its new endpoints; APIMs: the write's own round
	// trip to the API server, part of it.
	ChangeMs    []float64 `json:"change_ms"`
	APIMs       []float64 `json:"api_write_ms"`
	ChangeP50Ms float64   `json:"change_p50_ms"`
	ChangeP99Ms float64   `json:"change_p99_ms"`
	ChangeMaxMs float64   `json:"change_max_ms"`
	// AfterAPI: ChangeMs less APIMs, each change: from the API's answer
	// to the write until traffic reached the new endpoints, the part
	// the API server's load does not add to (watch delivery included).
	AfterAPIP50Ms float64 `json:"after_api_p50_ms"`
	AfterAPIMaxMs float64 `json:"after_api_max_ms"`
	// The proxier's syncs during the run (its own metrics) and the goal
	// they give: 2 × its least time between syncs + the mean sync.
	Syncs      float64 `json:"syncs"`
	SyncMeanMs float64 `json:"sync_mean_ms"`
	BoundMs    float64 `json:"bound_ms"`
	// CPU: the proxier's (children included) in cores, over the run and
	// each second; per write; resident memory at the end and the most
	// seen.
	Cores         float64   `json:"cpu_cores"`
	CoresPerSec   []float64 `json:"cpu_cores_each_second"`
	CPUPerWriteMs float64   `json:"cpu_per_write_ms"`
	RSSMiB        float64   `json:"rss_mib"`
	RSSMaxMiB     float64   `json:"rss_max_mib"`
	// The API server's and etcd's CPU in cores over the run.
	APIServerCores float64 `json:"apiserver_cpu_cores"`
	EtcdCores      float64 `json:"etcd_cpu_cores"`
}

// churnSlice is write k of the rolling update, counted from 0 over the
// whole benchmark: the churning Services' slices are rewritten in turn,
// and each rewrite moves the slice's window of K endpoints one address
// along the backend addresses, so one endpoint goes and one comes, as
// when a rolling update replaces a pod.
func (e *Env) churnSlice(k, services int) (name string, backends []netip.Addr) {
	i, shift := k%services, k/services+1
	all := e.Topo.BackendIPv4
	backends = make([]netip.Addr, e.Cfg.Endpoints)
	for j := range backends {
		backends[j] = all[(i*e.Cfg.Endpoints+j+shift)%len(all)]
	}
	return fmt.Sprintf(firstBulkName, i), backends
}

// churnWriter rewrites EndpointSlices at a steady rate with up to
// --load-workers writes in flight.
type churnWriter struct {
	e        *Env
	client   kubernetes.Interface
	services int
	writes   atomic.Int64
	failed   atomic.Int64
	lastErr  atomic.Value
}

// run writes at perSecond until pace ends, and returns how long it wrote.
// Writes in flight then finish under ctx.
func (w *churnWriter) run(ctx, pace context.Context, perSecond int) time.Duration {
	lim := rate.NewLimiter(rate.Limit(perSecond), max(1, perSecond/20))
	start := time.Now()
	var wg sync.WaitGroup
	for range w.e.Cfg.LoadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lim.Wait(pace) == nil {
				k := int(w.e.churnWrites.Add(1) - 1)
				name, backends := w.e.churnSlice(k, w.services)
				sl := slice(name, bulkPort, backends)
				// No resourceVersion: EndpointSlices take unconditional
				// updates, so no read precedes a write.
				err := retryTransient(ctx, func() error {
					_, err := w.client.DiscoveryV1().EndpointSlices(namespace).Update(ctx, sl, metav1.UpdateOptions{})
					return err
				})
				switch {
				case err == nil:
					w.writes.Add(1)
				case ctx.Err() == nil:
					w.failed.Add(1)
					w.lastErr.Store(fmt.Errorf("update EndpointSlice %s/%s: %w", namespace, name, err))
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// procSample is the proxier's CPU time and memory at one moment.
type procSample struct {
	at time.Time
	st ProcStats
}

// sampleProc reads the proxier's stats every second until stop is
// closed, and returns them, the first taken at once.
func sampleProc(pid int, stop <-chan struct{}) <-chan []procSample {
	out := make(chan []procSample, 1)
	go func() {
		var samples []procSample
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if st, err := readProcStats(pid); err == nil {
				samples = append(samples, procSample{time.Now(), st})
			}
			select {
			case <-stop:
				if st, err := readProcStats(pid); err == nil {
					samples = append(samples, procSample{time.Now(), st})
				}
				out <- samples
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// measureChurn runs the churn phase against a running proxier.
func (e *Env) measureChurn(ctx context.Context, proc *Proc, p *Proxier, n int) (*ChurnResult, error) {
	c := e.Cfg.Churn
	client, err := e.protoClient()
	if err != nil {
		return nil, err
	}
	w := &churnWriter{e: e, client: client, services: min(c.Services, e.bulk)}
	res := &ChurnResult{Services: w.services}
	changeDst := netip.AddrPortFrom(changeIP, servicePort)
	for _, target := range c.Rates {
		logf("%s N=%d: churn at %d writes/s for %v", p.Name, n, target, c.Duration)
		run := ChurnRun{TargetPerSecond: target}
		m0, err := scrapeSyncMetrics(ctx, e, p)
		if err != nil {
			return res, fmt.Errorf("metrics: %w", err)
		}
		api0, etcd0 := serverCPU(e.API)
		w.writes.Store(0)
		w.failed.Store(0)
		stopSampling := make(chan struct{})
		samples := sampleProc(proc.PID(), stopSampling)
		wctx, cancel := context.WithTimeout(ctx, c.Duration)
		wrote := make(chan time.Duration, 1)
		go func() { wrote <- w.run(ctx, wctx, target) }()

		// The unrelated Service, about every c.Every: a deliberate pace,
		// not a wait for readiness. A change that takes longer than
		// that is followed by the next at once.
		start := time.Now()
		var probeErr error
		for i := 0; probeErr == nil; i++ {
			next := start.Add(time.Duration(i) * c.Every)
			if next.After(start.Add(c.Duration)) {
				break
			}
			select {
			case <-wctx.Done():
			case <-time.After(time.Until(next)):
			}
			if wctx.Err() != nil {
				break
			}
			port, at, err := e.ChangeEndpoints(ctx)
			if err != nil {
				probeErr = err
				break
			}
			api := time.Since(at)
			took, err := e.waitBackendPort(ctx, proc, changeDst, port, at)
			if err != nil {
				probeErr = fmt.Errorf("unrelated change %d at %d writes/s: %w", i+1, target, err)
				break
			}
			run.ChangeMs = append(run.ChangeMs, float64(took)/float64(time.Millisecond))
			run.APIMs = append(run.APIMs, float64(api)/float64(time.Millisecond))
		}
		if probeErr != nil {
			cancel()
		}
		d := <-wrote
		cancel()
		close(stopSampling)
		ss := <-samples
		if probeErr != nil {
			return res, probeErr
		}
		api1, etcd1 := serverCPU(e.API)
		m1, err := scrapeSyncMetrics(ctx, e, p)
		if err != nil {
			return res, fmt.Errorf("metrics: %w", err)
		}
		run.Seconds = d.Seconds()
		run.Writes, run.Failed = int(w.writes.Load()), int(w.failed.Load())
		if run.Failed > run.Writes/10 {
			return res, fmt.Errorf("%d of %d churn writes failed at %d/s, last: %v", run.Failed, run.Writes+run.Failed, target, w.lastErr.Load())
		}
		run.PerSecond = float64(run.Writes) / d.Seconds()
		run.summarize(ss, m1.sub(m0), minSyncInterval[p.Name])
		run.APIServerCores, run.EtcdCores = (api1-api0).Seconds()/d.Seconds(), (etcd1-etcd0).Seconds()/d.Seconds()
		logf("%s", run.Summary(p.Name, n))
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// summarize fills in the figures of a run from its samples and the
// proxier's sync counters over it.
func (r *ChurnRun) summarize(ss []procSample, m SyncMetrics, minSync time.Duration) {
	r.ChangeP50Ms, r.ChangeP99Ms, r.ChangeMaxMs = percentile(r.ChangeMs, 50), percentile(r.ChangeMs, 99), percentile(r.ChangeMs, 100)
	if len(r.APIMs) == len(r.ChangeMs) {
		after := make([]float64, len(r.ChangeMs))
		for i := range after {
			after[i] = r.ChangeMs[i] - r.APIMs[i]
		}
		r.AfterAPIP50Ms, r.AfterAPIMaxMs = percentile(after, 50), percentile(after, 100)
	}
	r.Syncs = m.Syncs
	if m.Syncs > 0 {
		r.SyncMeanMs = m.SyncSeconds / m.Syncs * 1000
	}
	r.BoundMs = 2*float64(minSync)/float64(time.Millisecond) + r.SyncMeanMs
	if len(ss) < 2 {
		return
	}
	first, last := ss[0], ss[len(ss)-1]
	cpu := last.st.CPU - first.st.CPU
	r.Cores = cpu.Seconds() / last.at.Sub(first.at).Seconds()
	if r.Writes > 0 {
		r.CPUPerWriteMs = float64(cpu) / float64(time.Millisecond) / float64(r.Writes)
	}
	r.RSSMiB = float64(last.st.RSSKiB) / 1024
	for i, s := range ss {
		r.RSSMaxMiB = max(r.RSSMaxMiB, float64(s.st.RSSKiB)/1024)
		if i > 0 {
			prev := ss[i-1]
			r.CoresPerSec = append(r.CoresPerSec, (s.st.CPU-prev.st.CPU).Seconds()/s.at.Sub(prev.at).Seconds())
		}
	}
}

// Summary is one line for the log.
func (r ChurnRun) Summary(proxier string, n int) string {
	return fmt.Sprintf("%s N=%d: churn %d writes/s aimed, %.0f/s written (%d failed): unrelated change p50 %.0fms p99 %.0fms max %.0fms (bound %.0fms: %.0f syncs, mean %.0fms), CPU %.2f cores, %.2fms per write, RSS %.0f MiB (max %.0f)",
		proxier, n, r.TargetPerSecond, r.PerSecond, r.Failed, r.ChangeP50Ms, r.ChangeP99Ms, r.ChangeMaxMs, r.BoundMs, r.Syncs, r.SyncMeanMs,
		r.Cores, r.CPUPerWriteMs, r.RSSMiB, r.RSSMaxMiB)
}

// sub is the counters' growth from o to m.
func (m SyncMetrics) sub(o SyncMetrics) SyncMetrics {
	return SyncMetrics{Syncs: m.Syncs - o.Syncs, SyncSeconds: m.SyncSeconds - o.SyncSeconds,
		ProgrammingCount: m.ProgrammingCount - o.ProgrammingCount, ProgrammingSeconds: m.ProgrammingSeconds - o.ProgrammingSeconds}
}

// ChurnMarkdown is the report's churn section; empty when the phase did
// not run.
func (r *Report) ChurnMarkdown() string {
	var b strings.Builder
	for _, res := range r.Results {
		if res.Churn == nil {
			continue
		}
		if b.Len() == 0 {
			fmt.Fprintf(&b, "\n## Under churn\n\n"+
				"A rolling update rewrites the EndpointSlices of %s churning Services in turn (each write moves one of its endpoints "+
				"to another address) at a rate aimed at, with up to %d writes in flight, through the API; meanwhile, about once a "+
				"second, the changed Service (not one of them) moves its endpoints to the other port, timed as the endpoint change "+
				"above: from the API write until a client's connection reaches the new port. *Bound*: the goal, 2 × the proxier's "+
				"least time between syncs (nftgate's `min_sync_interval`, 50 ms; kube-proxy's `minSyncPeriod`, 1 s) + its mean sync "+
				"during the run (its own metrics). CPU: the proxier's, children included, from /proc/PID/stat, sampled every second; "+
				"per write = CPU over the run / writes. API write: the unrelated change's own round trip to kube-apiserver (p50), "+
				"part of the change's time; *after the API*: the change's time less it, each change (p50 / max): what the "+
				"API server's load does not add to. p99 by nearest rank (of fewer than 100 changes, the slowest). Plot: churn.png.\n\n"+
				"| Proxier | N | writes/s aimed | written | unrelated change p50 | p99 | max | bound | API write | after the API | syncs/s | CPU | CPU max (1 s) | CPU per write | RSS (max) | kube-apiserver + etcd |\n"+
				"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
				thousands(res.Churn.Services), r.churnWorkers())
		}
		for _, run := range res.Churn.Runs {
			fmt.Fprintf(&b, "| %s | %s | %s | %s/s | %s | %s | %s | %s | %s | %s / %s | %.1f | %.2f cores | %.2f | %.2f ms | %.0f MiB (%.0f) | %.2f cores |\n",
				res.Proxier, thousands(res.Services), thousands(run.TargetPerSecond), thousands(int(math.Round(run.PerSecond))),
				millis(run.ChangeP50Ms), millis(run.ChangeP99Ms), millis(run.ChangeMaxMs), millis(run.BoundMs),
				millis(percentile(run.APIMs, 50)), millis(run.AfterAPIP50Ms), millis(run.AfterAPIMaxMs), run.Syncs/run.Seconds, run.Cores, slices.Max(append([]float64{0}, run.CoresPerSec...)),
				run.CPUPerWriteMs, run.RSSMiB, run.RSSMaxMiB, run.APIServerCores+run.EtcdCores)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	b.WriteString(r.churnScaling())
	return b.String()
}

func (r *Report) churnWorkers() int { return max(r.LoadWorkers, 1) }

// churnScaling compares each proxier's CPU per write between its
// smallest and largest size at the same aimed rate: the same cost means
// the CPU grows with the writes, not with the Services.
func (r *Report) churnScaling() string {
	var b strings.Builder
	for _, name := range append(slices.Clone(allProxiers), proxNftgateMaglev) {
		var small, large *Result
		for i := range r.Results {
			res := &r.Results[i]
			if res.Proxier != name || res.Churn == nil {
				continue
			}
			if small == nil || res.Services < small.Services {
				small = res
			}
			if large == nil || res.Services > large.Services {
				large = res
			}
		}
		if small == nil || small == large {
			continue
		}
		for _, rl := range large.Churn.Runs {
			for _, rs := range small.Churn.Runs {
				if rs.TargetPerSecond == rl.TargetPerSecond && rs.CPUPerWriteMs > 0 {
					fmt.Fprintf(&b, "- %s, %s writes/s aimed: CPU per write %.2f ms at %s Services, %.2f ms at %s (%.1f×; %.1f× the Services).\n",
						name, thousands(rl.TargetPerSecond), rs.CPUPerWriteMs, thousands(small.Services), rl.CPUPerWriteMs,
						thousands(large.Services), rl.CPUPerWriteMs/rs.CPUPerWriteMs, float64(large.Services)/float64(small.Services))
				}
			}
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n" + b.String()
}

// PlotChurn draws two panels into a PNG at path, each line one proxier at
// one size against the writes per second written: the unrelated change's
// p50 (max as the upper points), and the proxier's CPU. It writes nothing
// when no result has a churn phase.
func (r *Report) PlotChurn(path string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("plot %s: %v", path, v)
		}
	}()
	var sizes []int
	for _, res := range r.Results {
		if res.Churn != nil && len(res.Churn.Runs) > 0 {
			sizes = append(sizes, res.Services)
		}
	}
	if len(sizes) == 0 {
		return nil
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	newPanel := func(title, unit string) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "EndpointSlice writes/s (written)"
		p.Y.Label.Text = unit
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		return p
	}
	lat := newPanel("Unrelated change under churn (p50; points: max)", "ms")
	lat.Y.Scale, lat.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	cpu := newPanel("Proxier CPU under churn", "cores")
	xlo, xhi, ylo, yhi, chi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1), 0.0
	for _, res := range r.Results {
		if res.Churn == nil || len(res.Churn.Runs) == 0 {
			continue
		}
		var p50s, maxes, cores plotter.XYs
		for _, run := range res.Churn.Runs {
			x := max(run.PerSecond, 1)
			p50s = append(p50s, plotter.XY{X: x, Y: max(run.ChangeP50Ms, 1)})
			maxes = append(maxes, plotter.XY{X: x, Y: max(run.ChangeMaxMs, 1)})
			cores = append(cores, plotter.XY{X: x, Y: run.Cores})
			xlo, xhi = min(xlo, x), max(xhi, x)
			ylo, yhi, chi = min(ylo, max(run.ChangeP50Ms, 1)), max(yhi, max(run.ChangeMaxMs, 1)), max(chi, run.Cores)
		}
		col := proxierColors[res.Proxier]
		if col == nil {
			col = color.Black
		}
		dashes := []vg.Length(nil)
		if res.Services != sizes[len(sizes)-1] {
			dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		}
		label := fmt.Sprintf("%s, %s Services", res.Proxier, thousands(res.Services))
		for _, pl := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{lat, p50s}, {cpu, cores}} {
			line, points, err := plotter.NewLinePoints(pl.xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = col, col
			line.Width, line.Dashes = vg.Points(2), dashes
			points.Shape = draw.CircleGlyph{}
			pl.p.Add(line, points)
			pl.p.Legend.Add(label, line, points)
		}
		top, err := plotter.NewScatter(maxes)
		if err != nil {
			return err
		}
		top.Color, top.Shape = col, draw.TriangleGlyph{}
		lat.Add(top)
	}
	for _, p := range []*plot.Plot{lat, cpu} {
		p.X.Min, p.X.Max = xlo/2, xhi*2
	}
	lat.Y.Min, lat.Y.Max = ylo/2, yhi*8
	cpu.Y.Min, cpu.Y.Max = 0, max(chi, 0.1)*1.6
	return saveRow(path, []*plot.Plot{lat, cpu})
}
