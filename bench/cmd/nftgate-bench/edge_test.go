package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFlagsEdge(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin}
	cfg, err := parseFlags(append(bins, "--edge", "10000"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Edge != (EdgeConfig{Services: 10000, Samples: 200}) {
		t.Errorf("--edge 10000: %+v", cfg.Edge)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--edge", "-1"}, "--edge: -1"},
		{[]string{"--edge", "65400"}, "--edge: 65400: want 1 to 65336"},
		{[]string{"--edge", "10", "--edge-samples", "0"}, "--edge-samples: 0"},
		{[]string{"--edge", "10", "--source", "manifests"}, "--edge: needs --source api"},
	} {
		_, err := parseFlags(append(bins, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// The edge results render again from their JSON, percentiles from the
// samples, and the restart's lost routes show.
func TestEdgeResultRerender(t *testing.T) {
	dir := t.TempDir()
	r := &EdgeResult{Services: 3, Samples: 4, ToRouteMs: []float64{40, 10, 30, 20}, ToStatusMs: []float64{1, 2, 3, 4},
		Routes: 7, MinRoutes: 5, GRSeen: true, Timeline: []string{"0.001 s: 7 routes, graceful restart false"}}
	if err := r.write(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "edge.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rerenderEdge(filepath.Join(dir, "edge.json"), data); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "edge.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"p50 / p90 / max | 20.0 / 40.0 / 40.0 ms", "5 of 7", "- 0.001 s: 7 routes"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("edge.md lacks %q:\n%s", want, md)
		}
	}
}
