package statesync

import (
	"testing"
	"time"
)

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
