package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// The data-plane phase: new connections per second and bulk throughput
// through the gateway, to one backend via a Service (masqueraded, as every
// client outside the cluster CIDRs is) against the same backend addressed
// directly (routed by the same gateway, no NAT): the limit.
const (
	dpConnName = "dp-conn" // the Service of the connection test
	dpBulkName = "dp-bulk" // the Service of the bulk test (iperf3)
	dpFile     = "dataplane.json"
	dpConnPort = 8090 // the backend's line server
	dpBulkPort = 5201 // the backend's iperf3 server
	// bannerPrefix starts the line the backend's server writes.
	bannerPrefix = "nftgate-bench"

	pathVia    = "via"
	pathDirect = "direct"
)

var (
	dpConnIP = netip.MustParseAddr("198.19.0.12")
	dpBulkIP = netip.MustParseAddr("198.19.0.13")
	// Client source addresses, added to the client namespace: one and
	// many per path, each path its own, so that TIME_WAIT sockets one
	// path leaves on the backend never meet the other path's flows.
	dpViaOne      = netip.MustParseAddr("198.18.1.32")
	dpDirectOne   = netip.MustParseAddr("198.18.1.33")
	dpViaMany0    = netip.MustParseAddr("198.18.1.64")
	dpDirectMany0 = netip.MustParseAddr("198.18.1.128")
	dpMaxSources  = 64
)

// DataplaneConfig is what the command line sets for the data-plane phase.
type DataplaneConfig struct {
	// Duration of each run (connection test or iperf3); 0 skips the phase.
	Duration time.Duration
	Proxiers []string
	Parallel []int
	// Sources is the "many" of "from many client addresses".
	Sources int
	// Only skips the endpoint changes and the latency samples.
	Only bool
	// NftgateConfigExtra is a TOML file appended to the configuration the
	// benchmark gives nftgate (--config).
	NftgateConfigExtra string
	// OwnCPU gives the gateway a CPU of its own (dataplane_pin.go).
	OwnCPU bool
	// Rounds: how many times each run is made, via and direct taking
	// turns (roundPaths).
	Rounds int
	// ServersRunning leaves kube-apiserver and etcd running during the
	// runs, which otherwise pauses them (pauseServers).
	ServersRunning bool
}

// dpMaxRounds bounds --dataplane-rounds.
const dpMaxRounds = 20

// dataplaneFlags registers the phase's flags; check validates them after
// parsing.
func dataplaneFlags(fs *flag.FlagSet, c *DataplaneConfig) (check func() error) {
	var proxiers, parallel string
	fs.DurationVar(&c.Duration, "dataplane-duration", 10*time.Second,
		"length of each data-plane run (connections per second, iperf3); 0 skips the data-plane phase. The goal of no stalls is judged over 60s")
	fs.StringVar(&proxiers, "dataplane-proxiers", proxNftgate+","+proxKPNFTables, "proxiers whose data plane is measured (of those run)")
	fs.StringVar(&parallel, "dataplane-parallel", "8,64", "comma-separated numbers of parallel clients in the connection test")
	fs.IntVar(&c.Sources, "dataplane-sources", 16, "client addresses of the \"many addresses\" runs, per path")
	fs.BoolVar(&c.Only, "dataplane-only", false, "measure cold start and the data plane only: no endpoint changes, no latency samples")
	fs.BoolVar(&c.OwnCPU, "dataplane-own-cpu", false,
		"the gateway on a CPU of its own, as on a box of its own: the proxier and the packets the gateway receives (RPS) on the last CPU, the clients, the backend and everything else on the others; each run also records that CPU's busy time")
	fs.IntVar(&c.Rounds, "dataplane-rounds", 1,
		"how many times each data-plane run is made, via and direct taking turns (via first in odd rounds, direct first in even ones); the report gives the means, their ratio and every round's ratio")
	fs.BoolVar(&c.ServersRunning, "dataplane-servers-running", false,
		"leave kube-apiserver and etcd running during each data-plane run (by default they are paused with SIGSTOP for the run and continued after it: they share the endpoints' CPUs, which set the rate)")
	fs.StringVar(&c.NftgateConfigExtra, "nftgate-config-extra", "",
		"TOML `file` appended to the configuration nftgate gets (--config), e.g. to measure masquerade or flowtable settings")
	return func() error {
		c.Proxiers = nil
		for _, p := range strings.Split(proxiers, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if !slices.Contains(allProxiers, p) {
				return fmt.Errorf("--dataplane-proxiers: %q: want one of %s", p, strings.Join(allProxiers, ", "))
			}
			c.Proxiers = append(c.Proxiers, p)
		}
		c.Parallel = nil
		for _, s := range strings.Split(parallel, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > 1024 {
				return fmt.Errorf("--dataplane-parallel: %q: want whole numbers from 1 to 1024", s)
			}
			c.Parallel = append(c.Parallel, n)
		}
		switch {
		case c.Duration < 0:
			return fmt.Errorf("--dataplane-duration: %v: want zero or more", c.Duration)
		case c.Duration > 0 && c.Duration < time.Second:
			return fmt.Errorf("--dataplane-duration: %v: want 0 (skip) or at least 1s", c.Duration)
		case c.Duration%time.Second != 0:
			return fmt.Errorf("--dataplane-duration: %v: want whole seconds (iperf3 counts in seconds)", c.Duration)
		case c.Rounds < 1 || c.Rounds > dpMaxRounds:
			return fmt.Errorf("--dataplane-rounds: %d: want 1 to %d", c.Rounds, dpMaxRounds)
		case c.Sources < 2 || c.Sources > dpMaxSources:
			return fmt.Errorf("--dataplane-sources: %d: want 2 to %d", c.Sources, dpMaxSources)
		case c.Only && c.Duration == 0:
			return errors.New("--dataplane-only with --dataplane-duration 0: nothing to measure")
		}
		if c.NftgateConfigExtra != "" {
			if _, err := os.ReadFile(c.NftgateConfigExtra); err != nil {
				return fmt.Errorf("--nftgate-config-extra: %w", err)
			}
		}
		return nil
	}
}

// DataplaneSettings are the phase's settings as the report records them.
type DataplaneSettings struct {
	Seconds  float64 `json:"seconds_per_run"`
	Parallel []int   `json:"parallel"`
	Sources  int     `json:"sources"`
	Only     bool    `json:"dataplane_only,omitempty"`
	// NftgateConfigExtra is the content of --nftgate-config-extra.
	NftgateConfigExtra string `json:"nftgate_config_extra,omitempty"`
	// OwnCPU: --dataplane-own-cpu.
	OwnCPU bool `json:"own_cpu,omitempty"`
	// Rounds: --dataplane-rounds, when more than one.
	Rounds int `json:"rounds,omitempty"`
	// ServersPaused: kube-apiserver and etcd were paused during each run
	// (not --dataplane-servers-running; results of --source manifests have
	// none to pause).
	ServersPaused bool `json:"servers_paused,omitempty"`
}

func (c *DataplaneConfig) settings() *DataplaneSettings {
	if c.Duration == 0 && c.NftgateConfigExtra == "" {
		return nil
	}
	s := &DataplaneSettings{Seconds: c.Duration.Seconds(), Parallel: c.Parallel, Sources: c.Sources, Only: c.Only, OwnCPU: c.OwnCPU}
	if c.Rounds > 1 {
		s.Rounds = c.Rounds
	}
	s.ServersPaused = !c.ServersRunning
	if c.NftgateConfigExtra != "" {
		b, _ := os.ReadFile(c.NftgateConfigExtra)
		s.NftgateConfigExtra = string(b)
	}
	return s
}

// nftgateConfigArgs prepends --config FILE to nftgate's arguments when
// --nftgate-config-extra is given or more holds settings (top-level TOML
// lines, such as a proxier variant's): FILE in dir holds a header, more,
// then the extra file's content. The benchmark's own settings stay flags,
// which override the file.
func (e *Env) nftgateConfigArgs(dir string, args []string, more ...string) ([]string, error) {
	extra := e.Cfg.Dataplane.NftgateConfigExtra
	if extra == "" && len(more) == 0 {
		return args, nil
	}
	var b []byte
	if extra != "" {
		var err error
		if b, err = os.ReadFile(extra); err != nil {
			return nil, fmt.Errorf("--nftgate-config-extra: %w", err)
		}
	}
	path := filepath.Join(dir, "nftgate.toml")
	content := fmt.Sprintf("# Written by nftgate-bench: its settings are flags (--node-name, --listen, --cluster-cidr and the source);\n# what follows is the proxier's own settings, then %s.\n\n%s\n%s\n",
		cmp.Or(extra, "nothing else"), strings.Join(more, "\n"), b)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return nil, err
	}
	return append([]string{"--config", path}, args...), nil
}

// dpSources are a path's client addresses: one, or many.
func dpSources(path string, many int) (one netip.Addr, all []netip.Addr) {
	one, first := dpViaOne, dpViaMany0
	if path == pathDirect {
		one, first = dpDirectOne, dpDirectMany0
	}
	a := first
	for range many {
		all = append(all, a)
		a = a.Next()
	}
	return one, all
}

// setupDataplane adds the client addresses, starts the backend's line
// server and iperf3, and creates the two Services (one endpoint each, on
// the first backend address). stop ends the servers.
func (e *Env) setupDataplane(ctx context.Context) (stop func(), err error) {
	var closers []func()
	stopAll := func() {
		for _, c := range closers {
			c()
		}
	}
	stop = stopAll
	defer func() {
		// The error returns set stop to nil: close with stopAll.
		if err != nil {
			stopAll()
		}
	}()
	c := e.Cfg.Dataplane
	var addrs []netip.Prefix
	for _, path := range []string{pathVia, pathDirect} {
		one, many := dpSources(path, c.Sources)
		for _, a := range append([]netip.Addr{one}, many...) {
			addrs = append(addrs, netip.PrefixFrom(a, lab.ClientNet4.Bits()))
		}
	}
	if err := e.Topo.Client.AddAddress(e.Topo.ClientIface, addrs...); err != nil {
		return nil, err
	}
	backend := e.Topo.BackendIPv4[0]
	ln, err := e.Topo.Backend.Listen("tcp", netip.AddrPortFrom(backend, dpConnPort).String())
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { ln.Close() })
	for range 2 {
		go serveLine(ln)
	}
	ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	iperf := e.Topo.Backend.Command(ictx, "iperf3", "--server", "--bind", backend.String(),
		"--port", strconv.Itoa(dpBulkPort))
	logPath := filepath.Join(e.LogDir, "iperf3-server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		cancel()
		return nil, err
	}
	defer logFile.Close()
	iperf.Stdout, iperf.Stderr = logFile, logFile
	if err := iperf.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("iperf3 server (install iperf3: make bench-deps): %w", err)
	}
	waited := make(chan struct{})
	go func() { _ = iperf.Wait(); close(waited) }()
	closers = append(closers, func() { cancel(); <-waited })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := lab.Eventually(wctx, func() error {
		out, err := e.Topo.Backend.Command(wctx, "ss", "-Hltn", "sport", "=", ":"+strconv.Itoa(dpBulkPort)).Output()
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(out)) == 0 {
			return fmt.Errorf("iperf3 not listening on %s:%d (log %s)", backend, dpBulkPort, logPath)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	one := []netip.Addr{backend}
	if e.Manifests != nil {
		_, err := e.Manifests.Write(dpFile, service(dpConnName, dpConnIP), slice(dpConnName, dpConnPort, one),
			service(dpBulkName, dpBulkIP), slice(dpBulkName, dpBulkPort, one))
		return stop, err
	}
	if err := e.createService(ctx, dpConnName, dpConnIP, dpConnPort, one); err != nil {
		return nil, err
	}
	return stop, e.createService(ctx, dpBulkName, dpBulkIP, dpBulkPort, one)
}

// serveLine answers every connection with one line and closes it, first:
// the backend of the connection test.
func serveLine(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = c.Write([]byte(bannerPrefix + " " + c.RemoteAddr().String() + "\n"))
		c.Close()
	}
}

// DataplaneResult is the data-plane phase of one proxier at one size.
type DataplaneResult struct {
	Connections []ConnRun `json:"connections"`
	Bulk        []BulkRun `json:"bulk"`
	// Shards is the shard count nftgate ran with (0 for kube-proxy), and
	// ShardsPassedVia how many of the shards' NAT chains the first packet
	// of a connection via the connection test's Service passes: the kernel
	// passes chains of one priority last registered first, and a cold
	// start creates shard 0 first, so shard i is passed (Shards-i)-th. One
	// direct passes them all.
	Shards          int `json:"shards,omitempty"`
	ShardsPassedVia int `json:"shards_passed_via,omitempty"`
}

// shardsPassed is how many of n shards' NAT chains a new connection to
// Service key passes before its own shard's, its own included, when shard
// 0 was created first.
func shardsPassed(n int, key model.ServiceKey) int {
	if n <= 0 {
		return 0
	}
	return n - ruleset.Config{Shards: n}.ShardOf(key)
}

// ConnRun is one run of the connection test.
type ConnRun struct {
	Path string `json:"path"` // via (the Service) or direct
	// Round: which of --dataplane-rounds (from 1; 0 in results from
	// before rounds, which had one).
	Round    int    `json:"round,omitempty"`
	Dst      string `json:"dst"`
	Parallel int    `json:"parallel"`
	Sources  int    `json:"sources"`
	ConnStats
	// BackendTimeWait: TIME_WAIT sockets on the backend at the run's end
	// (the backend starts each run without any).
	BackendTimeWait int `json:"backend_time_wait"`
	// Counters of the backend's and the client's TCP stacks
	// (/proc/net/netstat) over the run: netstatCounters.
	Backend map[string]int64 `json:"backend_tcp"`
	Client  map[string]int64 `json:"client_tcp"`
	// Gateway: the gateway's conntrack counters over the run
	// (conntrackCounters), which name a stall's cause where no TCP
	// counter does.
	Gateway map[string]int64 `json:"gateway_conntrack"`
	// CPUSeconds is the machine's busy time over the run (user, nice,
	// system, irq and softirq of every CPU, from /proc/stat), whatever ran;
	// GatewayCPUSeconds that of the gateway's own CPU with
	// --dataplane-own-cpu (GatewayCPU), else 0; ProxierCPUSeconds the
	// proxier process's own CPU time (user and system, its reaped children
	// included).
	CPUSeconds        float64 `json:"cpu_seconds,omitempty"`
	GatewayCPU        *int    `json:"gateway_cpu,omitempty"`
	GatewayCPUSeconds float64 `json:"gateway_cpu_seconds,omitempty"`
	ProxierCPUSeconds float64 `json:"proxier_cpu_seconds,omitempty"`
}

// CPUPerConnection is the busy time a connection of the run, in µs: with
// the gateway on its own CPU, that CPU's less the proxier process's (its
// own work, such as a periodic reconcile, is not a connection's), else the
// machine's. 0 without a figure.
func (r ConnRun) CPUPerConnection() float64 {
	if r.Exchanges <= 0 {
		return 0
	}
	busy := r.CPUSeconds
	if r.GatewayCPU != nil {
		busy = max(r.GatewayCPUSeconds-r.ProxierCPUSeconds, 0)
	}
	return busy * 1e6 / float64(r.Exchanges)
}

// cpuWatch is what a run's CPU figures read: the gateway's own CPU, if it
// has one, and the proxier's process.
type cpuWatch struct {
	GatewayCPU *int
	ProxierPID int
}

// cpuReading is one reading of the CPUs' busy time and the proxier's CPU
// time.
type cpuReading struct {
	busy    map[string]float64
	proxier time.Duration
}

func (w cpuWatch) read() (cpuReading, error) {
	busy, err := readCPUBusy()
	if err != nil {
		return cpuReading{}, err
	}
	p, err := readProcStats(w.ProxierPID)
	return cpuReading{busy: busy, proxier: p.CPU}, err
}

// record sets run's CPU figures from the readings before and after it.
func (w cpuWatch) record(run *ConnRun, before, after cpuReading) {
	run.CPUSeconds = after.busy["cpu"] - before.busy["cpu"]
	run.GatewayCPUSeconds, run.ProxierCPUSeconds = w.between(before, after)
}

// between is the gateway CPU's busy time (0 without one) and the
// proxier's CPU time from one reading to the next, in seconds.
func (w cpuWatch) between(before, after cpuReading) (gateway, proxier float64) {
	if w.GatewayCPU != nil {
		k := "cpu" + strconv.Itoa(*w.GatewayCPU)
		gateway = after.busy[k] - before.busy[k]
	}
	return gateway, (after.proxier - before.proxier).Seconds()
}

// conntrackCounters are the gateway's conntrack counters a run records
// (/proc/net/stat/nf_conntrack, summed over the CPUs): new entries dropped
// at insertion because another took the tuple first (insert_failed), or
// for want of room (drop, early_drop), clashes resolved (clashres), packets
// conntrack found invalid, and lookups restarted.
var conntrackCounters = []string{"insert_failed", "drop", "early_drop", "clashres", "invalid", "search_restart"}

// readConntrackStat reads the conntrack counters of h's namespace.
func readConntrackStat(h *lab.Host) (map[string]int64, error) {
	data, err := readNetnsProc(h, "net/stat/nf_conntrack")
	if err != nil {
		return nil, err
	}
	return parseConntrackStat(data)
}

// readNetnsProc reads the file name of /proc/thread-self in h's
// namespace: the thread reading is the one in the namespace.
func readNetnsProc(h *lab.Host, name string) (string, error) {
	var data []byte
	err := h.Do(func() error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/" + name)
		return err
	})
	return string(data), err
}

// parseConntrackStat sums the per-CPU rows (hexadecimal) of
// /proc/net/stat/nf_conntrack by the names of its first line.
func parseConntrackStat(data string) (map[string]int64, error) {
	lines := strings.Split(strings.TrimSpace(data), "\n")
	names := strings.Fields(lines[0])
	if len(names) == 0 || names[0] != "entries" {
		return nil, fmt.Errorf("nf_conntrack stat: first line %q, want the counters' names", lines[0])
	}
	out := map[string]int64{}
	for _, line := range lines[1:] {
		values := strings.Fields(line)
		if len(values) != len(names) {
			return nil, fmt.Errorf("nf_conntrack stat: %d names, %d values in %q", len(names), len(values), line)
		}
		for i, v := range values {
			n, err := strconv.ParseInt(v, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("nf_conntrack stat: %s: %q: %w", names[i], v, err)
			}
			out[names[i]] += n
		}
	}
	return out, nil
}

// netstatCounters are the TCP counters a run records, on the backend and
// the client: SYNs a TIME_WAIT socket turned away for an old timestamp
// (PAWSTimewait) and TIME_WAIT sockets a new SYN took over (TWRecycled),
// ACKs a TIME_WAIT socket did not send for a SYN it did not take
// (TCPACKSkippedTimeWait, rate-limited), connections the listener had no
// room for (ListenOverflows, ListenDrops),
// and SYNs the client sent again (TCPSynRetrans).
var netstatCounters = []string{"PAWSTimewait", "TWRecycled", "TCPACKSkippedTimeWait", "ListenOverflows", "ListenDrops", "TCPSynRetrans"}

// readNetstat reads the TcpExt counters of h's namespace.
func readNetstat(h *lab.Host) (map[string]int64, error) {
	data, err := readNetnsProc(h, "net/netstat")
	if err != nil {
		return nil, err
	}
	return parseNetstat(data, "TcpExt")
}

// parseNetstat reads one group of /proc/net/netstat: a line of names
// after "Group:", then a line of values.
func parseNetstat(data, group string) (map[string]int64, error) {
	lines := strings.Split(data, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != group+":" {
			continue
		}
		if len(values) != len(names) || values[0] != group+":" {
			return nil, fmt.Errorf("netstat: %s: %d names, %d values", group, len(names), len(values))
		}
		out := map[string]int64{}
		for j := 1; j < len(names); j++ {
			v, err := strconv.ParseInt(values[j], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("netstat: %s %s: %q: %w", group, names[j], values[j], err)
			}
			out[names[j]] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("netstat: no %s group", group)
}

// counterDelta is after minus before for each of names the kernel has.
func counterDelta(names []string, before, after map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, k := range names {
		if a, ok := after[k]; ok {
			out[k] = a - before[k]
		}
	}
	return out
}

// BulkRun is one iperf3 run, with the host's CPU time meanwhile.
type BulkRun struct {
	Path        string  `json:"path"`
	Round       int     `json:"round,omitempty"` // as ConnRun's
	Dst         string  `json:"dst"`
	Gbps        float64 `json:"gbit_per_s"`
	Retransmits int     `json:"retransmits"`
	Seconds     float64 `json:"seconds"`
	CPU
	// With --dataplane-own-cpu, the gateway's CPU and its busy time over
	// the run, and the proxier's own CPU time (as ConnRun's).
	GatewayCPU        *int    `json:"gateway_cpu,omitempty"`
	GatewayCPUSeconds float64 `json:"gateway_cpu_seconds,omitempty"`
	ProxierCPUSeconds float64 `json:"proxier_cpu_seconds,omitempty"`
}

// GatewayBusy is how busy the gateway's own CPU was over the run, 0 to 1,
// less the proxier's own work; -1 without a CPU of its own.
func (b BulkRun) GatewayBusy() float64 {
	if b.GatewayCPU == nil || b.Seconds <= 0 {
		return -1
	}
	return max(b.GatewayCPUSeconds-b.ProxierCPUSeconds, 0) / b.Seconds
}

// CPU is the host's CPU time over a run, from /proc/stat, in seconds
// summed over all CPUs. The network namespaces share the kernel, so this is
// the whole machine's; see bench/README.md for what softirq holds.
type CPU struct {
	UserSeconds    float64 `json:"user_seconds"`
	SystemSeconds  float64 `json:"system_seconds"`
	SoftirqSeconds float64 `json:"softirq_seconds"`
}

// SoftirqCores is softirq time per second of the run.
func (b BulkRun) SoftirqCores() float64 {
	if b.Seconds <= 0 {
		return 0
	}
	return b.SoftirqSeconds / b.Seconds
}

// SoftirqPerGiB is softirq time per GiB moved (at the measured rate over
// the whole run).
func (b BulkRun) SoftirqPerGiB() float64 {
	gib := b.Gbps * 1e9 / 8 * b.Seconds / (1 << 30)
	if gib <= 0 {
		return 0
	}
	return b.SoftirqSeconds / gib
}

// dataplaneFor says whether the phase runs for proxier name.
func (e *Env) dataplaneFor(name string) bool {
	return e.Cfg.Dataplane.Duration > 0 && slices.Contains(e.Cfg.Dataplane.Proxiers, name)
}

// measureDataplane runs the connection test (via and direct, each
// parallelism, one and many sources) and iperf3 (via and direct) against
// the running proxier.
func (e *Env) measureDataplane(ctx context.Context, proc *Proc, p *Proxier, n int) (*DataplaneResult, error) {
	c := e.Cfg.Dataplane
	backend := e.Topo.BackendIPv4[0]
	dst := map[string][2]netip.AddrPort{ // connection test, bulk
		pathVia:    {netip.AddrPortFrom(dpConnIP, servicePort), netip.AddrPortFrom(dpBulkIP, servicePort)},
		pathDirect: {netip.AddrPortFrom(backend, dpConnPort), netip.AddrPortFrom(backend, dpBulkPort)},
	}
	// The Services are programmed with the rest; wait until they answer.
	wctx, cancel := context.WithTimeout(ctx, e.Cfg.Timeout)
	defer cancel()
	if err := lab.Eventually(wctx, func() error {
		if err := proc.Exited(); err != nil {
			return err
		}
		return e.Topo.Client.Do(func() error {
			return oneExchange(wctx, &net.Dialer{}, dst[pathVia][0], time.Now().Add(time.Second))
		})
	}); err != nil {
		return nil, fmt.Errorf("data plane: Service %s not served: %w", dst[pathVia][0], err)
	}
	watch := cpuWatch{ProxierPID: proc.PID()}
	if c.OwnCPU {
		split, restore, err := e.pinDataplane(ctx, proc.PID())
		if err != nil {
			return nil, fmt.Errorf("data plane: %w", err)
		}
		defer func() {
			if rerr := restore(); rerr != nil {
				logf("data plane: putting back the CPUs: %v", rerr)
			}
		}()
		watch.GatewayCPU = &split.Gateway
		logf("%s N=%d: the gateway on CPU %d, the rest on %v", p.Name, n, split.Gateway, split.Others)
	}
	res := &DataplaneResult{}
	if log, err := os.ReadFile(proc.LogPath); err == nil { // kube-proxy logs no shards
		res.Shards = loggedShards(log)
		res.ShardsPassedVia = shardsPassed(res.Shards, model.NewServiceKey(namespace, dpConnName))
	}
	for round := 1; round <= max(c.Rounds, 1); round++ {
		for _, par := range c.Parallel {
			for _, many := range []bool{false, true} {
				for _, path := range roundPaths(round) {
					one, all := dpSources(path, c.Sources)
					srcs := []netip.Addr{one}
					if many {
						srcs = all
					}
					run, err := e.connRun(ctx, path, dst[path][0], srcs, par, c.Duration, watch)
					if err != nil {
						return res, err
					}
					run.Round = round
					logf("%s N=%d round %d: %s", p.Name, n, round, run.Summary())
					res.Connections = append(res.Connections, run)
				}
			}
		}
		for _, path := range roundPaths(round) {
			one, _ := dpSources(path, c.Sources)
			run, err := e.bulkRun(ctx, path, dst[path][1], one, c.Duration, watch)
			if err != nil {
				return res, err
			}
			run.Round = round
			logf("%s N=%d round %d: %s", p.Name, n, round, run.Summary())
			res.Bulk = append(res.Bulk, run)
		}
	}
	return res, nil
}

// roundPaths is the order of the paths in round (from 1): via first in odd
// rounds, direct first in even ones, so that over two rounds each path has
// run as often first as second and a steady drift of the host's speed
// weighs on both alike.
func roundPaths(round int) []string {
	if round%2 == 0 {
		return []string{pathDirect, pathVia}
	}
	return []string{pathVia, pathDirect}
}

// pauseServers stops kube-apiserver and etcd (SIGSTOP) for a run, unless
// --dataplane-servers-running or without a control plane (--source
// manifests); resume continues them. On one machine they share the CPUs
// the clients and the backend use, and a gateway has none of their work:
// idle, with 10,000 Services, the two spent about 16% of that CPU in user
// time during a run (and their system time more), in bursts that moved
// each run's rate. The proxier keeps its watch connections, silent
// meanwhile; nothing changes in a run.
func (e *Env) pauseServers() (resume func() error, err error) {
	if e.API == nil || e.Cfg.Dataplane.ServersRunning {
		return func() error { return nil }, nil
	}
	return pauseProcesses(e.API.APIServerPID(), e.API.EtcdPID())
}

// pauseProcesses stops the processes (SIGSTOP; a pid of 0 is none), and
// resume continues them. If one cannot be stopped, those stopped are
// continued.
func pauseProcesses(pids ...int) (resume func() error, err error) {
	signal := func(sig syscall.Signal) error {
		var errs []error
		for _, pid := range pids {
			if pid == 0 {
				continue
			}
			if err := syscall.Kill(pid, sig); err != nil {
				errs = append(errs, fmt.Errorf("%v to process %d: %w", sig, pid, err))
			}
		}
		return errors.Join(errs...)
	}
	if err := signal(syscall.SIGSTOP); err != nil {
		return nil, errors.Join(err, signal(syscall.SIGCONT))
	}
	return func() error { return signal(syscall.SIGCONT) }, nil
}

// resetFlows starts a run from a clean slate: no conntrack entries on the
// gateway and no TIME_WAIT sockets on the backend, so a run does not
// inherit the one before it. Within the run they build up as on a busy
// Service.
func (e *Env) resetFlows(ctx context.Context) error {
	_ = e.Topo.Gateway.Command(ctx, "conntrack", "-F").Run() // says what it flushed on stderr
	if out, err := e.Topo.Backend.Command(ctx, "ss", "-K", "-t", "state", "time-wait").CombinedOutput(); err != nil {
		return fmt.Errorf("ss -K state time-wait in the backend: %v: %.500s", err, out)
	}
	return nil
}

// timeWaitCount is the number of TIME_WAIT TCP sockets on the backend.
func (e *Env) timeWaitCount(ctx context.Context) int {
	out, err := e.Topo.Backend.Command(ctx, "ss", "-Htan", "state", "time-wait").Output()
	if err != nil {
		return -1
	}
	return bytes.Count(out, []byte("\n"))
}

func (e *Env) connRun(ctx context.Context, path string, dst netip.AddrPort, srcs []netip.Addr, parallel int, d time.Duration, watch cpuWatch) (ConnRun, error) {
	run := ConnRun{Path: path, Dst: dst.String(), Parallel: parallel, Sources: len(srcs), GatewayCPU: watch.GatewayCPU}
	if err := e.resetFlows(ctx); err != nil {
		return run, err
	}
	cmd, err := clientCommand(ctx, e.Topo.Client, dataplaneClientCmd, dst, srcs,
		"-parallel", strconv.Itoa(parallel), "-duration", d.String())
	if err != nil {
		return run, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	backendBefore, err := readNetstat(e.Topo.Backend)
	if err != nil {
		return run, err
	}
	clientBefore, err := readNetstat(e.Topo.Client)
	if err != nil {
		return run, err
	}
	gatewayBefore, err := readConntrackStat(e.Topo.Gateway)
	if err != nil {
		return run, err
	}
	resume, err := e.pauseServers()
	if err != nil {
		return run, err
	}
	cpuBefore, err := watch.read()
	if err != nil {
		return run, errors.Join(err, resume())
	}
	out, err := cmd.Output()
	// The after-reading comes before the servers continue, as in bulkRun:
	// the reading covers the run alone.
	cpuAfter, werr := watch.read()
	if rerr := resume(); rerr != nil {
		return run, rerr
	}
	if err != nil {
		return run, fmt.Errorf("connection test %s: %v: %.1000s", path, err, stderr.String())
	}
	if werr != nil {
		return run, werr
	}
	watch.record(&run, cpuBefore, cpuAfter)
	backendAfter, err := readNetstat(e.Topo.Backend)
	if err != nil {
		return run, err
	}
	clientAfter, err := readNetstat(e.Topo.Client)
	if err != nil {
		return run, err
	}
	gatewayAfter, err := readConntrackStat(e.Topo.Gateway)
	if err != nil {
		return run, err
	}
	run.Backend, run.Client = counterDelta(netstatCounters, backendBefore, backendAfter), counterDelta(netstatCounters, clientBefore, clientAfter)
	run.Gateway = counterDelta(conntrackCounters, gatewayBefore, gatewayAfter)
	if err := json.Unmarshal(out, &run.ConnStats); err != nil {
		return run, fmt.Errorf("connection test %s: %q: %w", path, out, err)
	}
	run.BackendTimeWait = e.timeWaitCount(ctx)
	return run, nil
}

// Summary is one line for the log.
func (r ConnRun) Summary() string {
	return fmt.Sprintf("connections %s %s, %d clients from %d address(es): %.0f/s, %d stalled (%d failed), p50 %.0fµs p99 %.0fµs max %.0fµs, backend TIME_WAIT %d, backend %v, client %v, gateway conntrack %v",
		r.Path, r.Dst, r.Parallel, r.Sources, r.PerSecond, r.Stalled, r.Failed, r.P50us, r.P99us, r.MaxUs, r.BackendTimeWait, r.Backend, r.Client, r.Gateway)
}

// Summary is one line for the log.
func (b BulkRun) Summary() string {
	return fmt.Sprintf("iperf3 %s %s: %.2f Gbit/s, %d retransmits, softirq %.2f cores (%.2f s/GiB), system %.2f s, user %.2f s",
		b.Path, b.Dst, b.Gbps, b.Retransmits, b.SoftirqCores(), b.SoftirqPerGiB(), b.SystemSeconds, b.UserSeconds)
}

func (e *Env) bulkRun(ctx context.Context, path string, dst netip.AddrPort, src netip.Addr, d time.Duration, watch cpuWatch) (BulkRun, error) {
	run := BulkRun{Path: path, Dst: dst.String(), GatewayCPU: watch.GatewayCPU}
	if err := e.resetFlows(ctx); err != nil {
		return run, err
	}
	cmd := e.Topo.Client.Command(ctx, "iperf3", "--client", dst.Addr().String(), "--port", strconv.Itoa(int(dst.Port())),
		"--bind", src.String(), "--time", strconv.Itoa(int(d/time.Second)), "--json")
	resume, err := e.pauseServers()
	if err != nil {
		return run, err
	}
	before, err := readCPU()
	if err != nil {
		return run, errors.Join(err, resume())
	}
	wBefore, err := watch.read()
	if err != nil {
		return run, errors.Join(err, resume())
	}
	start := time.Now()
	out, err := cmd.Output()
	run.Seconds = time.Since(start).Seconds()
	wAfter, werr := watch.read()
	after, cerr := readCPU()
	if rerr := resume(); rerr != nil {
		return run, rerr
	}
	if cerr = errors.Join(cerr, werr); cerr != nil {
		return run, cerr
	}
	run.CPU = after.sub(before)
	run.GatewayCPUSeconds, run.ProxierCPUSeconds = watch.between(wBefore, wAfter)
	gbps, retr, perr := parseIperf(out)
	if err != nil || perr != nil {
		return run, fmt.Errorf("iperf3 %s to %s: %w", path, dst, errors.Join(err, perr))
	}
	run.Gbps, run.Retransmits = gbps, retr
	return run, nil
}

// parseIperf reads the received rate (Gbit/s) and the sender's
// retransmissions from iperf3's --json output.
func parseIperf(out []byte) (gbps float64, retransmits int, err error) {
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, 0, fmt.Errorf("iperf3 output %.300q: %w", out, err)
	}
	if r.Error != "" {
		return 0, 0, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.End.SumReceived.BitsPerSecond <= 0 {
		return 0, 0, fmt.Errorf("iperf3 output %.300q: no received rate", out)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, r.End.SumSent.Retransmits, nil
}

// readCPU is the first line of /proc/stat ("cpu  user nice system idle
// iowait irq softirq ..."), in seconds.
func readCPU() (CPU, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return CPU{}, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return CPU{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return parseProcStatCPU(line)
}

func parseProcStatCPU(line string) (CPU, error) {
	name, v, err := procStatCPULine(line)
	if err != nil {
		return CPU{}, err
	}
	if name != "cpu" {
		return CPU{}, fmt.Errorf("/proc/stat: first line %q: want \"cpu\"", line)
	}
	return CPU{UserSeconds: v[0] + v[1], SystemSeconds: v[2], SoftirqSeconds: v[6]}, nil
}

// procStatCPULine reads a "cpu" or "cpuN" line of /proc/stat: its name and
// its first 7 counters (user nice system idle iowait irq softirq) in
// seconds.
func procStatCPULine(line string) (name string, v [7]float64, err error) {
	f := strings.Fields(line)
	if len(f) < 8 {
		return "", v, fmt.Errorf("/proc/stat: %q: want a name and at least 7 counters", line)
	}
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return "", v, fmt.Errorf("/proc/stat: %s counter %d %q: %w", f[0], i+1, f[i+1], err)
		}
		v[i] = float64(n) / float64(clockTick)
	}
	return f[0], v, nil
}

// readCPUBusy is the busy time (user, nice, system, irq, softirq) of the
// machine ("cpu") and of each CPU ("cpu0", ...) from /proc/stat, in
// seconds.
func readCPUBusy() (map[string]float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	return parseProcStatBusy(string(b))
}

func parseProcStatBusy(data string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, line := range strings.Split(data, "\n") {
		if !strings.HasPrefix(line, "cpu") {
			continue
		}
		name, v, err := procStatCPULine(line)
		if err != nil {
			return nil, err
		}
		out[name] = v[0] + v[1] + v[2] + v[5] + v[6] // not idle, iowait
	}
	if _, ok := out["cpu"]; !ok {
		return nil, errors.New("/proc/stat: no \"cpu\" line")
	}
	return out, nil
}

func (c CPU) sub(o CPU) CPU {
	return CPU{UserSeconds: c.UserSeconds - o.UserSeconds, SystemSeconds: c.SystemSeconds - o.SystemSeconds,
		SoftirqSeconds: c.SoftirqSeconds - o.SoftirqSeconds}
}
