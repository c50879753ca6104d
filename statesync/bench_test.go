package statesync

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

func benchEntries(n int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		out[i] = natEntry(unix.IPPROTO_TCP, fmt.Sprintf("10.1.%d.%d:40000", i/250, i%250+1), "10.96.0.10:80",
			"10.2.0.10:8080", fmt.Sprintf("10.2.0.1:%d", 1024+i))
	}
	return out
}

// BenchmarkWrite10000 creates 10,000 TCP replicas with both translations
// in an empty namespace; deleting them again is not timed.
func BenchmarkWrite10000(b *testing.B) {
	requireRoot(b)
	k := newKernel(b, netnstest.Temp(b), ConntrackOptions{})
	puts := benchEntries(10000)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		noErrors(b, "write", k.Write(puts, nil))
		b.StopTimer()
		noErrors(b, "delete", k.Write(nil, puts))
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(puts)), "ns/entry")
}

// BenchmarkUpdate10000 writes 10,000 replicas that exist with Write: each
// is a create refused with EEXIST and an update.
func BenchmarkUpdate10000(b *testing.B) {
	benchUpdate(b, func(k *Conntrack, puts []Entry) []error { return k.Write(puts, nil) })
}

// BenchmarkUpdateKnown10000 writes 10,000 replicas that exist with
// Update, as the writer does for the replicas it knows: an update each.
func BenchmarkUpdateKnown10000(b *testing.B) {
	benchUpdate(b, (*Conntrack).Update)
}

func benchUpdate(b *testing.B, write func(*Conntrack, []Entry) []error) {
	requireRoot(b)
	k := newKernel(b, netnstest.Temp(b), ConntrackOptions{})
	puts := benchEntries(10000)
	noErrors(b, "write", k.Write(puts, nil))
	b.Cleanup(func() { k.Write(nil, puts) })
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		noErrors(b, "write", write(k, puts))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(puts)), "ns/entry")
}

// BenchmarkDecodeEvent decodes one real UPDATE event of a translated TCP
// entry as Listen does (parseMessage and the entry filter).
func BenchmarkDecodeEvent(b *testing.B) {
	requireRoot(b)
	ns := netnstest.Temp(b)
	k := newKernel(b, ns, ConntrackOptions{})
	conn, _, err := dial(int(ns), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := conn.JoinGroup(ctnetlink.GroupUpdate); err != nil {
		b.Fatal(err)
	}
	e := benchEntries(1)
	noErrors(b, "write", k.Write(e, nil))
	noErrors(b, "adopt", k.Adopt(e))
	defer k.Write(nil, e)
	msgs, err := conn.Receive()
	if err != nil {
		b.Fatal(err)
	}
	raw, err := msgs[0].MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := decodeEvent(raw); !ok {
		b.Fatal("the captured event does not decode")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := decodeEvent(raw); !ok {
			b.Fatal("decode failed")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkDumpOwn10000 reads a table of 10,000 translated entries of
// this gateway's own, as a refresh pass or a resync on the active gateway
// does.
func BenchmarkDumpOwn10000(b *testing.B) {
	requireRoot(b)
	k := newKernel(b, netnstest.Temp(b), ConntrackOptions{})
	es := benchEntries(10000)
	noErrors(b, "create", k.CreateOrigins(es))
	benchDump(b, k, len(es))
}

// BenchmarkDumpReplicas10000 reads a table of 10,000 replicas, as a
// refresh pass on the backup gateway does: none of them is its own.
func BenchmarkDumpReplicas10000(b *testing.B) {
	requireRoot(b)
	k := newKernel(b, netnstest.Temp(b), ConntrackOptions{})
	es := benchEntries(10000)
	noErrors(b, "write", k.Write(es, nil))
	benchDump(b, k, 0)
}

func benchDump(b *testing.B, k *Conntrack, want int) {
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		n := 0
		if err := k.Dump(func(e Entry) {
			if e.Mark&ReplicaMark == 0 {
				n++
			}
		}); err != nil {
			b.Fatal(err)
		}
		if n != want {
			b.Fatalf("%d own entries, want %d", n, want)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*10000), "ns/entry")
}
