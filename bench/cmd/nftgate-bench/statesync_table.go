package main

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/statesync"
)

// The state-sync phase's table run: what an idle pair spends on a full
// table. Short connections leave their gateway's conntrack table full of
// closed ones (TIME_WAIT, 120 s each: at 1,000 new connections a second
// 120,000 entries), which the sync's refresh passes walk. The run creates
// --statesync-table-entries such entries in A's kernel through netlink
// (as statesync-ctgen does, at 10,000 a second, in TIME_WAIT with
// tableTimeout left, so that the table stays full through the window),
// waits until B holds their replicas, and then reads both nftgates' CPU
// and A's refresh counters over --statesync-table-idle without any load.
// Then B restarts as a rebooted gateway would (its nftgate killed, its
// conntrack flushed, nftgate started again), and A sends it the table in
// a full resync: how long until B is ready and holds it all, and what that
// costs both in CPU and memory.
const ssTable = "table"

// tcpTimeWait is TCP_CONNTRACK_TIME_WAIT.
const tcpTimeWait = 7

// tableTimeout outlasts the creation, the replication and the window.
const tableTimeout = 1800

// tableRate is how fast the table's entries are created: A's listener
// keeps up (no kernel event is lost, which would make the next pass a
// full one).
const tableRate = 10000

// StateSyncTableRun is the table run's outcome.
type StateSyncTableRun struct {
	Entries int `json:"entries"`
	// Created: how many A's kernel took, and in how long.
	Created       int     `json:"created"`
	CreateSeconds float64 `json:"create_seconds"`
	Held          bool    `json:"held"`
	HeldAfter     float64 `json:"held_after_seconds"`
	HeldMissing   int     `json:"held_missing,omitempty"`
	IdleSeconds   float64 `json:"idle_seconds"`
	CPUSecondsA   float64 `json:"cpu_seconds_a"`
	CPUSecondsB   float64 `json:"cpu_seconds_b"`
	// Passes and Read: A's refresh passes in the window and the entries
	// they read, by kind (nftgate_statesync_refresh_passes_total and
	// _entries_read_total: "table", "due"); nil for an nftgate without
	// them (every pass read the table).
	Passes map[string]float64 `json:"refresh_passes_a,omitempty"`
	Read   map[string]float64 `json:"refresh_entries_read_a,omitempty"`
	// Sync: the sync's own counters over the window.
	Sync    SyncCounters `json:"sync"`
	Alive   bool         `json:"alive"`
	LoadAvg [2]float64   `json:"load_avg_before_after"`
	// Restart: B's restart after the window.
	Restart *TableRestart `json:"restart,omitempty"`
}

// TableRestart is B's restart in the table run: its nftgate killed and its
// conntrack flushed, then nftgate started again.
type TableRestart struct {
	// From B's start until its state sync first says it is ready
	// (/api/v1/statesync), until its gateway set does (/api/v1/gateways:
	// a candidate for the addresses), and until its peer's resync is done
	// (polled together, about every 10 ms); HeldAfter: until B's kernel
	// holds a replica of every entry of A's (HeldMissing at the last look
	// if never).
	ReadyAfter      float64 `json:"ready_after_seconds"`
	SetReadyAfter   float64 `json:"set_ready_after_seconds"`
	ResyncDoneAfter float64 `json:"resync_done_after_seconds"`
	Held            bool    `json:"held"`
	HeldAfter       float64 `json:"held_after_seconds"`
	HeldMissing     int     `json:"held_missing,omitempty"`
	// ResyncsSent: A's full resyncs to B meanwhile.
	ResyncsSent uint64 `json:"resyncs_sent"`
	// CPU of A from the kill until B held it all, and of B's new nftgate
	// until then.
	CPUSecondsA float64 `json:"cpu_seconds_a"`
	CPUSecondsB float64 `json:"cpu_seconds_b"`
	// A's resident memory before the restart and its peak until B held
	// it all (VmHWM, reset before the kill); B's peak until then.
	RSSMiBA     float64 `json:"rss_mib_a"`
	PeakRSSMiBA float64 `json:"peak_rss_mib_a"`
	PeakRSSMiBB float64 `json:"peak_rss_mib_b"`
}

func statesyncTable(cfg *Config, topo *failover.Topology, nc *failover.NftgateConfig, gs []*failover.Nftgate, a int, srcs []netip.Addr) (run StateSyncTableRun, err error) {
	c := &cfg.StateSync
	b := 1 - a
	ga, gb := gs[a], gs[b]
	run = StateSyncTableRun{Entries: c.TableEntries, LoadAvg: [2]float64{loadAvg(), 0}}
	svc := netip.AddrPortFrom(failover.ServiceAddr, failover.ServicePort)
	k, err := statesync.NewConntrack(statesync.ConntrackOptions{NetNS: topo.Gateways[a].FD()})
	if err != nil {
		return run, err
	}
	defer k.Close()
	eps := make([]netip.AddrPort, len(failover.Endpoints))
	for i, e := range failover.Endpoints {
		eps[i] = netip.AddrPortFrom(e, failover.EndpointPort)
	}
	window := time.Duration(float64(c.TableEntries) / tableRate * float64(time.Second))
	start := time.Now()
	st := runCtgenShaped(k, svc, srcs, eps, failover.Floating, tableRate, window, tcpTimeWait, tableTimeout)
	run.Created, run.CreateSeconds = st.Completed, time.Since(start).Seconds()
	if st.Failed > 0 {
		return run, fmt.Errorf("creating the table on A: %d failed, the last: %s", st.Failed, st.LastError)
	}
	if run.Held, run.HeldMissing, run.HeldAfter, err = heldSince(topo, a, svc, time.Now()); err != nil {
		return run, err
	}

	cpuA0, errA := readProcStats(ga.PID())
	cpuB0, errB := readProcStats(gb.PID())
	m0, errM := refreshMetrics(ga)
	s0, errS := syncSnapshot(ga, gb)
	if err := errors.Join(errA, errB, errM, errS); err != nil {
		return run, err
	}
	idleStart := time.Now()
	var profiles sync.WaitGroup
	if c.Profile != "" {
		for _, g := range []*failover.Nftgate{ga, gb} {
			path := filepath.Join(c.Profile, fmt.Sprintf("table-%d-%s.pprof", c.TableEntries, g.Host))
			profiles.Go(func() {
				if err := fetchProfile(g, c.TableIdle, path); err != nil {
					logf("profile of %s: %v", g.Host, err)
				}
			})
		}
	}
	time.Sleep(c.TableIdle) // the measurement window, not a readiness wait
	profiles.Wait()
	cpuA1, errA := readProcStats(ga.PID())
	cpuB1, errB := readProcStats(gb.PID())
	m1, errM := refreshMetrics(ga)
	s1, errS := syncSnapshot(ga, gb)
	if err := errors.Join(errA, errB, errM, errS); err != nil {
		return run, fmt.Errorf("after the idle window: %w", err)
	}
	run.IdleSeconds = time.Since(idleStart).Seconds()
	run.CPUSecondsA, run.CPUSecondsB = (cpuA1.CPU - cpuA0.CPU).Seconds(), (cpuB1.CPU - cpuB0.CPU).Seconds()
	run.Sync = syncDelta(s0, s1)
	if m0 != nil && m1 != nil {
		run.Passes, run.Read = map[string]float64{}, map[string]float64{}
		for _, kind := range []string{"table", "due"} {
			run.Passes[kind] = m1["passes/"+kind] - m0["passes/"+kind]
			run.Read[kind] = m1["read/"+kind] - m0["read/"+kind]
		}
	}
	run.Alive = !ga.Ended() && !gb.Ended()
	restart, err := restartB(cfg, topo, nc, gs, a, svc)
	if err != nil {
		return run, fmt.Errorf("restart of B: %w", err)
	}
	run.Restart = &restart
	run.LoadAvg[1] = loadAvg()
	return run, nil
}

// heldSince waits (2 minutes at most) until B holds a replica of every
// entry of A's (heldByB): whether it did, how many it lacked at the last
// look, and the seconds since since.
func heldSince(topo *failover.Topology, a int, svc netip.AddrPort, since time.Time) (held bool, missing int, after float64, err error) {
	held, _, missing, _, err = heldByB(topo.Gateways[a], topo.Gateways[1-a], svc, 2*time.Minute)
	return held, missing, time.Since(since).Seconds(), err
}

// restartB kills B's nftgate, flushes B's conntrack (a gateway that
// reboots holds nothing) and starts nftgate there again, replacing gs[b].
func restartB(cfg *Config, topo *failover.Topology, nc *failover.NftgateConfig, gs []*failover.Nftgate, a int, svc netip.AddrPort) (r TableRestart, err error) {
	b := 1 - a
	ga := gs[a]
	st0, err := syncStatus(ga)
	if err != nil {
		return r, err
	}
	// VmHWM from now on (proc(5), clear_refs: 5).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", ga.PID()), []byte("5"), 0); err != nil {
		return r, err
	}
	a0, err := readProcStats(ga.PID())
	if err != nil {
		return r, err
	}
	r.RSSMiBA = float64(a0.RSSKiB) / 1024
	if err := failover.KillNamespace(topo.Gateways[b]); err != nil {
		return r, err
	}
	if err := flushConntrack(topo.Gateways[b]); err != nil {
		return r, err
	}
	start := time.Now()
	gb, err := failover.StartNftgate(topo.Gateways[b], cfg.NftgateBin, append(slices.Clone(nc.Args[b]), cfg.NftgateArgs...))
	if err != nil {
		return r, err
	}
	gs[b] = gb
	if err := gb.WaitReady(2 * time.Minute); err != nil {
		return r, err
	}
	// When B's state sync and its gateway set first said ready, and when
	// its peer's resync was first done: a gate open before the resync was
	// done let B take addresses without the flows.
	var syncReady, setReady, done time.Duration
	first := func(d *time.Duration, yes bool) {
		if yes && *d == 0 {
			*d = time.Since(start)
		}
	}
	if err := lab.EventuallyWithin(2*time.Minute, func() error {
		st, err := syncStatus(gb)
		if err != nil {
			return err
		}
		set, err := setStatus(gb)
		if err != nil {
			return err
		}
		first(&syncReady, st.Ready)
		first(&setReady, set.Ready)
		first(&done, len(st.Peers) == 1 && st.Peers[0].ResyncDone)
		if syncReady == 0 || setReady == 0 || done == 0 {
			return fmt.Errorf("%s: not ready: %+v; gateways ready %v", gb.Host, st, set.Ready)
		}
		return nil
	}); err != nil {
		return r, err
	}
	r.ReadyAfter, r.SetReadyAfter, r.ResyncDoneAfter = syncReady.Seconds(), setReady.Seconds(), done.Seconds()
	if r.Held, r.HeldMissing, r.HeldAfter, err = heldSince(topo, a, svc, start); err != nil {
		return r, err
	}
	a1, errA := readProcStats(ga.PID())
	b1, errB := readProcStats(gb.PID())
	st1, errS := syncStatus(ga)
	if err := errors.Join(errA, errB, errS); err != nil {
		return r, err
	}
	r.CPUSecondsA, r.CPUSecondsB = (a1.CPU - a0.CPU).Seconds(), b1.CPU.Seconds()
	r.PeakRSSMiBA, r.PeakRSSMiBB = float64(a1.HWMKiB)/1024, float64(b1.HWMKiB)/1024
	if len(st0.Peers) == 1 && len(st1.Peers) == 1 {
		r.ResyncsSent = st1.Peers[0].ResyncsSent - st0.Peers[0].ResyncsSent
	}
	return r, nil
}

// refreshMetrics reads g's refresh pass counters from /metrics
// (parseRefreshMetrics).
func refreshMetrics(g *failover.Nftgate) (map[string]float64, error) {
	code, body, err := g.Get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("%s: /metrics: %d", g.Host, code)
	}
	m, err := parseRefreshMetrics(body)
	if err != nil {
		return nil, fmt.Errorf("%s: /metrics: %w", g.Host, err)
	}
	return m, nil
}

// parseRefreshMetrics picks the refresh pass counters out of a metrics
// page as "passes/table", "passes/due", "read/table", "read/due"; nil
// when it has none (an nftgate without them).
func parseRefreshMetrics(body string) (map[string]float64, error) {
	names := map[string]string{"nftgate_statesync_refresh_passes_total": "passes", "nftgate_statesync_refresh_entries_read_total": "read"}
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		metric, rest, ok := strings.Cut(sc.Text(), `{read="`)
		name, known := names[metric]
		if !ok || !known {
			continue
		}
		kind, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			return nil, fmt.Errorf("%q: not a counter with a read label", sc.Text())
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", sc.Text(), err)
		}
		m[name+"/"+kind] = v
	}
	if len(m) == 0 {
		return nil, sc.Err()
	}
	return m, sc.Err()
}

func (r StateSyncTableRun) Summary() string {
	s := fmt.Sprintf("table of %d entries (%d created in %.1f s, B held all %v after %.1f s): idle %.0f s, CPU A %.2f s B %.2f s, A's passes %v read %v, sent %d, lost %d, kernel losses %d, refreshes %d, alive %v",
		r.Entries, r.Created, r.CreateSeconds, r.Held, r.HeldAfter, r.IdleSeconds, r.CPUSecondsA, r.CPUSecondsB, r.Passes, r.Read, r.Sync.Sent, r.Sync.Lost, r.Sync.KernelLossesA, r.Sync.Refreshes, r.Alive)
	if t := r.Restart; t != nil {
		s += fmt.Sprintf("; B restarted: sync ready after %.2f s, gateways ready %.2f s, resync done %.2f s, held all %v after %.1f s (%d missing), resyncs %d, CPU A %.2f s B %.2f s, A's RSS %.0f MiB peak %.0f, B's peak %.0f",
			t.ReadyAfter, t.SetReadyAfter, t.ResyncDoneAfter, t.Held, t.HeldAfter, t.HeldMissing, t.ResyncsSent, t.CPUSecondsA, t.CPUSecondsB, t.RSSMiBA, t.PeakRSSMiBA, t.PeakRSSMiBB)
	}
	return s
}

func (r *StateSyncReport) tableMarkdown(b *strings.Builder) {
	if len(r.Tables) == 0 {
		return
	}
	b.WriteString("\n## An idle pair with a full table\n\n")
	b.WriteString("A's kernel holds N translated TCP entries in TIME_WAIT (what short connections leave for 120 s: 120,000 at 1,000 new connections a second), created through netlink at 10,000 a second and replicated to B; then nothing happens for the window. CPU: nftgate's utime+stime on A and B over the window. A's refresh passes (`sync_refresh_interval`, 5 s) and the entries they read, by kind: the whole table, or only the entries due (\"–\": an nftgate whose every pass read the table).\n\n")
	b.WriteString("| entries | B held all after | window (s) | CPU A / B (s) | CPU A / B (% of a core) | A's passes table / due | entries read table / due | sent / lost / kernel losses / refreshes | alive | load avg before / after |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range r.Tables {
		held := fmt.Sprintf("no (%d missing)", t.HeldMissing)
		if t.Held {
			held = fmt.Sprintf("%.1f s", t.HeldAfter)
		}
		passes, read := "–", "–"
		if t.Passes != nil {
			passes = fmt.Sprintf("%.0f / %.0f", t.Passes["table"], t.Passes["due"])
			read = fmt.Sprintf("%.0f / %.0f", t.Read["table"], t.Read["due"])
		}
		fmt.Fprintf(b, "| %d | %s | %.0f | %.2f / %.2f | %.2f / %.2f | %s | %s | %d / %d / %d / %d | %v | %.2f / %.2f |\n",
			t.Created, held, t.IdleSeconds, t.CPUSecondsA, t.CPUSecondsB, 100*t.CPUSecondsA/t.IdleSeconds, 100*t.CPUSecondsB/t.IdleSeconds,
			passes, read, t.Sync.Sent, t.Sync.Lost, t.Sync.KernelLossesA, t.Sync.Refreshes, t.Alive, t.LoadAvg[0], t.LoadAvg[1])
	}
	b.WriteString("\nThen B restarts as a rebooted gateway would: its nftgate killed, its conntrack flushed, nftgate started again; A sends it the table in a full resync. Ready: from B's start until its state sync and its gateway set (a candidate for the addresses) first say it is ready, and until its peer's resync is done; held: until B's kernel holds a replica of every entry of A's. CPU: A's from the kill, B's new nftgate's, until held. Memory: A's VmRSS before the kill and its peak (VmHWM, reset before) until held; B's peak.\n\n")
	b.WriteString("| entries | B's sync / gateways ready, resync done after (s) | B held all after (s) | resyncs | CPU A / B (s) | A's RSS / peak (MiB) | B's peak (MiB) |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, t := range r.Tables {
		rs := t.Restart
		if rs == nil {
			continue
		}
		held := fmt.Sprintf("no (%d missing)", rs.HeldMissing)
		if rs.Held {
			held = fmt.Sprintf("%.1f", rs.HeldAfter)
		}
		fmt.Fprintf(b, "| %d | %.2f / %.2f, %.2f | %s | %d | %.2f / %.2f | %.0f / %.0f | %.0f |\n",
			t.Created, rs.ReadyAfter, rs.SetReadyAfter, rs.ResyncDoneAfter, held, rs.ResyncsSent, rs.CPUSecondsA, rs.CPUSecondsB, rs.RSSMiBA, rs.PeakRSSMiBA, rs.PeakRSSMiBB)
	}
}
