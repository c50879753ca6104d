package statesync

import (
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// recordsN is how many flows and replicas BenchmarkSyncRecords keeps.
const recordsN = 100000

// BenchmarkSyncPathPerEntry is the CPU one entry costs on the sync path,
// both ends, without the kernel and the channel: the event taken and
// queued (deliver), cut into a batch and encoded, decoded, and checked by
// the Policy. At 10,000 entries a second the CPU share is ns/op × 1e-5.
func BenchmarkSyncPathPerEntry(b *testing.B) {
	s, err := New(Options{Kernel: newFakeKernel(), Policy: testPolicy(), Self: "gw-a", Peers: []string{"gw-b"}})
	if err != nil {
		b.Fatal(err)
	}
	p := s.peers["gw-b"]
	p.up = true
	pol := testPolicy()
	const n = 1000
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{Type: EventNew, Entry: flow(uint16(i + 1))}
	}
	var ops []op
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += n {
		s.deliver(evs)
		s.mu.Lock()
		clear(p.unacked)
		msgs := s.batchesLocked(p, time.Now().Add(time.Second))
		clear(p.unacked)
		clear(s.flows)
		s.mu.Unlock()
		for _, m := range msgs {
			bt, err := decodeBatch(m.payload, ops)
			if err != nil {
				b.Fatal(err)
			}
			ops = bt.ops
			for i := range bt.ops {
				if why := pol.Check(&bt.ops[i].entry); why != "" {
					b.Fatal(why)
				}
			}
		}
	}
}

// BenchmarkSyncRecords is the memory the sync keeps for its own flows and
// for the replicas it holds, recordsN of each, and what a collection of
// the heap then takes (gc-ms: the sync's maps hold no pointer, so it does
// not scan them).
func BenchmarkSyncRecords(b *testing.B) {
	for range b.N {
		s, err := New(Options{Kernel: newFakeKernel(), Policy: testPolicy(), Self: "gw-a", Peers: []string{"gw-b"}})
		if err != nil {
			b.Fatal(err)
		}
		evs := make([]Event, recordsN)
		for i := range evs {
			e := flow(uint16(i % 60000))
			e.Orig.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i / 60000), 1}), e.Orig.Src.Port())
			e.TCP.State, e.Timeout = 3, 432000
			evs[i] = Event{Type: EventNew, Entry: e}
		}
		var m0, m1, m2 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		s.deliver(evs)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		num := s.peers["gw-b"].num
		for i := range evs {
			e := &evs[i].Entry
			e.Orig.Dst = netip.AddrPortFrom(e.Orig.Dst.Addr(), 81)
			s.replicas[keyOf(e)] = replica{origin: num}
		}
		runtime.GC()
		runtime.ReadMemStats(&m2)
		if len(s.flows) != recordsN || len(s.replicas) != recordsN {
			b.Fatalf("%d flows, %d replicas: want %d of each", len(s.flows), len(s.replicas), recordsN)
		}
		runtime.KeepAlive(evs) // in m0, and so in m1 and m2
		evs = nil
		runtime.GC()
		start := time.Now()
		runtime.GC()
		gc := time.Since(start)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/recordsN, "B/flow")
		b.ReportMetric(float64(m2.HeapAlloc-m1.HeapAlloc)/recordsN, "B/replica")
		b.ReportMetric(float64(gc.Microseconds())/1000, "gc-ms")
		runtime.KeepAlive(s)
	}
}
