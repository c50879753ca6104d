package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/failover"
)

func TestParseFlagsFailover(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseFlags([]string{"--nftgate", bin, "--failover-only", "--failover-phases", "floor,anchor"})
	if err != nil {
		t.Fatal(err)
	}
	if f := cfg.Failover; !f.On || !f.Only || f.TCP != 1000 || f.UDP != 100 || !slices.Equal(f.Phases, []string{"floor", "anchor"}) {
		t.Errorf("--failover-only: %+v", f)
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--failover", "--failover-phases", "floor,keepalived"}, `--failover-phases: "keepalived"`},
		{[]string{"--failover", "--failover-tcp", "0"}, "--failover-tcp 0"},
		{[]string{"--failover", "--failover-udp", "20000"}, "at most 20,000"},
	} {
		_, err := parseFlags(append(bins, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// The table shows lost flows with their reasons, a dash for the stall
// when every flow was lost, and why a run was skipped.
func TestFailoverMarkdown(t *testing.T) {
	r := FailoverReport{TCP: 10, UDP: 2, Runs: []FailoverRun{
		{Name: "floor", Result: failover.Result{TCP: failover.Stats{Flows: 10, Lost: 10, Reasons: map[string]int{"timeout": 10}},
			UDP: failover.Stats{Flows: 2, StallP50Ms: 300, StallP99Ms: 400, StallMaxMs: 400}}},
		{Name: "nftgate", Skipped: "no state sync"},
	}}
	md := r.markdown()
	for _, want := range []string{"| floor | 10/10 (timeout 10) | – | 0/2 | 300 / 400 / 400 |", "| nftgate | skipped: no state sync |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
