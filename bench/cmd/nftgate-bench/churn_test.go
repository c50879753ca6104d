package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// Each write of the rolling update replaces exactly one of the slice's
// endpoints, and the writes go round the churning Services in turn.
func TestChurnSliceMovesOneEndpoint(t *testing.T) {
	var all []netip.Addr
	a := netip.MustParseAddr("198.18.2.10")
	for range maxEndpoints {
		all, a = append(all, a), a.Next()
	}
	e := &Env{Cfg: &Config{Endpoints: 4}, Topo: &lab.Topology{BackendIPv4: all}}
	const services = 3
	prev := map[string][]netip.Addr{}
	for i := range services {
		_, sl, err := e.bulkObjects(i)
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range sl.Endpoints {
			prev[sl.Name] = append(prev[sl.Name], netip.MustParseAddr(ep.Addresses[0]))
		}
	}
	for k := range 3 * services * maxEndpoints {
		name, eps := e.churnSlice(k, services)
		if want := fmt.Sprintf(firstBulkName, k%services); name != want {
			t.Fatalf("write %d: %s, want %s", k, name, want)
		}
		gone := 0
		for _, old := range prev[name] {
			if !slices.Contains(eps, old) {
				gone++
			}
		}
		if gone != 1 || len(eps) != 4 {
			t.Fatalf("write %d to %s: %v after %v: %d endpoints replaced, want 1 of 4", k, name, eps, prev[name], gone)
		}
		prev[name] = eps
	}
}

func TestChurnFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	base := []string{"--nftgate", bin, "--kube-proxy", bin, "--out", "out"}
	cfg, err := parseFlags(append(base, "--churn-only", "--churn-rates", "100, 1000", "--churn-duration", "5m"))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Churn
	if !c.On || !slices.Equal(c.Rates, []int{100, 1000}) || c.Duration != 5*time.Minute ||
		!slices.Equal(cfg.Proxiers, []string{proxNftgate, proxKPNFTables}) || cfg.Out != filepath.Join("out", churnDir) ||
		cfg.Dataplane.Duration != 0 || cfg.Drift.Repeats != 0 {
		t.Fatalf("--churn-only: %+v, proxiers %v, out %s, dataplane %v, drift %d", c, cfg.Proxiers, cfg.Out, cfg.Dataplane.Duration, cfg.Drift.Repeats)
	}
	if cfg, err = parseFlags(base); err != nil || cfg.Churn.On {
		t.Fatalf("default: churn on %v, %v", cfg.Churn.On, err)
	}
	for _, bad := range [][]string{
		{"--churn", "--churn-rates", "100,x"},
		{"--churn", "--churn-rates", "0"},
		{"--churn", "--churn-duration", "10ms"},
		{"--churn", "--churn-proxiers", "kube-router"},
		{"--churn", "--source", "manifests", "--proxiers", "nftgate"},
		{"--churn", "--load-only"},
	} {
		if _, err := parseFlags(append(base, bad...)); err == nil || !strings.Contains(err.Error(), "churn") {
			t.Errorf("%q: error %v, want one naming the churn flag", bad, err)
		}
	}
}

func TestChurnRunSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ss := []procSample{
		{t0, ProcStats{CPU: 10 * time.Second, RSSKiB: 50 << 10}},
		{t0.Add(time.Second), ProcStats{CPU: 10*time.Second + 500*time.Millisecond, RSSKiB: 70 << 10}},
		{t0.Add(2 * time.Second), ProcStats{CPU: 10*time.Second + 600*time.Millisecond, RSSKiB: 60 << 10}},
	}
	r := ChurnRun{Writes: 200, ChangeMs: []float64{60, 70, 130}, APIMs: []float64{5, 10, 100}}
	r.summarize(ss, SyncMetrics{Syncs: 40, SyncSeconds: 0.8}, 50*time.Millisecond)
	if r.Cores != 0.3 || r.CPUPerWriteMs != 3 || !slices.Equal(r.CoresPerSec, []float64{0.5, 0.1}) ||
		r.RSSMiB != 60 || r.RSSMaxMiB != 70 || r.SyncMeanMs != 20 || r.BoundMs != 120 || r.ChangeP50Ms != 70 || r.ChangeMaxMs != 130 ||
		r.AfterAPIP50Ms != 55 || r.AfterAPIMaxMs != 60 {
		t.Fatalf("%+v", r)
	}
}

func TestChurnReport(t *testing.T) {
	run := func(rate int, perWrite float64) ChurnRun {
		return ChurnRun{TargetPerSecond: rate, PerSecond: float64(rate) * 0.9, Seconds: 60, Syncs: 600, ChangeMs: []float64{60, 70},
			ChangeP50Ms: 60, ChangeP99Ms: 70, ChangeMaxMs: 70, BoundMs: 120, Cores: 0.5, CoresPerSec: []float64{0.4, 0.6}, CPUPerWriteMs: perWrite}
	}
	r := &Report{LoadWorkers: 32, Results: []Result{
		{Proxier: proxNftgate, Services: 1000, Churn: &ChurnResult{Services: 998, Runs: []ChurnRun{run(100, 4), run(1000, 1)}}},
		{Proxier: proxNftgate, Services: 10000, Churn: &ChurnResult{Services: 1000, Runs: []ChurnRun{run(100, 5), run(1000, 1.5)}}},
		{Proxier: proxKPNFTables, Services: 10000},
	}}
	md := r.ChurnMarkdown()
	for _, want := range []string{"## Under churn", "up to 32 writes in flight",
		"| nftgate | 10,000 | 1,000 | 900/s | 60 ms | 70 ms | 70 ms | 120 ms | 0.0 ms | 0.0 ms / 0.0 ms | 10.0 | 0.50 cores | 0.60 | 1.50 ms |",
		"- nftgate, 100 writes/s aimed: CPU per write 4.00 ms at 1,000 Services, 5.00 ms at 10,000 (1.2×; 10.0× the Services)."} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	path := filepath.Join(t.TempDir(), "churn.png")
	if err := r.PlotChurn(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("churn.png: %v", err)
	}
	if (&Report{Results: r.Results[2:]}).ChurnMarkdown() != "" {
		t.Error("a report without the phase has a churn section")
	}
}
