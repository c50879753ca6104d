package conntrack

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// benchTable is a namespace whose conntrack table holds n unrelated UDP
// flows: clients talking to 1,000 other services on port 53, answered by
// their endpoints. A broad dump of UDP returns all of them.
type benchTable struct {
	ns netns.NsHandle
	n  int
}

func newBenchTable(b *testing.B, n int) *benchTable {
	b.Helper()
	ns := newNetNS(b)
	linkUp(b, nlHandle(b, ns), "lo")
	conn := ctConn(b, ns)
	for i := range n {
		u := uint32(i)
		f := synthFlow{
			proto:    17,
			src:      netip.AddrPortFrom(addr4(0x0a_c8_00_00|u>>8), uint16(10000+u&0xff)),
			dst:      netip.AddrPortFrom(addr4(0x0a_c9_00_00|u%1000), 53),
			replySrc: netip.AddrPortFrom(addr4(0x0a_ca_00_00|u%4000), 5353),
		}
		// A namespace's table is limited by the global nf_conntrack_max
		// (262,144 here), read-only inside the namespace.
		if err := conn.Create(f.flow(3600)); err != nil {
			b.Fatalf("create entry %d of %d: %v (is nf_conntrack_max below %d?)", i, n, err, n)
		}
	}
	return &benchTable{ns: ns, n: n}
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, v)))
}

// heapPeak samples the heap's live objects while a measurement runs.
type heapPeak struct {
	stop, done chan struct{}
	peak       atomic.Uint64
}

func startHeapPeak() *heapPeak {
	h := &heapPeak{stop: make(chan struct{}), done: make(chan struct{})}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(h.done)
		t := time.NewTicker(50 * time.Microsecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapPeak) end() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

func heapNow() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// BenchmarkClean measures one Clean as a sync would issue it (two stale
// endpoints and one stale service, ten stale flows) against tables of 1,000
// and 100,000 unrelated UDP flows, once with narrow kernel filters and once
// forced onto the broad per-protocol dump.
//
//	go test -run '^$' -bench BenchmarkClean -benchtime 20x ./conntrack
func BenchmarkClean(b *testing.B) {
	requireRoot(b)
	for _, n := range []int{1000, 100000} {
		tbl := newBenchTable(b, n)
		for _, mode := range []struct {
			name      string
			maxNarrow int
		}{{"narrow", 32}, {"broad", 0}} {
			b.Run(fmt.Sprintf("entries=%d/%s", n, mode.name), func(b *testing.B) {
				benchClean(b, tbl, mode.maxNarrow)
			})
		}
	}
}

func benchClean(b *testing.B, tbl *benchTable, maxNarrow int) {
	c, err := New(WithNetNS(int(tbl.ns)), WithMaxNarrowDumps(maxNarrow))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	conn := ctConn(b, tbl.ns)
	vip, vip2 := mustAddr("10.96.0.10"), mustAddr("10.96.0.11")
	epA, epB := netip.MustParseAddrPort("10.1.0.1:5353"), netip.MustParseAddrPort("10.1.0.2:5353")
	var stale []synthFlow
	for i := range 4 {
		stale = append(stale,
			synthFlow{17, netip.AddrPortFrom(mustAddr("192.0.2.1"), uint16(2000+i)), netip.AddrPortFrom(vip, 53), epA},
			synthFlow{17, netip.AddrPortFrom(mustAddr("192.0.2.2"), uint16(2000+i)), netip.AddrPortFrom(vip, 53), epB})
	}
	stale = append(stale,
		synthFlow{17, netip.MustParseAddrPort("192.0.2.3:3000"), netip.AddrPortFrom(vip2, 53), netip.AddrPortFrom(vip2, 53)},
		synthFlow{17, netip.MustParseAddrPort("192.0.2.3:3001"), netip.AddrPortFrom(vip2, 53), netip.AddrPortFrom(vip2, 53)})
	endpoints := []StaleEndpoint{
		{Protocol: UDP, VIP: vip, Port: 53, Endpoint: epA},
		{Protocol: UDP, VIP: vip, Port: 53, Endpoint: epB},
	}
	services := []StaleService{{Protocol: UDP, VIP: vip2, Port: 53}}

	var peak, returned, deleted uint64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		createFlows(b, conn, stale)
		runtime.GC()
		base := heapNow()
		hp := startHeapPeak()
		b.StartTimer()

		res, err := c.Clean(context.Background(), endpoints, services)

		b.StopTimer()
		if p := hp.end(); p > base && p-base > peak {
			peak = p - base
		}
		if err != nil {
			b.Fatal(err)
		}
		if res.Deleted != len(stale) {
			b.Fatalf("deleted %d, want %d", res.Deleted, len(stale))
		}
		returned += uint64(res.Returned)
		deleted += uint64(res.Deleted)
		b.StartTimer()
	}
	b.ReportMetric(float64(peak)/1024, "peak-heap-KiB")
	b.ReportMetric(float64(returned)/float64(b.N), "returned/op")
	b.ReportMetric(float64(deleted)/float64(b.N), "deleted/op")
}

// BenchmarkFlowsRead reads a table of translated flows, alone or beside
// flows the gateway routes untranslated: what one reading of the active
// flows (at most one a second, for the page, the API and the metrics
// together; the traffic history's each minute) costs at that size. The
// kernel writes no message for the routed flows (the DNAT status filter).
//
//	go test -run '^$' -bench FlowsRead -benchtime 5x ./conntrack/
func BenchmarkFlowsRead(b *testing.B) {
	requireRoot(b)
	for _, c := range []struct{ translated, routed int }{{10_000, 0}, {100_000, 0}, {10_000, 100_000}} {
		b.Run(fmt.Sprintf("translated=%d/routed=%d", c.translated, c.routed), func(b *testing.B) {
			ns := newFlowsTable(b, c.translated, c.routed)
			b.ResetTimer()
			for range b.N {
				f := NewFlows(WithNetNS(int(ns)))
				runtime.GC()
				h := startHeapPeak()
				start := time.Now()
				flows, _, err := f.Read()
				d := time.Since(start)
				peak := h.end()
				if err != nil {
					b.Fatal(err)
				}
				if len(flows) != c.translated {
					b.Fatalf("read %d flows, want %d", len(flows), c.translated)
				}
				b.ReportMetric(float64(d.Milliseconds()), "read-ms")
				b.ReportMetric(float64(peak)/(1<<20), "heap-peak-MiB")
			}
		})
	}
}

// newFlowsTable is a namespace whose conntrack table holds translated UDP
// flows (DNAT, as a Service's) and routed ones (no translation).
func newFlowsTable(b *testing.B, translated, routed int) netns.NsHandle {
	b.Helper()
	ns := newNetNS(b)
	linkUp(b, nlHandle(b, ns), "lo")
	nat, conn := natConn(b, ns), ctConn(b, ns)
	var chunk []synthFlow
	for i := range translated {
		u := uint32(i)
		chunk = append(chunk, synthFlow{proto: 17, src: netip.AddrPortFrom(addr4(0x0a_c8_00_00|u>>8), uint16(10000+u&0xff)),
			dst: netip.AddrPortFrom(addr4(0x0a_c9_00_00|u%1000), 53), replySrc: netip.AddrPortFrom(addr4(0x0a_ca_00_00|u%4000), 5353)})
		if len(chunk) == 1024 || i == translated-1 {
			createDNAT(b, nat, chunk...)
			chunk = chunk[:0]
		}
	}
	for i := range routed {
		u := uint32(i)
		dst := netip.AddrPortFrom(addr4(0x0a_cb_00_00|u%4000), 5353)
		f := synthFlow{proto: 17, src: netip.AddrPortFrom(addr4(0x0a_cc_00_00|u>>8), uint16(10000+u&0xff)), dst: dst, replySrc: dst}
		if err := conn.Create(f.flow(3600)); err != nil {
			b.Fatalf("create routed entry %d of %d: %v", i, routed, err)
		}
	}
	return ns
}
