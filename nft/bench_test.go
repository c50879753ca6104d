package nft

// Benchmarks of the ruleset at cluster scale, against the product's goals on
// a 2-core gateway: 10,000 Services x 4 endpoints programmed from cold in
// under a second, one endpoint change in under 5 ms at that size, and still
// fast at 100,000 Services. The pure ones need no kernel; the Kernel ones
// program real tables in a network namespace of their own (root only) and
// check them with nft afterwards. 100,000 Services run only with -bench-100k
// or NFTGATE_BENCH_100K=1: a cold sync at that size takes long.
//
//	go test -run '^$' -bench . -benchtime 3x ./nft/
//	NFTGATE_BENCH_100K=1 go test -run '^$' -bench Kernel -benchtime 3x -timeout 60m ./nft/

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

var bench100k = flag.Bool("bench-100k", false, "also run benchmarks at 100,000 Services (slow)")

const scaleEndpoints = 4

func benchSizes(sizes ...int) []int {
	big := *bench100k || os.Getenv("NFTGATE_BENCH_100K") != ""
	var out []int
	for _, n := range sizes {
		if n < 100_000 || big {
			out = append(out, n)
		}
	}
	return out
}

// clusters caches synthetic clusters across benchmarks: building 100,000
// Services is not what any benchmark measures.
var (
	clustersMu sync.Mutex
	clusters   = map[clusterKey]*scaleCluster{}
)

// clusterKey names a synthetic cluster: n Services of the mixed shape, or
// of the plain one.
type clusterKey struct {
	plain bool
	n     int
}

func cachedCluster(k clusterKey) *scaleCluster {
	clustersMu.Lock()
	defer clustersMu.Unlock()
	if c, ok := clusters[k]; ok {
		return c
	}
	build := newScaleCluster
	if k.plain {
		build = newPlainCluster
	}
	c := build(k.n, scaleEndpoints)
	clusters[k] = c
	return c
}

func clusterOf(n int) *scaleCluster { return cachedCluster(clusterKey{n: n}) }

func plainClusterOf(n int) *scaleCluster { return cachedCluster(clusterKey{plain: true, n: n}) }

func sizeName(n int) string { return "services=" + strconv.Itoa(n) }

// BenchmarkRenderAll renders every Service of the cluster.
func BenchmarkRenderAll(b *testing.B) {
	cfg := scaleConfig()
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			b.ReportAllocs()
			b.ResetTimer()
			chains := 0
			for range b.N {
				chains = 0
				for _, k := range c.Keys {
					r := ruleset.RenderService(&cfg, c.Services[k])
					chains += len(r[0].Chains) + len(r[1].Chains)
				}
			}
			b.ReportMetric(float64(chains), "chains")
		})
	}
}

// BenchmarkPlanCold is the user-space part of a cold sync: render, diff
// against empty tables and encode the netlink batch.
func BenchmarkPlanCold(b *testing.B) {
	cfg := scaleConfig()
	for _, n := range append(benchSizes(10_000, 100_000), -10_000) {
		name, c := sizeName(n), (*scaleCluster)(nil)
		if n < 0 {
			name = "plain-" + sizeName(-n)
		}
		b.Run(name, func(b *testing.B) {
			if n < 0 {
				c = plainClusterOf(-n)
			} else {
				c = clusterOf(n)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var msgs, size int
			cpu := cpuTime()
			for range b.N {
				_, m := planCold(b, &cfg, c.Services)
				msgs, size = m.count(), m.size()
				m.release()
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(msgs), "msgs/op")
			b.ReportMetric(float64(size)/(1<<20), "batch-MiB/op")
		})
	}
}

// BenchmarkPlanEndpointChange is the user-space part of one endpoint change
// at scale: render the Service before and after, diff against the full
// table state, encode.
func BenchmarkPlanEndpointChange(b *testing.B) {
	cfg := scaleConfig()
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			ds, _ := planCold(b, &cfg, c.Services)
			ts := ruleset.NewTables(&cfg)
			state := make([]*ruleset.TableState, len(ds))
			for i := range ds {
				state[i] = ruleset.NewTableState()
				state[i].Apply(ds[i])
			}
			current := map[model.ServiceKey]*model.Service{}
			b.ReportAllocs()
			b.ResetTimer()
			msgs := 0
			for i := range b.N {
				k := c.Keys[(i*7919)%len(c.Keys)]
				old := current[k]
				if old == nil {
					old = c.Services[k]
				}
				svc := withReplacedEndpoint(old, i, addrPlus(scaleReplaceBase, uint32(i)))
				ds, m := planChange(b, &cfg, ts, state, old, svc)
				for f := range ds {
					state[f].Apply(ds[f])
				}
				current[k] = svc
				msgs += m.count()
			}
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
		})
	}
}

// BenchmarkKernelColdFull programs the whole cluster into empty tables with
// a new Programmer, as at boot. Each iteration gets a fresh namespace.
// plain-services is the shape of the binary's cold start measurements
// (newPlainCluster). kernel-p50-ms is the part of a sync between sending
// the batch and the kernel's answer.
func BenchmarkKernelColdFull(b *testing.B) {
	type size struct {
		name string
		c    func() *scaleCluster
	}
	var sizes []size
	for _, n := range benchSizes(1_000, 10_000, 100_000) {
		sizes = append(sizes, size{sizeName(n), func() *scaleCluster { return clusterOf(n) }})
	}
	sizes = append(sizes, size{"plain-" + sizeName(10_000), func() *scaleCluster { return plainClusterOf(10_000) }})
	for _, sz := range sizes {
		b.Run(sz.name, func(b *testing.B) {
			c := sz.c()
			n := len(c.Services)
			b.ReportAllocs()
			b.ResetTimer()
			var msgs int
			var durs, kernel, cpus []time.Duration
			var slabs []int64
			for i := range b.N {
				b.StopTimer()
				ns, fd := testNetNS(b)
				p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				slab := slabBytes(b)
				b.StartTimer()
				cpu := cpuTime()
				res, err := p.Full(c.Services)
				cpus = append(cpus, cpuTime()-cpu)
				b.StopTimer()
				slabs = append(slabs, slabBytes(b)-slab)
				if err != nil {
					b.Fatalf("cold full sync of %d Services: %v", n, err)
				}
				msgs = res.Messages
				durs = append(durs, res.Duration)
				kernel = append(kernel, res.Kernel)
				if i == 0 {
					checkKernel(b, ns, p.Config(), c.Want)
				}
				p.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(msgs), "msgs/op")
			reportQuantiles(b, durs)
			slices.Sort(kernel)
			b.ReportMetric(float64(kernel[len(kernel)/2])/float64(time.Millisecond), "kernel-p50-ms")
			slices.Sort(cpus)
			b.ReportMetric(float64(cpus[len(cpus)/2])/float64(time.Millisecond), "cpu-p50-ms")
			slices.Sort(slabs)
			b.ReportMetric(float64(slabs[len(slabs)/2])/(1<<20), "slab-MiB")
		})
	}
}

// BenchmarkKernelFlushRepair is the repair after another program ran nft
// flush ruleset: first-served-ms is when the first shard was back in the
// kernel (its Services served), p50-ms when every table was.
func BenchmarkKernelFlushRepair(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			ns, fd := testNetNS(b)
			p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			if _, err := p.Full(c.Services); err != nil {
				b.Fatal(err)
			}
			var first, durs []time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
					b.Fatalf("nft flush ruleset: %v: %s", err, out)
				}
				b.StartTimer()
				res, err := p.Full(c.Services)
				if err != nil {
					b.Fatal(err)
				}
				if res.FirstServed == 0 || res.Counts.ChainsAdded == 0 {
					b.Fatalf("the repair after a flush put no table back a table at a time: %+v", res.Counts)
				}
				first, durs = append(first, res.FirstServed), append(durs, res.Duration)
			}
			b.StopTimer()
			slices.Sort(first)
			b.ReportMetric(float64(first[len(first)/2])/float64(time.Millisecond), "first-served-ms")
			reportQuantiles(b, durs)
		})
	}
}

// BenchmarkKernelReconcileFull is the periodic reconcile with nothing to do
// after another program committed a transaction: read every table back and
// diff it against what nftgate believes. (Without such a transaction a
// reconcile reads one number, the ruleset's generation.)
func BenchmarkKernelReconcileFull(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			_, p := coldProgrammer(b, c)
			b.ReportAllocs()
			b.ResetTimer()
			var durs []time.Duration
			for range b.N {
				// As after another program's transaction: without one,
				// a reconcile does not read the tables back at all.
				p.genKnown = false
				res, err := p.Full(c.Services)
				if err != nil {
					b.Fatal(err)
				}
				if res.Counts.Changes() != 0 || res.Messages != 0 || len(res.Drift) != 0 || !res.ReadBack {
					b.Fatalf("reconcile of an unchanged cluster changed something, or read nothing: %+v", res)
				}
				durs = append(durs, res.Duration)
			}
			reportQuantiles(b, durs)
		})
	}
}

// BenchmarkKernelPartialEndpointChange moves one endpoint of one Service
// per iteration (a different Service each time) and programs it with a
// Partial sync. Afterwards a Full sync must find the kernel exactly as the
// partial syncs left it.
func BenchmarkKernelPartialEndpointChange(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			ns, p := coldProgrammer(b, c)
			current := make(map[model.ServiceKey]*model.Service, len(c.Services))
			for k, s := range c.Services {
				current[k] = s
			}
			b.ReportAllocs()
			b.ResetTimer()
			msgs := 0
			var durs []time.Duration
			var lastKey model.ServiceKey
			var lastAddr netip.Addr
			cpu := cpuTime()
			for i := range b.N {
				k := c.Keys[(i*7919)%len(c.Keys)]
				lastKey, lastAddr = k, addrPlus(scaleReplaceBase, uint32(i))
				svc := withReplacedEndpoint(current[k], i, lastAddr)
				res, err := p.Partial(map[model.ServiceKey]*model.Service{k: svc})
				if err != nil {
					b.Fatalf("partial sync of %s: %v", k, err)
				}
				if res.Counts.Changes() == 0 {
					b.Fatalf("endpoint change of %s programmed nothing", k)
				}
				current[k] = svc
				msgs += res.Messages
				durs = append(durs, res.Duration)
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
			reportQuantiles(b, durs)

			// The last change is in the kernel: its new endpoint is a DNAT
			// target there.
			svc := current[lastKey]
			chain := ruleset.PortObject("svc", svc, &svc.Ports[0])
			if svc.AffinityTimeout() > 0 || svc.Maglev(p.Config().EndpointSelection) {
				chain = ruleset.EndpointObject("ep", svc, &svc.Ports[0], netip.AddrPortFrom(lastAddr, svc.Ports[0].Endpoints[0].Port), "")
			}
			if out := scaleNft(b, ns, "list", "chain", "ip", p.Config().TableOf(lastKey), chain); !strings.Contains(out, "dnat to "+lastAddr.String()) {
				b.Fatalf("chain %s after the last change:\n%s", chain, out)
			}
			res, err := p.Full(current)
			if err != nil {
				b.Fatal(err)
			}
			if res.Counts.Changes() != 0 || len(res.Drift) != 0 {
				b.Fatalf("full sync after %d partial ones found differences: %+v", b.N, res)
			}
		})
	}
}

// coldProgrammer programs cluster c into a new namespace and checks the
// result.
func coldProgrammer(b *testing.B, c *scaleCluster) (ns string, p *Programmer) {
	b.Helper()
	ns, fd := testNetNS(b)
	p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	if _, err := p.Full(c.Services); err != nil {
		b.Fatalf("cold full sync of %d Services: %v", len(c.Services), err)
	}
	checkKernel(b, ns, p.Config(), c.Want)
	return ns, p
}

// BenchmarkKernelMemory measures the heap a Programmer keeps after a cold
// sync of the cluster (retained-MiB: live heap after GC, minus the same
// before the Programmer existed, with the model already built), the peak
// live heap during the sync (peak-heap-MiB, sampled every millisecond, so a
// slight underestimate), and the process's peak resident set during the sync
// (peak-rss-MiB, VmHWM reset just before; it includes the test binary and
// the model).
func BenchmarkKernelMemory(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			var retained, peak, rss float64
			for range b.N {
				_, fd := testNetNS(b)
				before := liveHeap()
				p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
				if err != nil {
					b.Fatal(err)
				}
				resetPeakRSS(b)
				stop := samplePeakHeap()
				if _, err := p.Full(c.Services); err != nil {
					b.Fatal(err)
				}
				peakHeap := stop()
				hwm := peakRSS(b)
				after := liveHeap()
				runtime.KeepAlive(p)
				p.Close()
				retained = float64(after-before) / (1 << 20)
				peak = float64(peakHeap-before) / (1 << 20)
				rss = float64(hwm) / (1 << 20)
			}
			b.ReportMetric(retained, "retained-MiB")
			b.ReportMetric(peak, "peak-heap-MiB")
			b.ReportMetric(rss, "peak-rss-MiB")
		})
	}
}

// slabBytes is the kernel's slab memory (Slab in /proc/meminfo), where
// nf_tables keeps its objects; the difference across a sync is what the
// sync's objects cost the kernel, give or take what the rest of the
// machine allocates meanwhile.
func slabBytes(tb testing.TB) int64 {
	tb.Helper()
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "Slab:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				tb.Fatalf("/proc/meminfo: %q: %v", line, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("/proc/meminfo has no Slab line")
	return 0
}

// cpuTime is the CPU time the process used so far, in user space and in
// the kernel (which processes a batch inside the sending system call): on
// a shared machine it varies less with the load than the wall time does.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// liveHeap is the heap in use by live objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// samplePeakHeap samples the heap in use until the returned function is
// called, which returns the largest value seen.
func samplePeakHeap() func() uint64 {
	done := make(chan struct{})
	result := make(chan uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				result <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		return <-result
	}
}

// resetPeakRSS resets the kernel's record of this process's peak resident
// set (VmHWM), so the next reading covers only what follows.
func resetPeakRSS(tb testing.TB) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		tb.Fatalf("reset peak RSS: %v", err)
	}
}

// peakRSS is VmHWM in bytes.
func peakRSS(tb testing.TB) uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("parse VmHWM %q: %v", line, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// reportQuantiles reports the median and the worst sync duration as the
// Programmer measured them (Result.Duration).
func reportQuantiles(b *testing.B, durs []time.Duration) {
	if len(durs) == 0 {
		return
	}
	slices.Sort(durs)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(durs[len(durs)/2]), "p50-ms")
	b.ReportMetric(ms(durs[len(durs)*99/100]), "p99-ms")
	b.ReportMetric(ms(durs[len(durs)-1]), "max-ms")
}

// TestScaleCluster checks the synthetic cluster's mix and the pure planner
// against the counts computed from the model, so that a benchmark's kernel
// check compares against the right numbers.
func TestScaleCluster(t *testing.T) {
	c := newScaleCluster(2_000, scaleEndpoints)
	if len(c.Services) != 2_000 {
		t.Fatalf("%d Services, want 2000", len(c.Services))
	}
	cfg := scaleConfig()
	ds, msgs := planCold(t, &cfg, c.Services)
	var got scaleExpect
	ts := ruleset.NewTables(&cfg)
	for _, slot := range ts.Slots(ruleset.IPv4) {
		st := ruleset.NewTableState()
		st.Apply(ds[slot])
		for name := range st.Chains {
			if !ruleset.Shared(name) {
				got.Chains++
			}
		}
		got.Picks += st.Picks.Len()
		for id := range st.Elems.All() {
			switch id.Map() {
			case ruleset.MapServiceIPs:
				got.ServiceIPs++
			case ruleset.MapServiceNodePorts:
				got.NodePorts++
			case ruleset.MapFirewallIPs:
				got.FirewallIPs++
			}
		}
		for name := range st.Sets {
			if strings.HasPrefix(name, "aff-") {
				got.AffinitySets++
			}
		}
	}
	if got != c.Want {
		t.Fatalf("planned %+v, want %+v", got, c.Want)
	}
	if msgs.count() == 0 {
		t.Fatal("cold plan encoded no messages")
	}
	t.Logf("2000 Services: %+v, %d messages", got, msgs.count())
}

// TestScaleColdAndPartial programs a mid-size cluster into a namespace,
// checks the kernel with nft, moves one endpoint with a Partial sync and
// checks that a Full sync then finds nothing to do.
// checkTotals compares the Programmer's totals, kept up to date by each
// sync, with a count of its tables' state.
func checkTotals(t *testing.T, p *Programmer) {
	t.Helper()
	got := p.Totals()
	var want Totals
	p.mu.Lock()
	for _, st := range p.state {
		want.Chains += len(st.Chains)
		want.Elements += st.Elems.Len()
		for _, info := range st.Picks.All() {
			want.Elements += int(info.N)
		}
		for _, c := range st.Chains {
			want.Rules += int(c.Rules)
		}
	}
	p.mu.Unlock()
	if got != want || want.Rules == 0 {
		t.Errorf("totals %+v, counted %+v", got, want)
	}
}

func TestScaleColdAndPartial(t *testing.T) {
	c := newScaleCluster(2_000, scaleEndpoints)
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := p.Full(c.Services)
	if err != nil {
		t.Fatal(err)
	}
	checkKernel(t, ns, p.Config(), c.Want)
	k := c.Keys[3] // one with affinity
	newAddr := addrPlus(scaleReplaceBase, 1)
	svc := withReplacedEndpoint(c.Services[k], 0, newAddr)
	pres, err := p.Partial(map[model.ServiceKey]*model.Service{k: svc})
	if err != nil {
		t.Fatal(err)
	}
	want := c.Want
	if pres.Counts.ChainsAdded != 1 || pres.Counts.ChainsDeleted != 1 || pres.Counts.SetsAdded != 1 || pres.Counts.SetsDeleted != 1 {
		t.Fatalf("endpoint change of %s: %+v, want one endpoint chain and one affinity set replaced", k, pres.Counts)
	}
	checkKernel(t, ns, p.Config(), want)
	if out := scaleNft(t, ns, "list", "table", "ip", p.Config().TableOf(k)); !strings.Contains(out, "dnat to "+newAddr.String()+":8080") {
		t.Fatalf("no DNAT to the new endpoint %s after the partial sync", newAddr)
	}
	checkTotals(t, p)
	// A Service gone and one back: the rule count kept by partial syncs
	// follows chains deleted and added.
	gone := c.Keys[5]
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{gone: nil}); err != nil {
		t.Fatal(err)
	}
	checkTotals(t, p)
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{gone: c.Services[gone]}); err != nil {
		t.Fatal(err)
	}
	checkTotals(t, p)
	current := map[model.ServiceKey]*model.Service{}
	for k, s := range c.Services {
		current[k] = s
	}
	current[k] = svc
	res, err = p.Full(current)
	if err != nil {
		t.Fatal(err)
	}
	if res.Counts.Changes() != 0 || len(res.Drift) != 0 {
		t.Fatalf("full sync after the partial one: %+v", res)
	}
	t.Log(fmt.Sprintf("cold sync of 2000 Services: %d messages", res.Messages))
}

// BenchmarkKernelCountersRead reads the counters of every Service port back
// from the kernel (Programmer.Counters without its one-second cache): what
// one reading for the API or a scrape costs, with the index of ports and
// destinations the readings share kept, and made anew (after a sync).
//
//	go test -run '^$' -bench KernelCountersRead -benchtime 5x ./nft/
func BenchmarkKernelCountersRead(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			cfg := scaleConfig()
			cfg.Counters = true
			p, _, _ := countedCluster(b, n, cfg)
			for _, index := range []string{"kept", "new"} {
				b.Run("index="+index, func(b *testing.B) {
					b.ReportAllocs()
					benchCountersReads(b, p, func(rd *Reading) bool {
						if index == "new" {
							p.counters.ports = nil // as after a sync
						}
						return rd.NumPorts() > 0
					})
				})
			}
		})
	}
}

// benchCountersReads reads the counters from the kernel b.N times (the
// last reading dropped before each), reports each reading's time and
// fails if read does not find what it should in one.
func benchCountersReads(b *testing.B, p *Programmer, read func(*Reading) bool) {
	for range b.N {
		p.counters.last = nil // read the kernel every time
		start := time.Now()
		rd, err := p.Counters()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "read-ms")
		if !read(rd) {
			b.Fatal("nothing read")
		}
	}
}

// countedCluster programs n Services with cfg into a new namespace and
// returns the programmer, the namespace's name and the cluster.
func countedCluster(b *testing.B, n int, cfg ruleset.Config) (*Programmer, string, *scaleCluster) {
	b.Helper()
	c := clusterOf(n)
	ns, fd := testNetNS(b)
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	if _, err := p.Full(c.Services); err != nil {
		b.Fatalf("cold full sync of %d Services: %v", n, err)
	}
	return p, ns, c
}
