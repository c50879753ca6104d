package main

// The edge phase (--edge N): N LoadBalancer Services allocated from a pool
// by nftgate and announced by its BGP speaker to BIRD, the upstream router
// of the tests (internal/testing/bird), in a namespace of its own. It
// measures the time until all N are allocated and announced from a cold
// start, from a Service's creation to its /32 in BIRD's table, and after a
// restart of nftgate the time until BIRD has every route from the new
// session, checking that the routes never leave BIRD meanwhile.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nftgate/nftgate/internal/testing/bird"
)

// The edge lab: the router's link to the gateway, the AS numbers, and the
// pool, a /16 of the shared address space: addresses announced to the
// router of the lab and never sent traffic.
var (
	edgeRouter4  = netip.MustParsePrefix("198.18.6.1/24")
	edgeGateway4 = netip.MustParsePrefix("198.18.6.2/24")
	edgeRouter6  = netip.MustParsePrefix("fd42:6::1/64")
	edgeGateway6 = netip.MustParsePrefix("fd42:6::2/64")
	edgePool     = netip.MustParsePrefix("100.64.0.0/16")
)

const (
	edgeRouterASN  = 64512
	edgeGatewayASN = 64513
	edgeProtocol   = "gw4" // BIRD's session with the gateway (bird.Upstream)
	edgeSampleName = "edge-%04d"
	// edgeSampleGap lets the sync of one sample end before the next
	// Service is created, so that each is measured on a quiet gateway.
	edgeSampleGap = 100 * time.Millisecond
	// edgePollCount is how often BIRD's route count is read while waiting
	// for thousands of routes; edgePollRoute how often one route is looked
	// for. Both go through one control-socket connection: a lookup costs
	// BIRD microseconds.
	edgePollCount = 20 * time.Millisecond
	edgePollRoute = time.Millisecond
)

// EdgeConfig is the edge phase's part of the command line.
type EdgeConfig struct {
	Services int
	Samples  int
}

func edgeFlags(fs *flag.FlagSet, c *EdgeConfig) {
	fs.IntVar(&c.Services, "edge", 0,
		"edge phase: this many LoadBalancer Services allocated by nftgate and announced by BGP to BIRD, after the sizes (0: none)")
	fs.IntVar(&c.Samples, "edge-samples", 200, "edge phase: Services created one at a time, once the others are announced, and timed to their route")
}

func (c EdgeConfig) check(cfg *Config) error {
	if c.Services == 0 {
		return nil
	}
	switch {
	case c.Services < 1 || c.Services+c.Samples > 1<<(32-edgePool.Bits()):
		return fmt.Errorf("--edge: %d: want 1 to %d with %d samples (the pool %s)", c.Services, 1<<(32-edgePool.Bits())-c.Samples, c.Samples, edgePool)
	case c.Samples < 1:
		return fmt.Errorf("--edge-samples: %d: want at least 1", c.Samples)
	case cfg.Source != sourceAPI:
		return fmt.Errorf("--edge: needs --source %s (allocation writes Service status)", sourceAPI)
	}
	return nil
}

// EdgeResult is what the edge phase measured.
type EdgeResult struct {
	Started  time.Time `json:"started"`
	Machine  string    `json:"machine"`
	Services int       `json:"services"`
	// ConvertSeconds: the N Services made type LoadBalancer through the
	// API, before nftgate starts (not nftgate's time).
	ConvertSeconds float64 `json:"convert_seconds"`
	// From nftgate's start until every status holds its address, and
	// until BIRD has every /32.
	AllocatedSeconds float64 `json:"allocated_seconds"`
	AnnouncedSeconds float64 `json:"announced_seconds"`

	// Services created one at a time once the N are announced: from the
	// create call's return until the bench sees the status, and until
	// BIRD's table has the /32.
	Samples       int       `json:"samples"`
	ToStatusMs    []float64 `json:"to_status_ms"`
	ToRouteMs     []float64 `json:"to_route_ms"`
	StatusP50Ms   float64   `json:"status_p50_ms"`
	StatusP90Ms   float64   `json:"status_p90_ms"`
	StatusMaxMs   float64   `json:"status_max_ms"`
	RouteP50Ms    float64   `json:"route_p50_ms"`
	RouteP90Ms    float64   `json:"route_p90_ms"`
	RouteMaxMs    float64   `json:"route_max_ms"`
	RSSMiB        float64   `json:"rss_mib"`
	CPUColdSecond float64   `json:"cpu_until_announced_seconds"`

	// The restart: SIGTERM, exit, a new nftgate. Routes is N plus the
	// samples; MinRoutes the fewest BIRD had at any reading from the
	// SIGTERM until the end (RouteReadings of them); GRSeen whether BIRD
	// was seen keeping the routes as stale. FreshSeconds is from the new
	// process's start until BIRD's graceful restart is over (the new
	// session's End-of-RIB) with every route in its table.
	Routes         int     `json:"routes"`
	StopSeconds    float64 `json:"stop_seconds"`
	MinRoutes      int     `json:"min_routes"`
	RouteReadings  int     `json:"route_readings"`
	GRSeen         bool    `json:"graceful_restart_seen"`
	FreshSeconds   float64 `json:"fresh_seconds"`
	FreshFromTermS float64 `json:"fresh_from_sigterm_seconds"`
	// Timeline is every change of BIRD's route count or graceful restart
	// state from the SIGTERM on: seconds after it, routes, restarting.
	Timeline []string `json:"restart_timeline"`
}

// RunEdge runs the edge phase after the sizes and writes edge.md and
// edge.json into the output directory.
func (e *Env) RunEdge(ctx context.Context, machine string) error {
	ec := e.Cfg.Edge
	if _, err := e.LoadTo(ctx, ec.Services+fixedCount); err != nil {
		return err
	}
	if e.bulk+ec.Samples > bulkRanges[0].size() {
		return fmt.Errorf("no ClusterIPs left for %d samples after %d Services", ec.Samples, e.bulk)
	}
	res := &EdgeResult{Started: time.Now().UTC(), Machine: machine, Services: ec.Services, Samples: ec.Samples,
		Routes: ec.Services + ec.Samples}

	router, err := e.Topo.AddHost("router")
	if err != nil {
		return err
	}
	if _, err := e.Topo.Link(router, []netip.Prefix{edgeRouter4, edgeRouter6}, e.Topo.Gateway, []netip.Prefix{edgeGateway4, edgeGateway6}); err != nil {
		return err
	}
	birdDir := filepath.Join(e.LogDir, "bird")
	if err := os.MkdirAll(birdDir, 0o700); err != nil {
		return err
	}
	b, err := bird.Launch(router, bird.Upstream(edgeRouter4.Addr(), edgeRouterASN, edgeGateway4.Addr(), edgeGateway6.Addr(), edgeGatewayASN,
		"debug { states, events };"), birdDir)
	if err != nil {
		return err
	}
	defer b.Close()
	conn, err := b.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()

	confPath := filepath.Join(e.LogDir, "nftgate-edge.toml")
	if err := os.WriteFile(confPath, []byte(edgeConfig()), 0o600); err != nil {
		return err
	}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nftgate"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace nftgate (the allocation Lease's): %w", err)
	}

	start := time.Now()
	if err := e.makeLoadBalancers(ctx, ec.Services); err != nil {
		return err
	}
	res.ConvertSeconds = time.Since(start).Seconds()
	logf("edge: %d Services made type LoadBalancer in %v", ec.Services, time.Since(start).Round(time.Millisecond))

	watch, err := watchIngress(ctx, e.Client)
	if err != nil {
		return err
	}
	defer watch.stop()

	p := proxierByName(proxNftgate, e)
	args := p.args
	p.args = func(dir string) ([]string, error) {
		a, err := args(dir)
		return append(a, "--config", confPath), err
	}
	if err := resetGateway(ctx, e); err != nil {
		return err
	}
	logf("edge: starting nftgate with %d LoadBalancer Services without an address", ec.Services)
	proc, err := p.Start(e, e.LogDir)
	if err != nil {
		return err
	}
	defer func() {
		proc.Stop()
		if cerr := p.Cleanup(context.WithoutCancel(ctx), e, e.LogDir); cerr != nil {
			logf("edge: cleanup: %v", cerr)
		}
	}()

	// (b) all allocated and all announced, from a cold start.
	deadline := time.Now().Add(e.Cfg.Timeout)
	var allocated, announced time.Time
	for allocated.IsZero() || announced.IsZero() {
		if err := proc.Exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d of %d statuses written, BIRD has %d routes", e.Cfg.Timeout, watch.count(), ec.Services, mustCount(conn))
		}
		if allocated.IsZero() {
			if n, at := watch.countAt(); n >= ec.Services {
				allocated = at
				logf("edge: all %d statuses written %.2fs after the start", n, at.Sub(proc.Started).Seconds())
			}
		}
		if announced.IsZero() {
			n, err := conn.RouteCount(edgeProtocol)
			if err != nil {
				return err
			}
			if n >= ec.Services {
				announced = time.Now()
				logf("edge: BIRD has all %d routes %.2fs after the start", n, announced.Sub(proc.Started).Seconds())
			}
		}
		if err := sleepCtx(ctx, edgePollCount); err != nil {
			return err
		}
	}
	res.AllocatedSeconds = allocated.Sub(proc.Started).Seconds()
	res.AnnouncedSeconds = announced.Sub(proc.Started).Seconds()
	if st, err := readProcStats(proc.PID()); err == nil {
		res.CPUColdSecond = st.CPU.Seconds()
	}

	// (a) Services created one at a time.
	for i := range ec.Samples {
		toStatus, toRoute, err := e.edgeSample(ctx, i, watch, conn, proc)
		if err != nil {
			return fmt.Errorf("sample %d: %w", i, err)
		}
		res.ToStatusMs = append(res.ToStatusMs, ms(toStatus))
		res.ToRouteMs = append(res.ToRouteMs, ms(toRoute))
		if err := sleepCtx(ctx, edgeSampleGap); err != nil {
			return err
		}
	}
	res.summarize()
	logf("edge: create to status p50 %.1f ms p90 %.1f ms max %.1f ms; to BIRD's route p50 %.1f ms p90 %.1f ms max %.1f ms",
		res.StatusP50Ms, res.StatusP90Ms, res.StatusMaxMs, res.RouteP50Ms, res.RouteP90Ms, res.RouteMaxMs)
	if st, err := readProcStats(proc.PID()); err == nil {
		res.RSSMiB = float64(st.RSSKiB) / 1024
	}

	// (c) The restart.
	if n := mustCount(conn); n != res.Routes {
		return fmt.Errorf("before the restart BIRD has %d routes, want %d", n, res.Routes)
	}
	proc, err = e.edgeRestart(ctx, p, proc, conn, res)
	if err != nil {
		return err
	}
	if res.MinRoutes < res.Routes {
		logf("edge: ROUTES LOST during the restart: BIRD had as few as %d of %d", res.MinRoutes, res.Routes)
	}
	return res.write(e.Cfg.Out)
}

// edgeConfig is nftgate's configuration for the edge phase: the pool and
// BIRD as its BGP peer over both families; every other key its default.
func edgeConfig() string {
	return fmt.Sprintf(`[bgp]
asn = %d
router_id = %q

[[bgp.peer]]
address = %q
asn = %d

[[bgp.peer]]
address = %q
asn = %d

[[pools]]
name = "bench"
addresses = [%q]
`, edgeGatewayASN, edgeGateway4.Addr(), edgeRouter4.Addr(), edgeRouterASN, edgeRouter6.Addr(), edgeRouterASN, edgePool)
}

// makeLoadBalancers turns the first n bulk Services into LoadBalancer
// Services without NodePorts, as many writers at a time as loading uses.
func (e *Env) makeLoadBalancers(ctx context.Context, n int) error {
	patch := []byte(`{"spec":{"type":"LoadBalancer","allocateLoadBalancerNodePorts":false}}`)
	next := make(chan int)
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range e.Cfg.LoadWorkers {
		wg.Go(func() {
			for i := range next {
				name := fmt.Sprintf(firstBulkName, i)
				err := retryTransient(ctx, func() error {
					_, err := e.Client.CoreV1().Services(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
					return err
				})
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("make Service %s/%s a LoadBalancer: %w", namespace, name, err) })
					cancel()
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// edgeSample creates sample Service i (its EndpointSlice first, so that it
// can be served at once) and times its status and its route from the
// return of the create call.
func (e *Env) edgeSample(ctx context.Context, i int, w *ingressWatch, conn *bird.Conn, proc *Proc) (toStatus, toRoute time.Duration, err error) {
	name := fmt.Sprintf(edgeSampleName, i)
	ip, err := bulkIP(bulkRanges[0].size() - 1 - i) // from the top of the range, clear of the bulk Services
	if err != nil {
		return 0, 0, err
	}
	sl := slice(name, bulkPort, e.Topo.BackendIPv4[:e.Cfg.Endpoints])
	if _, err := e.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return 0, 0, fmt.Errorf("create EndpointSlice %s: %w", name, err)
	}
	svc := service(name, ip)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	no := false
	svc.Spec.AllocateLoadBalancerNodePorts = &no
	if _, err := e.Client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return 0, 0, fmt.Errorf("create Service %s: %w", name, err)
	}
	created := time.Now()
	deadline := created.Add(e.Cfg.Timeout)
	var addr netip.Addr
	for {
		var at time.Time
		if addr, at = w.address(name); addr.IsValid() {
			toStatus = at.Sub(created)
			break
		}
		if err := proc.Exited(); err != nil {
			return 0, 0, err
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("Service %s: no status after %v", name, e.Cfg.Timeout)
		}
		if err := sleepCtx(ctx, edgePollRoute); err != nil {
			return 0, 0, err
		}
	}
	route := netip.PrefixFrom(addr, 32)
	for {
		has, err := conn.HasRoute(route)
		if err != nil {
			return 0, 0, err
		}
		if has {
			return toStatus, time.Since(created), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("BIRD has no route %s for Service %s after %v", route, name, e.Cfg.Timeout)
		}
		if err := sleepCtx(ctx, edgePollRoute); err != nil {
			return 0, 0, err
		}
	}
}

// edgeRestart stops nftgate with SIGTERM and starts it again, reading
// BIRD's route count all the while, and returns the new process once BIRD
// has every route from the new session.
func (e *Env) edgeRestart(ctx context.Context, p *Proxier, old *Proc, conn *bird.Conn, res *EdgeResult) (*Proc, error) {
	var (
		minRoutes atomic.Int64
		readings  atomic.Int64
		grSeen    atomic.Bool
		pollErr   error
		timeline  []string // the poller's until it is done
	)
	term := time.Now()
	minRoutes.Store(int64(res.Routes))
	// One reader of the connection at a time: the poller owns it until
	// it is told to stop, and reports what it reads.
	type reading struct {
		at     time.Time
		routes int
		gr     bool
	}
	latest := make(chan reading, 1)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := reading{routes: -1}
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := conn.RouteCount(edgeProtocol)
			if err == nil {
				var gr bool
				gr, err = conn.GracefulRestartActive(edgeProtocol)
				if err == nil {
					readings.Add(1)
					if int64(n) < minRoutes.Load() {
						minRoutes.Store(int64(n))
					}
					if gr {
						grSeen.Store(true)
					}
					if n != last.routes || gr != last.gr {
						timeline = append(timeline, fmt.Sprintf("%.3f s: %d routes, graceful restart %v", time.Since(term).Seconds(), n, gr))
						last = reading{routes: n, gr: gr}
					}
					select {
					case <-latest:
					default:
					}
					latest <- reading{time.Now(), n, gr}
				}
			}
			if err != nil {
				pollErr = err
				return
			}
			time.Sleep(edgePollCount / 4)
		}
	}()
	finish := func() {
		close(stop)
		<-done
		res.MinRoutes = int(minRoutes.Load())
		res.RouteReadings = int(readings.Load())
		res.GRSeen = grSeen.Load()
		res.Timeline = timeline
	}

	old.Stop()
	res.StopSeconds = time.Since(term).Seconds()
	logf("edge: nftgate stopped by SIGTERM in %.2fs; starting it again", res.StopSeconds)
	proc, err := p.Start(e, e.LogDir)
	if err != nil {
		finish()
		return nil, err
	}
	deadline := time.Now().Add(e.Cfg.Timeout)
	sawGR := false
	for {
		select {
		case r := <-latest:
			sawGR = sawGR || r.gr
			// Fresh: the graceful restart began (BIRD kept the old
			// session's routes as stale) and is over, with every route.
			if sawGR && !r.gr && r.routes == res.Routes && r.at.After(proc.Started) {
				finish()
				res.FreshSeconds = r.at.Sub(proc.Started).Seconds()
				res.FreshFromTermS = r.at.Sub(term).Seconds()
				logf("edge: BIRD has all %d routes from the new session %.2fs after the start (%.2fs after SIGTERM); fewest routes seen meanwhile %d, in %d readings",
					res.Routes, res.FreshSeconds, res.FreshFromTermS, res.MinRoutes, res.RouteReadings)
				return proc, nil
			}
		case <-done:
			finish()
			return proc, fmt.Errorf("reading BIRD: %w", pollErr)
		case <-ctx.Done():
			finish()
			return proc, ctx.Err()
		case <-time.After(time.Second):
		}
		if err := proc.Exited(); err != nil {
			finish()
			return proc, err
		}
		if time.Now().After(deadline) {
			finish()
			return proc, fmt.Errorf("BIRD's graceful restart not over with all %d routes %v after the restart (restart seen: %v, fewest routes %d)",
				res.Routes, e.Cfg.Timeout, sawGR, res.MinRoutes)
		}
	}
}

func mustCount(conn *bird.Conn) int {
	n, err := conn.RouteCount(edgeProtocol)
	if err != nil {
		return -1
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// ingressWatch follows the bench namespace's Services through an informer
// and notes when each first had an address in its status.
type ingressWatch struct {
	mu    sync.Mutex
	first map[string]time.Time
	addr  map[string]netip.Addr
	last  time.Time
	stopc chan struct{}
}

func watchIngress(ctx context.Context, client kubernetes.Interface) (*ingressWatch, error) {
	w := &ingressWatch{first: map[string]time.Time{}, addr: map[string]netip.Addr{}, stopc: make(chan struct{})}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	inf := f.Core().V1().Services().Informer()
	note := func(obj any) {
		svc, ok := obj.(*corev1.Service)
		if !ok || len(svc.Status.LoadBalancer.Ingress) == 0 {
			return
		}
		now := time.Now()
		a, err := netip.ParseAddr(svc.Status.LoadBalancer.Ingress[0].IP)
		if err != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.first[svc.Name]; !ok {
			w.first[svc.Name], w.addr[svc.Name], w.last = now, a, now
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    note,
		UpdateFunc: func(_, obj any) { note(obj) },
	}); err != nil {
		return nil, err
	}
	f.Start(w.stopc)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		close(w.stopc)
		return nil, errors.New("the Service informer did not sync")
	}
	if n := w.count(); n != 0 {
		close(w.stopc)
		return nil, fmt.Errorf("%d Services already have a LoadBalancer address before nftgate starts", n)
	}
	return w, nil
}

func (w *ingressWatch) stop() { close(w.stopc) }

func (w *ingressWatch) count() int {
	n, _ := w.countAt()
	return n
}

// countAt is how many Services have had an address, and when the last of
// them got it.
func (w *ingressWatch) countAt() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.first), w.last
}

func (w *ingressWatch) address(name string) (netip.Addr, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addr[name], w.first[name]
}

// summarize computes the percentiles from the samples.
func (r *EdgeResult) summarize() {
	r.StatusP50Ms, r.StatusP90Ms, r.StatusMaxMs = percentile(r.ToStatusMs, 50), percentile(r.ToStatusMs, 90), percentile(r.ToStatusMs, 100)
	r.RouteP50Ms, r.RouteP90Ms, r.RouteMaxMs = percentile(r.ToRouteMs, 50), percentile(r.ToRouteMs, 90), percentile(r.ToRouteMs, 100)
}

// rerenderEdge writes edge.md (and edge.json) next to an edge.json again.
func rerenderEdge(path string, data []byte) error {
	var r EdgeResult
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	r.summarize()
	return r.write(filepath.Dir(path))
}

// write puts edge.json and edge.md into dir.
func (r *EdgeResult) write(dir string) error {
	return writeResults(dir, "edge", r, r.markdown)
}

func (r *EdgeResult) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# nftgate edge: %d LoadBalancer Services announced to BIRD\n\n", r.Services)
	fmt.Fprintf(&b, "Run %s on %s.\n\n", r.Started.Format(time.RFC3339), r.Machine)
	fmt.Fprintf(&b, "nftgate with one pool (%s) and one BGP peer per family: BIRD 2 in its own namespace. "+
		"Method: bench/README.md, \"Edge\".\n\n", edgePool)
	fmt.Fprintf(&b, "| what | time |\n|---|---:|\n")
	fmt.Fprintf(&b, "| %d Services made LoadBalancer through the API (before nftgate starts) | %.1f s |\n", r.Services, r.ConvertSeconds)
	fmt.Fprintf(&b, "| cold start: every status written | %.2f s |\n", r.AllocatedSeconds)
	fmt.Fprintf(&b, "| cold start: every /32 in BIRD's table | %.2f s |\n", r.AnnouncedSeconds)
	fmt.Fprintf(&b, "| one Service created (of %d): status written, p50 / p90 / max | %.1f / %.1f / %.1f ms |\n",
		r.Samples, r.StatusP50Ms, r.StatusP90Ms, r.StatusMaxMs)
	fmt.Fprintf(&b, "| one Service created: /32 in BIRD's table, p50 / p90 / max | %.1f / %.1f / %.1f ms |\n",
		r.RouteP50Ms, r.RouteP90Ms, r.RouteMaxMs)
	fmt.Fprintf(&b, "| restart: SIGTERM until nftgate exited | %.2f s |\n", r.StopSeconds)
	fmt.Fprintf(&b, "| restart: new nftgate's start until BIRD has all %d routes from the new session | %.2f s (%.2f s after SIGTERM) |\n",
		r.Routes, r.FreshSeconds, r.FreshFromTermS)
	fmt.Fprintf(&b, "\nDuring the restart BIRD kept the routes as stale (graceful restart seen: %v); "+
		"the fewest routes it had in %d readings from SIGTERM to the end: %d of %d.\n",
		r.GRSeen, r.RouteReadings, r.MinRoutes, r.Routes)
	fmt.Fprintf(&b, "\nBIRD's routes from the gateway from SIGTERM on, as they changed:\n\n")
	for _, l := range r.Timeline {
		fmt.Fprintf(&b, "- %s\n", l)
	}
	fmt.Fprintf(&b, "nftgate: %.0f MiB resident after the samples, %.1f s of CPU until every route was announced.\n",
		r.RSSMiB, r.CPUColdSecond)
	return b.String()
}
