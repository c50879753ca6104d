package statesync

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/nftgate/nftgate/gateways"
)

// Channel is the gateway set's channel as the Syncer uses it
// (*gateways.Set).
type Channel interface {
	Handle(t byte, fn gateways.Handler) error
	Send(peer string, t byte, payload []byte) error
	Status() gateways.Status
}

// Defaults of Options.
const (
	DefaultQueue           = gateways.DefaultSyncQueue
	DefaultBatchInterval   = gateways.DefaultSyncBatchInterval
	DefaultBatchBytes      = gateways.DefaultSyncBatchBytes
	DefaultRefreshInterval = gateways.DefaultSyncRefreshInterval
	// DefaultFullRefreshEvery: a minute at the default refresh interval.
	DefaultFullRefreshEvery = 12
	DefaultPeerWait         = gateways.DefaultStartupWait
	DefaultReadyWait        = gateways.DefaultReadyTimeout
)

// Internal bounds.
const (
	// window is how many batches may wait for their ack per peer: the
	// channel's queue (256 frames) is never filled by the sync alone.
	window = 32
	// ackTimeout: a batch not acked by then is taken as lost (the link
	// broke under it); the peer is resynced.
	ackTimeout = 3 * time.Second
	// retryAfter is the pause before a peer whose send failed is tried
	// again.
	retryAfter = 500 * time.Millisecond
	// incoming bounds the batches decoded but not yet written.
	incoming = 64
	// resyncMoving: a peer's resync to this gateway that began or
	// delivered a batch within it is still moving (ResyncMoving), and Ready
	// waits for it past ReadyWait, up to ReadyWaitMoving times ReadyWait.
	resyncMoving = 5 * time.Second
)

// ReadyWaitMoving bounds how long Ready waits, in ReadyWaits, for a resync
// that is still moving (a large table: about 2 s per 100,000 entries on a
// 2-core machine): the gateway set's bound for its wait
// (gateways.Options.ReadyHold).
const ReadyWaitMoving = gateways.ReadyHoldMax

// Options are what New needs.
type Options struct {
	Kernel Kernel
	Policy *Policy
	// Self is this gateway's name; Peers the others' (as in [gateways]).
	Self  string
	Peers []string
	// Queue bounds the updates waiting per peer (distinct flows).
	Queue int
	// BatchInterval and BatchBytes: a batch goes out when the oldest
	// update waited BatchInterval or BatchBytes are ready.
	BatchInterval time.Duration
	BatchBytes    int
	// RefreshInterval is how often the table is read for entries whose
	// replicas would expire before the next pass.
	RefreshInterval time.Duration
	// FullRefreshEvery: one refresh pass in this many reads the whole
	// table (and the first, and the next after an adoption or lost
	// events); the others read only the entries the sync knows to be
	// due (docs/design/gateways.md, "What is sent").
	FullRefreshEvery int
	// PeerWait is how long Ready waits for a peer not yet heard; ReadyWait
	// bounds the wait for the resyncs of the peers that are.
	PeerWait, ReadyWait time.Duration
	// ConntrackEvents is, for the status, which of a Service connection's
	// events conntrack reports ([gateways] conntrack_events as chosen at
	// start: "lean", "services" or "all").
	ConntrackEvents string
	Log             *slog.Logger
}

// flowKey identifies an entry: protocol and original tuple, the
// addresses in their 16-byte form. It holds no pointer (a netip.Addr
// does), so the maps keyed by it, which hold a record for every flow and
// every replica, take a third less room and the collector does not scan
// them.
type flowKey struct {
	src, dst     [16]byte
	sport, dport uint16
	proto        Proto
	is4          bool
}

func keyOf(e *Entry) flowKey {
	src, dst := e.Orig.Src.Addr(), e.Orig.Dst.Addr()
	return flowKey{src: src.As16(), dst: dst.As16(), sport: e.Orig.Src.Port(), dport: e.Orig.Dst.Port(), proto: e.Proto, is4: src.Is4()}
}

// entry is the entry k identifies, without more than its protocol and
// original tuple (what Get, Write's deletes and Adopt match by).
func (k flowKey) entry() Entry {
	src, dst := netip.AddrFrom16(k.src), netip.AddrFrom16(k.dst)
	if k.is4 {
		src, dst = src.Unmap(), dst.Unmap()
	}
	return Entry{Proto: k.proto, Orig: Tuple{Src: netip.AddrPortFrom(src, k.sport), Dst: netip.AddrPortFrom(dst, k.dport)}}
}

// flowRec is what was last sent of one of this gateway's own entries,
// held by value in Syncer.flows (no pointer in it either).
type flowRec struct {
	state   protoState
	status  uint32
	mark    uint32
	expires int64  // when the replicas expire unless refreshed (Syncer.mono)
	seen    uint64 // the refresh pass that last saw it (or will: see deliver)
	id      uint32 // the entry's kernel id (Entry.ID), 0 when not known
	// idPass is the refresh pass whose dump may be older than id: id was
	// set by an event (deliver), which may have come after that pass read
	// the table.
	idPass uint64
}

// statusMatters are the IPS_* bits whose change is sent: SEEN_REPLY,
// ASSURED (both change the timeout), SRC_NAT, DST_NAT.
const statusMatters = 1<<1 | 1<<2 | 1<<4 | 1<<5

// protoState is the part of an entry's protocol info whose change is sent:
// the TCP state, or the SCTP state and verification tags (the tag of the
// original direction is known only once the INIT-ACK passed).
type protoState struct {
	state               uint8
	vtagOrig, vtagReply uint32
}

func protoStateOf(e *Entry) protoState {
	if e.Proto == protoSCTP {
		return protoState{e.SCTP.State, e.SCTP.VTagOrig, e.SCTP.VTagReply}
	}
	return protoState{state: e.TCP.State}
}

// pending is one flow's update waiting for a batch.
type pending struct {
	op    op
	stamp time.Time // the oldest event it carries
	last  time.Time // the newest
}

type peer struct {
	name string
	num  uint32 // its number in Options.Peers, from 1 (replica.origin)
	up   bool
	inc  uint64

	queue map[flowKey]*pending
	fifo  []flowKey

	resync     bool          // a full dump is due
	resyncAsk  time.Time     // when it was last asked for
	resyncDump []resyncBatch // the dump being sent
	resyncPos  int
	resyncing  bool
	begun      bool // the resync's begin was sent
	retryAt    time.Time
	seq        uint64
	unacked    map[uint64]time.Time
	doneFromIt bool // it finished its resync to this gateway
	// resyncIn is the number of its resync to this gateway under way
	// (sweeping) or last: the replicas of its flows that carry an older
	// one when the resync is done were not sent again, it no longer has
	// them (their deletes were lost with an overflowed queue), and the
	// done deletes them.
	resyncIn uint64
	sweeping bool
	// resyncAt is when its resync to this gateway began or last
	// delivered a batch.
	resyncAt time.Time

	sent, received, lost         uint64
	resyncsSent, resyncsReceived uint64
	refused                      map[string]uint64
	lastLag                      time.Duration
	refuseLog                    map[string]*rate.Sometimes
}

// peerEvent is a liveness change told by the gateway set.
type peerEvent struct {
	name  string
	alive bool
	inc   uint64
}

// inItem is a message from a peer for the writer, in arrival order.
type inItem struct {
	peer  string
	bt    batch
	done  bool // resync done
	begin bool // resync begin
}

// Syncer replicates this gateway's conntrack entries to its peers and
// writes theirs here (see the package comment).
type Syncer struct {
	o       Options
	ch      Channel
	log     *slog.Logger
	m       *metrics
	started time.Time
	ready   chan struct{}
	wake    chan struct{}
	in      chan inItem
	stop    chan struct{}

	evMu   sync.Mutex
	events []peerEvent

	mu    sync.Mutex
	peers map[string]*peer
	flows map[flowKey]flowRec
	// ended are flows whose DESTROY came since the last refresh pass
	// began (until the next ends).
	ended    map[flowKey]uint64
	replicas map[flowKey]replica
	// resyncs numbers the peers' resyncs to this gateway as they begin.
	resyncs uint64
	// pass counts the full refresh passes; sinceFull the passes since
	// the last; fullDue makes the next one full.
	pass       uint64
	sinceFull  int
	fullDue    bool
	readyDone  bool
	readyLate  bool // Ready waited past ReadyWait for a resync that moved
	eventsLost uint64
	adopted    uint64
	// notReplicated counts the own flows not sent, by reason
	// (Policy.CheckOwn), at their NEW events.
	notReplicated map[string]uint64
	swept         uint64
	enc           batchEncoder
}

// replica is what this gateway knows of a replica it holds: the peer
// that is the flow's origin (or has it in custody; its num, not a pointer,
// so that the map holds none), and the number of the last resync from it
// that sent the flow again (Syncer.resyncs).
type replica struct {
	origin uint32
	resync uint64
}

// mono is t in nanoseconds since the Syncer's start, on the monotonic
// clock (t from time.Now, or computed from it): a step of the wall clock
// (NTP setting a box that booted without one) moves no expiry.
func (s *Syncer) mono(t time.Time) int64 { return int64(t.Sub(s.started)) }

// New validates opts. The gateway set's OnPeer is then PeerChanged,
// Attach connects the Syncer to the set's channel, and Run starts the work.
func New(o Options) (*Syncer, error) {
	if o.Kernel == nil || o.Policy == nil {
		return nil, errors.New("statesync: Kernel and Policy are required")
	}
	o.Queue = cmp.Or(o.Queue, DefaultQueue)
	o.BatchInterval = cmp.Or(o.BatchInterval, DefaultBatchInterval)
	o.BatchBytes = cmp.Or(o.BatchBytes, DefaultBatchBytes)
	o.RefreshInterval = cmp.Or(o.RefreshInterval, DefaultRefreshInterval)
	o.FullRefreshEvery = cmp.Or(o.FullRefreshEvery, DefaultFullRefreshEvery)
	o.PeerWait = cmp.Or(o.PeerWait, DefaultPeerWait)
	o.ReadyWait = cmp.Or(o.ReadyWait, DefaultReadyWait)
	s := &Syncer{o: o, log: o.Log, started: time.Now(), ready: make(chan struct{}), wake: make(chan struct{}, 1),
		in: make(chan inItem, incoming), stop: make(chan struct{}),
		peers: map[string]*peer{}, flows: map[flowKey]flowRec{}, ended: map[flowKey]uint64{}, replicas: map[flowKey]replica{},
		notReplicated: map[string]uint64{}, fullDue: true}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for i, n := range o.Peers {
		s.peers[n] = &peer{name: n, num: uint32(i + 1), queue: map[flowKey]*pending{}, unacked: map[uint64]time.Time{},
			refused: map[string]uint64{}, refuseLog: map[string]*rate.Sometimes{}}
	}
	s.m = newMetrics(s)
	return s, nil
}

// Attach registers the sync's message types on ch and takes the peers ch
// knows alive now (those whose OnPeer came before PeerChanged was wired
// to this Syncer). Call it once, before Run.
func (s *Syncer) Attach(ch Channel) error {
	s.ch = ch
	for t, h := range map[byte]gateways.Handler{msgBatch: s.onBatch, msgAck: s.onAck, msgResyncDone: s.onResyncDone, msgResyncBegin: s.onResyncBegin} {
		if err := ch.Handle(t, h); err != nil {
			return err
		}
	}
	s.evMu.Lock()
	told := map[string]bool{}
	for _, ev := range s.events {
		told[ev.name] = true
	}
	s.evMu.Unlock()
	for _, p := range ch.Status().Peers {
		if p.State == "alive" && !told[p.Name] {
			s.PeerChanged(p.Name, true, 0)
		}
	}
	return nil
}

// PeerChanged is the gateway set's OnPeer: a peer came up (or back with
// another incarnation) or went down. It does not block and does not call
// the set.
func (s *Syncer) PeerChanged(name string, alive bool, incarnation uint64) {
	s.evMu.Lock()
	s.events = append(s.events, peerEvent{name, alive, incarnation})
	s.evMu.Unlock()
	s.poke()
}

func (s *Syncer) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Ready is closed when every live peer has finished its resync to this
// gateway (a peer not heard within PeerWait of the start is not waited
// for), or ReadyWait after the start: this gateway then holds every live
// entry its peers know, and may take its addresses.
func (s *Syncer) Ready() <-chan struct{} { return s.ready }

// Run listens to the kernel's events and sends, refreshes, resyncs and
// writes until ctx ends. Kernel errors of Listen are returned.
func (s *Syncer) Run(ctx context.Context) error {
	if s.ch == nil {
		return errors.New("statesync: Run before Attach")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(s.stop)
	wg.Go(func() { s.writer(ctx) })
	wg.Go(func() { s.sender(ctx) })
	wg.Go(func() { s.refresher(ctx) })
	err := s.o.Kernel.Listen(ctx, s.deliver, s.lostEvents)
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("statesync: conntrack events: %w", err)
}

// deliver takes a batch of the kernel's events.
func (s *Syncer) deliver(evs []Event) {
	now := time.Now()
	full := false
	s.mu.Lock()
	for i := range evs {
		ev := &evs[i]
		e := &ev.Entry
		k := keyOf(e)
		rec, known := s.flows[k]
		switch ev.Type {
		case EventDestroy:
			if !known && s.o.Policy.CheckOwn(e) != "" {
				continue // never sent
			}
			if known && rec.id != 0 && e.ID != 0 && e.ID != rec.id {
				// The end of an earlier entry of the tuple, reported
				// after the new one's start: a kernel that confirms a
				// new entry while the old one is still being deleted
				// (image/kernel/patches) can report them in that order.
				continue
			}
			delete(s.flows, k)
			// A refresh pass whose dump was read before this must not
			// take the flow for one never sent.
			s.ended[k] = s.pass + 1
			full = s.enqueue(k, op{del: true, entry: *e}, now) || full
		case EventNew, EventUpdate:
			if known && rec.state == protoStateOf(e) && rec.status&statusMatters == e.Status&statusMatters && rec.mark == e.Mark &&
				(e.ID == 0 || e.ID == rec.id) {
				continue // nothing that matters changed
			}
			if !known {
				if why := s.o.Policy.CheckOwn(e); why != "" {
					if ev.Type == EventNew {
						s.notReplicated[why]++
						s.m.notReplicated.WithLabelValues(why).Inc()
					}
					continue
				}
				delete(s.ended, k) // its tuple began another flow
			}
			rec.state, rec.status, rec.mark = protoStateOf(e), e.Status, e.Mark
			if e.ID != 0 {
				rec.id, rec.idPass = e.ID, s.pass+1
			}
			rec.expires = s.mono(now.Add(time.Duration(e.Timeout) * time.Second))
			// Seen by the next refresh pass too, whose dump may have been
			// read before the flow existed: it is not taken for gone.
			rec.seen = s.pass + 1
			s.flows[k] = rec
			full = s.enqueue(k, op{entry: *e}, now) || full
		}
	}
	s.mu.Unlock()
	if full {
		s.poke()
	}
}

// enqueue queues o to every live peer, the latest state of a flow
// replacing the one waiting; it tells whether a queue holds a batch's
// worth. On overflow the peer's queue is dropped and a full resync (which
// supersedes it) is due. s.mu is held.
func (s *Syncer) enqueue(k flowKey, o op, now time.Time) bool {
	full := false
	for _, p := range s.peers {
		if !p.up {
			continue
		}
		if w := p.queue[k]; w != nil {
			w.op, w.last = o, now
			continue
		}
		if len(p.queue) >= s.o.Queue {
			s.overflow(p, 1)
			continue
		}
		p.queue[k] = &pending{op: o, stamp: now, last: now}
		p.fifo = append(p.fifo, k)
		full = full || len(p.queue)*maxEntrySize >= s.o.BatchBytes
	}
	return full
}

// overflow drops p's queue (and extra updates that did not fit), counts
// them lost and marks p for a resync. s.mu is held.
func (s *Syncer) overflow(p *peer, extra int) {
	n := len(p.queue) + extra
	p.lost += uint64(n)
	s.m.lost.WithLabelValues(p.name).Add(float64(n))
	clear(p.queue)
	p.fifo = p.fifo[:0]
	if !p.resync {
		s.log.Warn("statesync: queue to peer full: updates dropped, a full resync follows", "peer", p.name, "dropped", n, "queue", s.o.Queue)
	}
	askResync(p, time.Now())
}

// askResync makes a full resync of p due. One that starts with a dump
// begun before now does not cover what was dropped now, so another
// follows it. s.mu is held.
func askResync(p *peer, now time.Time) {
	p.resync, p.resyncAsk = true, now
}

// lostEvents: the kernel dropped events; every peer gets a full resync.
func (s *Syncer) lostEvents(n int) {
	s.mu.Lock()
	s.eventsLost++
	s.fullDue = true // flows whose events were lost are found by a full pass
	now := time.Now()
	for _, p := range s.peers {
		if p.up {
			askResync(p, now)
		}
	}
	s.mu.Unlock()
	s.m.eventsLost.Inc()
	s.log.Warn("statesync: the kernel dropped conntrack events: full resync of every peer", "dropped", n)
	s.poke()
}

// sender sends batches, runs resyncs, applies peer changes and watches
// for Ready.
func (s *Syncer) sender(ctx context.Context) {
	tick := time.NewTicker(s.o.BatchInterval)
	defer tick.Stop()
	// due wakes the sender when the oldest waiting update has waited
	// BatchInterval: the tick alone would add up to another interval.
	due := time.NewTimer(time.Hour)
	defer due.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-due.C:
		case <-s.wake:
		}
		s.applyPeerEvents()
		s.flush()
		s.checkReady()
		if at, ok := s.nextDue(); ok {
			due.Reset(time.Until(at))
		}
	}
}

// nextDue is when the oldest update waiting for a peer that has room in
// its window is due to go out.
func (s *Syncer) nextDue() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var at time.Time
	for _, p := range s.peers {
		if !p.up || len(p.fifo) == 0 || len(p.unacked) >= window {
			continue
		}
		if w := p.queue[p.fifo[0]]; w != nil && (at.IsZero() || w.stamp.Before(at)) {
			at = w.stamp
		}
	}
	return at.Add(s.o.BatchInterval), !at.IsZero()
}

// applyPeerEvents takes the liveness changes told since the last round.
func (s *Syncer) applyPeerEvents() {
	s.evMu.Lock()
	evs := s.events
	s.events = nil
	s.evMu.Unlock()
	for _, ev := range evs {
		s.mu.Lock()
		p := s.peers[ev.name]
		if p == nil {
			s.mu.Unlock()
			continue
		}
		wasUp := p.up
		p.up, p.inc = ev.alive, ev.inc
		clear(p.queue)
		p.fifo = p.fifo[:0]
		clear(p.unacked)
		p.resyncDump, p.resyncPos, p.resyncing, p.begun = nil, 0, false, false
		p.retryAt = time.Time{}
		var adopt []Entry
		if ev.alive {
			// A peer that comes (back) holds nothing of ours: all of it.
			askResync(p, time.Now())
			s.log.Info("statesync: peer up, full resync", "peer", p.name)
		} else {
			p.resync = false
			if wasUp {
				adopt = s.custodyLocked(p.name)
			}
		}
		s.mu.Unlock()
		if len(adopt) > 0 {
			s.adopt(p.name, adopt)
		}
	}
}

// custodyLocked decides who takes over the entries whose origin is the
// dead peer: the live gateway (this one included) with the highest
// rendezvous score for the dead peer's name, the same choice on every
// gateway that sees the same peers. It returns the entries this gateway
// adopts; otherwise the replicas are recorded as the successor's. s.mu
// is held.
func (s *Syncer) custodyLocked(dead string) []Entry {
	succ, best := s.o.Self, custodyScore(dead, s.o.Self)
	for n, p := range s.peers {
		if sc := custodyScore(dead, n); p.up && (sc > best || sc == best && n < succ) {
			succ, best = n, sc
		}
	}
	var adopt []Entry
	from, to := s.peers[dead], s.peers[succ] // to: nil for this gateway
	for k, r := range s.replicas {
		if from == nil || r.origin != from.num {
			continue
		}
		if to == nil {
			adopt = append(adopt, k.entry())
			delete(s.replicas, k)
		} else {
			// Numbered as sent by the successor's resync under way or
			// last: a resync from it begun before it had them does not
			// sweep them.
			s.replicas[k] = replica{origin: to.num, resync: to.resyncIn}
		}
	}
	s.log.Info("statesync: peer down; custody of its entries", "peer", dead, "custodian", succ, "adopted here", len(adopt))
	return adopt
}

func custodyScore(dead, name string) uint64 {
	h := sha256.Sum256([]byte("nftgate statesync custody\x00" + dead + "\x00" + name))
	return binary.BigEndian.Uint64(h[:8])
}

// adopt makes the dead peer's replicas this gateway's own: they are
// refreshed and replicated from here (the next refresh pass, a full one,
// sends them as entries not yet sent).
func (s *Syncer) adopt(dead string, es []Entry) {
	failed := 0
	var first error
	for _, err := range s.o.Kernel.Adopt(es) {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	s.mu.Lock()
	s.adopted += uint64(len(es) - failed)
	s.fullDue = true // the next pass sends them, as never sent
	s.mu.Unlock()
	s.m.adopted.Add(float64(len(es) - failed))
	if failed > 0 {
		s.log.Warn("statesync: adopting a dead peer's entries failed for some (they expire)", "peer", dead, "failed", failed, "of", len(es), "error", first)
	}
	s.poke()
}

// message is one frame for a peer.
type message struct {
	t       byte
	payload []byte
	ops     int
	seq     uint64
}

// flush sends what is due to every live peer: a resync's dump first,
// then the queue, within the window of unacked batches.
func (s *Syncer) flush() {
	now := time.Now()
	s.mu.Lock()
	needDump := false
	for _, p := range s.peers {
		for seq, at := range p.unacked {
			if now.Sub(at) > ackTimeout {
				delete(p.unacked, seq)
				if !p.resync {
					s.log.Warn("statesync: batch not acked in time: full resync", "peer", p.name, "seq", seq)
				}
				askResync(p, now)
			}
		}
		// A resync under way is not restarted: one asked for meanwhile
		// follows it, so that each makes progress however often the
		// queue overflows.
		if p.up && p.resync && !p.resyncing && !now.Before(p.retryAt) {
			needDump = true
		}
	}
	s.mu.Unlock()
	var dump []resyncBatch
	var dumpAt time.Time
	if needDump {
		var err error
		dumpAt = time.Now()
		if dump, err = s.originEntries(); err != nil {
			s.log.Warn("statesync: conntrack dump for a resync failed", "error", err)
			return
		}
	}
	s.mu.Lock()
	plan := map[*peer][]message{}
	for _, p := range s.peers {
		if !p.up || now.Before(p.retryAt) {
			continue
		}
		if p.resync && needDump && !p.resyncing {
			// What was dropped after the dump began is not in it.
			p.resync = !p.resyncAsk.Before(dumpAt)
			p.resyncing, p.resyncDump, p.resyncPos = true, dump, 0
			s.supersedeLocked(p, dumpAt)
			p.resyncsSent++
			s.m.resyncs.WithLabelValues(p.name, "sent").Inc()
		}
		plan[p] = s.batchesLocked(p, now)
	}
	s.mu.Unlock()
	for p, msgs := range plan {
		for i, m := range msgs {
			if err := s.ch.Send(p.name, m.t, m.payload); err != nil {
				s.mu.Lock()
				for _, r := range msgs[i:] {
					if r.t == msgBatch {
						delete(p.unacked, r.seq)
						p.lost += uint64(r.ops)
						s.m.lost.WithLabelValues(p.name).Add(float64(r.ops))
					}
				}
				if p.up {
					askResync(p, time.Now())
					p.retryAt = now.Add(retryAfter)
				}
				s.mu.Unlock()
				s.log.Warn("statesync: send failed: full resync when the peer is back", "peer", p.name, "error", err)
				break
			}
			if m.t == msgBatch {
				s.m.sent.WithLabelValues(p.name).Add(float64(m.ops))
			}
		}
	}
}

// supersedeLocked drops p's waiting updates that the dump begun at
// dumpAt supersedes: those of flows not updated since. An update that came
// while the dump was read stays queued (it goes after the dump): the dump
// may have read the table before its flow existed. s.mu is held.
func (s *Syncer) supersedeLocked(p *peer, dumpAt time.Time) {
	kept := p.fifo[:0]
	for _, k := range p.fifo {
		if w := p.queue[k]; w != nil && w.last.Before(dumpAt) {
			delete(p.queue, k)
		} else if w != nil {
			kept = append(kept, k)
		}
	}
	p.fifo = kept
}

// batchesLocked cuts what p is due into batch messages (a resync done
// after a resync's last). s.mu is held.
func (s *Syncer) batchesLocked(p *peer, now time.Time) []message {
	var out []message
	oldestDue := now.Add(-s.o.BatchInterval)
	for len(p.unacked) < window {
		more := p.resyncing || len(p.fifo) > 0
		if !more {
			break
		}
		// A partial batch of the queue waits for BatchInterval or more.
		if !p.resyncing && len(p.queue)*maxEntrySize < s.o.BatchBytes && p.queue[p.fifo[0]].stamp.After(oldestDue) {
			break
		}
		if p.resyncing && !p.begun {
			p.begun = true
			out = append(out, message{t: msgResyncBegin, payload: encodeResyncBegin()})
		}
		p.seq++
		enc := &s.enc
		enc.reset(p.seq, 0)
		var stamp time.Time
		if p.resyncing && p.resyncPos < len(p.resyncDump) {
			b := &p.resyncDump[p.resyncPos]
			enc.body, enc.n = append(enc.body, b.body...), b.n
			p.resyncPos++
		}
		if stamp.IsZero() && enc.n > 0 {
			stamp = now
		}
		finished := p.resyncing && p.resyncPos >= len(p.resyncDump)
		for !p.resyncing || finished {
			if len(p.fifo) == 0 || enc.size()+maxEntrySize > s.o.BatchBytes {
				break
			}
			k := p.fifo[0]
			p.fifo = p.fifo[1:]
			w := p.queue[k]
			delete(p.queue, k)
			if enc.add(&w.op) != nil {
				s.log.Warn("statesync: entry cannot be encoded", "entry", w.op.entry)
			}
			if stamp.IsZero() || w.stamp.Before(stamp) {
				stamp = w.stamp
			}
		}
		if len(p.fifo) == 0 {
			p.fifo = nil // let the backing array go
		}
		if enc.n > 0 {
			enc.stamp = stamp.UnixNano()
			out = append(out, message{t: msgBatch, payload: slices.Clone(enc.finish()), ops: enc.n, seq: p.seq})
			p.unacked[p.seq] = now
			p.sent += uint64(enc.n)
		}
		if finished {
			p.resyncing, p.resyncDump, p.resyncPos, p.begun = false, nil, 0, false
			out = append(out, message{t: msgResyncDone, payload: encodeResyncDone()})
		}
		if enc.n == 0 && !finished {
			break
		}
	}
	return out
}

// resyncBatch is a batch of a resync's dump: its entries as puts, encoded
// (the body of a batch message, without its head). A resync holds the
// table this way until the peer has it all, shared by the peers it goes
// to: an IPv4 TCP entry takes 44 bytes encoded, some 180 as an op
// (BenchmarkResyncDump).
type resyncBatch struct {
	body []byte
	n    int
}

// originEntries dumps this gateway's own entries (its origin, or in its
// custody) that go to the peers (Policy.CheckOwn), encoded as puts in
// batches of at most BatchBytes.
func (s *Syncer) originEntries() ([]resyncBatch, error) {
	var out []resyncBatch
	var enc batchEncoder
	cut := func() {
		out = append(out, resyncBatch{body: slices.Clone(enc.body), n: enc.n})
		enc.reset(0, 0)
	}
	err := s.o.Kernel.Dump(func(e Entry) {
		if e.Mark&ReplicaMark != 0 || s.o.Policy.CheckOwn(&e) != "" {
			return
		}
		o := op{entry: e}
		if enc.add(&o) != nil {
			s.log.Warn("statesync: entry cannot be encoded", "entry", e)
			return
		}
		if enc.size()+maxEntrySize > s.o.BatchBytes {
			cut()
		}
	})
	if enc.n > 0 {
		cut()
	}
	return out, err
}

// refresher runs the refresh passes, apart from the sender: reading a
// large table takes long (a second for 50,000 entries on a loaded
// machine), and the batches must not wait for it.
func (s *Syncer) refresher(ctx context.Context) {
	tick := time.NewTicker(s.o.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if s.fullPassDue() {
				s.refresh()
			} else {
				s.refreshDue()
			}
			s.poke()
		}
	}
}

// What a refresh pass reads (the read label of its metrics).
const (
	readTable = "table"
	readDue   = "due"
)

// fullPassDue tells whether this pass reads the whole table: one in
// FullRefreshEvery, and the next after an adoption or lost events.
func (s *Syncer) fullPassDue() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sinceFull++
	if s.fullDue || s.sinceFull >= s.o.FullRefreshEvery {
		s.fullDue, s.sinceFull = false, 0
		return true
	}
	return false
}

// refreshDue is a refresh pass that reads only the entries a full pass
// could send again: those whose replicas would expire before the pass
// after next and which may live on (not TCP connections that are over).
// The others are what the sync knows from the events; in a table of
// short connections nearly every entry is a closed one (TIME_WAIT, 120 s),
// which a full pass reads every time for nothing. Flows never sent, and
// flows gone without an event, are a full pass's. When more than half
// the flows are due, the pass is a full one.
func (s *Syncer) refreshDue() {
	s.mu.Lock()
	horizon := s.mono(time.Now().Add(2 * s.o.RefreshInterval))
	isDue := func(k flowKey, rec *flowRec) bool {
		return rec.expires <= horizon && !overState(k.proto, rec.state)
	}
	// When most flows are due (their timeouts all short), the whole
	// table is read for less: a dump reads an entry for about half what a
	// read by tuple costs (BenchmarkDumpOwn10000, BenchmarkGet10000).
	n := 0
	for k, rec := range s.flows {
		if isDue(k, &rec) {
			n++
		}
	}
	if 2*n > len(s.flows) {
		s.mu.Unlock()
		s.refresh()
		return
	}
	due := make([]Entry, 0, n)
	// asked: when each flow asked for expired as the sync knew it then;
	// an event since changes it.
	asked := make(map[flowKey]int64, n)
	for k, rec := range s.flows {
		if len(due) == n {
			break // all found: a table of closed connections is not walked twice
		}
		if isDue(k, &rec) {
			due = append(due, k.entry())
			asked[k] = rec.expires
		}
	}
	s.mu.Unlock()
	defer func() {
		s.m.passes.WithLabelValues(readDue).Inc()
		s.m.read.WithLabelValues(readDue).Add(float64(len(due)))
	}()
	if len(due) == 0 {
		return
	}
	var got []op
	err := s.o.Kernel.Get(due, func(e Entry) {
		delete(asked, keyOf(&e)) // found
		if e.Mark&ReplicaMark == 0 && s.o.Policy.CheckOwn(&e) == "" {
			got = append(got, op{entry: e})
		}
	})
	if err != nil {
		s.log.Warn("statesync: conntrack read for the refresh failed", "error", err, "entries read", len(got), "of", len(due))
	}
	now := time.Now()
	later := now.Add(2 * s.o.RefreshInterval)
	for chunk := range slices.Chunk(got, refreshChunk) {
		s.mu.Lock()
		for i := range chunk {
			o := &chunk[i]
			k := keyOf(&o.entry)
			// A flow that ended (or was forgotten) while it was read is
			// left alone.
			if rec, ok := s.flows[k]; ok {
				s.resendLocked(k, &rec, o, 0, now, later)
			}
		}
		s.mu.Unlock()
	}
	if err != nil {
		return
	}
	// The flows the kernel no longer holds, with no event since they were
	// asked for: their DESTROY was lost (or is still on its way, and then
	// sends the delete without them). Forgotten, as a full pass would:
	// they are not asked for again.
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, expires := range asked {
		if rec, ok := s.flows[k]; ok && rec.expires == expires {
			delete(s.flows, k)
		}
	}
}

// refresh, a full pass, reads the table and queues the entries whose
// replicas would expire before the next pass but are alive here (UDP,
// short TCP states: the events do not say a flow is still alive), and
// entries never sent (adopted ones; events that were lost). Flows gone
// without an event are forgotten. A queue without room is left for the
// next pass. The entries are taken as the dump reads them, a chunk at a
// time: the pass holds a chunk, not the table (a copy of 1.2 million
// entries is some 200 MB), and the events and the batches wait for the
// lock no longer than a chunk takes.
func (s *Syncer) refresh() {
	// The pass's number: the events that come while it runs mark their
	// flows seen by it (deliver), as the entries it reads.
	s.mu.Lock()
	pass := s.pass + 1
	s.mu.Unlock()
	read := 0
	chunk := make([]op, 0, refreshChunk)
	take := func() {
		now := time.Now()
		horizon := now.Add(2 * s.o.RefreshInterval)
		s.mu.Lock()
		for i := range chunk {
			s.refreshOneLocked(&chunk[i], pass, now, horizon)
		}
		s.mu.Unlock()
		read += len(chunk)
		chunk = chunk[:0]
		if testHookRefreshChunk != nil {
			testHookRefreshChunk()
		}
	}
	err := s.o.Kernel.Dump(func(e Entry) {
		if e.Mark&ReplicaMark != 0 || s.o.Policy.CheckOwn(&e) != "" {
			return
		}
		chunk = append(chunk, op{entry: e})
		if len(chunk) == refreshChunk {
			take()
		}
	})
	if err != nil {
		// What was taken stays; nothing is forgotten on a partial read.
		s.log.Warn("statesync: conntrack dump for the refresh failed", "error", err)
		return
	}
	if len(chunk) > 0 {
		take()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pass = pass
	for k, rec := range s.flows {
		if rec.seen != s.pass {
			delete(s.flows, k)
		}
	}
	for k, pass := range s.ended {
		if pass <= s.pass {
			delete(s.ended, k)
		}
	}
	s.m.passes.WithLabelValues(readTable).Inc()
	s.m.read.WithLabelValues(readTable).Add(float64(read))
}

// refreshChunk is how many entries of a refresh pass are taken under one
// hold of s.mu.
const refreshChunk = 1024

// testHookRefreshChunk, when set (by tests), runs after each chunk of a
// refresh pass.
var testHookRefreshChunk func()

// refreshOneLocked takes one entry of refresh pass number pass. s.mu is
// held.
func (s *Syncer) refreshOneLocked(o *op, pass uint64, now, horizon time.Time) {
	e := &o.entry
	k := keyOf(e)
	rec, known := s.flows[k]
	if _, ok := s.ended[k]; ok && !known {
		return // ended while the table was read
	}
	if !known {
		s.resendLocked(k, nil, o, pass, now, horizon)
		return
	}
	rec.seen = pass
	// The tuple's entry now, if both events of its change were lost (the
	// kernel dropped them): the DESTROY that ends it is then taken as its
	// own, not as an earlier entry's (deliver). Not from a dump that may
	// be older than the id an event gave.
	if e.ID != 0 && rec.idPass < pass {
		rec.id = e.ID
	}
	s.flows[k] = rec
	s.resendLocked(k, &rec, o, pass, now, horizon)
}

// resendLocked queues o, the entry of flow k read now, when its replicas
// would expire before the pass after next (horizon) while it lives on,
// or when it was never sent (rec nil; full pass number pass found it).
// rec is a copy of the flow's record, which it stores when it queues o.
// s.mu is held.
func (s *Syncer) resendLocked(k flowKey, rec *flowRec, o *op, pass uint64, now, later time.Time) {
	e := &o.entry
	expires := s.mono(now.Add(time.Duration(e.Timeout) * time.Second))
	horizon := s.mono(later)
	// Timeouts come in whole seconds rounded down: an entry lives longer
	// than its replica only past that second. A TCP connection that is
	// over (a late packet lengthens its entry in CLOSE or TIME_WAIT)
	// needs no replica that long; but one last sent before it was over
	// (the events of its end were lost) is sent once more, so that its
	// replica ends as it does and the sync stops asking for it.
	caughtUp := rec != nil && over(e) && !overState(k.proto, rec.state)
	if rec != nil && !caughtUp && (rec.expires > horizon || expires <= rec.expires+int64(time.Second) || over(e)) {
		return
	}
	for _, p := range s.peers {
		if p.up && len(p.queue) >= s.o.Queue {
			return // no room: left for the next pass
		}
	}
	if rec == nil {
		rec = &flowRec{seen: pass, id: e.ID}
	}
	rec.state, rec.status, rec.mark, rec.expires = protoStateOf(e), e.Status, e.Mark, expires
	s.flows[k] = *rec
	s.enqueue(k, *o, now)
	s.m.refreshed.Inc()
}

// over: e is a TCP connection in TIME_WAIT or CLOSE, or an SCTP
// association that is CLOSED.
func over(e *Entry) bool { return overState(e.Proto, protoStateOf(e)) }

// overState: a flow of protocol p in state st is over, as over says.
func overState(p Proto, st protoState) bool {
	const timeWait, closed = 7, 8 // TCP_CONNTRACK_TIME_WAIT, _CLOSE
	const sctpClosed = 1          // SCTP_CONNTRACK_CLOSED
	switch p {
	case protoTCP:
		return st.state == timeWait || st.state == closed
	case protoSCTP:
		return st.state == sctpClosed
	}
	return false
}

// checkReady closes Ready when it is time: every live peer's resync done
// (a peer not heard within PeerWait is not waited for), or ReadyWait
// passed and no resync still moving (ResyncMoving), or ReadyWaitMoving
// times ReadyWait passed.
func (s *Syncer) checkReady() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readyDone {
		return
	}
	since := time.Since(s.started)
	all := true
	for _, p := range s.peers {
		if !p.doneFromIt && (p.up || since < s.o.PeerWait) {
			all = false
		}
	}
	if !all && since >= s.o.ReadyWait && since < ReadyWaitMoving*s.o.ReadyWait && s.resyncMovingLocked() {
		if !s.readyLate {
			s.readyLate = true
			s.log.Info("statesync: a peer's resync is still under way past ready_timeout; waiting for it while it moves", "waited", since.Round(time.Millisecond))
		}
		return
	}
	if all || since >= s.o.ReadyWait {
		s.readyDone = true
		close(s.ready)
		s.m.ready.Set(1)
		if !all {
			s.log.Warn("statesync: not every peer finished its resync in time; going ahead", "waited", since.Round(time.Millisecond))
		}
	}
}

// ResyncMoving tells whether a live peer's resync to this gateway is under
// way and still moving: it began or delivered a batch within the last 5 s.
// The gateway set asks it when ready_timeout passes (gateways.Options.ReadyHold).
func (s *Syncer) ResyncMoving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resyncMovingLocked()
}

func (s *Syncer) resyncMovingLocked() bool {
	for _, p := range s.peers {
		if p.up && p.sweeping && !p.doneFromIt && time.Since(p.resyncAt) < resyncMoving {
			return true
		}
	}
	return false
}

// onBatch decodes a batch from a peer and hands it to the writer.
func (s *Syncer) onBatch(from string, payload []byte) {
	bt, err := decodeBatch(payload, nil)
	if err != nil {
		s.refuse(from, RefusedDecode, 1, nil, err)
		return
	}
	s.toWriter(inItem{peer: from, bt: bt})
}

func (s *Syncer) onResyncBegin(from string, payload []byte) {
	if err := decodeResyncBegin(payload); err != nil {
		s.refuse(from, RefusedDecode, 1, nil, err)
		return
	}
	s.toWriter(inItem{peer: from, begin: true})
}

func (s *Syncer) onResyncDone(from string, payload []byte) {
	if err := decodeResyncDone(payload); err != nil {
		s.refuse(from, RefusedDecode, 1, nil, err)
		return
	}
	s.toWriter(inItem{peer: from, done: true})
}

// toWriter hands an item to the writer in order; it waits while the
// writer is behind (the channel's reader waits with it, which slows the
// peer's sending), and drops it once the Syncer stopped.
func (s *Syncer) toWriter(it inItem) {
	select {
	case s.in <- it:
	case <-s.stop:
	}
}

func (s *Syncer) onAck(from string, payload []byte) {
	a, err := decodeAck(payload)
	if err != nil {
		s.refuse(from, RefusedDecode, 1, nil, err)
		return
	}
	lag := time.Since(time.Unix(0, a.stamp))
	s.mu.Lock()
	p := s.peers[from]
	if p != nil {
		if _, ok := p.unacked[a.seq]; ok {
			delete(p.unacked, a.seq)
			p.lastLag = lag
		} else {
			p = nil // an ack of a batch given up
		}
	}
	s.mu.Unlock()
	if p != nil {
		s.m.lag.WithLabelValues(from).Observe(lag.Seconds())
		s.poke()
	}
}

// writer writes the peers' batches into the kernel, in arrival order,
// and acks them, once the Policy knows the Services (before, the peers'
// batches wait, as they do while the writer is behind).
func (s *Syncer) writer(ctx context.Context) {
	var puts, updates, dels []Entry
	var own, known []bool
	lastOp := map[flowKey]int{}
	// A gateway that (re)starts hears its peers' resync before its first
	// sync: checked then, every entry would be refused.
	select {
	case <-ctx.Done():
		return
	case <-s.o.Policy.Primed():
	}
	for {
		var it inItem
		select {
		case <-ctx.Done():
			return
		case it = <-s.in:
		}
		s.mu.Lock()
		p := s.peers[it.peer]
		s.mu.Unlock()
		if p == nil {
			continue
		}
		if it.begin {
			s.resyncBegins(p)
			continue
		}
		if it.done {
			s.sweep(p)
			s.mu.Lock()
			p.doneFromIt = true
			p.resyncsReceived++
			s.mu.Unlock()
			s.m.resyncs.WithLabelValues(p.name, "received").Inc()
			s.log.Info("statesync: resync from peer done", "peer", p.name)
			s.poke()
			continue
		}
		puts, updates, dels = puts[:0], updates[:0], dels[:0]
		refused := 0
		// A flow twice in a batch (the end of a resync's dump, then the
		// queue) takes its last op: Write deletes before it creates.
		clear(lastOp)
		for i := range it.bt.ops {
			lastOp[keyOf(&it.bt.ops[i].entry)] = i
		}
		// Which of them this gateway originated itself, and which it
		// holds replicas of from this peer already, under one lock for
		// the batch; during a resync from it, those are sent again (kept
		// by the sweep, also when refused now).
		own = slices.Grow(own[:0], len(it.bt.ops))[:len(it.bt.ops)]
		known = slices.Grow(known[:0], len(it.bt.ops))[:len(it.bt.ops)]
		s.mu.Lock()
		resync := p.resyncIn
		if p.sweeping {
			p.resyncAt = time.Now()
		}
		for i := range it.bt.ops {
			k := keyOf(&it.bt.ops[i].entry)
			_, own[i] = s.flows[k]
			r, ok := s.replicas[k]
			known[i] = ok && r.origin == p.num
			if known[i] && p.sweeping && r.resync != resync {
				s.replicas[k] = replica{origin: p.num, resync: resync}
			}
		}
		s.mu.Unlock()
		for i := range it.bt.ops {
			o := &it.bt.ops[i]
			if lastOp[keyOf(&o.entry)] != i {
				continue
			}
			why := ""
			if o.del {
				why = s.o.Policy.CheckDelete(&o.entry)
			} else {
				why = s.o.Policy.Check(&o.entry)
			}
			if why == "" && own[i] {
				why = RefusedOwn
			}
			if why != "" {
				refused++
				s.refuse(p.name, why, 1, &o.entry, nil)
				continue
			}
			switch {
			case o.del:
				dels = append(dels, o.entry)
			case known[i]:
				updates = append(updates, o.entry)
			default:
				puts = append(puts, o.entry)
			}
		}
		s.m.received.WithLabelValues(p.name).Add(float64(len(it.bt.ops)))
		written := 0
		// What the kernel said of each, puts first, then dels.
		results := func(errs []error, puts, dels []Entry) {
			s.mu.Lock()
			defer s.mu.Unlock()
			for i, err := range errs {
				var e *Entry
				if i < len(puts) {
					e = &puts[i]
				} else if i-len(puts) < len(dels) {
					e = &dels[i-len(puts)]
				} else {
					break
				}
				if err != nil {
					refused++
					s.refuseLocked(p, RefusedWrite, 1, e, err)
					continue
				}
				written++
				if i < len(puts) {
					s.replicas[keyOf(e)] = replica{origin: p.num, resync: resync}
				} else {
					delete(s.replicas, keyOf(e))
				}
			}
		}
		if len(puts)+len(dels) > 0 {
			results(s.o.Kernel.Write(puts, dels), puts, dels)
		}
		if len(updates) > 0 {
			results(s.o.Kernel.Update(updates), updates, nil)
		}
		s.mu.Lock()
		p.received += uint64(len(it.bt.ops))
		s.mu.Unlock()
		_ = s.ch.Send(p.name, msgAck, encodeAck(ack{seq: it.bt.seq, stamp: it.bt.stamp, written: uint64(written), refused: uint64(refused)}))
	}
}

// resyncBegins numbers p's resync to this gateway as it begins: the
// replicas of p's flows written before carry older numbers until it sends
// them again.
func (s *Syncer) resyncBegins(p *peer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resyncs++
	p.resyncIn, p.sweeping, p.resyncAt = s.resyncs, true, time.Now()
}

// sweep deletes, when p's resync is done, the replicas of p's flows that
// the resync did not include: p has none of them any more (their deletes
// were lost, e.g. with a queue that overflowed), and a stale one would hold
// its reply tuple against p's next flow on that masquerade port. Runs on
// the writer.
func (s *Syncer) sweep(p *peer) {
	s.mu.Lock()
	if !p.sweeping {
		s.mu.Unlock()
		return
	}
	p.sweeping = false
	var dels []Entry
	for k, r := range s.replicas {
		if r.origin == p.num && r.resync != p.resyncIn {
			dels = append(dels, k.entry())
		}
	}
	s.mu.Unlock()
	if len(dels) == 0 {
		return
	}
	errs := s.o.Kernel.Write(nil, dels)
	s.mu.Lock()
	n := 0
	for i, err := range errs {
		if err == nil {
			n++
			if k := keyOf(&dels[i]); s.replicas[k].origin == p.num {
				delete(s.replicas, k)
			}
		}
	}
	s.swept += uint64(n)
	s.mu.Unlock()
	s.m.swept.Add(float64(n))
	s.log.Info("statesync: replicas the peer's resync left out deleted", "peer", p.name, "deleted", n, "of", len(dels))
}

// refuse counts n refused entries from a peer, and logs at a bounded
// rate.
func (s *Syncer) refuse(from, reason string, n int, e *Entry, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peers[from]; p != nil {
		s.refuseLocked(p, reason, n, e, err)
	}
}

func (s *Syncer) refuseLocked(p *peer, reason string, n int, e *Entry, err error) {
	p.refused[reason] += uint64(n)
	s.m.refused.WithLabelValues(p.name, reason).Add(float64(n))
	lim := p.refuseLog[reason]
	if lim == nil {
		lim = &rate.Sometimes{First: 1, Interval: 10 * time.Second}
		p.refuseLog[reason] = lim
	}
	total := p.refused[reason]
	lim.Do(func() {
		args := []any{"peer", p.name, "reason", reason, "refused so far", total}
		if e != nil {
			args = append(args, "proto", e.Proto, "orig", e.Orig.Src.String()+" → "+e.Orig.Dst.String(),
				"reply", e.Reply.Src.String()+" → "+e.Reply.Dst.String(), "timeout", e.Timeout)
		}
		if err != nil {
			args = append(args, "error", err)
		}
		s.log.Warn("statesync: entry from peer refused, nothing written", args...)
	})
}
