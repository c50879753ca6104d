package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestShardsArg(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--pprof"}, 0},
		{[]string{"--pprof", "--shards=64"}, 64},
		{[]string{"--shards", "8"}, 8},
	} {
		if got := shardsArg(c.args); got != c.want {
			t.Errorf("shardsArg(%q) = %d, want %d", c.args, got, c.want)
		}
	}
}

func TestDriftCommandNamesTheCanarysShard(t *testing.T) {
	e := &Env{Cfg: &Config{}}
	if got := strings.Join(e.driftCommand(driftFlush, 0), " "); got != "flush ruleset" {
		t.Fatalf("flush: %q", got)
	}
	def := strings.Join(e.driftCommand(driftElement, 0), " ")
	if !strings.HasPrefix(def, "delete element ip nftgate-services-") || !strings.HasSuffix(def, " service-ips { 198.19.0.10 . tcp . 80 }") {
		t.Fatalf("element: %q", def)
	}
	e.Cfg.NftgateArgs = []string{"--shards=64"}
	if other := strings.Join(e.driftCommand(driftElement, 0), " "); other == def {
		t.Fatalf("element with 64 shards names the same table as with 16: %q", other)
	}
	e.Cfg.NftgateArgs = nil
	if logged := strings.Join(e.driftCommand(driftElement, 64), " "); logged == def {
		t.Fatalf("element with 64 shards logged names the same table as with 16: %q", logged)
	}
}

func TestLoggedShards(t *testing.T) {
	log := []byte("=== 2026-11-29T12:00:00Z nftgate --manifests m\n" +
		"time=x level=INFO msg=\"full sync\" services=10000 shards=16\n" +
		"=== 2026-11-29T12:05:00Z nftgate --manifests m\n" +
		"time=x level=INFO msg=\"nftgate starting\" shards=3\n" +
		"time=x level=INFO msg=\"full sync\" services=100000 changes=300962 duration=9.1s tables_read=130 shards=64 first_served=788ms\n" +
		"time=x level=INFO msg=\"full sync\" services=100000 shards=16\n")
	if got := loggedShards(log); got != 64 {
		t.Errorf("loggedShards = %d, want 64 (the first full sync's of the last start)", got)
	}
	if got := loggedShards([]byte("time=x level=INFO msg=\"full sync\" services=10\n")); got != 0 {
		t.Errorf("loggedShards of a line without = %d, want 0", got)
	}
}

func TestDriftReport(t *testing.T) {
	r := &Report{Results: []Result{
		{Proxier: proxNftgate, Services: 10000},
		{Proxier: proxNftgate, Services: 100000, Drift: &DriftResult{IntervalMs: 10, Kinds: []DriftKind{
			{Kind: driftFlush, GapsMs: []float64{900, 1100, 1000}, MedianMs: 1000, MaxMs: 1100, Failed: []int{80, 95, 90},
				RepairedMs: []float64{2000, 2200, 2100}, RepairedMedianMs: 2100},
			{Kind: driftElement, GapsMs: []float64{12, 30, 20}, MedianMs: 20, MaxMs: 30, Failed: []int{1, 2, 2}},
		}}},
	}}
	md := r.DriftMarkdown()
	for _, want := range []string{"## Drift under traffic", "| nftgate | 100,000 | `nft flush ruleset` | 1000 ms | 1100 ms | 2100 ms | 3 | 90 |", "| nftgate | 100,000 | the canary's service-ips element deleted | 20 ms | 30 ms | – | 3 | 2 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	path := filepath.Join(t.TempDir(), "drift.png")
	if err := r.PlotDrift(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("drift.png: %v", err)
	}
	if (&Report{Results: r.Results[:1]}).DriftMarkdown() != "" {
		t.Error("a report without the phase has a drift section")
	}
}
