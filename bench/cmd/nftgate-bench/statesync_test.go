package main

import (
	"maps"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/statesync"
)

func TestParseFlagsStateSync(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseFlags([]string{"--nftgate", bin, "--statesync-load-only", "--statesync-rates", "1000, 0"})
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.StateSync; !c.On || !c.Only || !slices.Equal(c.Rates, []int{1000, 0}) || c.Duration != 10*time.Second ||
		!slices.Equal(c.Runs, allStateSyncRuns) || !slices.Equal(c.Modes, allStateSyncModes) || c.OverflowQueue != 1024 {
		t.Errorf("--statesync-load-only: %+v", c)
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--statesync-load", "--statesync-rates", "1000,fast"}, `--statesync-rates: "fast"`},
		{[]string{"--statesync-load", "--statesync-runs", "sync,conntrackd"}, `--statesync-runs: "conntrackd"`},
		{[]string{"--statesync-load", "--statesync-modes", "tcp,udp"}, `--statesync-modes: "udp"`},
		{[]string{"--statesync-load", "--statesync-overflow-queue", "100"}, "--statesync-overflow-queue: 100"},
		{[]string{"--statesync-load", "--statesync-overflow-stop", "10s"}, "--statesync-overflow-stop: 10s"},
		{[]string{"--statesync-load", "--statesync-dead-after", "1"}, "--statesync-dead-after: 1"},
		{[]string{"--statesync-load", "--statesync-table-ready-timeout", "500ms"}, "--statesync-table-ready-timeout: 500ms"},
	} {
		_, err := parseFlags(append(bins, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// The lag metric's quantiles are the upper bound of the bucket that holds
// them, over the run's part of the histogram; past the last bound, -1.
func TestLagBucketsQuantile(t *testing.T) {
	bucket := func(le float64, n uint64) struct {
		le    float64
		count uint64
	} {
		return struct {
			le    float64
			count uint64
		}{le, n}
	}
	before := lagBuckets{bucket(0.01, 5), bucket(0.1, 5), bucket(1, 5), bucket(math.Inf(1), 5)}
	after := lagBuckets{bucket(0.01, 55), bucket(0.1, 104), bucket(1, 105), bucket(math.Inf(1), 106)}
	d := after.sub(before)
	if d.count() != 101 {
		t.Fatalf("count %d, want 101", d.count())
	}
	for _, c := range []struct{ q, want float64 }{{0.4, 0.01}, {0.5, 0.1}, {0.98, 0.1}, {0.99, 1}, {1, -1}} {
		if got := d.quantile(c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := (lagBuckets{}).quantile(0.5); got != 0 {
		t.Errorf("no batches: %v, want 0", got)
	}
}

// The netlink generator's entries have distinct original and reply
// tuples for as many as its highest rate makes in their 10 s.
func TestCtgenEntriesDistinct(t *testing.T) {
	svc := netip.MustParseAddrPort("198.18.20.100:80")
	srcs := []netip.Addr{netip.MustParseAddr("198.18.20.2"), netip.MustParseAddr("198.18.20.3")}
	eps := []netip.AddrPort{netip.MustParseAddrPort("198.18.21.50:8080"), netip.MustParseAddrPort("198.18.21.51:8080")}
	masq := netip.MustParseAddr("198.18.21.100")
	orig, reply := map[statesync.Tuple]bool{}, map[statesync.Tuple]bool{}
	for n := range 12000 * ctgenTimeout {
		e := ctgenEntry(n, svc, srcs, eps, masq)
		if orig[e.Orig] || reply[e.Reply] {
			t.Fatalf("entry %d: %+v repeats a tuple", n, e)
		}
		orig[e.Orig], reply[e.Reply] = true, true
		if e.Orig.Dst != svc || e.Reply.Dst.Addr() != masq {
			t.Fatalf("entry %d: %+v", n, e)
		}
	}
}

// The table run reads A's refresh counters from its metrics page, and
// knows an nftgate without them.
func TestParseRefreshMetrics(t *testing.T) {
	page := `# HELP nftgate_statesync_refresh_passes_total Refresh passes.
# TYPE nftgate_statesync_refresh_passes_total counter
nftgate_statesync_refresh_passes_total{read="due"} 11
nftgate_statesync_refresh_passes_total{read="table"} 1
nftgate_statesync_refresh_entries_read_total{read="due"} 0
nftgate_statesync_refresh_entries_read_total{read="table"} 100000
nftgate_statesync_refreshes_total 3
`
	m, err := parseRefreshMetrics(page)
	want := map[string]float64{"passes/due": 11, "passes/table": 1, "read/due": 0, "read/table": 100000}
	if err != nil || !maps.Equal(m, want) {
		t.Errorf("parseRefreshMetrics: %v, %v; want %v", m, err, want)
	}
	if m, err := parseRefreshMetrics("nftgate_statesync_refreshes_total 3\n"); m != nil || err != nil {
		t.Errorf("a page without the counters: %v, %v; want nil, nil", m, err)
	}
	if _, err := parseRefreshMetrics(`nftgate_statesync_refresh_passes_total{read="due"} x` + "\n"); err == nil {
		t.Error("a counter that is not a number: no error")
	}
}
