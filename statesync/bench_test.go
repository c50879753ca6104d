package statesync

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
	"github.com/nftgate/nftgate/ruleset"
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

// ownTable is a namespace's conntrack holding 10,000 translated entries
// of this gateway's own (benchEntries), and those entries.
func ownTable(b *testing.B) (*Conntrack, []Entry) {
	requireRoot(b)
	k := newKernel(b, netnstest.Temp(b), ConntrackOptions{})
	es := benchEntries(10000)
	noErrors(b, "create", k.CreateOrigins(es))
	return k, es
}

// BenchmarkDumpOwn10000 reads a table of 10,000 translated entries of
// this gateway's own, as a refresh pass or a resync on the active gateway
// does.
func BenchmarkDumpOwn10000(b *testing.B) {
	k, es := ownTable(b)
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

// BenchmarkRefreshPass is one refresh pass of a gateway whose table holds
// what short connections leave behind: 10,000 TCP entries in TIME_WAIT
// (a client that connects, asks, reads and closes leaves each for
// 120 s), and 100 UDP flows whose replicas are due. A full pass ("table")
// reads every entry; the passes between two full ones ("due") read the
// UDP flows alone. ns/entry is per entry of the table.
func BenchmarkRefreshPass(b *testing.B) {
	requireRoot(b)
	k := newKernel(b, netnstest.Temp(b), ConntrackOptions{})
	all := benchEntries(10000)
	for i := range all {
		all[i].TCP.State, all[i].Timeout = 7, 120 // TIME_WAIT
	}
	for i := range 100 {
		e := natEntry(unix.IPPROTO_UDP, fmt.Sprintf("10.3.0.%d:40000", i+1), "10.96.0.10:53", "10.2.0.10:5353", fmt.Sprintf("10.2.0.1:%d", 20000+i))
		e.TCP, e.Timeout = TCPInfo{}, 30
		all = append(all, e)
	}
	noErrors(b, "create", k.CreateOrigins(all))
	// A Policy that has followed no sync yet sends everything.
	s, err := New(Options{Kernel: k, Policy: NewPolicy(ruleset.Config{}, nil), Self: "gw-a", Peers: []string{"gw-b"},
		RefreshInterval: 20 * time.Second}) // the UDP flows' 30 s are within two passes
	if err != nil {
		b.Fatal(err)
	}
	// The sync knows the flows from their events.
	evs := make([]Event, len(all))
	for i := range all {
		evs[i] = Event{Type: EventNew, Entry: all[i]}
	}
	s.deliver(evs)
	for _, pass := range []struct {
		name string
		run  func()
		read float64
	}{{readTable, s.refresh, float64(len(all))}, {readDue, s.refreshDue, 100}} {
		b.Run(pass.name, func(b *testing.B) {
			read := s.m.read.WithLabelValues(pass.name)
			before := testutil.ToFloat64(read)
			b.ReportAllocs()
			for range b.N {
				pass.run()
			}
			if got := (testutil.ToFloat64(read) - before) / float64(b.N); got != pass.read {
				b.Fatalf("%v entries read a pass, want %v", got, pass.read)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(all)), "ns/entry")
		})
	}
}

// BenchmarkGet10000 reads 10,000 entries by their original tuples, as a
// refresh pass between full ones asks for those due: against
// BenchmarkDumpOwn10000, what a read costs an entry either way.
func BenchmarkGet10000(b *testing.B) {
	k, es := ownTable(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		n := 0
		if err := k.Get(es, func(Entry) { n++ }); err != nil {
			b.Fatal(err)
		}
		if n != len(es) {
			b.Fatalf("%d entries read, want %d", n, len(es))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(es)), "ns/entry")
}

// BenchmarkResyncDump reads a table of 10,000 own TCP entries for a peer's
// resync, as the resync holds it until the peer has it all; held-B/entry
// is what it holds an entry.
func BenchmarkResyncDump(b *testing.B) {
	k, es := ownTable(b)
	s, err := New(Options{Kernel: k, Policy: NewPolicy(ruleset.Config{}, nil), Self: "gw-a", Peers: []string{"gw-b"}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	held := 0
	for range b.N {
		dump, err := s.originEntries()
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		held = 0
		for _, d := range dump {
			n += d.n
			held += cap(d.body)
		}
		held += cap(dump) * int(unsafe.Sizeof(dump[0]))
		if n != len(es) {
			b.Fatalf("%d entries dumped, want %d", n, len(es))
		}
	}
	b.ReportMetric(float64(held)/float64(len(es)), "held-B/entry")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(es)), "ns/entry")
}
