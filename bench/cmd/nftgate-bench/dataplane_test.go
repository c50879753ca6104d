package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

func TestSummarizeExchanges(t *testing.T) {
	// 100 exchanges of 1..100 ms, two of them at or over 1 s, and 3 that
	// failed: stalled = 2 + 3.
	var us []float64
	for i := 1; i <= 98; i++ {
		us = append(us, float64(i)*1000)
	}
	us = append(us, 999_999, 1_000_000, 2_500_000)
	s := summarizeExchanges(us, 3, 90, 10*time.Second, "x")
	if s.Stalled != 5 || s.Failed != 3 || s.Exchanges != 104 || s.Completed != 90 || s.PerSecond != 9 {
		t.Errorf("stalled %d failed %d exchanges %d completed %d rate %v; want 5, 3, 104, 90, 9/s",
			s.Stalled, s.Failed, s.Exchanges, s.Completed, s.PerSecond)
	}
	if s.P50us != 51_000 || s.P99us != 1_000_000 || s.MaxUs != 2_500_000 {
		t.Errorf("p50 %v p99 %v max %v; want 51000, 1000000, 2500000", s.P50us, s.P99us, s.MaxUs)
	}
	if z := summarizeExchanges(nil, 0, 0, 0, ""); z.PerSecond != 0 || z.Stalled != 0 || z.P99us != 0 {
		t.Errorf("nothing measured: %+v", z)
	}
}

// TestConnClientsLoopback runs the connection test's client against the
// backend's line server on loopback: every exchange completes, and a
// server that closes without its line makes every attempt fail, counted
// as stalled.
func TestConnClientsLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serveLine(ln)
	dst := netip.MustParseAddrPort(ln.Addr().String())
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	s := runConnClients(context.Background(), dst, lo, 4, 300*time.Millisecond)
	if s.Completed == 0 || s.Failed != 0 || s.Stalled != 0 || s.PerSecond <= 0 || s.P99us <= 0 {
		t.Errorf("against the line server: %+v; want exchanges, none failed or stalled", s)
	}

	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	s = runConnClients(context.Background(), netip.MustParseAddrPort(mute.Addr().String()), lo, 2, 100*time.Millisecond)
	if s.Failed == 0 || s.Stalled != s.Failed || s.Completed != 0 || !strings.Contains(s.LastError, "server's line") {
		t.Errorf("against a server that writes nothing: %+v; want every attempt failed and stalled", s)
	}
}

func TestPairConnsAndMarkdown(t *testing.T) {
	runs := []ConnRun{
		{Path: pathVia, Parallel: 8, Sources: 1, ConnStats: ConnStats{PerSecond: 966, Stalled: 104, P99us: 1_020_000, Exchanges: 20_000}, BackendTimeWait: 24000,
			Backend: map[string]int64{"PAWSTimewait": 1500, "ListenDrops": 0}, Client: map[string]int64{"TCPSynRetrans": 110},
			Gateway: map[string]int64{"insert_failed": 3, "invalid": 900}, CPUSeconds: 1.73},
		{Path: pathDirect, Parallel: 8, Sources: 1, ConnStats: ConnStats{PerSecond: 10496, P99us: 900, Exchanges: 200_000},
			Backend: map[string]int64{"PAWSTimewait": 0, "ListenDrops": 2}, Client: map[string]int64{"TCPSynRetrans": 2},
			Gateway: map[string]int64{"insert_failed": 0}, CPUSeconds: 16.48},
		{Path: pathVia, Parallel: 64, Sources: 16, ConnStats: ConnStats{PerSecond: 9000}},
		{Path: pathDirect, Parallel: 64, Sources: 16, ConnStats: ConnStats{PerSecond: 10000}},
		{Path: pathVia, Parallel: 64, Sources: 1}, // no direct run: left out
	}
	pairs := pairConns(runs)
	if len(pairs) != 2 || pairs[0].Direct.PerSecond != 10496 || pairs[1].Via.PerSecond != 9000 || pairs[1].Direct.PerSecond != 10000 {
		t.Fatalf("pairs = %+v", pairs)
	}
	r := &Report{Started: time.Now(), Dataplane: &DataplaneSettings{Seconds: 15, NftgateConfigExtra: "[masquerade]\npool = []\n"},
		Results: []Result{{Proxier: proxNftgate, Services: 10000, Dataplane: &DataplaneResult{Connections: runs, Shards: 16, ShardsPassedVia: 13,
			Bulk: []BulkRun{
				{Path: pathVia, Gbps: 9, Seconds: 10, Retransmits: 3, CPU: CPU{SoftirqSeconds: 5}},
				{Path: pathDirect, Gbps: 10, Seconds: 10, CPU: CPU{SoftirqSeconds: 4}},
			}}}}}
	md := r.Markdown()
	for _, want := range []string{
		"## Data plane", "Each run lasts 15 s",
		"| nftgate | 10,000 | 8 | 1 | 966 | 10,496 | **0.09** | 104 | 0 | 1020 ms | 900 µs | 24,000 | 110 / 2 | 1,500 / 0 | 0 / 2 | 3 / 0 | 86.5 / 82.4 µs |\n",
		"| nftgate | 10,000 | 64 | 16 | 9,000 | 10,000 | **0.90** | 0 | 0 | 0 µs | 0 µs | 0 | – / – | – / – | – / – | – / – | – / – µs |\n",
		"| conntrack insertion clashes | CPU a connection via / direct |\n", "share the machine's CPUs",
		"| nftgate | 10,000 | 9.00 | 10.00 | **0.90** | 0.50 | 0.40 | 0.48 | 0.34 | 3 / 0 |\n",
		"```toml\n[masquerade]\npool = []\n```",
		"- nftgate at 10,000 Services: 16 shards; a new connection via the Service passes 13 of their NAT chains, one direct all 16.\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	r.Results = append(r.Results, Result{Proxier: proxNftgate, Services: 100, Dataplane: &DataplaneResult{Shards: 1, ShardsPassedVia: 1}})
	if md := r.Markdown(); !strings.Contains(md, "- nftgate at 100 Services: one shard; every new connection passes its NAT chain.\n") {
		t.Errorf("results.md does not say one shard as one:\n%s", md)
	}
	if strings.Count(md, "| nftgate | 10,000 | 64 |") != 1 {
		t.Errorf("a via run without its direct run made a row:\n%s", md)
	}
	if md := (&Report{Started: time.Now(), Results: []Result{{Proxier: proxNftgate}}}).Markdown(); strings.Contains(md, "Data plane") {
		t.Errorf("a run without the data-plane phase has its section:\n%s", md)
	}
	noDP := &Report{Started: time.Now(), Results: []Result{{Proxier: proxNftgate}}, Dataplane: &DataplaneSettings{NftgateConfigExtra: "a = 1"}}
	if md := noDP.Markdown(); strings.Contains(md, "Data plane") || !strings.Contains(md, "```toml\na = 1\n```") {
		t.Errorf("a run without the data-plane phase but with --nftgate-config-extra:\n%s", md)
	}
	// With the gateway on a CPU of its own, the column is that CPU's time.
	gw := 1
	for i := range runs {
		runs[i].GatewayCPU = &gw
	}
	runs[0].GatewayCPUSeconds, runs[1].GatewayCPUSeconds = 1.3, 9.5
	runs[0].ProxierCPUSeconds = 0.2 // the proxier's own work is not counted
	r.Dataplane.OwnCPU = true
	md = r.Markdown()
	// The bulk runs from before the gateway's CPU was recorded: dashes.
	for _, want := range []string{"| retransmits via / direct | gateway CPU busy via / direct |\n", "| 3 / 0 | – / – |\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md with --dataplane-own-cpu, bulk without its gateway CPU, lacks %q:\n%s", want, md)
		}
	}
	bulk := r.Results[0].Dataplane.Bulk
	bulk[0].GatewayCPU, bulk[0].GatewayCPUSeconds, bulk[0].ProxierCPUSeconds = &gw, 9.1, 0.1 // over 10 s
	bulk[1].GatewayCPU, bulk[1].GatewayCPUSeconds = &gw, 5.5
	md = r.Markdown()
	for _, want := range []string{"**The gateway on a CPU of its own**", "| gateway CPU a connection via / direct |\n",
		"| 0 / 2 | 3 / 0 | 55.0 / 47.5 µs |\n", "*Gateway CPU busy*", "| 3 / 0 | 0.90 / 0.55 |\n"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md with --dataplane-own-cpu lacks %q:\n%s", want, md)
		}
	}
	r.Dataplane.Only = true
	if md := r.Markdown(); strings.Contains(md, "| Proxier | N | cold start") || !strings.Contains(md, "`--dataplane-only`") {
		t.Errorf("--dataplane-only: results.md has the sync table or does not say why not:\n%s", md)
	}
}

// Shard 0 is created first and so passed last: a Service in it has a new
// connection pass every shard's NAT chain, one in the last shard only its own.
func TestShardsPassed(t *testing.T) {
	key := model.NewServiceKey(namespace, dpConnName)
	for _, n := range []int{1, 16, 64} {
		i := ruleset.Config{Shards: n}.ShardOf(key)
		if got := shardsPassed(n, key); got != n-i || got < 1 || got > n {
			t.Errorf("shardsPassed(%d) = %d, the Service in shard %d", n, got, i)
		}
	}
	if got := shardsPassed(0, key); got != 0 {
		t.Errorf("shardsPassed(0) = %d: no shards logged, none passed", got)
	}
}

func TestParseNetstat(t *testing.T) {
	data := "TcpExt: SyncookiesSent TW PAWSTimewait TCPSynRetrans\nTcpExt: 0 12 7 3\n" +
		"IpExt: InNoRoutes InTruncatedPkts\nIpExt: 0 0\n"
	m, err := parseNetstat(data, "TcpExt")
	if err != nil || m["TW"] != 12 || m["PAWSTimewait"] != 7 || m["TCPSynRetrans"] != 3 || len(m) != 4 {
		t.Fatalf("parseNetstat = %v, %v", m, err)
	}
	d := counterDelta(netstatCounters, map[string]int64{"PAWSTimewait": 2}, m)
	if d["PAWSTimewait"] != 5 || d["TCPSynRetrans"] != 3 {
		t.Errorf("delta %v", d)
	}
	if _, ok := d["ListenDrops"]; ok {
		t.Errorf("delta has a counter the kernel does not: %v", d)
	}
	for in, want := range map[string]string{
		"IpExt: A\nIpExt: 1\n":       "no TcpExt group",
		"TcpExt: A B\nTcpExt: 1\n":   "3 names, 2 values",
		"TcpExt: A B\nTcpExt: 1 x\n": `TcpExt B: "x"`,
	} {
		if _, err := parseNetstat(in, "TcpExt"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseNetstat(%q) = %v, want an error naming %s", in, err, want)
		}
	}
}

// The per-CPU rows of /proc/net/stat/nf_conntrack are hexadecimal and
// summed by name.
func TestParseConntrackStat(t *testing.T) {
	data := "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n" +
		"0000002a  00000001 00000000 00000000 00000010 00000000 00000000 00000000 00000000 00000002 00000000 00000000 00000000  00000000 00000000 00000000 00000000\n" +
		"0000002a  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 0000000f 00000000 00000000 00000000  00000000 00000000 00000000 00000003\n"
	m, err := parseConntrackStat(data)
	if err != nil || m["insert_failed"] != 17 || m["invalid"] != 17 || m["clashres"] != 1 || m["search_restart"] != 3 || m["entries"] != 84 {
		t.Fatalf("parseConntrackStat = %v, %v", m, err)
	}
	d := counterDelta(conntrackCounters, map[string]int64{"insert_failed": 7}, m)
	if d["insert_failed"] != 10 || d["drop"] != 0 {
		t.Errorf("delta %v", d)
	}
	for in, want := range map[string]string{
		"cpu insert\n1 2\n":           "want the counters' names",
		"entries drop\n00000001\n":    "2 names, 1 values",
		"entries drop\n00000001 zz\n": `drop: "zz"`,
	} {
		if _, err := parseConntrackStat(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseConntrackStat(%q) = %v, want an error naming %s", in, err, want)
		}
	}
}

func TestParseIperf(t *testing.T) {
	gbps, retr, err := parseIperf([]byte(`{"start":{},"end":{"sum_sent":{"retransmits":7,"bits_per_second":9.5e9},` +
		`"sum_received":{"bits_per_second":9.4e9}}}`))
	if err != nil || gbps != 9.4 || retr != 7 {
		t.Errorf("parseIperf = %v, %v, %v; want 9.4, 7", gbps, retr, err)
	}
	for in, want := range map[string]string{
		`{"start":{},"end":{},"error":"unable to connect to server: Connection refused"}`: "Connection refused",
		`{"end":{}}`:    "no received rate",
		`iperf3: error`: "iperf3 output",
	} {
		if _, _, err := parseIperf([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseIperf(%s) = %v, want an error naming %q", in, err, want)
		}
	}
}

func TestParseProcStatCPU(t *testing.T) {
	c, err := parseProcStatCPU("cpu  831197 13127 277893 1144762 33783 0 18974 879 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.UserSeconds != 8443.24 || c.SystemSeconds != 2778.93 || c.SoftirqSeconds != 189.74 {
		t.Errorf("parsed %+v", c)
	}
	if d := c.sub(CPU{UserSeconds: 1, SystemSeconds: 2, SoftirqSeconds: 0.74}); d.SoftirqSeconds != 189 {
		t.Errorf("sub: %+v", d)
	}
	for _, bad := range []string{"cpu0 1 2 3 4 5 6 7", "cpu 1 2 3", "cpu 1 2 3 4 5 6 x"} {
		if _, err := parseProcStatCPU(bad); err == nil || !strings.Contains(err.Error(), "/proc/stat") {
			t.Errorf("parseProcStatCPU(%q) = %v, want an error naming /proc/stat", bad, err)
		}
	}
	live, err := readCPU()
	if err != nil || live.UserSeconds <= 0 {
		t.Errorf("readCPU() = %+v, %v", live, err)
	}
}

func TestParseFlagsDataplane(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	extra := filepath.Join(dir, "extra.toml")
	for _, f := range []string{bin, extra} {
		if err := os.WriteFile(f, []byte("# x\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bins := []string{"--nftgate", bin, "--kube-proxy", bin}
	cfg, err := parseFlags(bins)
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Dataplane
	if d.Duration != 10*time.Second || !slices.Equal(d.Parallel, []int{8, 64}) || d.Sources != 16 || d.Only || d.OwnCPU || d.Rounds != 1 ||
		d.settings().Rounds != 0 || d.ServersRunning ||
		!slices.Equal(d.Proxiers, []string{proxNftgate, proxKPNFTables}) {
		t.Errorf("defaults: %+v", d)
	}
	cfg, err = parseFlags(append(bins, "--dataplane-only", "--dataplane-duration", "60s", "--nftgate-config-extra", extra, "--dataplane-own-cpu",
		"--dataplane-rounds", "3"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Dataplane.Only || cfg.Changes != 0 || cfg.LatencyN != 0 || cfg.Dataplane.settings().NftgateConfigExtra != "# x\n" ||
		!cfg.Dataplane.settings().OwnCPU || cfg.Dataplane.settings().Rounds != 3 || !cfg.Dataplane.settings().ServersPaused {
		t.Errorf("--dataplane-only: %+v, changes %d, latency samples %d", cfg.Dataplane, cfg.Changes, cfg.LatencyN)
	}
	if !slices.Equal(cfg.Proxiers, []string{proxNftgate, proxKPNFTables}) {
		t.Errorf("--dataplane-only runs %q, want only the proxiers whose data plane is measured", cfg.Proxiers)
	}
	cfg, err = parseFlags(append(bins, "--dataplane-only", "--proxiers", proxNftgate+","+proxKPIPTables))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Proxiers, []string{proxNftgate, proxKPIPTables}) {
		t.Errorf("--dataplane-only with --proxiers runs %q, want what --proxiers names", cfg.Proxiers)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dataplane-duration", "-1s"}, "--dataplane-duration: -1s"},
		{[]string{"--dataplane-duration", "1500ms"}, "--dataplane-duration: 1.5s"},
		{[]string{"--dataplane-proxiers", "ipvs"}, `--dataplane-proxiers: "ipvs"`},
		{[]string{"--dataplane-parallel", "8,0"}, `--dataplane-parallel: "0"`},
		{[]string{"--dataplane-sources", "65"}, "--dataplane-sources: 65"},
		{[]string{"--dataplane-rounds", "0"}, "--dataplane-rounds: 0: want 1 to 20"},
		{[]string{"--dataplane-rounds", "21"}, "--dataplane-rounds: 21"},
		{[]string{"--dataplane-only", "--dataplane-duration", "0"}, "nothing to measure"},
		{[]string{"--nftgate-config-extra", filepath.Join(dir, "missing.toml")}, "missing.toml"},
	} {
		_, err := parseFlags(append(bins, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

func TestNftgateConfigExtra(t *testing.T) {
	dir := t.TempDir()
	extra := filepath.Join(dir, "extra.toml")
	if err := os.WriteFile(extra, []byte("flowtable = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &Env{Cfg: &Config{}}
	if args, err := e.nftgateConfigArgs(dir, []string{"--node-name", "gateway"}); err != nil || !slices.Equal(args, []string{"--node-name", "gateway"}) {
		t.Errorf("without --nftgate-config-extra: %q, %v", args, err)
	}
	e.Cfg.Dataplane.NftgateConfigExtra = extra
	args, err := e.nftgateConfigArgs(dir, []string{"--node-name", "gateway"})
	if err != nil || len(args) != 4 || args[0] != "--config" || args[2] != "--node-name" {
		t.Fatalf("args %q, %v", args, err)
	}
	b, err := os.ReadFile(args[1])
	if err != nil || !strings.HasSuffix(string(b), "\nflowtable = true\n\n") || !strings.HasPrefix(string(b), "#") {
		t.Errorf("config %q, %v", b, err)
	}
}

func TestParseProcStatBusy(t *testing.T) {
	data := "cpu  100 5 50 9000 7 3 40 2 0 0\ncpu0 60 5 30 4500 4 2 20 1 0 0\ncpu1 40 0 20 4500 3 1 20 1 0 0\nintr 1 2 3\nctxt 99\n"
	got, err := parseProcStatBusy(data)
	if err != nil {
		t.Fatal(err)
	}
	// user + nice + system + irq + softirq, ticks of 1/100 s; not idle,
	// iowait or steal.
	want := map[string]float64{"cpu": 1.98, "cpu0": 1.17, "cpu1": 0.81}
	for k, v := range want {
		if math.Abs(got[k]-v) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != 3 {
		t.Errorf("got %v, want only the cpu lines", got)
	}
	for _, bad := range []string{"intr 1\n", "cpu 1 2 3\n", "cpu 1 2 3 4 5 x 7 8\n"} {
		if _, err := parseProcStatBusy(bad); err == nil {
			t.Errorf("parseProcStatBusy(%q): no error", bad)
		}
	}
}

func TestSplitCPUsAndRPSMask(t *testing.T) {
	s, err := splitCPUs([]int{0, 1})
	if err != nil || s.Gateway != 1 || !slices.Equal(s.Others, []int{0}) {
		t.Errorf("splitCPUs(0 1) = %+v, %v", s, err)
	}
	s, err = splitCPUs([]int{2, 7, 3})
	if err != nil || s.Gateway != 7 || !slices.Equal(s.Others, []int{2, 3}) {
		t.Errorf("splitCPUs(2 7 3) = %+v, %v", s, err)
	}
	if _, err := splitCPUs([]int{0}); err == nil || !strings.Contains(err.Error(), "--dataplane-own-cpu") {
		t.Errorf("one CPU: %v, want an error naming the flag", err)
	}
	for _, c := range []struct {
		cpus []int
		want string
	}{
		{[]int{1}, "00000002"},
		{[]int{0}, "00000001"},
		{[]int{0, 2, 3}, "0000000d"},
		{[]int{33}, "00000002,00000000"},
		{[]int{0, 32, 63}, "80000001,00000001"},
	} {
		if got := rpsMask(c.cpus); got != c.want {
			t.Errorf("rpsMask(%v) = %q, want %q", c.cpus, got, c.want)
		}
	}
}

func TestCPUWatchRecord(t *testing.T) {
	before := cpuReading{busy: map[string]float64{"cpu": 10, "cpu0": 6, "cpu1": 4}, proxier: time.Second}
	after := cpuReading{busy: map[string]float64{"cpu": 130, "cpu0": 66, "cpu1": 64}, proxier: 3 * time.Second}
	var shared ConnRun
	cpuWatch{}.record(&shared, before, after)
	if shared.CPUSeconds != 120 || shared.ProxierCPUSeconds != 2 || shared.GatewayCPUSeconds != 0 {
		t.Errorf("shared CPUs: %+v", shared)
	}
	gw := 1
	run := ConnRun{GatewayCPU: &gw, ConnStats: ConnStats{Exchanges: 1_000_000}}
	cpuWatch{GatewayCPU: &gw}.record(&run, before, after)
	if run.CPUSeconds != 120 || run.GatewayCPUSeconds != 60 || run.ProxierCPUSeconds != 2 {
		t.Errorf("own CPU: %+v", run)
	}
	// The gateway CPU's 60 s less the proxier's 2, over a million.
	if got := run.CPUPerConnection(); math.Abs(got-58) > 1e-9 {
		t.Errorf("CPUPerConnection = %v µs, want 58", got)
	}
}

func TestBelow(t *testing.T) {
	children := map[int][]int{1: {10, 11}, 10: {100}, 100: {1000}, 2: {20}}
	got := below(children, 1)
	slices.Sort(got)
	if !slices.Equal(got, []int{10, 11, 100, 1000}) {
		t.Errorf("below(1) = %v", got)
	}
	if got := below(children, 5); len(got) != 0 {
		t.Errorf("below(5) = %v, want none", got)
	}
	live, err := processChildren()
	if err != nil || !slices.Contains(below(live, 1), os.Getpid()) {
		t.Errorf("this test's process is not below pid 1 in /proc: %v", err)
	}
}

func TestRoundsTakeTurnsAndMerge(t *testing.T) {
	if got := [][]string{roundPaths(1), roundPaths(2), roundPaths(3)}; !slices.Equal(got[0], []string{pathVia, pathDirect}) ||
		!slices.Equal(got[1], []string{pathDirect, pathVia}) || !slices.Equal(got[2], got[0]) {
		t.Errorf("paths of rounds 1, 2, 3: %v; want via first in odd rounds, direct first in even ones", got)
	}
	conn := func(path string, round int, perSecond float64, stalled int, p99 float64, tw int, retrans int64, gwCPU float64) ConnRun {
		return ConnRun{Path: path, Round: round, Parallel: 8, Sources: 1,
			ConnStats:       ConnStats{PerSecond: perSecond, Exchanges: int(perSecond * 10), Stalled: stalled, P50us: perSecond / 100, P99us: p99},
			BackendTimeWait: tw, Client: map[string]int64{"TCPSynRetrans": retrans}, GatewayCPUSeconds: gwCPU}
	}
	// Taking turns, as measureDataplane runs them: direct first in round 2.
	runs := []ConnRun{
		conn(pathVia, 1, 900, 0, 9000, 0, 0, 2.0), conn(pathDirect, 1, 1000, 0, 8000, 0, 0, 2.0),
		conn(pathDirect, 2, 2000, 1, 7000, 5, 2, 4.0), conn(pathVia, 2, 2000, 2, 12000, 7, 3, 4.0),
		conn(pathVia, 3, 1300, 0, 8000, 1, 0, 3.0), conn(pathDirect, 3, 1000, 0, 6000, 0, 0, 2.0),
	}
	pairs := pairConns(runs)
	if len(pairs) != 1 {
		t.Fatalf("pairs = %+v; want one for the one setting", pairs)
	}
	p := pairs[0]
	if !slices.Equal(p.Rounds, []float64{0.9, 1, 1.3}) {
		t.Errorf("each round's ratio: %v; want 0.9, 1, 1.3 (via over the same round's direct)", p.Rounds)
	}
	if p.Via.PerSecond != 1400 || p.Direct.PerSecond != 4000.0/3 || p.Via.Exchanges != 42000 || p.Via.Stalled != 2 || p.Direct.Stalled != 1 ||
		p.Via.P99us != 12000 || p.Via.P50us != 13 || p.Via.BackendTimeWait != 7 || p.Via.Client["TCPSynRetrans"] != 3 ||
		p.Via.GatewayCPUSeconds != 9 || p.Via.Round != 0 {
		t.Errorf("merged via %+v, direct %+v; want mean rates, sums of counts and CPU, worst p99 and TIME_WAIT, median p50", p.Via, p.Direct)
	}
	if runs[0].Client["TCPSynRetrans"] != 0 {
		t.Errorf("merging wrote into the first run's counters: %v", runs[0].Client)
	}
	bulk := []BulkRun{
		{Path: pathVia, Round: 1, Gbps: 3, Seconds: 10, Retransmits: 1, CPU: CPU{SoftirqSeconds: 6}},
		{Path: pathDirect, Round: 1, Gbps: 4, Seconds: 10, CPU: CPU{SoftirqSeconds: 7}},
		{Path: pathDirect, Round: 2, Gbps: 4, Seconds: 10, CPU: CPU{SoftirqSeconds: 7}},
		{Path: pathVia, Round: 2, Gbps: 5, Seconds: 10, Retransmits: 2, CPU: CPU{SoftirqSeconds: 8}},
	}
	via, direct, rs, ok := bulkPair(bulk)
	if !ok || via.Gbps != 4 || direct.Gbps != 4 || via.Retransmits != 3 || via.Seconds != 20 || via.SoftirqCores() != 0.7 ||
		!slices.Equal(rs, []float64{0.75, 1.25}) {
		t.Errorf("bulk: via %+v, direct %+v, rounds %v, ok %v", via, direct, rs, ok)
	}
	r := &Report{Started: time.Now(), Dataplane: &DataplaneSettings{Seconds: 10, Rounds: 3},
		Results: []Result{{Proxier: proxNftgate, Services: 100, Dataplane: &DataplaneResult{Connections: runs, Bulk: bulk}}}}
	md := r.Markdown()
	for _, want := range []string{
		"**3 rounds** (`--dataplane-rounds`)",
		"| via/direct | each round | stalled via |",
		"| nftgate | 100 | 8 | 1 | 1,400 | 1,333 | **1.05** | 0.90, 1.00, 1.30 | 2 | 1 | 12 ms | 8000 µs | 7 | 3 / 2 |",
		"| via/direct | each round | softirq via (cores) |",
		"| nftgate | 100 | 4.00 | 4.00 | **1.00** | 0.75, 1.25 | 0.70 | 0.70 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md with rounds lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "were paused") {
		t.Errorf("results.md says the servers were paused, which the settings do not:\n%s", md)
	}
	r.Dataplane.ServersPaused = true
	if md := r.Markdown(); !strings.Contains(md, "kube-apiserver and etcd were paused (SIGSTOP) during each run") {
		t.Errorf("results.md does not say the servers were paused:\n%s", md)
	}
	r.Source = sourceManifests
	if md := r.Markdown(); strings.Contains(md, "were paused") {
		t.Errorf("results.md of --source manifests says servers were paused:\n%s", md)
	}
	r.Source = ""
	// One round: no column, the runs as they are.
	r.Dataplane.Rounds = 0
	r.Results[0].Dataplane = &DataplaneResult{Connections: runs[:2], Bulk: bulk[:2]}
	md = r.Markdown()
	if strings.Contains(md, "each round") || !strings.Contains(md, "| nftgate | 100 | 8 | 1 | 900 | 1,000 | **0.90** | 0 | 0 |") {
		t.Errorf("results.md of one round:\n%s", md)
	}
}

func TestPauseProcesses(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	state := func() string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return f[0]
	}
	waitState := func(want func(string) bool, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for s := state(); !want(s); s = state() {
			if time.Now().After(deadline) {
				t.Fatalf("sleep's state %q, want %s", s, what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	resume, err := pauseProcesses(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitState(func(s string) bool { return s == "T" }, "stopped")
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	waitState(func(s string) bool { return s != "T" }, "running again")
	// One that cannot be signalled: an error, and the other is continued.
	if _, err := pauseProcesses(cmd.Process.Pid, 1<<22+1); err == nil {
		t.Error("pausing a process that does not exist: no error")
	}
	waitState(func(s string) bool { return s != "T" }, "continued after the other failed")
}
