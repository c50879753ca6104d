package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestPercentile(t *testing.T) {
	xs := []float64{9, 1, 8, 2, 7, 3, 6, 4, 5, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {100, 10}, {1, 1}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 9 {
		t.Error("percentile sorted its input in place")
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile of nothing = %v, want 0", got)
	}
}

func TestThousandsAndRatio(t *testing.T) {
	for n, want := range map[int]string{7: "7", 1000: "1,000", 10000: "10,000", 100000: "100,000", 1234567: "1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
	if got := ratio(3500, 20); got != "175×" {
		t.Errorf("ratio(3500, 20) = %q", got)
	}
	if got := ratio(3, 2); got != "1.5×" {
		t.Errorf("ratio(3, 2) = %q", got)
	}
	if got := ratio(3, 0); got != "n/a" {
		t.Errorf("ratio(3, 0) = %q", got)
	}
}

func TestReportWrite(t *testing.T) {
	r := &Report{Started: time.Now(), Endpoints: 4, Changes: 20, ChangeGap: "1.5s", LatencySamples: 10}
	for _, n := range []int{1000, 10000} {
		r.Results = append(r.Results,
			Result{Proxier: proxNftgate, Services: n, ColdStartSeconds: 0.5, ChangeP50Ms: 20, RSSMiB: 50, CPUPerChangeMs: 10},
			Result{Proxier: proxKPNFTables, Services: n, ColdStartSeconds: 20, ChangeP50Ms: 3500, RSSMiB: 280, CPUPerChangeMs: 900},
			Result{Proxier: proxKPIPTables, Services: n, ColdStartSeconds: 10, ChangeP50Ms: 0, RSSMiB: 200})
	}
	r.LoadSeconds = []LoadTime{{Services: 1000, Seconds: 9}, {Services: 10000, Seconds: 117, APIServerCPUSeconds: 150, EtcdCPUSeconds: 20}}
	dir := t.TempDir()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| nftgate | 10,000 | 0.50 s | 20 ms |",
		"| kube-proxy-nftables | 1,000 | 20.0 s | 3500 ms |",
		"N=10,000, nftgate vs kube-proxy-nftables: cold start 40× faster, endpoint change p50 175× faster, RSS 5.6× smaller",
		"took 9 s (up to 1,000), 117 s (up to 10,000; kube-apiserver CPU 150 s, etcd 20 s).",
		"the run stopped before its last size.",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	png, err := os.ReadFile(filepath.Join(dir, "results.png"))
	if err != nil {
		t.Fatal(err)
	}
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Errorf("results.png is not a PNG image (%d bytes)", len(png))
	}
}

func TestReadProcStats(t *testing.T) {
	// Burn a little CPU so the process has used at least one tick.
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	s, err := readProcStats(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.RSSKiB <= 0 || s.HWMKiB < s.RSSKiB {
		t.Errorf("RSS %d KiB, peak %d KiB: want 0 < RSS <= peak", s.RSSKiB, s.HWMKiB)
	}
	if s.CPU <= 0 {
		t.Errorf("CPU time %v after a busy loop", s.CPU)
	}
	if _, err := readProcStats(-1); err == nil {
		t.Error("readProcStats(-1) did not fail")
	}
}

func TestKubeProxyConfig(t *testing.T) {
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(kubeProxyConfig("nftables", "/k/config")), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["mode"] != "nftables" || cfg["hostnameOverride"] != nodeName || cfg["clusterCIDR"] != clusterCIDR {
		t.Errorf("config: %v", cfg)
	}
	ct, _ := cfg["conntrack"].(map[string]any)
	// A network namespace cannot change nf_conntrack_max: zero leaves it.
	if ct["maxPerCore"] != float64(0) || ct["min"] != float64(0) {
		t.Errorf("conntrack: %v", ct)
	}
	cc, _ := cfg["clientConnection"].(map[string]any)
	if cc["kubeconfig"] != "/k/config" {
		t.Errorf("clientConnection: %v", cc)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sizes", "1000,x"}, `--sizes: "x"`},
		{[]string{"--sizes", "1"}, `--sizes: "1"`},
		{[]string{"--proxiers", "nftgate,ipvs"}, `--proxiers: "ipvs"`},
		{[]string{"--endpoints", "21"}, "--endpoints: 21"},
		{[]string{"--changes", "0"}, "--changes: 0"},
		{[]string{"--api-server-arg", "profiling=true"}, `"profiling=true"`},
		{[]string{"--nftgate-arg", "pprof"}, `"pprof"`},
	} {
		_, err := parseFlags(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

func TestReportSaysManifests(t *testing.T) {
	r := &Report{Started: time.Now(), Source: sourceManifests, ManifestsPerFile: 1000, Endpoints: 4, Changes: 20,
		ChangeGap: "1.5s", LatencySamples: 10, LoadSeconds: []LoadTime{{Services: 100000, Seconds: 12}},
		Results: []Result{{Proxier: proxNftgate, Services: 100000, ColdStartSeconds: 30, ChangeP50Ms: 90}}}
	md := r.Markdown()
	for _, want := range []string{"Source: **manifests**", "1,000 bulk Services", "Writing the manifest files took 12 s (up to 100,000)",
		"| nftgate | 100,000 | 30.0 s | 90 ms |"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "kube-apiserver;") || strings.Contains(md, "through the API") {
		t.Errorf("results.md of a manifests run speaks of the API:\n%s", md)
	}
}
