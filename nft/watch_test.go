package nft

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Another program's transaction stays known as one after nftgate commits
// its own: the next full sync reads the tables back and repairs them.
func TestFullReadsBackAfterOthersCommitBeforeAPartial(t *testing.T) {
	ns, p := testProgrammer(t)
	svc := webService("198.18.2.10")
	other := webService("198.18.2.20")
	other.Key, other.ClusterIPs[0] = model.NewServiceKey(other.Key.Namespace(), "other"), other.ClusterIPs[0].Next()
	services := map[model.ServiceKey]*model.Service{svc.Key: svc, other.Key: other}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	moved := webService("198.18.2.11")
	moved.Key, moved.ClusterIPs = other.Key, other.ClusterIPs
	services[other.Key] = moved
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{other.Key: moved}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Full(services)
	if err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after another program's edit and a partial sync: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the edit was not repaired:\n%s", out)
	}
}

// watchDrifts runs p.Watch until the test ends and returns the channel
// of what it reports.
func watchDrifts(t *testing.T, p *Programmer) <-chan Drift {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Drift, 64)
	done := make(chan error, 1)
	go func() { done <- p.Watch(ctx, func(d Drift) { ch <- d }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if p.watchRunning() {
			return ch
		}
		if time.Now().After(deadline) {
			t.Fatal("Watch did not start")
		}
		select {
		case err := <-done:
			t.Fatalf("Watch: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// nextDrift waits for the next report that is not about lost messages.
func nextDrift(t *testing.T, ch <-chan Drift, what string) Drift {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case d := <-ch:
			if !d.Lost {
				return d
			}
		case <-deadline:
			t.Fatalf("no drift reported after %s", what)
		}
	}
}

// noDrift checks nothing but lost messages was reported, after the
// notifications caught up with the kernel's generation.
func noDrift(t *testing.T, p *Programmer, ch <-chan Drift, what string) {
	t.Helper()
	g, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	if !p.watch.quietSince(p.watch.snapshot(), g, 5*time.Second) {
		t.Fatalf("notifications did not catch up with generation %d after %s", g, what)
	}
	for {
		select {
		case d := <-ch:
			if !d.Lost {
				t.Fatalf("drift reported after %s: %s", what, d)
			}
		default:
			return
		}
	}
}

func TestWatchReportsOthersChanges(t *testing.T) {
	ns, p := testProgrammer(t)
	ch := watchDrifts(t, p)
	svc := webService("198.18.2.10")
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	if res, err := p.Full(services); err != nil || !res.ReadBack {
		t.Fatalf("first full sync: %+v, %v", res, err)
	}
	moved := webService("198.18.2.11")
	services[svc.Key] = moved
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{svc.Key: moved}); err != nil {
		t.Fatal(err)
	}
	noDrift(t, p, ch, "nftgate's own syncs")

	// Another program's table is none of nftgate's business, and a full
	// sync after it need not read nftgate's tables back.
	nftList(t, ns, "add", "table", "ip", "someone-else")
	noDrift(t, p, ch, "another program's table")
	if res, err := p.Full(services); err != nil || res.ReadBack {
		t.Fatalf("full sync after another program changed only its own table: %+v, %v; want no read-back", res, err)
	}

	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	d := nextDrift(t, ch, "deleting an element")
	if want := "deleted elements of set " + ruleset.MapServiceIPs + " of table ip " + table; !strings.Contains(d.String(), want) || !strings.Contains(d.Writer, "nft") {
		t.Fatalf("reported %q; want it to name %q and nft", d, want)
	}
	if res, err := p.Full(services); err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after the report: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the edit was not repaired:\n%s", out)
	}

	nftList(t, ns, "flush", "ruleset")
	d = nextDrift(t, ch, "nft flush ruleset")
	if !strings.Contains(d.String(), "deleted table ip") {
		t.Fatalf("reported %q; want the tables' deletion", d)
	}
	if res, err := p.Full(services); err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after the flush: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the flush was not repaired:\n%s", out)
	}
	noDrift(t, p, ch, "the repair")
}

// BenchmarkKernelColdFullWatched is BenchmarkKernelColdFull with Watch
// running: what the kernel's notifications of nftgate's own batch cost
// (the kernel builds them only while someone listens).
func BenchmarkKernelColdFullWatched(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			var durs, kernel []time.Duration
			for range b.N {
				b.StopTimer()
				_, fd := testNetNS(b)
				p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				lost := 0
				go func() { done <- p.Watch(ctx, func(d Drift) { lost++ }) }()
				for !p.watchRunning() {
					time.Sleep(time.Millisecond)
				}
				b.StartTimer()
				res, err := p.Full(c.Services)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				durs, kernel = append(durs, res.Duration), append(kernel, res.Kernel)
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.Logf("%d reports (lost notifications)", lost)
				p.Close()
				b.StartTimer()
			}
			reportQuantiles(b, durs)
			slices.Sort(kernel)
			b.ReportMetric(float64(kernel[len(kernel)/2])/float64(time.Millisecond), "kernel-p50-ms")
		})
	}
}

// BenchmarkKernelReconcileWatched is the periodic reconcile after another
// program committed a transaction of its own tables, with Watch running:
// the notifications say nftgate's tables were not touched, so nothing is
// read back (BenchmarkKernelReconcileFull is the same without them).
func BenchmarkKernelReconcileWatched(b *testing.B) {
	for _, n := range benchSizes(10_000, 100_000) {
		b.Run(sizeName(n), func(b *testing.B) {
			c := clusterOf(n)
			ns, p := coldProgrammer(b, c)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Watch(ctx, func(Drift) {}) }()
			b.Cleanup(func() { cancel(); <-done })
			for !p.watchRunning() {
				time.Sleep(time.Millisecond)
			}
			var durs []time.Duration
			for i := range b.N {
				b.StopTimer()
				scaleNft(b, ns, "add", "table", "ip", fmt.Sprintf("other-%d", i))
				b.StartTimer()
				res, err := p.Full(c.Services)
				if err != nil {
					b.Fatal(err)
				}
				if i > 0 && res.ReadBack {
					b.Fatalf("reconcile read back after another program's own table: %+v", res)
				}
				durs = append(durs, res.Duration)
			}
			reportQuantiles(b, durs)
		})
	}
}

// watchedScaleProgrammer is a Programmer of the synthetic clusters' config
// in a namespace of its own, with Watch running.
func watchedScaleProgrammer(t *testing.T) (string, *Programmer, <-chan Drift) {
	t.Helper()
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return ns, p, watchDrifts(t, p)
}

// nftgate's own large batch goes unannounced: the notification socket
// leaves the group for it, so the kernel builds no notifications of its
// messages and none overflow the socket, and the announcements are caught
// up with the kernel's generation right after it.
func TestOwnLargeBatchUnannounced(t *testing.T) {
	_, p, ch := watchedScaleProgrammer(t)
	c := clusterOf(10_000)
	res, err := p.Full(c.Services)
	if err != nil {
		t.Fatal(err)
	}
	if res.Messages <= muteAbove {
		t.Fatalf("the cold sync sent %d messages; the test needs more than %d", res.Messages, muteAbove)
	}
	noDrift(t, p, ch, "nftgate's cold sync")
	// noDrift lets lost notifications pass: here there must be none.
	select {
	case d := <-ch:
		t.Fatalf("reported after nftgate's own batch: %s", d)
	default:
	}
}

// A batch of few messages holding many map elements (Services choosing
// through the endpoint maps: elements go 500 to a message) goes
// unannounced too: the kernel announces every element on its own.
func TestElementHeavyBatchUnannounced(t *testing.T) {
	_, p, ch := watchedScaleProgrammer(t)
	muted := 0
	p.mutedSend = func() { muted++ }
	res, err := p.Full(plainClusterOf(10_000).Services)
	if err != nil {
		t.Fatal(err)
	}
	if res.Messages > muteAbove {
		t.Fatalf("the cold sync sent %d messages; the test needs fewer than %d", res.Messages, muteAbove)
	}
	if muted == 0 {
		t.Fatalf("none of the cold sync's batches (%d messages, %+v) was sent muted", res.Messages, res.Counts)
	}
	noDrift(t, p, ch, "nftgate's cold sync")
	select {
	case d := <-ch:
		t.Fatalf("reported after nftgate's own batches: %s", d)
	default:
	}
}

// Another program's transaction while the socket is out of the group for
// one of nftgate's batches is not announced; the kernel's generation tells
// of it, it counts as notifications lost, and the next full sync reads the
// tables back.
func TestTransactionWhileMutedCountsAsLost(t *testing.T) {
	ns, p, ch := watchedScaleProgrammer(t)
	// A cold sync commits table by table: at 10,000 Services each
	// table's batch is above muteAbove.
	c := clusterOf(10_000)
	committed := false
	p.mutedSend = func() {
		nftList(t, ns, "add", "table", "ip", "someone-else")
		committed = true
	}
	if _, err := p.Full(c.Services); err != nil {
		t.Fatal(err)
	}
	if !committed {
		t.Fatal("the cold sync was not sent muted")
	}
	deadline := time.After(5 * time.Second)
	for lost := false; !lost; {
		select {
		case d := <-ch:
			lost = d.Lost
		case <-deadline:
			t.Fatal("the transaction committed while muted was not reported as notifications lost")
		}
	}
	p.mutedSend = nil
	if res, err := p.Full(c.Services); err != nil || !res.ReadBack {
		t.Fatalf("full sync after a transaction went unannounced: %+v, %v; want a read-back", res, err)
	}
}

// A repair reads back only the tables the notifications named, when none
// were lost since the last read-back; after a loss, every table.
func TestRepairReadsOnlyTheTablesChanged(t *testing.T) {
	ns, p := testProgrammer(t)
	ch := watchDrifts(t, p)
	svc := webService("198.18.2.10")
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	all := len(p.tables.Refs)
	if all < 3 {
		t.Fatalf("%d tables: the test needs several", all)
	}
	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	nextDrift(t, ch, "deleting an element")
	res, err := p.Full(services)
	if err != nil || !res.ReadBack || len(res.Drift) == 0 || res.ReadTables != 1 {
		t.Fatalf("repair of one deleted element: %+v, %v; want a read-back of its table alone (of %d) that finds drift", res, err, all)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the element was not put back:\n%s", out)
	}
	if res.Counts.ElementsAdded != 1 || res.Messages > 4 {
		t.Fatalf("repair of one deleted element: %+v; want the element added back and nothing else", res)
	}
	noDrift(t, p, ch, "the repair")
	if res, err := p.Full(services); err != nil || res.ReadBack {
		t.Fatalf("full sync after the repair: %+v, %v; want no read-back", res, err)
	}

	// More than elements: the table is read back in full and planned.
	var chain string
	for slot, ref := range p.tables.Refs {
		if ref.Family == ruleset.IPv4 && ref.Name == table {
			for id, v := range p.state[slot].Elems.All() {
				if id.Map() == ruleset.MapServiceIPs {
					chain = v.Chain
				}
			}
		}
	}
	before := nftList(t, ns, "list", "chain", "ip", table, chain)
	nftList(t, ns, "flush", "chain", "ip", table, chain)
	nextDrift(t, ch, "flushing a chain")
	res, err = p.Full(services)
	if err != nil || len(res.Drift) == 0 || res.ReadTables != 1 || res.Counts.ChainsChanged != 1 {
		t.Fatalf("repair of a flushed chain: %+v, %v; want a read-back of its table alone that finds the chain changed", res, err)
	}
	if after := nftList(t, ns, "list", "chain", "ip", table, chain); after != before {
		t.Fatalf("the chain was not repaired:\n%s\nwant\n%s", after, before)
	}

	// Notifications lost: nothing tells which tables changed.
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	nextDrift(t, ch, "deleting the element again")
	p.watch.update(p.watch.lost)
	if res, err := p.Full(services); err != nil || res.ReadTables != all || len(res.Drift) == 0 {
		t.Fatalf("repair after lost notifications: %+v, %v; want every table (%d) read back", res, err, all)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the element was not put back:\n%s", out)
	}
}

// `nft flush ruleset` at scale overflows the notification socket with the
// deletion of every object: the loss asks for a read-back of every table,
// and the repair's own batch still goes unannounced, without waiting for
// announcements the overflow dropped, so the one repair is all it takes.
func TestFlushOverflowRepairedOnce(t *testing.T) {
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// The watcher is held while the flush is announced, as a busy
	// machine would hold it: the announcements overflow its socket
	// however fast the machine, once.
	var holding atomic.Bool
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	p.beforeReceive = func() {
		if holding.Load() {
			select {
			case held <- struct{}{}:
			default:
			}
			<-hold
		}
	}
	ch := watchDrifts(t, p)
	// With session affinity, every Service has chains and sets of its
	// own, as many objects to announce as the test needs.
	plain := clusterOf(10_000)
	c := &scaleCluster{Services: map[model.ServiceKey]*model.Service{}, Keys: plain.Keys}
	for k, svc := range plain.Services {
		cp := *svc
		cp.EditRare().AffinityTimeout = time.Hour
		c.Services[k] = &cp
	}
	if _, err := p.Full(c.Services); err != nil {
		t.Fatal(err)
	}
	noDrift(t, p, ch, "the cold sync")
	holding.Store(true)
	// The watcher waits in a receive begun before: another program's
	// transaction (a table not nftgate's: no drift) has it return, and
	// it is held before its next. Else it would read the flush as it
	// is announced, and on a loaded machine overflow twice, the second
	// loss coming after the repair.
	nftList(t, ns, "add", "table", "ip", "wake")
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the watcher did not come back from its receive")
	}
	nftList(t, ns, "flush", "ruleset")
	holding.Store(false)
	close(hold)
	deadline := time.After(30 * time.Second)
	for lost := false; !lost; {
		select {
		case d := <-ch:
			lost = d.Lost
		case <-deadline:
			t.Fatal("the flush of 10,000 Services' tables did not overflow the notification socket; the test needs it to")
		}
	}
	res, err := p.Full(c.Services)
	if err != nil || res.ReadTables != len(p.tables.Refs) || res.Messages <= muteAbove {
		t.Fatalf("repair after the flush: %+v, %v; want every table read back and recreated", res, err)
	}
	// Wait out the announcements the flush left queued.
	g, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	if !p.watch.caughtUp(g, 5*time.Second, nil) {
		t.Fatalf("notifications did not catch up with generation %d after the repair", g)
	}
	for {
		select {
		case d := <-ch:
			if d.Lost {
				t.Fatalf("notifications lost again after the repair: its own batch was announced")
			}
			t.Fatalf("a drift reported after the repair: %v (announcements of the flush the read-back covered)", d)
		default:
		}
		break
	}
	// The next drift, one map element deleted by hand, is repaired by
	// reading just that: nothing of the flush is left to be taken for it.
	repairOneElement(t, ns, p, ch, c, "after the flush's repair")
}

// The notifications of nftgate's own transactions stay in the kernel, all
// but each transaction's NEWGEN: the socket receives one message per
// generation of nftgate's, however many changes each commits, and another
// program's changes still arrive whole.
func TestOwnNotificationsFiltered(t *testing.T) {
	ns, p := testProgrammer(t)
	ch := watchDrifts(t, p)
	services := map[model.ServiceKey]*model.Service{}
	for i := range 20 {
		svc := webService(fmt.Sprintf("198.18.2.%d", 10+i))
		svc.Key, svc.ClusterIPs[0] = model.NewServiceKey(svc.Key.Namespace(), fmt.Sprintf("web-%d", i)), svc.ClusterIPs[0].Next()
		for range i {
			svc.ClusterIPs[0] = svc.ClusterIPs[0].Next()
		}
		services[svc.Key] = svc
	}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	noDrift(t, p, ch, "the first full sync")
	gen0, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	received0 := p.watch.received.Load()
	for round := range 5 {
		changed := map[model.ServiceKey]*model.Service{}
		for k, svc := range services {
			moved := *svc
			moved.Ports = slices.Clone(svc.Ports)
			moved.Ports[0].Endpoints = slices.Clone(svc.Ports[0].Endpoints)
			moved.Ports[0].Endpoints[0].Port = uint16(9000 + round)
			changed[k], services[k] = &moved, &moved
		}
		if _, err := p.Partial(changed); err != nil {
			t.Fatal(err)
		}
	}
	noDrift(t, p, ch, "nftgate's partial syncs")
	gen1, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	if got, gens := p.watch.received.Load()-received0, uint64(gen1-gen0); gens == 0 || got > gens {
		t.Fatalf("received %d notifications of %d transactions of nftgate's own; want one each (their NEWGEN)", got, gens)
	}

	var table string
	for k := range services {
		table = p.cfg.TableOf(k)
		break
	}
	received0 = p.watch.received.Load()
	nftList(t, ns, "add", "chain", "ip", table, "someone-elses")
	if d := nextDrift(t, ch, "adding a chain"); !strings.Contains(d.String(), "added or changed chain someone-elses") {
		t.Fatalf("reported %q; want the chain added", d)
	}
	if got := p.watch.received.Load() - received0; got < 2 {
		t.Fatalf("received %d notifications of another program's transaction; want its change and its NEWGEN", got)
	}
}

// TestLateLossSettledByQuietSync: a loss of notifications received after
// the read-back that covered it (the overflow of a flush at 100,000
// Services is still being received while the repair reads), followed by a
// full sync that finds the kernel at nftgate's own last generation, leaves
// nothing behind: the next drift, one map element, is repaired by reading
// its one table, not every table.
func TestLateLossSettledByQuietSync(t *testing.T) {
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(scaleConfig(), Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ch := watchDrifts(t, p)
	c := clusterOf(100)
	if _, err := p.Full(c.Services); err != nil {
		t.Fatal(err)
	}
	noDrift(t, p, ch, "the cold sync")
	g, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	// The loss as the watcher notes an overflow: at the generation read
	// then, which nftgate's own last commit is.
	p.watch.update(func() {
		p.watch.lost()
		p.watch.seen(g)
	})
	res, err := p.Full(c.Services)
	if err != nil || res.ReadBack {
		t.Fatalf("full sync with the kernel at nftgate's own generation: %+v, %v; want no read-back", res, err)
	}
	repairOneElement(t, ns, p, ch, c, "after a settled loss")

	// A loss noted for a later transaction than nftgate's own last one
	// stays: the next full sync reads every table.
	if g, err = p.batch.generation(); err != nil {
		t.Fatal(err)
	}
	p.watch.update(func() {
		p.watch.lost()
		p.watch.seen(g + 1)
	})
	p.watch.settle(g)
	p.watch.mu.Lock()
	whole := p.watch.whole
	p.watch.mu.Unlock()
	if !whole {
		t.Fatalf("a loss noted after generation %d was forgotten when settling at it", g)
	}
}

// repairOneElement deletes the service-ips element of c's first Service by
// hand, waits for its report as that one change, and checks that the full
// sync repairing it reads just its table.
func repairOneElement(t *testing.T, ns string, p *Programmer, ch <-chan Drift, c *scaleCluster, when string) {
	t.Helper()
	table := p.tables.Refs[p.tables.Shard(ruleset.IPv4, c.Keys[0])].Name
	svc := c.Services[c.Keys[0]]
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs,
		fmt.Sprintf("{ %s . %s . %d }", svc.ClusterIPs[0], strings.ToLower(svc.Ports[0].Protocol.KubeName()), svc.Ports[0].Port))
	select {
	case d := <-ch:
		if d.Lost || len(d.Changes) != 1 {
			t.Fatalf("the element's deletion reported as %+v, want that one change", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the element's deletion was not reported")
	}
	if res, err := p.Full(c.Services); err != nil || res.ReadTables != 1 {
		t.Fatalf("repair of one element %s: %+v, %v; want its one table read", when, res, err)
	}
}
