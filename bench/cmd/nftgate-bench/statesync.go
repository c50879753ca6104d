package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/statesync"
)

// StateSyncConfig is the state-sync load phase: short TCP connections
// through gateway A of the failover harness's active/backup pair, at
// target rates, with the time until B's kernel holds each replica, the
// CPU nftgate spends with the sync on and off, and a run whose queue
// overflows.
type StateSyncConfig struct {
	On, Only bool
	// Rates are the target new connections per second; 0 is as fast as
	// the generator goes.
	Rates    []int
	Duration time.Duration
	Workers  int
	Runs     []string
	// Modes are the load generators (ssTCP, ssNetlink), each run at each
	// rate in each mode.
	Modes []string
	// OverflowRate, OverflowQueue and OverflowStop shape the overflow run:
	// B is stopped (SIGSTOP) for OverflowStop in the middle of the load.
	OverflowRate  int
	OverflowQueue int
	OverflowStop  time.Duration
	// DeadAfter is [gateways] dead_after of the sync and nosync runs; 0
	// leaves nftgate's default.
	DeadAfter int
	// Profile, when set, is where CPU profiles of A's and B's nftgate
	// during each sync run are written (nftgate runs with --pprof).
	Profile string
	// TableEntries and TableIdle shape the table run (statesync_table.go);
	// TableReadyTimeout is its [gateways] ready_timeout (0: the default).
	TableEntries      int
	TableIdle         time.Duration
	TableReadyTimeout time.Duration
}

// The runs of the state-sync phase.
const (
	ssSync     = "sync"
	ssNoSync   = "nosync"
	ssOverflow = "overflow"
)

var allStateSyncRuns = []string{ssSync, ssNoSync, ssOverflow, ssTable}

// The load modes: real TCP connections from the client namespace through
// A (statesync-client), or the entries such connections make created in
// A's kernel through netlink (statesync-ctgen).
const (
	ssTCP     = "tcp"
	ssNetlink = "netlink"
)

var allStateSyncModes = []string{ssTCP, ssNetlink}

// clientSources is how many source addresses the generator spreads over
// (198.18.20.2 and the next ones): enough tuples that no client port is
// reused while its gateway entry is in CLOSE (10 s).
const clientSources = 8

func statesyncFlags(fs *flag.FlagSet, c *StateSyncConfig) func() error {
	fs.BoolVar(&c.On, "statesync-load", false, "state-sync load phase after the others: short connections through gateway A, time until B holds each (bench/results/statesync)")
	fs.BoolVar(&c.Only, "statesync-load-only", false, "the state-sync load phase alone (no kube-apiserver, no proxiers)")
	rates := fs.String("statesync-rates", "1000,10000,0", "state-sync phase: target new connections per second, 0 as fast as the generator goes")
	fs.DurationVar(&c.Duration, "statesync-duration", 10*time.Second, "state-sync phase: how long each rate runs")
	fs.IntVar(&c.Workers, "statesync-workers", 256, "state-sync phase: generator goroutines")
	runs := fs.String("statesync-runs", strings.Join(allStateSyncRuns, ","), "state-sync phase: the runs, of "+strings.Join(allStateSyncRuns, ", "))
	modes := fs.String("statesync-modes", strings.Join(allStateSyncModes, ","), "state-sync phase: the load generators, of tcp (connections through A) and netlink (their entries created in A's kernel, no handshakes)")
	fs.IntVar(&c.OverflowRate, "statesync-overflow-rate", 10000, "state-sync phase: the overflow run's target rate")
	fs.IntVar(&c.OverflowQueue, "statesync-overflow-queue", 1024, "state-sync phase: the overflow run's sync_queue")
	fs.DurationVar(&c.OverflowStop, "statesync-overflow-stop", time.Second, "state-sync phase: how long B is stopped (SIGSTOP) in the overflow run")
	fs.IntVar(&c.DeadAfter, "statesync-dead-after", 0, "state-sync phase: [gateways] dead_after of the sync and nosync runs (0: nftgate's default)")
	fs.StringVar(&c.Profile, "statesync-profile", "", "state-sync phase: directory for CPU profiles of both nftgates during each sync run")
	fs.IntVar(&c.TableEntries, "statesync-table-entries", 100000, "state-sync phase: the table run's entries in TIME_WAIT on A")
	fs.DurationVar(&c.TableIdle, "statesync-table-idle", time.Minute, "state-sync phase: the table run's window without load")
	fs.DurationVar(&c.TableReadyTimeout, "statesync-table-ready-timeout", 0, "state-sync phase: the table run's [gateways] ready_timeout (0: nftgate's default), shorter than B's resync after its restart to see it waited for")
	return func() error {
		c.On = c.On || c.Only
		for _, r := range strings.Split(*rates, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(r))
			if err != nil || n < 0 || n > 100000 {
				return fmt.Errorf("--statesync-rates: %q: want whole numbers from 0 to 100000", r)
			}
			c.Rates = append(c.Rates, n)
		}
		for _, r := range strings.Split(*runs, ",") {
			if r = strings.TrimSpace(r); !slices.Contains(allStateSyncRuns, r) {
				return fmt.Errorf("--statesync-runs: %q: want some of %s", r, strings.Join(allStateSyncRuns, ", "))
			}
			c.Runs = append(c.Runs, r)
		}
		for _, m := range strings.Split(*modes, ",") {
			if m = strings.TrimSpace(m); !slices.Contains(allStateSyncModes, m) {
				return fmt.Errorf("--statesync-modes: %q: want some of %s", m, strings.Join(allStateSyncModes, ", "))
			}
			c.Modes = append(c.Modes, m)
		}
		switch {
		case c.Duration < time.Second || c.Duration > 5*time.Minute:
			return fmt.Errorf("--statesync-duration: %v: want 1s to 5m", c.Duration)
		case c.Workers < 1 || c.Workers > 1024:
			return fmt.Errorf("--statesync-workers: %d: want 1 to 1024", c.Workers)
		case c.DeadAfter != 0 && (c.DeadAfter < 2 || c.DeadAfter > 100):
			return fmt.Errorf("--statesync-dead-after: %d: want 0, or 2 to 100 as [gateways] dead_after", c.DeadAfter)
		case c.OverflowRate < 0:
			return fmt.Errorf("--statesync-overflow-rate: %d: want 0 or more", c.OverflowRate)
		case c.OverflowQueue < 1024:
			return fmt.Errorf("--statesync-overflow-queue: %d: want at least 1024 (nftgate's minimum sync_queue)", c.OverflowQueue)
		case c.OverflowStop < 0 || c.OverflowStop >= c.Duration:
			return fmt.Errorf("--statesync-overflow-stop: %v: want 0 or more and less than --statesync-duration", c.OverflowStop)
		case c.TableEntries < 1000 || c.TableEntries > 120000:
			// The generator's reply tuples last for 129,024 entries.
			return fmt.Errorf("--statesync-table-entries: %d: want 1,000 to 120,000", c.TableEntries)
		case c.TableIdle < 10*time.Second || c.TableIdle > 10*time.Minute:
			return fmt.Errorf("--statesync-table-idle: %v: want 10s to 10m", c.TableIdle)
		case c.TableReadyTimeout != 0 && (c.TableReadyTimeout < time.Second || c.TableReadyTimeout > 10*time.Minute):
			return fmt.Errorf("--statesync-table-ready-timeout: %v: want 1s to 10m", c.TableReadyTimeout)
		}
		return nil
	}
}

// StateSyncRun is one load run.
type StateSyncRun struct {
	Name       string `json:"name"`
	Mode       string `json:"mode"`
	TargetRate int    `json:"target_rate"`
	// Client is the generator's outcome; ClientCPUSeconds its CPU time.
	Client           ConnStats `json:"client"`
	ClientCPUSeconds float64   `json:"client_cpu_seconds"`
	// Lag is measured from outside nftgate (see SyncLag).
	Lag SyncLag `json:"lag"`
	// CPU of nftgate on A and B over the load and 2 s after it.
	CPUSecondsA float64 `json:"cpu_seconds_a"`
	CPUSecondsB float64 `json:"cpu_seconds_b"`
	CPUWindow   float64 `json:"cpu_window_seconds"`
	// Sync is what nftgate itself counted during the run (A's view of B
	// and B's of A), with its lag histogram's quantiles.
	Sync SyncCounters `json:"sync"`
	// Stopped is how long B was stopped (SIGSTOP) during the load.
	Stopped float64 `json:"b_stopped_seconds,omitempty"`
	// Alive: both nftgates still running and ready after the run.
	Alive bool `json:"alive"`
	// Held: after the load, every entry A still had was held by B;
	// HeldAfter how long after the load's end that was first seen;
	// HeldEntries how many entries A had then; HeldMissingFirst how many
	// of A's entries B lacked at the first look after the load.
	Held             bool       `json:"held"`
	HeldMissingFirst int        `json:"held_missing_first"`
	HeldAfter        float64    `json:"held_after_seconds"`
	HeldEntries      int        `json:"held_entries"`
	HeldMissing      int        `json:"held_missing,omitempty"`
	LoadAvg          [2]float64 `json:"load_avg_before_after"`
	// PeerDead: how often A and B took the other for dead during the run
	// (heartbeats missed: a gateway starved of CPU for dead_after
	// heartbeat intervals); while B is dead to A, A queues nothing for it
	// and B gets the flows with the resync when it is back.
	PeerDead [2]int `json:"peer_dead_a_b"`
	// RefusedLog: B's first log lines about refused entries.
	RefusedLog []string `json:"refused_log,omitempty"`
}

// SyncCounters are deltas of nftgate's own counters over a run.
type SyncCounters struct {
	Sent          uint64            `json:"sent"`
	Received      uint64            `json:"received"`
	Refused       map[string]uint64 `json:"refused,omitempty"`
	Lost          uint64            `json:"lost"`
	ResyncsSent   uint64            `json:"resyncs_sent"`
	KernelLossesA uint64            `json:"kernel_event_losses_a"`
	// Refreshes: A's entries sent again by its refresh passes.
	Refreshes  uint64  `json:"refreshes"`
	LagP50Ms   float64 `json:"lag_metric_p50_ms"`
	LagP99Ms   float64 `json:"lag_metric_p99_ms"`
	LagBatches uint64  `json:"lag_metric_batches"`
}

// StateSyncReport is bench/results/statesync/results.json.
type StateSyncReport struct {
	Started  time.Time `json:"started"`
	Machine  string    `json:"machine"`
	Duration float64   `json:"seconds_per_run"`
	Workers  int       `json:"workers"`
	// DeadAfter is the sync and nosync runs' dead_after (0: the default).
	DeadAfter int            `json:"dead_after,omitempty"`
	Runs      []StateSyncRun `json:"runs"`
	// Tables are the table runs (statesync_table.go).
	Tables []StateSyncTableRun `json:"tables,omitempty"`
}

// RunStateSync runs the state-sync phase and writes statesync/results.md
// and results.json under cfg.Out after every run.
func RunStateSync(cfg *Config, machine string) error {
	c := &cfg.StateSync
	r := &StateSyncReport{Started: time.Now().UTC(), Machine: machine, Duration: c.Duration.Seconds(), Workers: c.Workers, DeadAfter: c.DeadAfter}
	dir := filepath.Join(cfg.Out, "statesync")
	for _, name := range c.Runs {
		o := failover.NftgateOptions{NoStateSync: name == ssNoSync, DeadAfter: c.DeadAfter}
		if name == ssTable {
			o.ReadyTimeout = c.TableReadyTimeout
		}
		rates := c.Rates
		if name == ssOverflow {
			// B stops for a second: it must not be declared dead (its
			// peer would stop queueing to it, not overflow).
			o.SyncQueue, o.DeadAfter, rates = c.OverflowQueue, 100, []int{c.OverflowRate}
		}
		err := statesyncGateways(cfg, o, func(topo *failover.Topology, nc *failover.NftgateConfig, srcs []netip.Addr, gs []*failover.Nftgate, a int) error {
			if name == ssTable {
				logf("statesync table of %d entries: load %.2f", c.TableEntries, loadAvg())
				run, err := statesyncTable(cfg, topo, nc, gs, a, srcs)
				if err != nil {
					return fmt.Errorf("table: %w", err)
				}
				logf("statesync %s", run.Summary())
				r.Tables = append(r.Tables, run)
				return r.write(dir)
			}
			for _, rate := range rates {
				for _, mode := range c.Modes {
					if mode == ssNetlink && rate == 0 {
						// Its entries' reply tuples (F and a port per
						// endpoint) last for 129,024 of them: about
						// 12,000 a second for their 10 s.
						logf("statesync %s %s at max: skipped (the netlink generator runs at target rates only)", name, mode)
						continue
					}
					for _, i := range []int{a, 1 - a} {
						if err := flushConntrack(topo.Gateways[i]); err != nil {
							return err
						}
					}
					if err := aloneHolds(topo, gs, a); err != nil {
						return err
					}
					logf("statesync %s %s at %d/s: load %.2f", name, mode, rate, loadAvg())
					run, err := statesyncRun(cfg, topo, gs, a, name, mode, rate, srcs)
					if err != nil {
						return fmt.Errorf("%s %s at %d/s: %w", name, mode, rate, err)
					}
					logf("statesync %s", run.Summary())
					r.Runs = append(r.Runs, run)
					if err := r.write(dir); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	logf("statesync results in %s", dir)
	return nil
}

// loadClient gives the client namespace the source addresses the load
// needs.
func loadClient(topo *failover.Topology) ([]netip.Addr, error) {
	srcs := []netip.Addr{failover.ClientAddr}
	var extra []netip.Prefix
	for a := failover.ClientAddr.Next(); len(srcs) < clientSources; a = a.Next() {
		srcs = append(srcs, a)
		extra = append(extra, netip.PrefixFrom(a, failover.UpstreamNet.Bits()))
	}
	return srcs, topo.Client.AddAddress(topo.ClientIface, extra...)
}

// statesyncGateways builds the topology (a fresh one for each
// configuration: a killed nftgate's sockets may outlive the kill by a
// moment), starts the echo servers and nftgate with o in both gateways,
// calls fn with them, their configuration, the client's source addresses
// and the index of A (the holder of the Service address), and removes it
// all.
func statesyncGateways(cfg *Config, o failover.NftgateOptions, fn func(*failover.Topology, *failover.NftgateConfig, []netip.Addr, []*failover.Nftgate, int) error) (err error) {
	topo, err := failover.New(failover.Options{Name: "bench-statesync", Gateways: 2})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	srcs, err := loadClient(topo)
	if err != nil {
		return err
	}
	stopEcho, err := failover.ServeEcho(topo.Endpoints, failover.Endpoints, failover.EndpointPort)
	if err != nil {
		return err
	}
	defer stopEcho()
	tmp, err := os.MkdirTemp("", "nftgate-bench-statesync-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	nc, err := failover.WriteNftgate(topo, tmp, o)
	if err != nil {
		return err
	}
	if err := failover.NftgateSupports(cfg.NftgateBin, nc.Configs[0]); err != nil {
		return err
	}
	if cfg.StateSync.Profile != "" {
		for i := range nc.Args {
			nc.Args[i] = append(nc.Args[i], "--pprof")
		}
	}
	gs, err := startNftgates(cfg, topo, nc)
	defer func() { err = errors.Join(err, stopNftgates(gs, err != nil)) }()
	if err != nil {
		return err
	}
	a := 0
	if err := aloneHolds(topo, gs, a); err != nil {
		return err
	}
	if !o.NoStateSync {
		if err := lab.EventuallyWithin(time.Minute, func() error {
			st, err := syncStatus(gs[a])
			if err != nil {
				return err
			}
			if len(st.Peers) != 1 || !st.Peers[0].Up || !st.Ready {
				return fmt.Errorf("%s: state sync not ready with its peer: %+v", gs[a].Host, st)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return fn(topo, nc, srcs, gs, a)
}

// aloneHolds waits until gateway a alone holds the Service address and F
// (active/backup: the first by name), and makes the client and the
// endpoints forget any other holder they learnt: the load must go through
// A. A gateway starved of CPU for dead_after heartbeats is taken for dead
// and its peer takes the addresses for a while.
func aloneHolds(topo *failover.Topology, gs []*failover.Nftgate, a int) error {
	if err := lab.EventuallyWithin(time.Minute, func() error {
		for i, g := range gs {
			h, err := g.Holds()
			if err != nil {
				return err
			}
			want := i == a
			if slices.Contains(h, failover.ServiceAddr) != want || slices.Contains(h, failover.Floating) != want {
				return fmt.Errorf("%s holds %v", g.Host, h)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, h := range []*lab.Host{topo.Client, topo.Endpoints} {
		if out, err := h.Command(context.Background(), "ip", "neigh", "flush", "all").CombinedOutput(); err != nil {
			return fmt.Errorf("%s: ip neigh flush: %v: %s", h, err, out)
		}
	}
	return nil
}

// flushConntrack empties h's conntrack table and waits until it is empty.
func flushConntrack(h *lab.Host) error {
	return lab.EventuallyWithin(30*time.Second, func() error {
		if out, err := h.Command(context.Background(), "conntrack", "-F").CombinedOutput(); err != nil {
			return fmt.Errorf("%s: conntrack -F: %v: %s", h, err, out)
		}
		out, err := h.Command(context.Background(), "conntrack", "-C").Output()
		if err != nil {
			return fmt.Errorf("%s: conntrack -C: %w", h, err)
		}
		if n := strings.TrimSpace(string(out)); n != "0" {
			return fmt.Errorf("%s: %s entries left after a flush", h, n)
		}
		return nil
	})
}

// peerDead is what nftgate logs when it takes a peer for dead.
const peerDead = "gateways: peer dead"

// cpuTail is how long after the load the CPU window goes on: the sync of
// the last connections belongs to the load.
const cpuTail = 2 * time.Second

func statesyncRun(cfg *Config, topo *failover.Topology, gs []*failover.Nftgate, a int, name, mode string, rate int, srcs []netip.Addr) (run StateSyncRun, err error) {
	c := &cfg.StateSync
	b := 1 - a
	ga, gb := gs[a], gs[b]
	run = StateSyncRun{Name: name, Mode: mode, TargetRate: rate, LoadAvg: [2]float64{loadAvg(), 0}}
	svc := netip.AddrPortFrom(failover.ServiceAddr, failover.ServicePort)
	w, err := watchSync(topo.Gateways[a], topo.Gateways[b], svc)
	if err != nil {
		return run, err
	}
	defer w.Close()
	syncOn := name != ssNoSync
	var before syncReading
	if syncOn {
		if before, err = syncSnapshot(ga, gb); err != nil {
			return run, err
		}
	}
	deadA0, deadB0 := strings.Count(ga.Logs(), peerDead), strings.Count(gb.Logs(), peerDead)
	cpuA0, errA := readProcStats(ga.PID())
	cpuB0, errB := readProcStats(gb.PID())
	if err := errors.Join(errA, errB); err != nil {
		return run, err
	}
	var cmd *exec.Cmd
	if mode == ssNetlink {
		eps := make([]string, len(failover.Endpoints))
		for i, e := range failover.Endpoints {
			eps[i] = netip.AddrPortFrom(e, failover.EndpointPort).String()
		}
		cmd, err = clientCommand(context.Background(), topo.Gateways[a], statesyncCtgenCmd, svc, srcs,
			"-rate", strconv.Itoa(rate), "-duration", c.Duration.String(),
			"-endpoints", strings.Join(eps, ","), "-masquerade", failover.Floating.String())
	} else {
		cmd, err = clientCommand(context.Background(), topo.Client, statesyncClientCmd, svc, srcs,
			"-rate", strconv.Itoa(rate), "-workers", strconv.Itoa(c.Workers), "-duration", c.Duration.String())
	}
	if err != nil {
		return run, err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return run, err
	}
	var profiles sync.WaitGroup
	if c.Profile != "" && name == ssSync {
		for _, g := range []*failover.Nftgate{ga, gb} {
			path := filepath.Join(c.Profile, fmt.Sprintf("%s-%s-%d-%s.pprof", name, mode, rate, g.Host))
			profiles.Go(func() {
				if err := fetchProfile(g, c.Duration, path); err != nil {
					logf("profile of %s: %v", g.Host, err)
				}
			})
		}
	}
	defer profiles.Wait()
	if name == ssOverflow && c.OverflowStop > 0 {
		// B stops in the middle of the load: its reads of the channel
		// and its writes to the kernel pause, A's queue to it fills.
		time.Sleep((c.Duration - c.OverflowStop) / 2) // a point in the load, not a readiness wait
		stopped := time.Now()
		if err := syscall.Kill(gb.PID(), syscall.SIGSTOP); err != nil {
			return run, fmt.Errorf("SIGSTOP %s: %w", gb.Host, err)
		}
		time.Sleep(c.OverflowStop)
		if err := syscall.Kill(gb.PID(), syscall.SIGCONT); err != nil {
			return run, fmt.Errorf("SIGCONT %s: %w", gb.Host, err)
		}
		run.Stopped = time.Since(stopped).Seconds()
	}
	if err := cmd.Wait(); err != nil {
		return run, fmt.Errorf("generator: %v: %.1000s", err, stderr.String())
	}
	loadEnd := time.Now()
	if err := json.Unmarshal(stdout.Bytes(), &run.Client); err != nil {
		return run, fmt.Errorf("generator: %q: %w", stdout.Bytes(), err)
	}
	run.ClientCPUSeconds = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	time.Sleep(cpuTail) // the end of the CPU window, not a readiness wait
	cpuA1, errA := readProcStats(ga.PID())
	cpuB1, errB := readProcStats(gb.PID())
	if err := errors.Join(errA, errB); err != nil {
		return run, fmt.Errorf("nftgate gone after the load: %w", err)
	}
	run.CPUWindow = time.Since(start).Seconds()
	run.CPUSecondsA, run.CPUSecondsB = (cpuA1.CPU - cpuA0.CPU).Seconds(), (cpuB1.CPU - cpuB0.CPU).Seconds()
	if syncOn {
		// First whether B holds what A holds, while A's entries live
		// (CLOSE: 10 s); then late replicas still count (and show in the
		// lag); those not on B 10 s after the load never were.
		held, first, missing, entries, err := heldByB(topo.Gateways[a], topo.Gateways[b], svc, 30*time.Second)
		if err != nil {
			return run, err
		}
		run.Held, run.HeldMissingFirst, run.HeldMissing, run.HeldEntries = held, first, missing, entries
		run.HeldAfter = time.Since(loadEnd).Seconds()
		_ = lab.EventuallyWithin(10*time.Second, w.allSeen)
		after, err := syncSnapshot(ga, gb)
		if err != nil {
			return run, err
		}
		run.Sync = syncDelta(before, after)
	}
	if err := w.endTables(); err != nil {
		logf("statesync %s %s at %d/s: creation times: %v", name, mode, rate, err)
	}
	run.Lag = w.result(syncOn)
	run.PeerDead = [2]int{strings.Count(ga.Logs(), peerDead) - deadA0, strings.Count(gb.Logs(), peerDead) - deadB0}
	// Why B refused entries, as it logs it (at most every 10 s a reason).
	for _, l := range strings.Split(gb.Logs(), "\n") {
		if strings.Contains(l, "refused") && len(run.RefusedLog) < 3 {
			run.RefusedLog = append(run.RefusedLog, l)
		}
	}
	run.Alive = !ga.Ended() && !gb.Ended()
	for _, g := range gs {
		if code, _, err := g.Get("/readyz"); err != nil || code != 200 {
			run.Alive = false
		}
	}
	run.LoadAvg[1] = loadAvg()
	return run, nil
}

// syncStatus reads g's state sync (/api/v1/statesync).
func syncStatus(g *failover.Nftgate) (statesync.Status, error) {
	var st statesync.Status
	err := getJSON(g, "/api/v1/statesync", &st)
	return st, err
}

// setStatus reads g's gateway set (/api/v1/gateways).
func setStatus(g *failover.Nftgate) (gateways.Status, error) {
	var st gateways.Status
	err := getJSON(g, "/api/v1/gateways", &st)
	return st, err
}

// getJSON decodes g's answer to a GET of path into v.
func getJSON(g *failover.Nftgate, path string, v any) error {
	code, body, err := g.Get(path)
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("%s: %s: %d %s", g.Host, path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		return fmt.Errorf("%s: %s: %w", g.Host, path, err)
	}
	return nil
}

// syncReading is what A and B say of the sync at one moment.
type syncReading struct {
	st        [2]statesync.Status
	lag       lagBuckets
	refreshes uint64
}

func syncSnapshot(ga, gb *failover.Nftgate) (syncReading, error) {
	var r syncReading
	var err error
	for i, g := range []*failover.Nftgate{ga, gb} {
		if r.st[i], err = syncStatus(g); err != nil {
			return r, err
		}
		if len(r.st[i].Peers) != 1 {
			return r, fmt.Errorf("%s: %d state-sync peers, want 1", g.Host, len(r.st[i].Peers))
		}
	}
	r.lag, r.refreshes, err = lagHistogram(ga)
	return r, err
}

func syncDelta(r0, r1 syncReading) SyncCounters {
	pa0, pa1 := r0.st[0].Peers[0], r1.st[0].Peers[0]
	pb0, pb1 := r0.st[1].Peers[0], r1.st[1].Peers[0]
	s := SyncCounters{Sent: pa1.Sent - pa0.Sent, Received: pb1.Received - pb0.Received, Lost: pa1.Lost - pa0.Lost,
		ResyncsSent: pa1.ResyncsSent - pa0.ResyncsSent, KernelLossesA: r1.st[0].EventsLost - r0.st[0].EventsLost,
		Refreshes: r1.refreshes - r0.refreshes}
	for k, v := range pb1.Refused {
		if d := v - pb0.Refused[k]; d > 0 {
			if s.Refused == nil {
				s.Refused = map[string]uint64{}
			}
			s.Refused[k] = d
		}
	}
	d := r1.lag.sub(r0.lag)
	s.LagBatches = d.count()
	s.LagP50Ms, s.LagP99Ms = d.quantile(0.50)*1000, d.quantile(0.99)*1000
	return s
}

// Summary is one line for the log.
func (r StateSyncRun) Summary() string {
	return fmt.Sprintf("%s %s at %d/s: %.0f/s achieved (%d failed), %d flows on A, %d never on B; lag (kernel) p50 %.1f p99 %.1f max %.1f ms, as the listeners saw it p99 %.1f ms, read delay p99 A %.1f B %.1f ms; CPU A %.2f s B %.2f s; lost %d, resyncs %d, refreshes %d, peer dead %v, alive %v, held %v",
		r.Name, r.Mode, r.TargetRate, r.Client.PerSecond, r.Client.Failed, r.Lag.FlowsA, r.Lag.NeverOnB, r.Lag.Kernel.P50Ms, r.Lag.Kernel.P99Ms, r.Lag.Kernel.MaxMs,
		r.Lag.Listener.P99Ms, r.Lag.ReadDelayA.P99Ms, r.Lag.ReadDelayB.P99Ms, r.CPUSecondsA, r.CPUSecondsB, r.Sync.Lost, r.Sync.ResyncsSent, r.Sync.Refreshes, r.PeerDead, r.Alive, r.Held)
}

func (r *StateSyncReport) write(dir string) error {
	return writeResults(dir, "results", r, r.markdown)
}

func (r *StateSyncReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# State sync under load: new flows through gateway A, time until B holds each entry\n\n")
	fmt.Fprintf(&b, "%s, %s. The failover harness's active/backup pair (`internal/testing/failover`), %.0f s of load at each target rate, in two modes. **tcp**: a generator in the client namespace (%d goroutines, %d source addresses) opens connections to the Service through A: connect, a line and its echo, close with SO_LINGER 0. **netlink**: a generator in A's namespace creates, through conntrack netlink, the entries such connections make (client → Service, DNAT to an endpoint, masquerade to F, ESTABLISHED, 10 s): A's kernel emits the same NEW event, without the handshakes that saturate this machine first; it is the sync pipeline at the target rate. ",
		r.Started.Format("2006-01-02 15:04 UTC"), r.Machine, r.Duration, r.Workers, clientSources)
	b.WriteString("Lag: from A's kernel creating the flow's entry to B's kernel creating its replica (mark bit 31), from the kernels' own creation times (nf_conntrack_timestamp, read from the DESTROY events of the flush that ends each run), matched by original tuple; \"never\": A's flows with no replica on B 10 s after the load. Beside it the same lag as conntrack event listeners in the bench process saw it (NEW on A to NEW on B), and how late those listeners read the NEW events after the kernel made the entries (p99, A / B): what an event-timed bench adds when it falls behind. ")
	b.WriteString("nftgate's own lag metric (`nftgate_statesync_lag_seconds`, from the oldest event of a batch to B's ack of its write, bucket upper bounds). CPU: nftgate's utime+stime on A and B over the load and 2 s after it, per 1,000 flows made.\n\n")
	b.WriteString("| run | mode | target /s | achieved /s (failed) | flows on A | never on B | lag p50 / p90 / p99 / max (ms) | listeners' lag p99 (ms) | listeners late p99 A / B (ms) | metric p50 / p99 (ms) | CPU A / B (s) | CPU A / B per 1,000 flows (ms) | generator CPU (s) | lost / resyncs / refreshes | peer taken for dead by A / B | refused by B | B held all after | alive | load avg before / after |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		target := strconv.Itoa(run.TargetRate)
		if run.TargetRate == 0 {
			target = "max"
		}
		name := run.Name
		if run.Stopped > 0 {
			name += fmt.Sprintf(" (B stopped %.1f s)", run.Stopped)
		}
		per := func(s float64) string {
			if run.Client.Completed == 0 {
				return "–"
			}
			return fmt.Sprintf("%.1f", s*1000*1000/float64(run.Client.Exchanges))
		}
		lag, listener, late, never, metric, lost, held, refused := "–", "–", "–", "–", "–", "–", "–", "–"
		if run.Name != ssNoSync {
			l := run.Lag
			lag = l.Kernel.String()
			if l.KernelFlows < l.SeenB {
				lag += fmt.Sprintf(" (of %d)", l.KernelFlows)
			}
			listener = fmt.Sprintf("%.1f", l.Listener.P99Ms)
			late = fmt.Sprintf("%.1f / %.1f", l.ReadDelayA.P99Ms, l.ReadDelayB.P99Ms)
			never = fmt.Sprintf("%d (%.3f%%)", l.NeverOnB, 100*l.NeverFraction)
			metric = fmt.Sprintf("≤ %s / ≤ %s", bucketMs(run.Sync.LagP50Ms), bucketMs(run.Sync.LagP99Ms))
			lost = fmt.Sprintf("%d / %d / %d", run.Sync.Lost, run.Sync.ResyncsSent, run.Sync.Refreshes)
			refused = fmt.Sprint(run.Sync.Refused)
			held = fmt.Sprintf("no (%d of %d missing)", run.HeldMissing, run.HeldEntries)
			if run.Held {
				held = fmt.Sprintf("yes, %.1f s (%d entries; %d missing at first)", run.HeldAfter, run.HeldEntries, run.HeldMissingFirst)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f (%d) | %d | %s | %s | %s | %s | %s | %.2f / %.2f | %s / %s | %.2f | %s | %d / %d | %s | %s | %v | %.2f / %.2f |\n",
			name, run.Mode, target, run.Client.PerSecond, run.Client.Failed, run.Lag.FlowsA, never, lag, listener, late, metric,
			run.CPUSecondsA, run.CPUSecondsB, per(run.CPUSecondsA), per(run.CPUSecondsB), run.ClientCPUSeconds, lost,
			run.PeerDead[0], run.PeerDead[1], refused, held, run.Alive, run.LoadAvg[0], run.LoadAvg[1])
	}
	b.WriteString("\nsync: state_sync on (the default); nosync: state_sync = false, the same load (the difference is the sync's cost); overflow: sync_queue at its minimum and B stopped (SIGSTOP) in the middle of the load, dead_after raised so that A keeps B alive and its queue overflows: the updates dropped are counted as lost and a full resync follows. \"B held all after\": how long after the load's end B's kernel first held a replica of every entry A's kernel still had (but those with 2 s or less left), how many that was and how many B lacked at the first look.\n")
	if r.DeadAfter != 0 {
		fmt.Fprintf(&b, "\nThe sync and nosync runs with dead_after = %d.\n", r.DeadAfter)
	}
	b.WriteString("\nLongest lag (kernel) of the flows A created in each half second (ms):\n")
	for _, run := range r.Runs {
		if len(run.Lag.MaxBy500ms) > 0 {
			fmt.Fprintf(&b, "\n- %s %s at %d/s: %v", run.Name, run.Mode, run.TargetRate, run.Lag.MaxBy500ms)
		}
	}
	b.WriteString("\n")
	for _, run := range r.Runs {
		if len(run.Lag.ListenerErrors) > 0 || run.Lag.OnlyB > 0 || run.Lag.ReusedA > 0 || len(run.Sync.Refused) > 0 || run.Client.LastError != "" {
			fmt.Fprintf(&b, "\n- %s %s at %d/s: listener errors %q, replicas without A's event %d, tuples reused %d, refused %v, generator's last error %q",
				run.Name, run.Mode, run.TargetRate, run.Lag.ListenerErrors, run.Lag.OnlyB, run.Lag.ReusedA, run.Sync.Refused, run.Client.LastError)
		}
	}
	b.WriteString("\n")
	r.tableMarkdown(&b)
	return b.String()
}

func bucketMs(ms float64) string {
	if ms < 0 {
		return "> 8192"
	}
	return strconv.FormatFloat(ms, 'f', -1, 64)
}

// fetchProfile writes a CPU profile of g over d to path.
func fetchProfile(g *failover.Nftgate, d time.Duration, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	client := &http.Client{Timeout: d + 30*time.Second, Transport: &http.Transport{DialContext: g.Host.DialContext}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", failover.NftgateListen, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}
