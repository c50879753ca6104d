package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// Result is one proxier at one size.
type Result struct {
	Proxier   string `json:"proxier"`
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`

	// ColdStartSeconds: from the process start until the canary and the
	// first, middle and last bulk Services are all served.
	ColdStartSeconds float64 `json:"cold_start_seconds"`
	// ChangeMs: from each EndpointSlice write until a client's connection
	// reaches the new endpoints.
	ChangeMs    []float64 `json:"change_ms"`
	ChangeP50Ms float64   `json:"change_p50_ms"`
	ChangeP90Ms float64   `json:"change_p90_ms"`
	ChangeMaxMs float64   `json:"change_max_ms"`

	// Memory after the run, once the proxier is quiet: resident then,
	// and at its peak.
	RSSMiB float64 `json:"rss_mib"`
	HWMMiB float64 `json:"rss_peak_mib"`
	// CPU time (user+system, reaped children included) until the cold
	// start was over, and for the whole run.
	CPUColdSeconds float64 `json:"cpu_cold_start_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	// CPUPerChangeMs: CPU time during the change phase divided by the
	// number of changes (pauses between changes included). The phase
	// starts once the proxier is quiet (QuietSeconds after it was ready):
	// what it does once after its first sync is not a change's.
	CPUPerChangeMs float64 `json:"cpu_per_change_ms"`
	QuietSeconds   float64 `json:"quiet_seconds"`
	RunSeconds     float64 `json:"run_seconds"`
	// SlabMiB: the kernel's slab memory grown from before the start to
	// the end of the cold start (the whole machine's, see slabBytes).
	SlabMiB float64 `json:"slab_growth_mib"`

	// Connection latency from the client: the whole exchange (connect,
	// one line each way, close) to the backend directly and through the
	// canary's ClusterIP.
	Direct  Latency `json:"direct"`
	Service Latency `json:"via_clusterip"`

	Metrics SyncMetrics `json:"metrics"`

	// Dataplane: new connections per second and bulk throughput, via a
	// Service and direct (dataplane.go).
	Dataplane *DataplaneResult `json:"dataplane,omitempty"`
	// Drift: traffic's gap when another program changes the tables
	// (drift.go).
	Drift *DriftResult `json:"drift,omitempty"`
	// Churn: an unrelated change and the CPU under a rolling update
	// (churn.go).
	Churn *ChurnResult `json:"churn,omitempty"`

	// TimedOut says what did not finish within --timeout; the numbers
	// after that point are missing.
	TimedOut string `json:"timed_out,omitempty"`
}

// Latency summarises connection timings in microseconds.
type Latency struct {
	ConnectP50us  float64 `json:"connect_p50_us"`
	ExchangeP50us float64 `json:"exchange_p50_us"`
	ExchangeP90us float64 `json:"exchange_p90_us"`
	// Failed attempts, retried: refused, or no answer within 2 s.
	Failed int `json:"failed"`
	// LastFailure is the error of the last failed attempt, and when it
	// came: refused and timed out point to different causes.
	LastFailure string `json:"last_failure,omitempty"`
}

// Summary is one line for the log.
func (r Result) Summary() string {
	return fmt.Sprintf("%s N=%d: cold start %.2fs, change p50 %.1fms p90 %.1fms max %.1fms, RSS %.0f MiB (peak %.0f), CPU %.2fs (cold %.2fs), exchange p50 %.0fµs via ClusterIP vs %.0fµs direct",
		r.Proxier, r.Services, r.ColdStartSeconds, r.ChangeP50Ms, r.ChangeP90Ms, r.ChangeMaxMs, r.RSSMiB, r.HWMMiB,
		r.CPUSeconds, r.CPUColdSeconds, r.Service.ExchangeP50us, r.Direct.ExchangeP50us)
}

// Measure runs proxier p against the n Services loaded: cold start,
// endpoint changes, data-plane latency, then its memory and CPU time. The
// gateway is left without rules and conntrack entries.
func (e *Env) Measure(ctx context.Context, p *Proxier, n int) (res Result, err error) {
	res = Result{Proxier: p.Name, Services: n, Endpoints: e.Cfg.Endpoints}
	if err := resetGateway(ctx, e); err != nil {
		return res, err
	}
	logf("%s N=%d: starting", p.Name, n)
	slabBefore, err := slabBytes()
	if err != nil {
		return res, err
	}
	proc, err := p.Start(e, e.LogDir)
	if err != nil {
		return res, err
	}
	defer func() {
		proc.Stop()
		if cerr := p.Cleanup(context.WithoutCancel(ctx), e, e.LogDir); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()

	served, err := e.waitServed(ctx, proc, e.Probes())
	if errors.Is(err, errTimeout) {
		// A result too: the proxier could not serve N Services in time.
		logf("%s N=%d: %v", p.Name, n, err)
		res.TimedOut = fmt.Sprintf("cold start over %v", e.Cfg.Timeout)
		res.ColdStartSeconds = e.Cfg.Timeout.Seconds()
		if st, err := readProcStats(proc.PID()); err == nil {
			res.RSSMiB, res.HWMMiB = float64(st.RSSKiB)/1024, float64(st.HWMKiB)/1024
			res.CPUColdSeconds, res.CPUSeconds = st.CPU.Seconds(), st.CPU.Seconds()
		}
		res.RunSeconds = time.Since(proc.Started).Seconds()
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("cold start: %w", err)
	}
	res.ColdStartSeconds = served.Sub(proc.Started).Seconds()
	slabCold, err := slabBytes()
	if err != nil {
		return res, err
	}
	res.SlabMiB = float64(slabCold-slabBefore) / (1 << 20)
	cold, err := readProcStats(proc.PID())
	if err != nil {
		return res, err
	}
	res.CPUColdSeconds = cold.CPU.Seconds()
	logf("%s N=%d: cold start %.2fs", p.Name, n, res.ColdStartSeconds)

	if err := e.waitReady(ctx, proc, p); err != nil {
		return res, err
	}
	changeDst := netip.AddrPortFrom(changeIP, servicePort)
	if _, err := e.waitBackendPort(ctx, proc, changeDst, e.ChangePort(), time.Now()); err != nil {
		return res, fmt.Errorf("changed Service before the first change: %w", err)
	}
	quiet, err := waitQuiet(ctx, proc.PID(), e.Cfg.Timeout)
	if err != nil {
		return res, err
	}
	res.QuietSeconds = quiet.Seconds()
	before, err := readProcStats(proc.PID())
	if err != nil {
		return res, err
	}
	for i := range e.Cfg.Changes {
		// A deliberate pause, not a wait for readiness: it lets
		// kube-proxy's minimum sync period lapse, so each change starts
		// a sync of its own as one would on a quiet cluster.
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(e.Cfg.ChangeGap):
		}
		port, at, err := e.ChangeEndpoints(ctx)
		if err != nil {
			return res, err
		}
		took, err := e.waitBackendPort(ctx, proc, changeDst, port, at)
		if err != nil {
			return res, fmt.Errorf("change %d: %w", i+1, err)
		}
		res.ChangeMs = append(res.ChangeMs, float64(took)/float64(time.Millisecond))
	}
	after, err := readProcStats(proc.PID())
	if err != nil {
		return res, err
	}
	res.CPUPerChangeMs = float64(after.CPU-before.CPU) / float64(time.Millisecond) / float64(max(e.Cfg.Changes, 1))
	res.ChangeP50Ms = percentile(res.ChangeMs, 50)
	res.ChangeP90Ms = percentile(res.ChangeMs, 90)
	res.ChangeMaxMs = percentile(res.ChangeMs, 100)

	direct := netip.AddrPortFrom(e.Topo.BackendIPv4[0], canaryPort)
	res.Direct, res.Service, err = e.connectionLatency(direct, netip.AddrPortFrom(canaryIP, servicePort), e.Cfg.LatencyN)
	if err != nil {
		return res, err
	}

	if e.dataplaneFor(p.Name) {
		if res.Dataplane, err = e.measureDataplane(ctx, proc, p, n); err != nil {
			return res, err
		}
	}

	if e.driftFor(p.Name) {
		if res.Drift, err = e.measureDrift(ctx, proc, p, n); err != nil {
			return res, fmt.Errorf("drift: %w", err)
		}
	}

	if e.churnFor(p.Name) {
		if res.Churn, err = e.measureChurn(ctx, proc, p, n); err != nil {
			return res, fmt.Errorf("churn: %w", err)
		}
	}

	if res.Metrics, err = scrapeSyncMetrics(ctx, e, p); err != nil {
		return res, fmt.Errorf("metrics: %w", err)
	}
	// Resident memory at rest: the last drift's repair may still be
	// returning what it used (read at once, one run in three at 100,000
	// read 217 MiB where the others read 179-182).
	if _, err := waitQuiet(ctx, proc.PID(), e.Cfg.Timeout); err != nil {
		return res, err
	}
	end, err := readProcStats(proc.PID())
	if err != nil {
		return res, err
	}
	res.RSSMiB = float64(end.RSSKiB) / 1024
	res.HWMMiB = float64(end.HWMKiB) / 1024
	res.CPUSeconds = end.CPU.Seconds()
	res.RunSeconds = time.Since(proc.Started).Seconds()
	return res, nil
}

// resetGateway empties the gateway's ruleset and conntrack table, and puts
// conntrack's TIME_WAIT timeout back to the kernel's default: nftgate sets
// it (conntrack_tcp_time_wait), and the proxier measured after it must not
// run with nftgate's setting.
func resetGateway(ctx context.Context, e *Env) error {
	if out, err := e.Topo.Gateway.Command(ctx, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		return fmt.Errorf("nft flush ruleset: %v: %s", err, out)
	}
	_ = e.Topo.Gateway.Command(ctx, "conntrack", "-F").Run()
	if err := e.Topo.Gateway.Sysctl(conntrackTimeWaitKey, kernelConntrackTimeWait); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// conntrackTimeWaitKey is conntrack's TIME_WAIT timeout, in seconds;
// kernelConntrackTimeWait the kernel's default. The file exists once
// conntrack is loaded (before that, nothing has changed it).
const (
	conntrackTimeWaitKey    = "net/netfilter/nf_conntrack_tcp_timeout_time_wait"
	kernelConntrackTimeWait = "120"
)

var errTimeout = errors.New("timed out")

// coldProbeTimeout bounds one connection attempt while waiting for the
// first rules. Before they exist a SYN is lost in the gateway's sink and
// the attempt times out; lab round trips take well under a millisecond, so
// this is also the resolution of the cold start time.
const coldProbeTimeout = 25 * time.Millisecond

// waitServed connects to every probe until each has been served once, and
// returns when the last one was.
func (e *Env) waitServed(ctx context.Context, proc *Proc, probes []Probe) (time.Time, error) {
	deadline := time.Now().Add(e.Cfg.Timeout)
	pending := append([]Probe(nil), probes...)
	var last time.Time
	var lastErr error
	for len(pending) > 0 {
		if err := proc.Exited(); err != nil {
			return last, err
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("%w: %d of %d Services not served after %v (first: %s %s; last error: %v)",
				errTimeout, len(pending), len(probes), e.Cfg.Timeout, pending[0].Name, pending[0].Dst, lastErr)
		}
		if ctx.Err() != nil {
			return last, ctx.Err()
		}
		var still []Probe
		for _, p := range pending {
			_, err := e.dial(p.Dst, coldProbeTimeout)
			if err == nil || (!p.Echo && lab.IsRefused(err)) {
				last = time.Now()
				continue
			}
			lastErr = err
			still = append(still, p)
		}
		pending = still
		if len(pending) > 0 {
			time.Sleep(2 * time.Millisecond) // pacing between rounds of attempts
		}
	}
	return last, nil
}

// waitReady waits until the proxier's readiness endpoint answers 200.
func (e *Env) waitReady(ctx context.Context, proc *Proc, p *Proxier) error {
	wctx, cancel := context.WithTimeout(ctx, e.Cfg.Timeout)
	defer cancel()
	err := lab.Eventually(wctx, func() error {
		if err := proc.Exited(); err != nil {
			return err
		}
		code, body, err := httpGet(wctx, e, p.ReadyURL)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET %s: %d %.200s", p.ReadyURL, code, body)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s not ready: %w", p.Name, err)
	}
	return nil
}

// Quiet is a proxier using at most quietCPU of CPU time over quietWindow.
const (
	quietWindow = time.Second
	quietCPU    = 50 * time.Millisecond
)

// waitQuiet waits until process pid is quiet (or timeout passed, which is
// no error: the changes are then measured as they are) and returns how
// long that took.
func waitQuiet(ctx context.Context, pid int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	last, err := readProcStats(pid)
	if err != nil {
		return 0, err
	}
	for time.Since(start) < timeout {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(quietWindow):
		}
		st, err := readProcStats(pid)
		if err != nil {
			return 0, err
		}
		if st.CPU-last.CPU <= quietCPU {
			break
		}
		last = st
	}
	return time.Since(start), nil
}

// changeProbeTimeout bounds one connection attempt while waiting for a
// change: far above a lab round trip, so an attempt lost in a rule swap
// costs little before the next one.
const changeProbeTimeout = 200 * time.Millisecond

// waitBackendPort connects to dst until an endpoint on port answers, and
// returns the time from since until then. Attempts follow each other
// closely at first and more loosely as the wait grows (every 1/200 of the
// time waited so far), so the resolution stays near half a percent without
// flooding the gateway during long syncs.
func (e *Env) waitBackendPort(ctx context.Context, proc *Proc, dst netip.AddrPort, port uint16, since time.Time) (time.Duration, error) {
	deadline := since.Add(e.Cfg.Timeout)
	var lastErr error
	for {
		backend, err := e.dial(dst, changeProbeTimeout)
		if err == nil {
			ap, perr := netip.ParseAddrPort(backend)
			if perr == nil && ap.Port() == port {
				return time.Since(since), nil
			}
			lastErr = fmt.Errorf("answered by %s", backend)
		} else {
			lastErr = err
		}
		if err := proc.Exited(); err != nil {
			return 0, err
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s: no endpoint on port %d after %v (last: %v)", dst, port, e.Cfg.Timeout, lastErr)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		time.Sleep(min(max(time.Since(since)/200, 200*time.Microsecond), 20*time.Millisecond))
	}
}

// connectionLatency times n exchanges with the echo server at direct and n
// through the ClusterIP via, alternating, from one thread in the client
// namespace. An attempt that fails is retried and counted, and the report
// shows the count: a proxier that refuses some connections now and then
// (kube-proxy's nftables mode did, at 10,000 Services, during its syncs)
// is a finding, not a reason to lose the run. More than 10% is an error.
func (e *Env) connectionLatency(direct, via netip.AddrPort, n int) (Latency, Latency, error) {
	var dConn, dAll, vConn, vAll []float64
	failed := map[netip.AddrPort]int{}
	lastFailure := map[netip.AddrPort]string{}
	err := e.Topo.Client.Do(func() error {
		for i := 0; i < 2*n; {
			dst := direct
			if i%2 == 1 {
				dst = via
			}
			_, conn, all, err := exchange(dst, 2*time.Second)
			if err != nil {
				lastFailure[dst] = time.Now().UTC().Format("15:04:05.000") + " " + err.Error()
				if failed[dst]++; failed[dst] > n/10+1 {
					return fmt.Errorf("latency probes to %s: %d failed, last: %w", dst, failed[dst], err)
				}
				continue
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			if dst == direct {
				dConn, dAll = append(dConn, us(conn)), append(dAll, us(all))
			} else {
				vConn, vAll = append(vConn, us(conn)), append(vAll, us(all))
			}
			i++
		}
		return nil
	})
	summary := func(conn, all []float64, dst netip.AddrPort) Latency {
		return Latency{ConnectP50us: percentile(conn, 50), ExchangeP50us: percentile(all, 50), ExchangeP90us: percentile(all, 90),
			Failed: failed[dst], LastFailure: lastFailure[dst]}
	}
	return summary(dConn, dAll, direct), summary(vConn, vAll, via), err
}

// exchange connects to an echo server, sends a line and reads the answer
// line, then resets the connection, and returns the connect and total times
// in microseconds. The reset (SO_LINGER 0) leaves no TIME_WAIT socket on
// the backend: thousands of probes from random masqueraded ports would
// otherwise hit old ones and lose SYNs, which is the lab's problem, not the
// proxier's.
func exchange(dst netip.AddrPort, timeout time.Duration) (backend string, connect, total time.Duration, err error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", dst.String(), timeout)
	if err != nil {
		return "", 0, 0, err
	}
	tc := c.(*net.TCPConn)
	defer func() {
		_ = tc.SetLinger(0)
		tc.Close()
	}()
	connect = time.Since(start)
	_ = tc.SetDeadline(start.Add(timeout))
	if _, err := io.WriteString(tc, "nftgate-bench\n"); err != nil {
		return "", 0, 0, err
	}
	line, err := bufio.NewReader(tc).ReadString('\n')
	if err != nil {
		return "", 0, 0, err
	}
	total = time.Since(start)
	backend, _, _ = strings.Cut(line, " ")
	return backend, connect, total, nil
}

// dial runs one exchange from inside the client namespace.
func (e *Env) dial(dst netip.AddrPort, timeout time.Duration) (string, error) {
	var backend string
	err := e.Topo.Client.Do(func() error {
		var err error
		backend, _, _, err = exchange(dst, timeout)
		return err
	})
	return backend, err
}
