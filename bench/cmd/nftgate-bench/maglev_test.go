package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// --maglev adds the nftgate-maglev row after nftgate; --maglev-only runs
// the two alone, without the data plane and drift, under maglev/.
func TestParseFlagsMaglev(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin, "--out", "res"}
	cfg, err := parseFlags(append(bins, "--maglev"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{proxNftgate, proxNftgateMaglev, proxKPNFTables, proxKPIPTables}; !slices.Equal(cfg.Proxiers, want) || cfg.Out != "res" {
		t.Errorf("--maglev: proxiers %q out %s, want %q in res", cfg.Proxiers, cfg.Out, want)
	}
	cfg, err = parseFlags(append(bins, "--maglev-only"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{proxNftgate, proxNftgateMaglev}; !slices.Equal(cfg.Proxiers, want) || cfg.Out != filepath.Join("res", "maglev") ||
		cfg.Dataplane.Duration != 0 || cfg.Drift.Repeats != 0 {
		t.Errorf("--maglev-only: proxiers %q out %s data plane %v drift %d", cfg.Proxiers, cfg.Out, cfg.Dataplane.Duration, cfg.Drift.Repeats)
	}
	if _, err := parseFlags(append(bins, "--maglev", "--load-only")); err == nil || !strings.Contains(err.Error(), "--load-only") {
		t.Errorf("--maglev --load-only: %v", err)
	}
}

// nftgate-maglev's configuration sets endpoint_selection at the top,
// before the extra file's content (which may open a table).
func TestNftgateMaglevConfig(t *testing.T) {
	dir := t.TempDir()
	extra := filepath.Join(dir, "extra.toml")
	if err := os.WriteFile(extra, []byte("[bgp]\nasn = 64512\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &Env{Cfg: &Config{NftgateBin: "nftgate"}, API: nil}
	e.Cfg.Dataplane.NftgateConfigExtra = extra
	e.Manifests = &ManifestDir{Dir: dir}
	args, err := proxierByName(proxNftgateMaglev, e).args(dir)
	if err != nil || args[0] != "--config" {
		t.Fatalf("args %q, %v", args, err)
	}
	b, err := os.ReadFile(args[1])
	if err != nil {
		t.Fatal(err)
	}
	sel, bgp := strings.Index(string(b), maglevSetting), strings.Index(string(b), "[bgp]")
	if sel < 0 || bgp < sel {
		t.Errorf("config:\n%s\nwant %s before [bgp]", b, maglevSetting)
	}
	if args, err := proxierByName(proxNftgate, e).args(dir); err != nil || strings.Contains(readFile(t, args[1]), "endpoint_selection") {
		t.Errorf("nftgate's config sets endpoint_selection: %q %v", args, err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The table puts hash and maglev side by side, and the disruption rows
// meet the goal for Maglev and not for hash mod N.
func TestMaglevMarkdown(t *testing.T) {
	m := MaglevReport{Changes: 3, Flows: maglevFlows, Disruption: maglevDisruption(), Rows: []Result{
		{Proxier: proxNftgate, Services: 10000, ColdStartSeconds: 1, ChangeMs: []float64{1, 2, 30}, ChangeP50Ms: 2, SlabMiB: 20, RSSMiB: 80},
		{Proxier: proxNftgateMaglev, Services: 10000, ColdStartSeconds: 30, ChangeMs: []float64{10, 20, 300}, ChangeP50Ms: 20, SlabMiB: 600, RSSMiB: 800},
	}}
	md := m.markdown()
	for _, want := range []string{"| 10,000 | hash | 1.00 s |", "| 10,000 | maglev | 30.0 s |", "300 ms", "cold sync 30.0×, change p50 10.0×, kernel slab 30.0×", "| 10 | 1021 | "} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	for _, d := range m.Disruption {
		if goal := 1/float64(d.Endpoints) + 0.025; d.Mean > goal || d.ModNMean < goal {
			t.Errorf("N=%d: maglev %.3f, mod N %.3f against %.3f", d.Endpoints, d.Mean, d.ModNMean, goal)
		}
	}
}
