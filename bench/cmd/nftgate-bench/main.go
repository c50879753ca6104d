// Command nftgate-bench runs nftgate and kube-proxy (nftables and iptables
// modes) one after the other in the same lab gateway namespace, against the
// same real kube-apiserver and the same Services, and measures what an
// operator feels: cold start, endpoint change latency, resident memory, CPU
// time and the data-plane cost of a ClusterIP.
//
//	nftgate-bench --nftgate build/nftgate --kube-proxy build/kube-proxy \
//	    --sizes 1000,10000 --out bench/results
//
// See bench/README.md for the method. It needs root (network namespaces,
// nftables) and the binaries `make kube-bin` builds.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/internal/testing/kubetest"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// Config is what the command line sets.
type Config struct {
	NftgateBin   string
	KubeProxyBin string
	Sizes        []int
	Endpoints    int
	Changes      int
	ChangeGap    time.Duration
	LatencyN     int
	LoadWorkers  int
	Proxiers     []string
	Out          string
	KeepLogs     bool
	Timeout      time.Duration
	// LoadOnly stops after loading each size: it measures the control
	// plane, not the proxiers.
	LoadOnly bool
	// APIServerArgs are extra kube-apiserver flags, e.g. --profiling=true
	// to look at where loading spends its time.
	APIServerArgs []string
	// NftgateArgs are extra nftgate flags, e.g. --pprof to profile it
	// while it is measured.
	NftgateArgs []string
	// Source is where the Services are: "api" (kube-apiserver) or
	// "manifests" (files nftgate reads with --manifests).
	Source string
	// ManifestsPerFile is how many bulk Services one manifest file holds.
	ManifestsPerFile int
	// Edge is the edge phase (edge.go).
	Edge EdgeConfig
	// Rerender names a results.json to render results.md and results.png
	// from again, without measuring.
	Rerender string
	// Dataplane is the data-plane phase (dataplane.go).
	Dataplane DataplaneConfig
	// Failover is the failover phase (failover.go).
	Failover FailoverConfig
	// Drift is the drift phase (drift.go).
	Drift DriftConfig
	// StateSync is the state-sync load phase (statesync.go).
	StateSync StateSyncConfig
	// Maglev is the Maglev comparison (maglev.go).
	Maglev MaglevConfig
	// Counters is the counters comparison (counters.go).
	Counters CountersConfig
	// Churn is the churn phase (churn.go).
	Churn ChurnConfig
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == dataplaneClientCmd {
		os.Exit(dataplaneClientMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == statesyncClientCmd {
		os.Exit(statesyncClientMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == statesyncCtgenCmd {
		os.Exit(statesyncCtgenMain(os.Args[2:]))
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftgate-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Rerender != "" {
		err = rerender(cfg.Rerender)
	} else {
		err = run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftgate-bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*Config, error) {
	fs := flag.NewFlagSet("nftgate-bench", flag.ContinueOnError)
	cfg := &Config{}
	var sizes, proxiers string
	fs.StringVar(&cfg.NftgateBin, "nftgate", "build/nftgate", "nftgate binary")
	fs.StringVar(&cfg.KubeProxyBin, "kube-proxy", "", "kube-proxy binary (default: the one `make kube-bin` built)")
	fs.StringVar(&sizes, "sizes", "1000,10000", "comma-separated numbers of Services N")
	fs.IntVar(&cfg.Endpoints, "endpoints", 4, "endpoints per Service K")
	fs.IntVar(&cfg.Changes, "changes", 20, "endpoint changes measured per proxier and size")
	fs.DurationVar(&cfg.ChangeGap, "change-gap", 1500*time.Millisecond,
		"pause before each endpoint change, longer than kube-proxy's 1 s minimum sync period so changes are not back to back")
	fs.IntVar(&cfg.LatencyN, "latency-samples", 1000, "connections measured through the ClusterIP and directly, each")
	fs.IntVar(&cfg.LoadWorkers, "load-workers", 32, "concurrent API writers while loading Services")
	fs.StringVar(&proxiers, "proxiers", strings.Join(allProxiers, ","), "comma-separated proxiers to run (default with --source manifests: nftgate)")
	fs.StringVar(&cfg.Source, "source", sourceAPI,
		"where the Services are: api (a real kube-apiserver) or manifests (files in a directory; nftgate only, with --manifests)")
	fs.IntVar(&cfg.ManifestsPerFile, "manifest-services-per-file", 1000, "with --source manifests: bulk Services (each with its EndpointSlice) per file")
	fs.StringVar(&cfg.Out, "out", "bench/results", "directory for results.md, results.json and results.png")
	fs.BoolVar(&cfg.KeepLogs, "keep-logs", false, "keep the proxiers' logs (their directory is printed)")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "bound on each proxier's cold start and on each endpoint change")
	fs.BoolVar(&cfg.LoadOnly, "load-only", false, "only load the Services of each size and report how long that took")
	fs.Func("api-server-arg", "extra kube-apiserver flag, e.g. --api-server-arg=--profiling=true (repeatable)", func(s string) error {
		if !strings.HasPrefix(s, "--") {
			return fmt.Errorf("%q: want a flag such as --profiling=true", s)
		}
		cfg.APIServerArgs = append(cfg.APIServerArgs, s)
		return nil
	})
	fs.Func("nftgate-arg", "extra nftgate flag, e.g. --nftgate-arg=--pprof (repeatable)", func(s string) error {
		if !strings.HasPrefix(s, "--") {
			return fmt.Errorf("%q: want a flag such as --pprof", s)
		}
		cfg.NftgateArgs = append(cfg.NftgateArgs, s)
		return nil
	})
	checkDataplane := dataplaneFlags(fs, &cfg.Dataplane)
	edgeFlags(fs, &cfg.Edge)
	checkFailover := failoverFlags(fs, &cfg.Failover)
	checkDrift := driftFlags(fs, &cfg.Drift)
	checkStateSync := statesyncFlags(fs, &cfg.StateSync)
	checkMaglev := maglevFlags(fs, &cfg.Maglev)
	checkCounters := countersFlags(fs, &cfg.Counters)
	checkChurn := churnFlags(fs, &cfg.Churn)
	fs.StringVar(&cfg.Rerender, "rerender", "", "results.json to render results.md and results.png from again, edge.json to render edge.md, or maglev.json to render maglev.md (no measuring)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if cfg.Rerender != "" {
		return cfg, nil
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < minServices || n > maxServices {
			return nil, fmt.Errorf("--sizes: %q: want whole numbers from %d to %d", s, minServices, maxServices)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	slices.Sort(cfg.Sizes)
	cfg.Sizes = slices.Compact(cfg.Sizes)
	if !slices.Contains(allSources, cfg.Source) {
		return nil, fmt.Errorf("--source: %q: want one of %s", cfg.Source, strings.Join(allSources, ", "))
	}
	proxiersSet := false
	fs.Visit(func(f *flag.Flag) { proxiersSet = proxiersSet || f.Name == "proxiers" })
	if cfg.Source == sourceManifests && !proxiersSet {
		proxiers = proxNftgate
	}
	for _, p := range strings.Split(proxiers, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(allProxiers, p) {
			return nil, fmt.Errorf("--proxiers: %q: want one of %s", p, strings.Join(allProxiers, ", "))
		}
		if cfg.Source == sourceManifests && p != proxNftgate {
			return nil, fmt.Errorf("--proxiers: %q cannot read manifests; with --source manifests only %s runs", p, proxNftgate)
		}
		cfg.Proxiers = append(cfg.Proxiers, p)
	}
	if cfg.Source == sourceManifests && len(cfg.APIServerArgs) > 0 {
		return nil, fmt.Errorf("--api-server-arg %q: no kube-apiserver runs with --source manifests", cfg.APIServerArgs[0])
	}
	switch {
	case cfg.Endpoints < 1 || cfg.Endpoints > maxEndpoints:
		return nil, fmt.Errorf("--endpoints: %d: want 1 to %d", cfg.Endpoints, maxEndpoints)
	case cfg.Changes < 1:
		return nil, fmt.Errorf("--changes: %d: want at least 1", cfg.Changes)
	case cfg.LatencyN < 1:
		return nil, fmt.Errorf("--latency-samples: %d: want at least 1", cfg.LatencyN)
	case cfg.LoadWorkers < 1:
		return nil, fmt.Errorf("--load-workers: %d: want at least 1", cfg.LoadWorkers)
	case cfg.ChangeGap < 0:
		return nil, fmt.Errorf("--change-gap: %v: want zero or more", cfg.ChangeGap)
	case cfg.Timeout <= 0:
		return nil, fmt.Errorf("--timeout: %v: want more than zero", cfg.Timeout)
	case cfg.ManifestsPerFile < 1:
		return nil, fmt.Errorf("--manifest-services-per-file: %d: want at least 1", cfg.ManifestsPerFile)
	}
	if err := cfg.Edge.check(cfg); err != nil {
		return nil, err
	}
	if err := checkDataplane(); err != nil {
		return nil, err
	}
	if cfg.Dataplane.Only && !proxiersSet {
		// Only the proxiers whose data plane is measured: of another
		// (kube-proxy-iptables) --dataplane-only would measure nothing
		// but a cold start (at 10,000 Services about 400 s).
		cfg.Proxiers = slices.DeleteFunc(cfg.Proxiers, func(p string) bool { return !slices.Contains(cfg.Dataplane.Proxiers, p) })
	}
	if err := checkFailover(); err != nil {
		return nil, err
	}
	if err := checkDrift(); err != nil {
		return nil, err
	}
	if err := checkStateSync(); err != nil {
		return nil, err
	}
	if err := checkMaglev(cfg); err != nil {
		return nil, err
	}
	if err := checkCounters(cfg); err != nil {
		return nil, err
	}
	if err := checkChurn(cfg); err != nil {
		return nil, err
	}
	if cfg.Dataplane.Only {
		cfg.Changes, cfg.LatencyN, cfg.Drift.Repeats = 0, 0, 0
	}
	var err error
	if cfg.NftgateBin, err = filepath.Abs(cfg.NftgateBin); err != nil {
		return nil, err
	}
	if cfg.KubeProxyBin == "" && !cfg.Failover.Only && !cfg.StateSync.Only {
		if cfg.KubeProxyBin, err = kubetest.KubeProxy(); err != nil {
			return nil, fmt.Errorf("--kube-proxy: %w", err)
		}
	}
	for _, bin := range []string{cfg.NftgateBin, cfg.KubeProxyBin} {
		if bin == "" {
			continue
		}
		if fi, err := os.Stat(bin); err != nil || fi.IsDir() {
			return nil, fmt.Errorf("binary %s: not found (run `make bench-build kube-bin`)", bin)
		}
	}
	return cfg, nil
}

// run builds the lab and the control plane once, then for each size loads
// the Services and measures every proxier in turn.
func run(ctx context.Context, cfg *Config) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: network namespaces and nftables")
	}
	if _, err := lab.RemoveStale(); err != nil {
		logf("removing namespaces of dead processes: %v", err)
	}
	logDir, err := os.MkdirTemp("", "nftgate-bench-logs-")
	if err != nil {
		return err
	}
	failed := true
	defer func() {
		if cfg.KeepLogs || failed {
			logf("proxier logs kept in %s", logDir)
			return
		}
		os.RemoveAll(logDir)
	}()

	machine := describeMachine(cfg)
	logf("machine: %s", machine.Summary())
	if cfg.Failover.Only || cfg.StateSync.Only {
		if cfg.Failover.On {
			if err := RunFailover(cfg, machine.Summary()); err != nil {
				return fmt.Errorf("failover: %w", err)
			}
		}
		if cfg.StateSync.On {
			if err := RunStateSync(cfg, machine.Summary()); err != nil {
				return fmt.Errorf("statesync: %w", err)
			}
		}
		failed = false
		return nil
	}

	topo, err := lab.NewGateway("bench", lab.GatewayOptions{})
	if err != nil {
		return err
	}
	defer topo.Close()
	env := &Env{Cfg: cfg, Topo: topo, LogDir: logDir}
	var cp *kubetest.ControlPlane
	if cfg.Source == sourceManifests {
		dir, err := os.MkdirTemp("", "nftgate-bench-manifests-")
		if err != nil {
			return err
		}
		// Regenerated by every run, and large: never kept.
		defer os.RemoveAll(dir)
		env.Manifests = &ManifestDir{Dir: dir, PerFile: cfg.ManifestsPerFile}
	} else {
		startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		cp, err = kubetest.Start(startCtx, kubetest.Options{NetNS: topo.Gateway.Name(),
			ExtraAPIServerArgs: cfg.APIServerArgs})
		cancel()
		if err != nil {
			return err
		}
		defer cp.Stop()
		env.API, env.Client = cp, cp.Client()
	}
	if err := env.Setup(ctx); err != nil {
		return err
	}
	if cfg.Dataplane.Duration > 0 {
		stopDataplane, err := env.setupDataplane(ctx)
		if err != nil {
			return fmt.Errorf("data plane: %w", err)
		}
		defer stopDataplane()
	}

	report := &Report{Machine: machine, Started: time.Now().UTC(), Source: cfg.Source, Endpoints: cfg.Endpoints,
		Changes: cfg.Changes, ChangeGap: cfg.ChangeGap.String(), LatencySamples: cfg.LatencyN, LoadWorkers: cfg.LoadWorkers,
		Dataplane: cfg.Dataplane.settings()}
	if env.Manifests != nil {
		report.ManifestsPerFile = cfg.ManifestsPerFile
	}
	for _, n := range cfg.Sizes {
		apiBefore, etcdBefore := serverCPU(cp)
		took, err := env.LoadTo(ctx, n)
		if err != nil {
			return err
		}
		apiAfter, etcdAfter := serverCPU(cp)
		load := LoadTime{Services: n, Seconds: took.Seconds(),
			APIServerCPUSeconds: (apiAfter - apiBefore).Seconds(), EtcdCPUSeconds: (etcdAfter - etcdBefore).Seconds()}
		if env.Manifests != nil {
			logf("N=%d: %d Services x %d endpoints in manifest files in %s (writing took %v)",
				n, n, cfg.Endpoints, env.Manifests.Dir, took.Round(time.Millisecond))
		} else {
			logf("N=%d: %d Services x %d endpoints in the API (loading took %v; CPU: kube-apiserver %.0f s, etcd %.0f s)",
				n, n, cfg.Endpoints, took.Round(time.Millisecond), load.APIServerCPUSeconds, load.EtcdCPUSeconds)
		}
		report.LoadSeconds = append(report.LoadSeconds, load)
		if cfg.LoadOnly {
			continue
		}
		for _, name := range cfg.Proxiers {
			res, err := env.Measure(ctx, proxierByName(name, env), n)
			if err != nil {
				return fmt.Errorf("%s at N=%d: %w", name, n, err)
			}
			logf("%s", res.Summary())
			report.Results = append(report.Results, res)
			// Written after every proxier, so a run stopped half way
			// still leaves what it measured.
			if err := report.Write(cfg.Out); err != nil {
				logf("writing results: %v", err)
			}
		}
	}
	if cfg.Edge.Services > 0 && !cfg.LoadOnly {
		if err := env.RunEdge(ctx, machine.Summary()); err != nil {
			return fmt.Errorf("edge: %w", err)
		}
	}
	if cfg.Failover.On && !cfg.LoadOnly {
		if err := RunFailover(cfg, machine.Summary()); err != nil {
			return fmt.Errorf("failover: %w", err)
		}
	}
	if cfg.StateSync.On && !cfg.LoadOnly {
		if err := RunStateSync(cfg, machine.Summary()); err != nil {
			return fmt.Errorf("statesync: %w", err)
		}
	}
	report.Finished = time.Now().UTC()
	report.Machine.LoadAvgEnd = loadAvg()
	if cfg.Counters.On {
		if err := writeCounters(cfg, report); err != nil {
			return fmt.Errorf("counters: %w", err)
		}
	}
	if cfg.Maglev.On {
		if err := writeMaglev(cfg, report); err != nil {
			return fmt.Errorf("maglev: %w", err)
		}
	}
	if err := report.Write(cfg.Out); err != nil {
		return err
	}
	logf("results in %s", cfg.Out)
	failed = false
	return nil
}

// serverCPU is the CPU time kube-apiserver and etcd have used so far;
// zero without a control plane.
func serverCPU(cp *kubetest.ControlPlane) (api, etcd time.Duration) {
	if cp == nil {
		return 0, 0
	}
	if st, err := readProcStats(cp.APIServerPID()); err == nil {
		api = st.CPU
	}
	if st, err := readProcStats(cp.EtcdPID()); err == nil {
		etcd = st.CPU
	}
	return api, etcd
}

// rerender writes results.md and results.png next to a results.json.
func rerender(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if filepath.Base(path) == "edge.json" {
		return rerenderEdge(path, data)
	}
	if filepath.Base(path) == "counters.json" {
		return rerenderCounters(path, data)
	}
	if filepath.Base(path) == "maglev.json" {
		return rerenderMaglev(path, data)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return r.Write(filepath.Dir(path))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}
