package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// FailoverConfig is the failover phase: long-lived TCP connections and UDP
// flows through a gateway that is killed, in the harness of
// internal/testing/failover, for the floor (keepalived alone), the anchor
// (keepalived + conntrackd) and nftgate (active/backup, and three
// gateways behind ECMP).
type FailoverConfig struct {
	On, Only bool
	TCP, UDP int
	Phases   []string
	// NewEvery: a new TCP connection this often beside the flows, each
	// failed without an echo within NewTimeout; 0: none.
	NewEvery, NewTimeout time.Duration
}

// The failover phase's runs.
const (
	foFloor   = "floor"
	foAnchor  = "anchor"
	foNftgate = "nftgate"
	foECMP    = "nftgate-ecmp"
	// foECMPDrain: nftgate-ecmp with `nftgate drain` instead of the kill.
	foECMPDrain = "nftgate-ecmp-drain"
	// foECMPNoSync: nftgate-ecmp with state_sync = false.
	foECMPNoSync = "nftgate-ecmp-no-sync"
	// foECMPNoSyncPorts: foECMPNoSync with masquerade_ports_by_cpu =
	// false, so that every gateway keeps the client's port where free.
	foECMPNoSyncPorts = "nftgate-ecmp-no-sync-ports"
	// foAnchorLinkCut and foNftgateLinkCut: the anchor and nftgate
	// (active/backup) with the active's upstream link cut instead of the
	// kill: it lives, and still hears its peer over its other links.
	foAnchorLinkCut  = "anchor-link-cut"
	foNftgateLinkCut = "nftgate-link-cut"
)

var allFailoverPhases = []string{foFloor, foAnchor, foNftgate, foECMP, foECMPDrain, foECMPNoSync, foECMPNoSyncPorts, foAnchorLinkCut, foNftgateLinkCut}

func failoverFlags(fs *flag.FlagSet, c *FailoverConfig) func() error {
	fs.BoolVar(&c.On, "failover", false, "failover phase after the others: kill a gateway under live flows (bench/results/failover)")
	fs.BoolVar(&c.Only, "failover-only", false, "the failover phase alone (no kube-apiserver, no proxiers)")
	fs.IntVar(&c.TCP, "failover-tcp", 1000, "failover phase: long-lived TCP connections, a line every 100 ms each")
	fs.IntVar(&c.UDP, "failover-udp", 100, "failover phase: UDP flows, a datagram every 100 ms each")
	fs.DurationVar(&c.NewEvery, "failover-new-every", 10*time.Millisecond, "failover phase: open a new TCP connection this often beside the flows (0: none)")
	fs.DurationVar(&c.NewTimeout, "failover-new-timeout", time.Second, "failover phase: a new connection without its echo within this fails")
	phases := fs.String("failover-phases", strings.Join(allFailoverPhases, ","), "failover phase: the runs, of "+strings.Join(allFailoverPhases, ", "))
	return func() error {
		c.On = c.On || c.Only
		for _, p := range strings.Split(*phases, ",") {
			if p = strings.TrimSpace(p); !slices.Contains(allFailoverPhases, p) {
				return fmt.Errorf("--failover-phases: %q: want some of %s", p, strings.Join(allFailoverPhases, ", "))
			}
			c.Phases = append(c.Phases, p)
		}
		if c.NewEvery < 0 || c.NewTimeout <= 0 {
			return fmt.Errorf("--failover-new-every %v, --failover-new-timeout %v: want zero or more, and more than zero", c.NewEvery, c.NewTimeout)
		}
		if c.TCP < 1 || c.UDP < 0 || c.TCP+c.UDP > 20000 {
			return fmt.Errorf("--failover-tcp %d, --failover-udp %d: want at least 1 TCP and at most 20,000 flows", c.TCP, c.UDP)
		}
		return nil
	}
}

// FailoverRun is one run's outcome.
type FailoverRun struct {
	Name string `json:"name"`
	// Skipped says why the run did not happen (nftgate without state
	// sync).
	Skipped  string          `json:"skipped,omitempty"`
	Result   failover.Result `json:"result"`
	LoadAvg  [2]float64      `json:"load_avg_before_after"`
	Duration float64         `json:"seconds"`
}

// FailoverReport is bench/results/failover/results.json.
type FailoverReport struct {
	Started time.Time     `json:"started"`
	Machine string        `json:"machine"`
	TCP     int           `json:"tcp"`
	UDP     int           `json:"udp"`
	Runs    []FailoverRun `json:"runs"`
}

// RunFailover runs the failover phase and writes failover/results.md and
// results.json under cfg.Out, after every run.
func RunFailover(cfg *Config, machine string) error {
	for _, v := range [][]string{{"keepalived", "--version"}, {"conntrackd", "-v"}} {
		out, _ := exec.Command(v[0], v[1:]...).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		line, _, _ = strings.Cut(line, ". ") // conntrackd: "... v1.4.7. Licensed under GPLv2."
		machine += "; " + line
	}
	r := &FailoverReport{Started: time.Now().UTC(), Machine: machine, TCP: cfg.Failover.TCP, UDP: cfg.Failover.UDP}
	dir := filepath.Join(cfg.Out, "failover")
	traffic := failover.Traffic{TCP: cfg.Failover.TCP, UDP: cfg.Failover.UDP,
		NewEvery: cfg.Failover.NewEvery, NewTimeout: cfg.Failover.NewTimeout}
	for _, name := range cfg.Failover.Phases {
		logf("failover %s: %d TCP + %d UDP, load %.2f", name, traffic.TCP, traffic.UDP, loadAvg())
		run := FailoverRun{Name: name, LoadAvg: [2]float64{loadAvg(), 0}}
		start := time.Now()
		res, skipped, err := failoverRun(cfg, name, traffic)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		run.Result, run.Skipped, run.Duration = res, skipped, time.Since(start).Seconds()
		run.LoadAvg[1] = loadAvg()
		if skipped != "" {
			logf("failover %s: skipped: %s", name, skipped)
		} else {
			logf("failover %s: %s", name, res)
		}
		r.Runs = append(r.Runs, run)
		if err := r.write(dir); err != nil {
			return err
		}
	}
	logf("failover results in %s", dir)
	return nil
}

func failoverRun(cfg *Config, name string, traffic failover.Traffic) (res failover.Result, skipped string, err error) {
	tmp, err := os.MkdirTemp("", "nftgate-bench-failover-")
	if err != nil {
		return res, "", err
	}
	defer os.RemoveAll(tmp)
	noSync := name == foECMPNoSync || name == foECMPNoSyncPorts
	ecmp := name == foECMP || name == foECMPDrain || noSync
	o := failover.Options{Name: "bench-failover", Gateways: 2}
	if ecmp {
		o.Gateways, o.Router = 3, true
	}
	topo, err := failover.New(o)
	if err != nil {
		return res, "", err
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	n := traffic.TCP + traffic.UDP
	switch name {
	case foFloor, foAnchor, foAnchorLinkCut:
		a, err := failover.StartAnchor(topo, filepath.Join(tmp, "anchor"), name != foFloor)
		if err != nil {
			return res, "", err
		}
		defer func() {
			if err != nil {
				logf("anchor logs:\n%s", a.Logs())
			}
			err = errors.Join(err, a.Close())
		}()
		inject := func() (time.Time, error) { return topo.Fail(0) }
		if name == foAnchorLinkCut {
			inject = func() (time.Time, error) { return time.Now(), topo.CutUpstream(0, false) }
		}
		res, err = failover.FailoverBy(topo, netip.AddrPortFrom(failover.ServiceAddr, failover.ServicePort), traffic, inject,
			func() error { return a.Synced(n, time.Minute) })
		return res, "", err
	}
	nc, err := failover.WriteNftgate(topo, tmp, failover.NftgateOptions{ECMP: ecmp, NoStateSync: noSync, PortsByCPUOff: name == foECMPNoSyncPorts})
	if err != nil {
		return res, "", err
	}
	if err := failover.NftgateSupports(cfg.NftgateBin, nc.Configs[0]); err != nil {
		return res, err.Error(), nil
	}
	var router *bird.Router
	if ecmp {
		router, err = failover.StartRouter(topo, filepath.Join(tmp, "bird"), 0)
		if err != nil {
			return res, "", err
		}
		defer router.Close()
	}
	gs, err := startNftgates(cfg, topo, nc)
	// Each nftgate's output goes to the bench's log when the run failed,
	// or when a new connection did, to tell why.
	defer func() {
		err = errors.Join(err, stopNftgates(gs, err != nil || (res.New != nil && res.New.Failed > 0)))
	}()
	if err != nil {
		return res, "", err
	}
	if router != nil {
		// Traffic starts once the router spreads the Service over every
		// gateway.
		if err := failover.ECMPRoutes(router, len(topo.Gateways), time.Minute); err != nil {
			return res, "", err
		}
	}
	// The gateway to kill: the holder of the Service address (active/
	// backup), or the first (ECMP, where each carries a share).
	fail := 0
	if name == foNftgate || name == foNftgateLinkCut {
		if fail, err = holderOf(gs, failover.ServiceAddr); err != nil {
			return res, "", err
		}
	}
	var others []*lab.Host
	for i, h := range topo.Gateways {
		if i != fail {
			others = append(others, h)
		}
	}
	inject := func() (time.Time, error) { return topo.Fail(fail) }
	switch name {
	case foECMPDrain:
		inject = func() (time.Time, error) { return drainECMP(cfg, gs[fail], nc.Configs[fail], router, len(gs)-1) }
	case foNftgateLinkCut:
		inject = func() (time.Time, error) { return time.Now(), topo.CutUpstream(fail, false) }
	}
	res, err = failover.FailoverBy(topo, nc.Dst, traffic, inject,
		func() error {
			if noSync {
				return nil // no replica ever comes
			}
			err := failover.Replicated(others, nc.Dst.Addr(), n, time.Minute)
			if err != nil && (name == foNftgate || name == foNftgateLinkCut || ecmp) {
				// Say what the state sync saw, so a miss can be told apart.
				for _, g := range gs {
					_, body, _ := g.Get("/api/v1/statesync")
					err = fmt.Errorf("%w\n%s /api/v1/statesync: %s", err, g.Host, body)
				}
			}
			return err
		})
	return res, "", err
}

// startNftgates starts nftgate in every gateway of topo and waits until
// each is ready. The gateways started are returned also on error, for
// stopNftgates.
func startNftgates(cfg *Config, topo *failover.Topology, nc *failover.NftgateConfig) ([]*failover.Nftgate, error) {
	var gs []*failover.Nftgate
	for i, h := range topo.Gateways {
		g, err := failover.StartNftgate(h, cfg.NftgateBin, append(slices.Clone(nc.Args[i]), cfg.NftgateArgs...))
		if err != nil {
			return gs, err
		}
		gs = append(gs, g)
	}
	for _, g := range gs {
		if err := g.WaitReady(time.Minute); err != nil {
			return gs, err
		}
	}
	return gs, nil
}

// stopNftgates kills every process in the gateways' namespaces; with
// failed, it logs each nftgate's output first.
func stopNftgates(gs []*failover.Nftgate, failed bool) error {
	var err error
	for _, g := range gs {
		if failed {
			logf("nftgate in %s:\n%s", g.Host, g.Logs())
		}
		err = errors.Join(err, failover.KillNamespace(g.Host))
	}
	return err
}

// holderOf waits until one of gs holds addr and returns its index.
func holderOf(gs []*failover.Nftgate, addr netip.Addr) (int, error) {
	holder := -1
	err := lab.EventuallyWithin(time.Minute, func() error {
		for i, g := range gs {
			h, err := g.Holds()
			if err != nil {
				return err
			}
			if slices.Contains(h, addr) {
				holder = i
				return nil
			}
		}
		return fmt.Errorf("no gateway holds %v", addr)
	})
	return holder, err
}

func (r *FailoverReport) write(dir string) error {
	return writeResults(dir, "results", r, r.markdown)
}

func (r *FailoverReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Failover: %d TCP connections and %d UDP flows through a gateway killed with -9\n\n", r.TCP, r.UDP)
	fmt.Fprintf(&b, "%s, %s. Each flow exchanges a line (datagram) every 100 ms; a flow is kept when it still echoes correctly 3 s after the kill, lost on a reset, a wrong byte or 10 s without an echo. Stall: the longest gap between two echoes of a kept flow (the interval included), from `internal/testing/failover`.\n\n",
		r.Started.Format("2006-01-02 15:04 UTC"), r.Machine)
	b.WriteString("| run | TCP lost | TCP stall p50 / p99 / max (ms) | UDP lost | UDP stall p50 / p99 / max (ms) | new connections failed | failure window (ms) | load avg before / after |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		if run.Skipped != "" {
			fmt.Fprintf(&b, "| %s | skipped: %s | | | | | | | |\n", run.Name, run.Skipped)
			continue
		}
		t, u := run.Result.TCP, run.Result.UDP
		newFailed, newGap := newConns(run.Result.New)
		fmt.Fprintf(&b, "| %s | %d/%d%s | %s | %d/%d%s | %s | %s | %s | %.2f / %.2f |\n",
			run.Name, t.Lost, t.Flows, reasons(t.Reasons), stalls(t), u.Lost, u.Flows, reasons(u.Reasons), stalls(u),
			newFailed, newGap, run.LoadAvg[0], run.LoadAvg[1])
	}
	b.WriteString("\nfloor: keepalived alone (VRRP, advert 100 ms) moves the Service address and F; anchor: the same with conntrackd (FTFW) and Debian's primary-backup.sh; nftgate: two gateways, active/backup; nftgate-ecmp: three behind BIRD (ECMP, BFD 100 ms), active/active; nftgate-ecmp-drain: the same with `nftgate drain` on the first gateway instead of the kill (the flows are followed from the drain's start, once BIRD has withdrawn its route); nftgate-ecmp-no-sync: nftgate-ecmp without state sync (`state_sync = false`): a flow of the dead gateway is picked up at a survivor, and carries on only at the one that took over its masquerade address, and only where the dead gateway kept the client's port; nftgate-ecmp-no-sync-ports: the same with `masquerade_ports_by_cpu = false`, so that every gateway keeps the client's port wherever it is free; anchor-link-cut and nftgate-link-cut: the anchor and nftgate (active/backup) with the active's link to the upstream segment cut (its carrier lost) instead of the kill: it lives and still hears its peer over its other links (nftgate tracks its [l2] interfaces; VRRP runs on the link).\n")
	for _, run := range r.Runs {
		if n := run.Result.New; n != nil {
			fmt.Fprintf(&b, "\nNew connections: one every %.0f ms from before the failure to the end (each a line echoed, failed without the echo within %.0f ms); counted when they ended after the failure. Failure window: from the start of the first that failed to the start of the first that echoed after the last that failed (behind ECMP, only those hashed to the dead gateway fail, so failures and successes alternate within it).\n", n.IntervalMs, n.TimeoutMs)
			break
		}
	}
	return b.String()
}

func reasons(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return " (" + strings.Join(parts, ", ") + ")"
}

// stalls is p50 / p99 / max over the kept flows; a dash when none was.
func stalls(s failover.Stats) string {
	if s.Lost == s.Flows {
		return "–"
	}
	return fmt.Sprintf("%.0f / %.0f / %.0f", s.StallP50Ms, s.StallP99Ms, s.StallMaxMs)
}

// newConns is the new connections' columns: failed of attempted, with
// the reasons, and the failure window; dashes without them.
func newConns(n *failover.NewConnStats) (string, string) {
	if n == nil {
		return "–", "–"
	}
	failed := fmt.Sprintf("%d/%d%s", n.Failed, n.Attempts, reasons(n.Reasons))
	if n.FailedBefore > 0 {
		failed += fmt.Sprintf("; %d before the failure", n.FailedBefore)
	}
	return failed, fmt.Sprintf("%.0f", n.GapMs)
}

// drainECMP runs `nftgate drain` on g and waits until the router has
// withdrawn its route (want routes left); it returns the drain's start.
func drainECMP(cfg *Config, g *failover.Nftgate, config string, router *bird.Router, want int) (time.Time, error) {
	start := time.Now()
	if err := g.Drain(cfg.NftgateBin, config); err != nil {
		return start, err
	}
	err := lab.EventuallyWithin(time.Minute, func() error {
		routes, err := router.Routes(netip.PrefixFrom(failover.ECMPServiceAddr, 32))
		if err != nil {
			return err
		}
		if len(routes) != want {
			return fmt.Errorf("BIRD has %d routes to %v, want %d after the drain", len(routes), failover.ECMPServiceAddr, want)
		}
		return nil
	})
	logf("failover %s: drain started; BIRD withdrew its route after %v", g.Host, time.Since(start).Round(time.Millisecond))
	return start, err
}
