package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// --counters adds the nftgate-nocounters row after nftgate, its data plane
// beside nftgate's; --counters-only runs the two alone under counters/.
func TestParseFlagsCounters(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin, "--out", "res"}
	cfg, err := parseFlags(append(bins, "--counters"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{proxNftgate, proxNftgateNoCounters, proxKPNFTables, proxKPIPTables}; !slices.Equal(cfg.Proxiers, want) || cfg.Out != "res" {
		t.Errorf("--counters: proxiers %q out %s, want %q in res", cfg.Proxiers, cfg.Out, want)
	}
	cfg, err = parseFlags(append(bins, "--counters-only"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{proxNftgate, proxNftgateNoCounters}; !slices.Equal(cfg.Proxiers, want) || cfg.Out != filepath.Join("res", "counters") ||
		!slices.Equal(cfg.Dataplane.Proxiers, want) || cfg.Drift.Repeats != 0 {
		t.Errorf("--counters-only: proxiers %q out %s data plane %q drift %d", cfg.Proxiers, cfg.Out, cfg.Dataplane.Proxiers, cfg.Drift.Repeats)
	}
	if _, err := parseFlags(append(bins, "--counters", "--load-only")); err == nil || !strings.Contains(err.Error(), "--load-only") {
		t.Errorf("--counters --load-only: %v", err)
	}
}

// nftgate-nocounters' configuration turns the counters off.
func TestNftgateNoCountersConfig(t *testing.T) {
	dir := t.TempDir()
	e := &Env{Cfg: &Config{NftgateBin: "nftgate"}}
	e.Manifests = &ManifestDir{Dir: dir}
	args, err := proxierByName(proxNftgateNoCounters, e).args(dir)
	if err != nil || args[0] != "--config" {
		t.Fatalf("args %q, %v", args, err)
	}
	b, err := os.ReadFile(args[1])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), countersOffSetting) {
		t.Errorf("config:\n%s\nwant %s", b, countersOffSetting)
	}
}

// The report puts both rows side by side and compares them.
func TestCountersMarkdown(t *testing.T) {
	c := &CountersReport{Changes: 3, Rows: []Result{
		{Proxier: proxNftgate, Services: 10000, ColdStartSeconds: 11, ChangeMs: []float64{10, 20, 30}, ChangeP50Ms: 20, SlabMiB: 500, RSSMiB: 100},
		{Proxier: proxNftgateNoCounters, Services: 10000, ColdStartSeconds: 10, ChangeMs: []float64{10, 20, 30}, ChangeP50Ms: 20, SlabMiB: 400, RSSMiB: 100},
	}}
	md := c.markdown()
	for _, want := range []string{"| 10,000 | on |", "| 10,000 | off |", "counters on against off: cold sync 1.1×", "kernel slab 1.2×"} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
}
