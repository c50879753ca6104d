package statesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// fakeKernel is a conntrack table in memory: the sync's logic is what
// these tests are about; the kernel side has its own tests.
type fakeKernel struct {
	mu      sync.Mutex
	table   map[flowKey]Entry
	writes  int // Write calls
	adopted int
	evs     chan []Event
	lost    chan int
	// updated counts the Updates of each flow.
	updated map[flowKey]int
	// dumps counts the Dumps; read the entries Get was asked for.
	dumps int
	read  []Entry
	// gate, when set, holds every Write until it is closed.
	gate chan struct{}
	// duringDump, when set, runs once in the next Dump, after the table
	// was read and before it is handed over.
	duringDump func()
	// ends, for the flows it names, is when the entry expires: Dump
	// reports its timeout counting down, in whole seconds rounded down as
	// the kernel does, and leaves it out once expired.
	ends map[flowKey]time.Time
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{table: map[flowKey]Entry{}, updated: map[flowKey]int{}, evs: make(chan []Event, 1024), lost: make(chan int, 1)}
}

func (k *fakeKernel) Listen(ctx context.Context, deliver func([]Event), lost func(int)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case evs := <-k.evs:
			deliver(evs)
		case n := <-k.lost:
			lost(n)
		}
	}
}

func (k *fakeKernel) Dump(fn func(Entry)) error {
	k.mu.Lock()
	k.dumps++
	es := make([]Entry, 0, len(k.table))
	for key, e := range k.table {
		if e, ok := k.liveLocked(key, e); ok {
			es = append(es, e)
		}
	}
	during := k.duringDump
	k.duringDump = nil
	k.mu.Unlock()
	if during != nil {
		during()
	}
	for _, e := range es {
		fn(e)
	}
	return nil
}

// liveLocked is the entry of key now: its timeout counting down, not ok
// once expired (ends). k.mu is held.
func (k *fakeKernel) liveLocked(key flowKey, e Entry) (Entry, bool) {
	if end, ok := k.ends[key]; ok {
		left := time.Until(end)
		if left <= 0 {
			return e, false
		}
		e.Timeout = uint32(left / time.Second)
	}
	return e, true
}

func (k *fakeKernel) Get(es []Entry, fn func(Entry)) error {
	k.mu.Lock()
	k.read = append(k.read, es...)
	var out []Entry
	for _, want := range es {
		key := keyOf(&want)
		if e, ok := k.table[key]; ok {
			if e, ok := k.liveLocked(key, e); ok {
				out = append(out, e)
			}
		}
	}
	k.mu.Unlock()
	for _, e := range out {
		fn(e)
	}
	return nil
}

func (k *fakeKernel) Write(puts, dels []Entry) []error {
	k.mu.Lock()
	gate := k.gate
	k.mu.Unlock()
	if gate != nil {
		<-gate
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writes++
	for _, e := range dels { // first, as the kernel's Write
		delete(k.table, keyOf(&e))
	}
	for _, e := range puts {
		e.Mark |= ReplicaMark
		k.table[keyOf(&e)] = e
	}
	return make([]error, len(puts)+len(dels))
}

func (k *fakeKernel) Update(puts []Entry) []error {
	k.mu.Lock()
	for _, e := range puts {
		k.updated[keyOf(&e)]++
	}
	k.mu.Unlock()
	return k.Write(puts, nil)
}

func (k *fakeKernel) Adopt(es []Entry) []error {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]error, len(es))
	for i, e := range es {
		got, ok := k.table[keyOf(&e)]
		if !ok || got.Mark&ReplicaMark == 0 {
			out[i] = fmt.Errorf("no replica")
			continue
		}
		got.Mark &^= ReplicaMark
		k.table[keyOf(&e)] = got
		k.adopted++
	}
	return out
}

// emit makes e this gateway's own entry (or removes it) and reports the
// event.
func (k *fakeKernel) emit(t EventType, es ...Entry) {
	evs := make([]Event, len(es))
	k.mu.Lock()
	for i, e := range es {
		if t == EventDestroy {
			delete(k.table, keyOf(&e))
		} else {
			k.table[keyOf(&e)] = e
		}
		evs[i] = Event{Type: t, Entry: e}
	}
	k.mu.Unlock()
	k.evs <- evs
}

func (k *fakeKernel) get(e Entry) (Entry, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	got, ok := k.table[keyOf(&e)]
	return got, ok
}

func (k *fakeKernel) replicas() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, e := range k.table {
		if e.Mark&ReplicaMark != 0 {
			n++
		}
	}
	return n
}

var testKey = []byte("0123456789abcdef0123456789abcdef")

// gw is one gateway: a real gateways.Set on loopback, a Syncer and its
// fake kernel.
type gw struct {
	name   string
	addr   string
	k      *fakeKernel
	set    *gateways.Set
	s      *Syncer
	cancel context.CancelFunc
	done   chan error
}

// cluster is a gateway set on loopback: heartbeats every 20ms, dead after
// 100ms.
type cluster struct {
	t     *testing.T
	addrs map[string]string
	gws   map[string]*gw
	opts  func(*Options)
}

func newCluster(t *testing.T, opts func(*Options), names ...string) *cluster {
	ignore := goleak.IgnoreCurrent()
	c := &cluster{t: t, addrs: map[string]string{}, gws: map[string]*gw{}, opts: opts}
	lns := map[string]net.Listener{}
	for _, n := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[n], c.addrs[n] = ln, ln.Addr().String()
	}
	t.Cleanup(func() {
		for _, g := range c.gws {
			c.stop(g.name)
		}
		goleak.VerifyNone(t, ignore)
	})
	for _, n := range names {
		c.start(n, lns[n], testKey)
	}
	return c
}

func (c *cluster) start(name string, ln net.Listener, key []byte) *gw {
	t := c.t
	t.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", c.addrs[name]); err != nil {
			t.Fatal(err)
		}
	}
	// A peer is dead after a second without a word: short enough for the
	// tests that kill one, long enough that a loaded machine (-race, other
	// tests) does not make a live one look dead.
	cfg := gateways.Config{Name: name, KeyFile: "k", HeartbeatInterval: 50 * time.Millisecond, DeadAfter: 20, StartupWait: 50 * time.Millisecond}
	var peers []string
	for n, a := range c.addrs {
		if n != name {
			cfg.Peers = append(cfg.Peers, gateways.PeerConfig{Name: n, Addresses: []string{a}})
			peers = append(peers, n)
		}
	}
	o := Options{Kernel: newFakeKernel(), Policy: testPolicy(), Self: name, Peers: peers, PeerWait: 300 * time.Millisecond, ReadyWait: 5 * time.Second}
	if c.opts != nil {
		c.opts(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	set, err := gateways.New(cfg, gateways.Options{Key: key, Listener: ln, OnPeer: s.PeerChanged})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Attach(set); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gw{name: name, addr: c.addrs[name], k: o.Kernel.(*fakeKernel), set: set, s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- s.Run(ctx) }()
	c.gws[name] = g
	return g
}

// stop ends a gateway as a crash would, for its peers: the channel goes
// silent.
func (c *cluster) stop(name string) {
	g := c.gws[name]
	if g == nil {
		return
	}
	delete(c.gws, name)
	g.cancel()
	if err := <-g.done; err != nil {
		c.t.Errorf("%s: Run: %v", name, err)
	}
	g.set.Close()
}

func eventually(t *testing.T, fn func() error) {
	t.Helper()
	if err := lab.EventuallyWithin(10*time.Second, fn); err != nil {
		t.Fatal(err)
	}
}

func waitReady(t *testing.T, gs ...*gw) {
	t.Helper()
	for _, g := range gs {
		select {
		case <-g.s.Ready():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not ready", g.name)
		}
	}
}

func waitUp(t *testing.T, g *gw, peers ...string) {
	t.Helper()
	eventually(t, func() error {
		st := g.s.Status()
		for _, p := range st.Peers {
			if slices.Contains(peers, p.Name) && (!p.Up || p.Resyncing) {
				return fmt.Errorf("%s: peer %s up %v resyncing %v", g.name, p.Name, p.Up, p.Resyncing)
			}
		}
		return nil
	})
}

func hasReplica(k *fakeKernel, e Entry) error {
	got, ok := k.get(e)
	if !ok {
		return fmt.Errorf("no replica of %v", e.Orig)
	}
	if got.Mark&ReplicaMark == 0 {
		return fmt.Errorf("%v: not a replica (mark %#x)", e.Orig, got.Mark)
	}
	want := e
	want.Mark |= ReplicaMark
	if got != want {
		return fmt.Errorf("replica %+v, want %+v", got, want)
	}
	return nil
}

// replicaGone: k holds no replica of e (its entry's DESTROY removed it).
func replicaGone(k *fakeKernel, e Entry) error {
	if _, ok := k.get(e); ok {
		return fmt.Errorf("the replica of %v is left after its entry's DESTROY", e.Orig)
	}
	return nil
}

// pair starts gateways gw-a and gw-b with opts and waits until each has
// the other up.
func pair(t *testing.T, opts func(*Options)) (c *cluster, a, b *gw) {
	t.Helper()
	c = newCluster(t, opts, "gw-a", "gw-b")
	a, b = c.gws["gw-a"], c.gws["gw-b"]
	waitUp(t, a, "gw-b")
	waitUp(t, b, "gw-a")
	return c, a, b
}

// newFlows is n flows from client ports first, first+1, ...
func newFlows(first, n int) []Entry {
	var out []Entry
	for i := range n {
		out = append(out, flow(uint16(first+i)))
	}
	return out
}

// stall holds every Write of k until the returned function is called.
func (k *fakeKernel) stall() (release func()) {
	gate := make(chan struct{})
	k.mu.Lock()
	k.gate = gate
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		k.gate = nil
		k.mu.Unlock()
		close(gate)
	}
}

// waitLost waits until g counts updates for its first peer lost.
func waitLost(t *testing.T, g *gw) {
	t.Helper()
	eventually(t, func() error {
		if st := g.s.Status().Peers[0]; st.Lost == 0 {
			return fmt.Errorf("nothing lost yet: %+v", st)
		}
		return nil
	})
}

// emitDuringDump has g's next Dump emit an event of type et for e and
// wait until g's Syncer took it (its flow count moved by delta): the event
// comes after the kernel read its part of the table.
func emitDuringDump(t *testing.T, g *gw, et EventType, e Entry, delta int) {
	before := g.s.Status().Flows
	g.k.mu.Lock()
	g.k.duringDump = func() {
		g.k.emit(et, e)
		// Dump runs in the Syncer's goroutine: no t.Fatal here.
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			if got := g.s.Status().Flows; got != before+delta {
				return fmt.Errorf("%d flows, want %d: the event not taken yet", got, before+delta)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	g.k.mu.Unlock()
}

// waitDumped waits until g's kernel ran the Dump set up by
// emitDuringDump.
func waitDumped(t *testing.T, g *gw) {
	t.Helper()
	eventually(t, func() error {
		g.k.mu.Lock()
		defer g.k.mu.Unlock()
		if g.k.duringDump != nil {
			return fmt.Errorf("no refresh pass yet")
		}
		return nil
	})
}

// replicate emits e as a new flow on a and waits for its replica on b
// (and so for what a queued for b before it).
func replicate(t *testing.T, a, b *gw, e Entry) {
	t.Helper()
	a.k.emit(EventNew, e)
	eventually(t, func() error { return hasReplica(b.k, e) })
}

// waitNextPass waits for g's next refresh pass from now: a full one, or
// (full false) one of either kind.
func waitNextPass(t *testing.T, g *gw, full bool) {
	t.Helper()
	count := func() float64 {
		n := testutil.ToFloat64(g.s.m.passes.WithLabelValues(readTable))
		if !full {
			n += testutil.ToFloat64(g.s.m.passes.WithLabelValues(readDue))
		}
		return n
	}
	want := count() + 1
	eventually(t, func() error {
		if got := count(); got < want {
			return fmt.Errorf("%v refresh passes, want %v", got, want)
		}
		return nil
	})
}

// An event on A reaches B's kernel within a batch; a state change follows;
// an update that changes nothing is not sent; a destroy deletes the
// replica.
func TestSyncEventReachesPeer(t *testing.T) {
	_, a, b := pair(t, nil)
	e := flow(1000)
	e.TCP.State = 1 // SYN_SENT
	replicate(t, a, b, e)
	e.TCP.State = 3 // ESTABLISHED
	a.k.emit(EventUpdate, e)
	eventually(t, func() error { return hasReplica(b.k, e) })
	sent := a.s.Status().Peers[0].Sent
	quiet := e
	quiet.Timeout = 99 // only the timeout: nothing that matters
	a.k.emit(EventUpdate, quiet)
	replicate(t, a, b, flow(1001))
	if got := a.s.Status().Peers[0].Sent; got != sent+1 {
		t.Errorf("sent %d entries after the quiet update and another flow's NEW, want 1 (the NEW only)", got-sent)
	}
	a.k.emit(EventDestroy, e)
	eventually(t, func() error {
		if _, ok := b.k.get(e); ok {
			return fmt.Errorf("replica still there after the destroy")
		}
		return nil
	})
	st := a.s.Status().Peers[0]
	if st.LagSeconds <= 0 || st.LagSeconds > 5 {
		t.Errorf("lag %v", st.LagSeconds)
	}
}

// An SCTP association's replica follows its state and verification tags:
// the INIT gives the reply direction's tag, the INIT-ACK the original
// direction's without a change of state, and that change is sent too (a
// replica without it takes the association's packets for invalid).
func TestSyncSCTPTagsReachPeer(t *testing.T) {
	_, a, b := pair(t, nil)
	e := flow(1000)
	e.Proto, e.TCP = protoSCTP, TCPInfo{}
	e.Orig.Dst = netip.AddrPortFrom(vip, 3868)
	e.SCTP = SCTPInfo{State: 2, VTagReply: 0x1234abcd} // COOKIE_WAIT after the INIT
	replicate(t, a, b, e)
	e.SCTP.VTagOrig = 0x5678ef01 // the INIT-ACK: still COOKIE_WAIT
	a.k.emit(EventUpdate, e)
	eventually(t, func() error { return hasReplica(b.k, e) })
	e.SCTP.State = 4 // ESTABLISHED
	a.k.emit(EventUpdate, e)
	eventually(t, func() error { return hasReplica(b.k, e) })
}

// Updates of one flow waiting for a batch are coalesced: the latest state
// wins, and many flows go in few writes.
func TestSyncCoalescesAndBatches(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.BatchInterval = 200 * time.Millisecond })
	b.k.mu.Lock()
	before := b.k.writes
	b.k.mu.Unlock()
	flows := newFlows(2000, 500)
	a.k.emit(EventNew, flows...)
	last := flows[7]
	for st := uint8(2); st <= 5; st++ { // SYN_RECV … FIN_WAIT
		last.TCP.State = st
		a.k.emit(EventUpdate, last)
	}
	eventually(t, func() error {
		if n := b.k.replicas(); n != len(flows) {
			return fmt.Errorf("%d replicas, want %d", n, len(flows))
		}
		return hasReplica(b.k, last)
	})
	b.k.mu.Lock()
	writes := b.k.writes - before
	b.k.mu.Unlock()
	if writes > 3 {
		t.Errorf("%d writes for 500 flows in one batch interval", writes)
	}
	if sent := a.s.Status().Peers[0].Sent; sent != uint64(len(flows)) {
		t.Errorf("sent %d entries, want %d (each flow once: its updates coalesced)", sent, len(flows))
	}
}

// A queue that overflows drops its updates, counts them, and the peer gets
// a full resync that brings it every live entry.
func TestSyncQueueOverflowResyncs(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.Queue = 100 })
	// B's kernel stalls: the window fills, then the queue.
	release := b.k.stall()
	flows := newFlows(10000, 5000)
	for _, f := range flows {
		a.k.emit(EventNew, f)
	}
	waitLost(t, a)
	release()
	eventually(t, func() error {
		for _, f := range flows {
			if err := hasReplica(b.k, f); err != nil {
				return err
			}
		}
		return nil
	})
	st := a.s.Status().Peers[0]
	if st.ResyncsSent < 2 || st.Lost == 0 {
		t.Errorf("after the overflow: %+v, want a second resync and losses counted", st)
	}
}

// Replicas whose deletes were lost (here: flows that leave A's table
// without an event) are deleted on B when A's next full resync leaves them
// out; the rest stay.
func TestSyncResyncSweepsLostDeletes(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.Queue = 100 })
	old := newFlows(20000, 50)
	a.k.emit(EventNew, old...)
	eventually(t, func() error {
		if n := b.k.replicas(); n != 50 {
			return fmt.Errorf("b holds %d replicas", n)
		}
		return nil
	})
	// Half of them end on A, their DESTROYs lost.
	a.k.mu.Lock()
	for _, f := range old[:25] {
		delete(a.k.table, keyOf(&f))
	}
	a.k.mu.Unlock()
	// An overflow makes A resync B in full.
	release := b.k.stall()
	for _, f := range newFlows(30000, 5000) {
		a.k.emit(EventNew, f)
	}
	waitLost(t, a)
	release()
	eventually(t, func() error {
		for _, f := range old[:25] {
			if hasReplica(b.k, f) == nil {
				return fmt.Errorf("b still holds %v, which a no longer has", f.Orig)
			}
		}
		for _, f := range old[25:] {
			if err := hasReplica(b.k, f); err != nil {
				return err
			}
		}
		if st := b.s.Status(); st.Swept < 25 {
			return fmt.Errorf("swept %d", st.Swept)
		}
		return nil
	})
}

// A flow whose event comes while the dump of a resync is read (after the
// kernel read its part of the table) is neither in the dump nor dropped
// with the queue the dump supersedes: it reaches the peer.
func TestSyncEventDuringResyncDumpKept(t *testing.T) {
	_, a, b := pair(t, nil)
	old := flow(3000)
	replicate(t, a, b, old)
	late := flow(3001)
	emitDuringDump(t, a, EventNew, late, +1)
	a.k.lost <- 1 // events lost: a full resync of B
	eventually(t, func() error {
		if st := a.s.Status().Peers[0]; st.ResyncsSent < 2 {
			return fmt.Errorf("no second resync yet: %+v", st)
		}
		return nil
	})
	eventually(t, func() error { return hasReplica(b.k, late) })
}

// A flow that ends while a resync's dump is read is in the dump (a put)
// and in the queue (a delete) that follows it in the same batch: the
// delete wins, its replica is not left behind.
func TestSyncDestroyDuringResyncDumpWins(t *testing.T) {
	_, a, b := pair(t, nil)
	gone := flow(3100)
	replicate(t, a, b, gone)
	emitDuringDump(t, a, EventDestroy, gone, -1)
	a.k.lost <- 1 // events lost: a full resync of B
	eventually(t, func() error {
		if st := a.s.Status().Peers[0]; st.ResyncsSent < 2 || st.Resyncing {
			return fmt.Errorf("the second resync not done yet: %+v", st)
		}
		return nil
	})
	replicate(t, a, b, flow(3101))
	if _, ok := b.k.get(gone); ok {
		t.Errorf("the replica of %v is left after its flow ended during the resync", gone.Orig)
	}
}

// A flow whose event comes while a refresh pass reads the table is kept
// as sent: the pass does not take it for gone (and send it again at the
// next as never sent).
func TestSyncRefreshKeepsFlowsBornDuringItsDump(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval, o.FullRefreshEvery = time.Second, 1 })
	born := flow(3300)
	emitDuringDump(t, a, EventNew, born, +1)
	waitDumped(t, a)
	eventually(t, func() error { return hasReplica(b.k, born) })
	waitNextPass(t, a, true)
	if n := testutil.ToFloat64(a.s.m.refreshed); n != 0 {
		t.Errorf("%v entries refreshed: the flow born during a pass's dump was sent again", n)
	}
}

// An entry whose timeout only counts down is not sent again by the
// refresh: the kernel gives timeouts in whole seconds rounded down, so at a
// pass the entry seems to live up to a second longer than its event said.
// That is no reason to resend it (at 10,000 connections a second every
// entry in CLOSE was, once a pass).
func TestSyncRefreshSkipsEntriesThatOnlyCountDown(t *testing.T) {
	// No pass but the test's own.
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Hour })
	e := flow(3200)
	e.Timeout = 2
	// The kernel's entry has 2.95 s left, said as 2 (whole seconds
	// rounded down), and counts down from then on: it ends when it did,
	// less than a second past its replica, whenever the pass comes.
	end := time.Now().Add(2950 * time.Millisecond)
	a.k.mu.Lock()
	a.k.ends = map[flowKey]time.Time{keyOf(&e): end}
	a.k.mu.Unlock()
	replicate(t, a, b, e)
	// The pass comes when the kernel says 1 (1.45 s left): the entry
	// outlives its replica by half a second, which is the rounding.
	time.Sleep(time.Until(end.Add(-1450 * time.Millisecond)))
	a.s.refresh()
	if n := testutil.ToFloat64(a.s.m.refreshed); n != 0 {
		t.Errorf("%v entries refreshed: one that only counts down was sent again", n)
	}
}

// A flow that ends while a refresh pass reads the table (it is in the
// dump) is not sent again as if it had never been: its replica, deleted by
// the DESTROY, is not written back (where it would hold its reply tuple
// against the flow the origin gives it to next).
func TestSyncRefreshSkipsFlowsEndedDuringItsDump(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval, o.FullRefreshEvery = time.Second, 1 })
	ended := flow(3400)
	replicate(t, a, b, ended)
	emitDuringDump(t, a, EventDestroy, ended, -1)
	waitDumped(t, a)
	waitNextPass(t, a, true)
	replicate(t, a, b, flow(3401))
	if _, ok := b.k.get(ended); ok {
		t.Errorf("the replica of %v was written back after its flow ended", ended.Orig)
	}
}

// duePass runs a refresh pass between full ones on g and returns the
// entries it read by tuple and how many times it read the table.
func duePass(g *gw) (read []Entry, dumps int) {
	g.k.mu.Lock()
	g.k.read = nil
	before := g.k.dumps
	g.k.mu.Unlock()
	g.s.refreshDue()
	g.k.mu.Lock()
	defer g.k.mu.Unlock()
	return g.k.read, g.k.dumps - before
}

// udpFlow is a UDP flow to the Service's DNS port, with timeout left.
func udpFlow(n uint16, timeout uint32) Entry {
	e := flow(n)
	e.Proto, e.TCP, e.Timeout = 17, TCPInfo{}, timeout
	e.Orig.Dst = netip.AddrPortFrom(vip, 53)
	return e
}

// A UDP flow whose entry lives longer than its replica (traffic the
// events do not tell of) is sent again; a TCP connection that is over
// (CLOSE, TIME_WAIT) is not, though a late packet lengthened its entry:
// its replica may go first, nothing is lost with it.
func TestSyncRefreshResendsLiveFlowsOnly(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Second })
	udp := udpFlow(3500, 2)
	closed := flow(3501)
	closed.TCP.State, closed.Timeout = 8, 2 // CLOSE
	a.k.emit(EventNew, udp, closed)
	eventually(t, func() error { return errors.Join(hasReplica(b.k, udp), hasReplica(b.k, closed)) })
	// Both live 5 s more now.
	a.k.mu.Lock()
	for _, e := range []Entry{udp, closed} {
		e.Timeout = 7
		a.k.table[keyOf(&e)] = e
	}
	a.k.mu.Unlock()
	eventually(t, func() error {
		if got, _ := b.k.get(udp); got.Timeout != 7 {
			return fmt.Errorf("the UDP flow's replica has timeout %d, want 7 (refreshed)", got.Timeout)
		}
		return nil
	})
	waitNextPass(t, a, false)
	if n := testutil.ToFloat64(a.s.m.refreshed); n != 1 {
		t.Errorf("%v entries refreshed, want 1 (the UDP flow, not the closed connection)", n)
	}
	if got, _ := b.k.get(closed); got.Timeout != 2 {
		t.Errorf("the closed connection's replica has timeout %d: sent again", got.Timeout)
	}
}

// A refresh pass between full ones reads from the kernel only the entries
// whose replicas would expire and which may live on: here the UDP flow,
// not the established connection (its replica has days left) nor the
// closed one (over). It sends the UDP flow again, which lives longer than
// its replica, and reads no table.
func TestSyncRefreshBetweenFullPassesReadsOnlyEntriesDue(t *testing.T) {
	// No pass but the test's own.
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Minute })
	udp := udpFlow(3900, 30)
	established := flow(3901)
	established.Timeout = 432000
	closed := flow(3902)
	closed.TCP.State, closed.Timeout = 7, 60 // TIME_WAIT
	a.k.emit(EventNew, udp, established, closed)
	eventually(t, func() error {
		return errors.Join(hasReplica(b.k, udp), hasReplica(b.k, established), hasReplica(b.k, closed))
	})
	a.k.mu.Lock()
	for _, e := range []Entry{udp, closed} {
		e.Timeout = 100 // both live longer now
		a.k.table[keyOf(&e)] = e
	}
	a.k.mu.Unlock()

	read, dumped := duePass(a)
	if len(read) != 1 || keyOf(&read[0]) != keyOf(&udp) || dumped != 0 {
		t.Errorf("the pass read %v and dumped the table %d times: want the UDP flow alone, no dump", read, dumped)
	}
	eventually(t, func() error {
		if got, _ := b.k.get(udp); got.Timeout != 100 {
			return fmt.Errorf("the UDP flow's replica has timeout %d, want 100 (refreshed)", got.Timeout)
		}
		return nil
	})
	if n := testutil.ToFloat64(a.s.m.refreshed); n != 1 {
		t.Errorf("%v entries refreshed, want 1", n)
	}
	if n := testutil.ToFloat64(a.s.m.read.WithLabelValues(readDue)); n != 1 {
		t.Errorf("nftgate_statesync_refresh_entries_read_total{read=\"due\"} = %v, want 1", n)
	}
}

// When the kernel dropped the events of a flow's end, a refresh pass
// between full ones catches up: a connection now closing (TIME_WAIT) is
// sent once more, so that its replica ends as it does; one gone from the
// table is forgotten. The next pass asks for neither.
func TestSyncRefreshCatchesUpWithLostEnds(t *testing.T) {
	// No pass but the test's own.
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Minute })
	closing, gone, opening := flow(4000), flow(4001), flow(4002)
	for _, e := range []*Entry{&closing, &gone, &opening} {
		e.TCP.State, e.Timeout = 1, 60 // SYN_SENT: due within two passes
	}
	a.k.emit(EventNew, closing, gone, opening)
	// Established ones, not due: the due are fewer than half the flows.
	for i := range 4 {
		e := flow(uint16(4010 + i))
		e.Timeout = 432000
		replicate(t, a, b, e)
	}
	eventually(t, func() error {
		return errors.Join(hasReplica(b.k, closing), hasReplica(b.k, gone), hasReplica(b.k, opening))
	})
	// Their events lost: closing is in TIME_WAIT now, gone has ended.
	a.k.mu.Lock()
	closing.TCP.State, closing.Timeout = 7, 120
	a.k.table[keyOf(&closing)] = closing
	delete(a.k.table, keyOf(&gone))
	a.k.mu.Unlock()

	a.s.refreshDue()
	eventually(t, func() error {
		if got, _ := b.k.get(closing); got.TCP.State != 7 {
			return fmt.Errorf("the closing connection's replica in state %d, want 7 (TIME_WAIT)", got.TCP.State)
		}
		return nil
	})
	if read, _ := duePass(a); len(read) != 1 || keyOf(&read[0]) != keyOf(&opening) {
		t.Errorf("the next pass read %v: want the opening connection alone", read)
	}
	if st := a.s.Status(); st.Flows != 6 {
		t.Errorf("%d flows known, want 6 (the ended one forgotten)", st.Flows)
	}
}

// A pass between full ones reads the whole table when more than half the
// flows are due: a dump costs an entry half what a read by tuple does.
func TestSyncRefreshReadsTheTableWhenMostFlowsAreDue(t *testing.T) {
	// No pass but the test's own.
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Minute })
	due := []Entry{udpFlow(4100, 30), udpFlow(4101, 30)}
	established := flow(4102)
	established.Timeout = 432000
	a.k.emit(EventNew, append(due, established)...)
	eventually(t, func() error {
		return errors.Join(hasReplica(b.k, due[0]), hasReplica(b.k, due[1]), hasReplica(b.k, established))
	})
	if read, dumped := duePass(a); len(read) != 0 || dumped != 1 {
		t.Errorf("two flows of three due: read %v by tuple, %d dumps; want none, one", read, dumped)
	}
}

// One refresh pass in FullRefreshEvery reads the whole table, and so do the
// first and the next after the kernel dropped events or the sync adopted
// a dead peer's entries: only a full pass finds flows never sent.
func TestSyncFullRefreshPasses(t *testing.T) {
	k := newFakeKernel()
	s, err := New(Options{Kernel: k, Policy: testPolicy(), Self: "gw-a", Peers: []string{"gw-b"}, FullRefreshEvery: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []bool
	for range 7 {
		got = append(got, s.fullPassDue())
	}
	s.lostEvents(1)
	got = append(got, s.fullPassDue(), s.fullPassDue())
	s.adopt("gw-b", nil)
	got = append(got, s.fullPassDue(), s.fullPassDue())
	want := []bool{true, false, false, true, false, false, true, true, false, true, false}
	if !slices.Equal(got, want) {
		t.Errorf("full passes %v, want %v", got, want)
	}
}

// A refresh pass that takes long to read the table does not hold the
// batches back: a new flow reaches the peer meanwhile.
func TestSyncSlowRefreshDumpDoesNotHoldBatches(t *testing.T) {
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Second })
	release, dumping := make(chan struct{}), make(chan struct{})
	defer close(release)
	a.k.mu.Lock()
	a.k.duringDump = func() {
		close(dumping)
		<-release
	}
	a.k.mu.Unlock()
	<-dumping
	e := flow(3600)
	replicate(t, a, b, e)
}

// A peer that restarts gets a full resync of every live entry, and its
// Ready closes once it has it.
func TestSyncRestartedPeerResyncedAndReady(t *testing.T) {
	c := newCluster(t, nil, "gw-a", "gw-b", "gw-c")
	a, b := c.gws["gw-a"], c.gws["gw-b"]
	waitReady(t, a, b, c.gws["gw-c"])
	fa, fb := flow(3000), flow(3001)
	a.k.emit(EventNew, fa)
	b.k.emit(EventNew, fb)
	eventually(t, func() error { return hasReplica(c.gws["gw-c"].k, fa) })
	c.stop("gw-c")
	g := c.start("gw-c", nil, testKey)
	waitReady(t, g)
	// Ready means it holds both peers' entries already.
	for _, f := range []Entry{fa, fb} {
		if err := hasReplica(g.k, f); err != nil {
			t.Errorf("ready without %v", err)
		}
	}
	st := g.s.Status()
	for _, p := range st.Peers {
		if !p.ResyncDone || p.ResyncsReceived == 0 {
			t.Errorf("%s: %+v", p.Name, p)
		}
	}
}

// A gateway that restarts hears its peers' resync before its first sync
// fed the Policy: the entries wait for it rather than being refused, and
// it is ready only once they are written.
func TestSyncResyncWaitsForPolicy(t *testing.T) {
	c := newCluster(t, nil, "gw-a", "gw-b")
	a := c.gws["gw-a"]
	waitReady(t, a, c.gws["gw-b"])
	fa := flow(3100)
	fa.Timeout = 400000 // established: no refresh sends it again
	a.k.emit(EventNew, fa)
	eventually(t, func() error { return hasReplica(c.gws["gw-b"].k, fa) })
	sent := a.s.Status().Peers[0].ResyncsSent
	c.stop("gw-b")
	pol := NewPolicy(ruleset.Config{Node: model.Node{Name: "gw"}}, []netip.Addr{masq})
	c.opts = func(o *Options) { o.Policy = pol }
	b := c.start("gw-b", nil, testKey)
	eventually(t, func() error {
		if st := a.s.Status().Peers[0]; !st.Up || st.ResyncsSent == sent || st.Resyncing {
			return fmt.Errorf("a's resync of the restarted b: %+v", st)
		}
		return nil
	})
	select {
	case <-b.s.Ready():
		t.Fatal("ready before the Policy knew the Services")
	default:
	}
	pol.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{webKey: webService()}})
	waitReady(t, b)
	if err := hasReplica(b.k, fa); err != nil {
		t.Error(err)
	}
	if st := b.s.Status().Peers[0]; len(st.Refused) > 0 {
		t.Errorf("refused: %v", st.Refused)
	}
}

// When a peer dies, its flows' replicas are adopted by one survivor (the
// custodian), which refreshes and replicates them from then on.
func TestSyncCustodyOnPeerDeath(t *testing.T) {
	c := newCluster(t, func(o *Options) { o.RefreshInterval = 100 * time.Millisecond }, "gw-a", "gw-b", "gw-c")
	waitReady(t, c.gws["gw-a"], c.gws["gw-b"], c.gws["gw-c"])
	a := c.gws["gw-a"]
	flows := newFlows(4000, 20)
	a.k.emit(EventNew, flows...)
	for _, n := range []string{"gw-b", "gw-c"} {
		eventually(t, func() error { return hasReplica(c.gws[n].k, flows[19]) })
	}
	c.stop("gw-a")
	b, cc := c.gws["gw-b"], c.gws["gw-c"]
	custodian, other := b, cc
	if custodyScore("gw-a", "gw-c") > custodyScore("gw-a", "gw-b") {
		custodian, other = cc, b
	}
	eventually(t, func() error {
		custodian.k.mu.Lock()
		defer custodian.k.mu.Unlock()
		if custodian.k.adopted != len(flows) {
			return fmt.Errorf("%s adopted %d, want %d", custodian.name, custodian.k.adopted, len(flows))
		}
		return nil
	})
	other.k.mu.Lock()
	if other.k.adopted != 0 {
		t.Errorf("%s adopted %d too", other.name, other.k.adopted)
	}
	other.k.mu.Unlock()
	// The custodian is now the origin: a change there reaches the other.
	f := flows[0]
	f.TCP.State = 5
	custodian.k.emit(EventUpdate, f)
	eventually(t, func() error { return hasReplica(other.k, f) })
	if got := custodian.s.Status().Adopted; got != uint64(len(flows)) {
		t.Errorf("status: adopted %d", got)
	}
}

// A dead peer's replicas go into the custody of a live peer whose resync
// to this gateway is under way: that resync, begun before, does not sweep
// them; a replica of the custodian's own it did not send again is swept.
func TestSyncResyncUnderWayKeepsReplicasTakenIntoCustody(t *testing.T) {
	// This gateway's name such that gw-b, not it, is gw-a's custodian.
	self := "gw-c"
	for i := 0; custodyScore("gw-a", self) > custodyScore("gw-a", "gw-b"); i++ {
		self = fmt.Sprintf("gw-c%d", i)
	}
	k := newFakeKernel()
	s, err := New(Options{Kernel: k, Policy: testPolicy(), Self: self, Peers: []string{"gw-a", "gw-b"}})
	if err != nil {
		t.Fatal(err)
	}
	pb := s.peers["gw-b"]
	pb.up = true
	ofA, ofB := flow(5000), flow(5001)
	noErrors(t, "write", k.Write([]Entry{ofA, ofB}, nil))
	s.replicas[keyOf(&ofA)] = replica{origin: s.peers["gw-a"].num}
	s.replicas[keyOf(&ofB)] = replica{origin: pb.num}
	s.resyncBegins(pb)
	s.mu.Lock()
	if adopt := s.custodyLocked("gw-a"); len(adopt) != 0 {
		t.Fatalf("adopted %d here, want gw-b the custodian", len(adopt))
	}
	s.mu.Unlock()
	s.sweep(pb)
	if err := hasReplica(k, ofA); err != nil {
		t.Errorf("gw-a's flow, in gw-b's custody: %v", err)
	}
	if r := s.replicas[keyOf(&ofA)]; r.origin != pb.num {
		t.Errorf("gw-a's flow recorded as peer %d's, want gw-b's (%d)", r.origin, pb.num)
	}
	if hasReplica(k, ofB) == nil {
		t.Errorf("gw-b's flow it did not send again is still here")
	}
	if got := s.Status().Swept; got != 1 {
		t.Errorf("swept %d, want 1", got)
	}
}

// A peer sending entries for addresses this gateway does not serve (gw-a
// serves an address gw-b does not): they are refused, counted by reason,
// and nothing is written.
func TestSyncRefusesEntriesNotServed(t *testing.T) {
	_, a, b := pair(t, func(o *Options) {
		if o.Self == "gw-a" {
			svc := webService()
			svc.EditRare().LoadBalancerIPs = append(svc.LoadBalancerIPs(), netip.MustParseAddr("192.0.2.99"))
			o.Policy = NewPolicy(ruleset.Config{Node: model.Node{Name: "gw"}}, []netip.Addr{masq})
			o.Policy.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{webKey: svc}})
		}
	})
	bad := flow(5000)
	bad.Orig.Dst = netip.MustParseAddrPort("192.0.2.99:80")
	stranger := flow(5001)
	stranger.Reply.Dst = netip.MustParseAddrPort("203.0.113.200:5001")
	a.k.emit(EventNew, bad, stranger)
	eventually(t, func() error {
		st := b.s.Status().Peers[0]
		if st.Refused[RefusedDestination] != 1 || st.Refused[RefusedReplyDst] != 1 {
			return fmt.Errorf("refused %v", st.Refused)
		}
		return nil
	})
	if n := b.k.replicas(); n != 0 {
		t.Errorf("%d replicas written", n)
	}
}

// This gateway's own flows to a node port are not sent: the peers never
// see them (no refusal there), and they are counted here by reason, at
// their NEW event only; their DESTROY is not sent either.
func TestSyncNodePortFlowsNotReplicated(t *testing.T) {
	_, a, b := pair(t, nil)
	np := nodePortFlow(6000)
	a.k.emit(EventNew, *np)
	a.k.emit(EventUpdate, func() Entry { e := *np; e.TCP.State = 4; return e }())
	replicate(t, a, b, flow(6001))
	a.k.emit(EventDestroy, *np)
	replicate(t, a, b, flow(6002))
	if st := a.s.Status(); st.NotReplicated[NotReplicatedNodePort] != 1 || st.Peers[0].Sent != 2 {
		t.Errorf("not replicated %v, sent %d: want node_port 1 and the 2 other flows sent", st.NotReplicated, st.Peers[0].Sent)
	}
	if _, ok := b.k.get(*np); ok {
		t.Error("the node-port flow has a replica")
	}
	if st := b.s.Status().Peers[0]; len(st.Refused) != 0 {
		t.Errorf("the peer refused %v, want nothing (nothing sent)", st.Refused)
	}
}

// A flow both gateways originated (each saw its first packets, as while
// an address moves) stays each one's own: neither overwrites the other's
// entry with a replica nor deletes it.
func TestSyncKeepsOwnFlows(t *testing.T) {
	_, a, b := pair(t, nil)
	f := flow(7000)
	b.k.emit(EventNew, f)
	eventually(t, func() error {
		if st := a.s.Status().Peers[0]; st.Received != 1 {
			return fmt.Errorf("a received %d", st.Received)
		}
		return nil
	})
	// a took b's entry as a replica; now a's kernel sees the flow's
	// packets itself and owns it, and b's later update must not turn it
	// back into a replica.
	a.k.emit(EventNew, f)
	b.k.emit(EventUpdate, func() Entry { g := f; g.TCP.State = 5; return g }())
	b.k.emit(EventDestroy, f)
	eventually(t, func() error {
		// b coalesces the update and the delete per flow: one or both
		// arrive, each after the first refused.
		st := a.s.Status().Peers[0]
		if st.Refused[RefusedOwn] == 0 || st.Refused[RefusedOwn] != st.Received-1 || b.s.Status().Peers[0].Queue != 0 {
			return fmt.Errorf("a refused %v of %d received", st.Refused, st.Received)
		}
		return nil
	})
	a.k.mu.Lock()
	e, ok := a.k.table[keyOf(&f)]
	a.k.mu.Unlock()
	if !ok || e.Mark&ReplicaMark != 0 || e.TCP.State == 5 {
		t.Errorf("a's own entry after b's update and delete: present %v, %+v", ok, e)
	}
}

// A gateway with the wrong key never reaches the Syncer: the channel
// refuses it, and nothing it sends is written.
func TestSyncWrongKeyNeverReachesSyncer(t *testing.T) {
	c := newCluster(t, nil, "gw-a", "gw-b")
	b := c.gws["gw-b"]
	// b saw the first gw-a up (else its late news could be taken for
	// the keyless one), and sees it die before the keyless one dials.
	waitUp(t, b, "gw-a")
	c.stop("gw-a")
	eventually(t, func() error {
		if st := b.s.Status().Peers[0]; st.Up {
			return fmt.Errorf("gw-a still up at b")
		}
		return nil
	})
	a := c.start("gw-a", nil, []byte("another key, another key, another key"))
	a.k.emit(EventNew, flow(6000))
	eventually(t, func() error {
		for _, p := range b.set.Status().Peers {
			if p.RefusedHellos > 0 {
				return nil
			}
		}
		return fmt.Errorf("no hello refused yet")
	})
	if st := b.s.Status().Peers[0]; st.Up || st.Received != 0 {
		t.Errorf("b's sync with the keyless peer: %+v", st)
	}
	if n := b.k.replicas(); n != 0 {
		t.Errorf("%d replicas written", n)
	}
}

// A refresh pass over a large table lets the kernel's events in between
// its chunks: deliver does not wait for the whole pass.
func TestSyncRefreshLetsEventsInBetween(t *testing.T) {
	k := newFakeKernel()
	s, err := New(Options{Kernel: k, Policy: testPolicy(), Self: "gw-a", Peers: []string{"gw-b"}})
	if err != nil {
		t.Fatal(err)
	}
	s.peers["gw-b"].up = true
	for _, e := range newFlows(1, 3*refreshChunk) {
		k.table[keyOf(&e)] = e
	}
	late := flow(60000)
	var delivered bool
	chunks := 0
	testHookRefreshChunk = func() {
		chunks++
		if chunks != 1 {
			return
		}
		done := make(chan struct{})
		go func() {
			s.deliver([]Event{{Type: EventNew, Entry: late}})
			close(done)
		}()
		select {
		case <-done:
			delivered = true
		case <-time.After(10 * time.Second):
		}
	}
	t.Cleanup(func() { testHookRefreshChunk = nil })
	s.refresh()
	if !delivered {
		t.Fatal("an event waited for the whole refresh pass")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, known := s.flows[keyOf(&late)]; chunks != 3 || !known || s.pass != 1 {
		t.Errorf("%d chunks, the event's flow known %v, pass %d: want 3, true, 1", chunks, known, s.pass)
	}
}

// A state change of a flow whose replica B holds is written as an update
// of it (Kernel.Update), not as a create that finds it exists.
func TestSyncUpdatesKnownReplicas(t *testing.T) {
	_, a, b := pair(t, nil)
	e := flow(3700)
	e.TCP.State = 2 // SYN_RECV
	replicate(t, a, b, e)
	e.TCP.State = tcpEstablished
	a.k.emit(EventUpdate, e)
	eventually(t, func() error {
		if got, _ := b.k.get(e); got.TCP.State != tcpEstablished {
			return fmt.Errorf("replica in state %d", got.TCP.State)
		}
		return nil
	})
	b.k.mu.Lock()
	defer b.k.mu.Unlock()
	if n := b.k.updated[keyOf(&e)]; n != 1 {
		t.Errorf("%d updates of the replica, want 1 (the state change)", n)
	}
}

// The start of a new entry of a tuple can be reported before the end of
// the tuple's earlier entry: a kernel that confirms the new entry while
// the old one is still being deleted (image/kernel/patches) reports them
// in that order. The late DESTROY is the old entry's, as its id says: the
// new flow's replica stays; the new entry's own DESTROY removes it.
func TestSyncLateDestroyOfEarlierEntry(t *testing.T) {
	_, a, b := pair(t, nil)
	sent := func(e Entry) Entry { e.ID = 0; return e } // ids stay home
	old := flow(3500)
	old.ID, old.TCP.State = 1, 7 // TIME_WAIT
	a.k.emit(EventNew, old)
	eventually(t, func() error { return hasReplica(b.k, sent(old)) })

	next := old
	next.ID, next.TCP.State = 2, 1 // SYN_SENT
	a.k.mu.Lock()
	a.k.table[keyOf(&next)] = next
	a.k.mu.Unlock()
	a.k.evs <- []Event{{Type: EventNew, Entry: next}, {Type: EventDestroy, Entry: old}}
	// A later flow's replica: what a sends, b takes in order.
	replicate(t, a, b, flow(3501))
	if err := hasReplica(b.k, sent(next)); err != nil {
		t.Errorf("after the old entry's late DESTROY: %v", err)
	}

	a.k.emit(EventDestroy, next)
	eventually(t, func() error { return replicaGone(b.k, next) })
}

// When both events of a tuple's change of entry are lost (the kernel
// dropped them), the refresh pass takes the id of the entry it finds: the
// new entry's DESTROY then removes its replica, not taken for an earlier
// entry's. An id an event gave while the pass read the table is kept: the
// dump is older.
func TestSyncRefreshTakesIdOfEntryWhoseEventsWereLost(t *testing.T) {
	// No pass but the test's own.
	_, a, b := pair(t, func(o *Options) { o.RefreshInterval = time.Hour })
	sent := func(e Entry) Entry { e.ID = 0; return e } // ids stay home
	old := flow(3800)
	old.ID = 1
	a.k.emit(EventNew, old)
	eventually(t, func() error { return hasReplica(b.k, sent(old)) })
	// A pass after the event: the next one's dump is newer than its id.
	a.s.refresh()
	next := old
	next.ID = 2
	a.k.mu.Lock()
	a.k.table[keyOf(&next)] = next // both events lost
	a.k.mu.Unlock()
	a.k.lost <- 1 // a full resync of B
	eventually(t, func() error {
		if st := a.s.Status().Peers[0]; st.ResyncsSent < 2 || st.Resyncing {
			return fmt.Errorf("the resync not done yet: %+v", st)
		}
		return nil
	})
	a.s.refresh()
	a.k.emit(EventDestroy, next)
	eventually(t, func() error { return replicaGone(b.k, next) })

	// The other way: the table read with the old entry, whose end and
	// the new one's start come while the pass reads it.
	third := next
	third.ID = 3
	a.k.emit(EventNew, next)
	eventually(t, func() error { return hasReplica(b.k, sent(next)) })
	a.s.refresh()
	a.k.mu.Lock()
	a.k.duringDump = func() {
		a.k.evs <- []Event{{Type: EventDestroy, Entry: next}, {Type: EventNew, Entry: third}}
		a.k.mu.Lock()
		a.k.table[keyOf(&third)] = third
		a.k.mu.Unlock()
		// Dump runs in the Syncer's goroutine: no t.Fatal here.
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			a.s.mu.Lock()
			defer a.s.mu.Unlock()
			if rec, ok := a.s.flows[keyOf(&third)]; !ok || rec.id != third.ID {
				return fmt.Errorf("the new entry's event not taken yet")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	a.k.mu.Unlock()
	a.s.refresh()
	a.k.emit(EventDestroy, third)
	eventually(t, func() error { return replicaGone(b.k, third) })
}

// A flow's key gives back its protocol and original tuple, for both
// families, and tells an IPv4 address from its IPv4-mapped IPv6 form.
func TestFlowKeyEntry(t *testing.T) {
	for _, e := range []Entry{
		{Proto: protoTCP, Orig: Tuple{Src: netip.MustParseAddrPort("203.0.113.7:40000"), Dst: netip.MustParseAddrPort("192.0.2.10:80")}},
		{Proto: protoUDP, Orig: Tuple{Src: netip.MustParseAddrPort("[2001:db8::7]:53000"), Dst: netip.MustParseAddrPort("[2001:db8:ff::10]:53")}},
		{Proto: protoSCTP, Orig: Tuple{Src: netip.MustParseAddrPort("[::ffff:203.0.113.7]:40000"), Dst: netip.MustParseAddrPort("[::ffff:192.0.2.10]:80")}},
	} {
		got := keyOf(&e).entry()
		if got.Proto != e.Proto || got.Orig != e.Orig {
			t.Errorf("%v %v: the key gives %v %v", e.Proto, e.Orig, got.Proto, got.Orig)
		}
	}
	v4 := Entry{Proto: protoTCP, Orig: Tuple{Src: netip.MustParseAddrPort("203.0.113.7:40000"), Dst: netip.MustParseAddrPort("192.0.2.10:80")}}
	mapped := Entry{Proto: protoTCP, Orig: Tuple{Src: netip.MustParseAddrPort("[::ffff:203.0.113.7]:40000"), Dst: netip.MustParseAddrPort("[::ffff:192.0.2.10]:80")}}
	if keyOf(&v4) == keyOf(&mapped) {
		t.Errorf("%v and %v have one key", v4.Orig, mapped.Orig)
	}
}

// Past ReadyWait, Ready still waits for a peer's resync to this gateway
// while it moves (it began or delivered a batch within resyncMoving), up
// to ReadyWaitMoving times ReadyWait; a resync that stalled, or one past
// that bound, is not waited for. ResyncMoving says the same. The clock is
// the Syncer's start and the resync's last batch, set here.
func TestSyncReadyWaitsForAResyncThatMoves(t *testing.T) {
	const wait = time.Second
	for _, tc := range []struct {
		name               string
		started, lastBatch time.Duration // ago
		moving, ready      bool
	}{
		{name: "moving within ReadyWait", started: wait / 2, moving: true},
		{name: "moving past ReadyWait", started: 2 * wait, moving: true},
		{name: "stalled", started: 2 * wait, lastBatch: resyncMoving + time.Second, ready: true},
		{name: "moving past the bound", started: ReadyWaitMoving*wait + time.Second, moving: true, ready: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Options{Kernel: newFakeKernel(), Policy: testPolicy(), Self: "gw-a", Peers: []string{"gw-b"}, ReadyWait: wait, PeerWait: wait})
			if err != nil {
				t.Fatal(err)
			}
			p := s.peers["gw-b"]
			p.up = true
			s.resyncBegins(p)
			s.mu.Lock()
			s.started = time.Now().Add(-tc.started)
			p.resyncAt = time.Now().Add(-tc.lastBatch)
			s.mu.Unlock()
			if got := s.ResyncMoving(); got != tc.moving {
				t.Errorf("ResyncMoving %v, want %v", got, tc.moving)
			}
			s.checkReady()
			ready := false
			select {
			case <-s.Ready():
				ready = true
			default:
			}
			if ready != tc.ready {
				t.Errorf("%v after the start, the resync's last batch %v ago: ready %v, want %v", tc.started, tc.lastBatch, ready, tc.ready)
			}
		})
	}
}

// The status tells which events conntrack reports, as nftgate chose them,
// and leaves the field out when it was not given.
func TestStatusConntrackEvents(t *testing.T) {
	for _, want := range []string{"lean", ""} {
		s, err := New(Options{Kernel: newFakeKernel(), Policy: testPolicy(), Self: "gw-a", Peers: []string{"gw-b"}, ConntrackEvents: want})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Status().ConntrackEvents; got != want {
			t.Errorf("status conntrack events %q, want %q", got, want)
		}
		b, err := json.Marshal(s.Status())
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), `"conntrackEvents"`); got != (want != "") {
			t.Errorf("given %q: the JSON %s", want, b)
		}
	}
}
