package gateways

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Message types: the first byte of a frame's plaintext. Types below
// FirstUserType are the set's own; others (the state sync of connections)
// register theirs with Handle.
const (
	msgState byte = 1
	// FirstUserType is the first message type Handle and Send accept.
	FirstUserType byte = 16
)

// Handler receives one message of a registered type from a peer. The
// payload is valid only during the call. It runs on the link's reader, so
// it must not block for long.
type Handler func(peer string, payload []byte)

// Options are what New needs besides the Config.
type Options struct {
	// Key is the shared key (Config.ReadKey).
	Key []byte
	// OnChange receives the addresses this gateway holds (answers for),
	// sorted, every time the set changes. It is called before the peers
	// are told, so an address is no longer answered for here before a
	// peer can take it. It must not call back into the Set.
	OnChange func(held []netip.Addr)
	Log      *slog.Logger
	// Clock drives the heartbeats and the liveness; nil is the real clock.
	Clock clock.WithTicker
	// Listener, when set, is used instead of listening on Config.Listen
	// (tests); the Set closes it.
	Listener net.Listener
	// OnPeer, when set, is told when a peer becomes alive or dead, and
	// when a live peer comes back with another incarnation (it restarted
	// within the dead time, and lost what it held). It is called with the
	// Set's lock held: it must not call back into the Set.
	OnPeer func(peer string, alive bool, incarnation uint64)
	// Ready, when set, is closed once this gateway holds its peers' flow
	// state (the connection-state sync's full resync). Until then, or
	// until Config.ReadyTimeout passes, the gateway takes no address a
	// ready live peer could hold; its peers learn it from its state, so
	// every gateway computes the same owner. nil: ready at once.
	Ready <-chan struct{}
	// ReadyHold, when set, is asked when ReadyTimeout passes with Ready
	// not closed: while it answers true (the peers' flow state still
	// arrives: a large table takes longer than ReadyTimeout), the gateway
	// waits on, asking again every ReadyHoldEvery, up to ReadyHoldMax
	// times ReadyTimeout.
	ReadyHold func() bool
	// OnStandby, when set, is told when this gateway goes on standby
	// (faulty, SetFault, while a live peer is fit and not leaving) and
	// when it comes off it: what every gateway of the set announces (the
	// Service routes of active-active mode) is then better drawn by the
	// fit peers. It is called with the Set's lock held: it must not call
	// back into the Set.
	OnStandby func(standby bool)
	// OnReady, when set, is called once this gateway is ready (Ready
	// closed, or ReadyTimeout passed; at once without Ready), with the
	// Set's lock held: it must not call back into the Set.
	OnReady func()
}

// How long ReadyHold can keep a gateway waiting past ReadyTimeout: asked
// every ReadyHoldEvery, until ReadyHoldMax times ReadyTimeout.
const (
	ReadyHoldEvery = time.Second
	ReadyHoldMax   = 10
)

// Set is this gateway's membership in the gateway set: the channel to
// every peer, the heartbeats, and the ownership of the floating addresses.
// Its methods are safe for concurrent use.
type Set struct {
	cfg   Config
	opts  Options
	log   *slog.Logger
	clock clock.WithTicker
	hash  [32]byte
	inc   uint64
	ln    net.Listener

	mu      sync.Mutex
	v       *view
	applied []netip.Addr
	// loggedTakenOver is v.takenOver when ownership was last logged.
	loggedTakenOver uint64
	// fault says why this gateway is faulty (SetFault), "" while fit;
	// standby is what OnStandby was last told.
	fault   string
	standby bool
	links   map[*link]bool
	peers   map[string]*peerStats
	refused []Refusal
	closed  bool
	stop    chan struct{}
	// ctx ends when the Set closes, cancelling dials in progress.
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	handlers map[byte]Handler
	upMetric *prometheus.GaugeVec
	refusals *prometheus.CounterVec
	chErrors *prometheus.CounterVec
}

type peerStats struct {
	errors  uint64
	refused uint64
	lastErr string
	up      bool
	inc     uint64 // the incarnation up was last reported for
}

// Refusal is one refused hello, for the status page.
type Refusal struct {
	Time   time.Time `json:"time"`
	Remote string    `json:"remote"`
	Peer   string    `json:"peer,omitempty"`
	Reason string    `json:"reason"`
	Error  string    `json:"error"`
}

// maxRefusals is how many recent refusals the status keeps.
const maxRefusals = 16

// link is one channel connection to a peer.
type link struct {
	peer   string
	addr   string // the configured address dialed, or the remote address accepted
	dialed bool
	c      *conn
	out    chan []byte
	since  time.Time
	done   chan struct{}
	// flushed is closed when the writer wrote everything queued before
	// Close's nil frame.
	flushed chan struct{}
	once    sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.c.close()
	})
}

// New validates cfg (after WithDefaults), listens on cfg.Listen and starts
// the channel to every peer. It holds no address until its peers answered
// or cfg.StartupWait passed.
func New(cfg Config, opts Options) (*Set, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(opts.Key) < MinKeyLen {
		return nil, fmt.Errorf("%s.key_file = %q: the key has %d bytes, want at least %d", Key, cfg.KeyFile, len(opts.Key), MinKeyLen)
	}
	s := &Set{cfg: cfg, opts: opts, log: opts.Log, clock: opts.Clock, hash: cfg.SetHash(),
		links: map[*link]bool{}, peers: map[string]*peerStats{}, handlers: map[byte]Handler{}, stop: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	s.inc = binary.BigEndian.Uint64(b[:])
	s.ctx, s.cancel = context.WithCancel(context.Background())
	var names []string
	for _, p := range cfg.Peers {
		names = append(names, p.Name)
		s.peers[p.Name] = &peerStats{}
	}
	s.v = newView(cfg.Name, names, s.inc, cfg.dead(), s.clock.Now().Add(cfg.StartupWait))
	s.v.activeBackup = cfg.Mode == ModeActiveBackup
	s.v.home = cfg.home()
	s.v.ready = opts.Ready == nil
	s.upMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nftgate_gateway_peer_up", Help: "1 while the peer gateway's heartbeats arrive, else 0.",
	}, []string{"peer"})
	for _, n := range names {
		s.upMetric.WithLabelValues(n).Set(0)
	}
	s.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftgate_gateway_hellos_refused_total",
		Help: "Channel connections refused in the handshake, by reason (key, set, unknown_peer, protocol).",
	}, []string{"reason"})
	s.chErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nftgate_gateway_channel_errors_total", Help: "Channel connections to a peer that failed or ended, by peer.",
	}, []string{"peer"})
	s.ln = opts.Listener
	if s.ln == nil {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			s.cancel()
			return nil, fmt.Errorf("%s.listen = %q: %w", Key, cfg.Listen, err)
		}
		s.ln = ln
	}
	s.wg.Go(s.accept)
	for _, p := range cfg.Peers {
		if cfg.Name < p.Name { // the lower name dials
			for _, a := range p.Addresses {
				s.wg.Go(func() { s.dial(p.Name, a) })
			}
		}
	}
	s.wg.Go(s.heartbeats)
	if opts.Ready != nil {
		s.wg.Go(s.awaitReady)
	} else if opts.OnReady != nil {
		opts.OnReady()
	}
	return s, nil
}

// awaitReady marks this gateway ready when Options.Ready is closed, or
// when Config.ReadyTimeout has passed and Options.ReadyHold does not hold
// it (up to ReadyHoldMax times ReadyTimeout).
func (s *Set) awaitReady() {
	t := s.clock.NewTimer(s.cfg.ReadyTimeout)
	defer t.Stop()
	limit := s.clock.Now().Add(ReadyHoldMax * s.cfg.ReadyTimeout)
	held := false
wait:
	for {
		select {
		case <-s.stop:
			return
		case <-s.opts.Ready:
			s.log.Info("gateways: ready (the peers' flow state is here)")
			break wait
		case <-t.C():
			if s.opts.ReadyHold != nil && s.clock.Now().Before(limit) && s.opts.ReadyHold() {
				if !held {
					held = true
					s.log.Info("gateways: ready_timeout passed while the peers' flow state still arrives; waiting on", "ready_timeout", s.cfg.ReadyTimeout)
				}
				t.Reset(ReadyHoldEvery)
				continue
			}
			s.log.Warn("gateways: not ready within ready_timeout; taking part as ready", "ready_timeout", s.cfg.ReadyTimeout, "held", held)
			break wait
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.v.setReady() && !s.decideLocked() {
		s.applyLocked() // the peers learn it
	}
	if s.opts.OnReady != nil {
		s.opts.OnReady()
	}
}

func (c Config) dead() time.Duration { return time.Duration(c.DeadAfter) * c.HeartbeatInterval }

// Addr is the channel's listening address.
func (s *Set) Addr() net.Addr { return s.ln.Addr() }

// Set makes the served addresses (those this gateway could answer for)
// equal to addrs; the Set decides which of them it holds. It is the
// announce.AddrSetter the L2 announcement goes through.
func (s *Set) Set(addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.v.setServed(addrs) {
		s.v.decide(s.clock.Now())
		s.applyLocked()
	}
}

// Leave makes this gateway no candidate for any address another live
// gateway serves (a drain): it releases those addresses, tells its peers,
// and they take them by handover; it keeps only what no other gateway
// can hold. It stays in the set (heartbeats, the channel) until Close.
func (s *Set) Leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.v.setLeaving() && !s.decideLocked() {
		s.applyLocked() // the peers learn it
	}
}

// SetFault makes this gateway faulty (why: which tracked link is down)
// or, with why empty, fit again. A faulty gateway is a candidate for an
// address only while no fit live gateway serves it: it releases what a
// fit peer can hold, tells its peers, and they take it by handover; fit
// again, it takes its addresses back the same way. It stays in the set.
func (s *Set) SetFault(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if why != s.fault {
		if why != "" {
			s.log.Warn("gateways: faulty; handing over what a fit peer can hold", "why", why)
		} else {
			s.log.Info("gateways: fit again", "was", s.fault)
		}
	}
	s.fault = why
	if s.v.setFaulty(why != "") && !s.decideLocked() {
		s.applyLocked() // the peers learn it
	}
}

// applyLocked hands the held set to OnChange if it changed, then sends
// the state to every link. s.mu is held.
func (s *Set) applyLocked() {
	held := s.v.held()
	if !slices.Equal(held, s.applied) {
		s.logOwnership(s.applied, held)
		s.applied = held
		if s.opts.OnChange != nil {
			s.opts.OnChange(slices.Clone(held))
		}
	}
	for l := range s.links {
		s.sendLocked(l, true)
	}
}

// logOwnership logs the addresses this gateway took and released between
// two held sets (sorted), and how many it took over from a dead peer
// since the last time. s.mu is held.
func (s *Set) logOwnership(before, after []netip.Addr) {
	var took, released []netip.Addr
	i, j := 0, 0
	for i < len(before) || j < len(after) {
		switch {
		case j == len(after) || i < len(before) && before[i].Less(after[j]):
			released = append(released, before[i])
			i++
		case i == len(before) || after[j].Less(before[i]):
			took = append(took, after[j])
			j++
		default:
			i++
			j++
		}
	}
	over := s.v.takenOver - s.loggedTakenOver
	s.loggedTakenOver = s.v.takenOver
	if len(took) > 0 {
		s.log.Info("gateways: addresses taken", "count", len(took), "fromDeadPeer", over, "addresses", someAddrs(took))
	}
	if len(released) > 0 {
		s.log.Info("gateways: addresses released", "count", len(released), "addresses", someAddrs(released))
	}
}

// someAddrs lists up to 10 addresses for a log line, and how many more.
func someAddrs(as []netip.Addr) string {
	const most = 10
	var b strings.Builder
	for i, a := range as[:min(len(as), most)] {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.String())
	}
	if len(as) > most {
		fmt.Fprintf(&b, " and %d more", len(as)-most)
	}
	return b.String()
}

// sendLocked queues this gateway's state (full or a heartbeat) on l; a
// link whose queue is full is closed (it reconnects and starts with a
// full state). s.mu is held.
func (s *Set) sendLocked(l *link, full bool) {
	b, err := json.Marshal(s.v.message(l.peer, full))
	if err != nil {
		panic(err) // a stateMsg always encodes
	}
	select {
	case l.out <- append([]byte{msgState}, b...):
	default:
		s.log.Warn("gateways: send queue full, reconnecting", "peer", l.peer, "link", l.addr)
		l.close()
	}
}

func (s *Set) heartbeats() {
	t := s.clock.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C():
		}
		s.mu.Lock()
		for l := range s.links {
			s.sendLocked(l, false)
		}
		s.decideLocked()
		s.mu.Unlock()
	}
}

// decideLocked runs the ownership decision now and logs peers that came
// or went; it tells whether the held set changed (and was applied).
func (s *Set) decideLocked() bool {
	changed := s.v.decide(s.clock.Now())
	for name, p := range s.v.peers {
		st := s.peers[name]
		if p.alive != st.up {
			st.up = p.alive
			if p.alive {
				s.upMetric.WithLabelValues(name).Set(1)
				s.log.Info("gateways: peer alive", "peer", name)
			} else {
				s.upMetric.WithLabelValues(name).Set(0)
				s.log.Warn("gateways: peer dead", "peer", name, "lastHeard", p.lastHeard)
			}
		} else if !p.alive || p.incarnation == st.inc {
			continue
		}
		st.inc = p.incarnation
		if s.opts.OnPeer != nil {
			s.opts.OnPeer(name, p.alive, p.incarnation)
		}
	}
	if changed {
		s.applyLocked()
	}
	if sb := s.v.standby(); sb != s.standby {
		s.standby = sb
		if sb {
			s.log.Warn("gateways: on standby: faulty while a fit peer lives", "why", s.fault)
		} else {
			s.log.Info("gateways: off standby")
		}
		if s.opts.OnStandby != nil {
			s.opts.OnStandby(sb)
		}
	}
	return changed
}

func (s *Set) accept() {
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("gateways: accept", "error", err)
			if !s.pause(s.cfg.HeartbeatInterval) {
				return
			}
			continue
		}
		s.wg.Go(func() {
			c, err := s.handshake(nc, "")
			if err != nil {
				nc.Close()
				return
			}
			s.run(&link{peer: c.peer, addr: nc.RemoteAddr().String(), c: c})
		})
	}
}

// dial keeps a link to peer at addr until the Set closes.
func (s *Set) dial(peer, addr string) {
	backoff := s.cfg.HeartbeatInterval
	for {
		d := net.Dialer{Timeout: s.cfg.dead()}
		nc, err := d.DialContext(s.ctx, "tcp", addr)
		if err == nil {
			var c *conn
			if c, err = s.handshake(nc, peer); err == nil {
				backoff = s.cfg.HeartbeatInterval
				s.run(&link{peer: peer, addr: addr, dialed: true, c: c})
			} else {
				nc.Close()
			}
		}
		if err != nil {
			s.linkError(peer, addr, err)
			backoff = min(2*backoff, time.Second)
		}
		if !s.pause(backoff) {
			return
		}
	}
}

// pause waits d of real time; false when the Set closed meanwhile.
func (s *Set) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.stop:
		return false
	case <-t.C:
		return true
	}
}

func (s *Set) handshake(nc net.Conn, expect string) (*conn, error) {
	_ = nc.SetDeadline(time.Now().Add(max(s.cfg.dead(), time.Second)))
	c, claimed, err := handshake(nc, handshakeParams{
		key: s.opts.Key, self: s.cfg.Name, setHash: s.hash, incarnation: s.inc,
		dialer: expect != "", expect: expect,
		accept: func(name string) bool { _, ok := s.peers[name]; return ok && name < s.cfg.Name },
	})
	if err != nil {
		if expect == "" || !isNetErr(err) {
			s.refuse(nc.RemoteAddr().String(), cmp.Or(expect, claimed), err)
		}
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed)
}

// refuse counts and records a refused hello.
func (s *Set) refuse(remote, peer string, err error) {
	reason := refusalReason(err)
	s.refusals.WithLabelValues(reason).Inc()
	s.log.Warn("gateways: hello refused", "remote", remote, "peer", peer, "reason", reason, "error", err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.peers[peer]; st != nil {
		st.refused++
	}
	s.refused = append(s.refused, Refusal{Time: s.clock.Now(), Remote: remote, Peer: peer, Reason: reason, Error: err.Error()})
	if len(s.refused) > maxRefusals {
		s.refused = s.refused[len(s.refused)-maxRefusals:]
	}
}

func (s *Set) linkError(peer, addr string, err error) {
	s.chErrors.WithLabelValues(peer).Inc()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.peers[peer]; st != nil {
		st.errors++
		st.lastErr = fmt.Sprintf("%s: %v", addr, err)
	}
}

// run serves one authenticated link until it fails or the Set closes.
func (s *Set) run(l *link) {
	l.out = make(chan []byte, 256)
	l.done = make(chan struct{})
	l.flushed = make(chan struct{})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.c.close()
		return
	}
	l.since = s.clock.Now()
	s.links[l] = true
	s.v.receive(l.peer, l.c.incarnation, stateMsg{}, s.clock.Now())
	s.sendLocked(l, true)
	s.mu.Unlock()
	s.log.Info("gateways: link up", "peer", l.peer, "link", l.addr)

	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-l.done:
				return
			case b := <-l.out:
				if b == nil { // Close: everything before was written
					close(l.flushed)
					return
				}
				_ = l.c.nc.SetWriteDeadline(time.Now().Add(s.cfg.dead()))
				if err := l.c.send(b); err != nil {
					l.close()
					return
				}
			}
		}
	})
	err := s.read(l)
	l.close()
	wg.Wait()
	s.mu.Lock()
	delete(s.links, l)
	s.mu.Unlock()
	select {
	case <-s.stop:
	default:
		s.log.Warn("gateways: link down", "peer", l.peer, "link", l.addr, "error", err)
		s.linkError(l.peer, l.addr, err)
	}
}

func (s *Set) read(l *link) error {
	for {
		// Liveness is the heartbeats' business (lastHeard); the deadline
		// only ends a link that carries nothing at all, so that it is
		// dialed afresh, and leaves a slow one be.
		l.c.setReadDeadline(time.Now().Add(3 * s.cfg.dead()))
		b, err := l.c.recv()
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return fmt.Errorf("%w: empty frame", ErrProtocol)
		}
		switch b[0] {
		case msgState:
			var m stateMsg
			if err := json.Unmarshal(b[1:], &m); err != nil {
				return fmt.Errorf("%w: state: %v", ErrProtocol, err)
			}
			s.mu.Lock()
			answer := s.v.receive(l.peer, l.c.incarnation, m, s.clock.Now())
			before := s.v.version
			s.decideLocked()
			if answer && s.v.version == before {
				for o := range s.links {
					if o.peer == l.peer {
						s.sendLocked(o, true)
					}
				}
			}
			s.mu.Unlock()
		default:
			s.mu.Lock()
			h := s.handlers[b[0]]
			s.mu.Unlock()
			if h != nil {
				h(l.peer, b[1:])
			}
			// else a type this gateway does not know (a newer peer's):
			// skipped
		}
	}
}

// Handle registers fn for messages of type t (at least FirstUserType),
// replacing any before it.
func (s *Set) Handle(t byte, fn Handler) error {
	if t < FirstUserType {
		return fmt.Errorf("message type %d is the gateway set's own (want %d or more)", t, FirstUserType)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[t] = fn
	return nil
}

// Send queues a message of type t to peer on one of its links (the oldest
// up). It fails when no link to the peer is up or its queue is full (the
// link is then dropped and dialed afresh, as for the set's own messages).
func (s *Set) Send(peer string, t byte, payload []byte) error {
	if t < FirstUserType {
		return fmt.Errorf("message type %d is the gateway set's own (want %d or more)", t, FirstUserType)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *link
	for l := range s.links {
		if l.peer == peer && (best == nil || l.since.Before(best.since)) {
			best = l
		}
	}
	if best == nil {
		return fmt.Errorf("no link to %q is up", peer)
	}
	select {
	case best.out <- append([]byte{t}, payload...):
		return nil
	default:
		best.close()
		return fmt.Errorf("the queue to %q is full", peer)
	}
}

// Close tells the peers this gateway serves nothing any more (so they take
// its addresses at once rather than after the dead time), stops answering
// (OnChange with nothing), and closes the channel.
func (s *Set) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	if s.v.setServed(nil) {
		s.v.decide(s.clock.Now())
		s.applyLocked()
	}
	s.closed = true
	links := make([]*link, 0, len(s.links))
	for l := range s.links {
		links = append(links, l)
	}
	s.mu.Unlock()
	// Let the writers send the last state, within a bound.
	ctx, cancel := context.WithTimeout(context.Background(), closeFlush)
	defer cancel()
	for _, l := range links {
		select {
		case l.out <- nil:
		default:
			continue
		}
		select {
		case <-l.flushed:
		case <-l.done:
		case <-ctx.Done():
		}
	}
	close(s.stop)
	s.cancel()
	err := s.ln.Close()
	for _, l := range links {
		l.close()
	}
	s.wg.Wait()
	return err
}

// closeFlush bounds how long Close waits for the last state to be written.
const closeFlush = 200 * time.Millisecond

// Status is the gateway set as the status page shows it.
type Status struct {
	Name string `json:"name"`
	// Mode is the configured mode (active-backup, active-active).
	Mode string `json:"mode"`
	// Ready: this gateway holds its peers' flow state (or gave up
	// waiting after ready_timeout).
	Ready bool `json:"ready"`
	// Leaving: this gateway drains (Leave) and hands its addresses over.
	Leaving bool `json:"leaving,omitempty"`
	// Fault says which tracked link is down (SetFault); "" while fit.
	// Standby: faulty while a fit peer lives.
	Fault   string `json:"fault,omitempty"`
	Standby bool   `json:"standby,omitempty"`
	// SetHash identifies the configured set (names and timing); a peer
	// with another is refused.
	SetHash string `json:"setHash"`
	// Holds are the addresses this gateway answers for; Serves counts
	// those it could answer for.
	Holds     []netip.Addr `json:"holds"`
	Serves    int          `json:"serves"`
	Peers     []PeerStatus `json:"peers"`
	Refused   []Refusal    `json:"refused"`
	Taken     uint64       `json:"taken"`
	TakenOver uint64       `json:"takenOver"`
	Released  uint64       `json:"released"`
}

// PeerStatus is one peer.
type PeerStatus struct {
	Name string `json:"name"`
	// State: "alive" (heartbeats arrive), "dead" (none for the dead
	// time), "unknown" (never heard since this gateway started).
	State string `json:"state"`
	// Ready: the peer said it holds its peers' flow state.
	Ready bool `json:"ready"`
	// Leaving: the peer drains and hands its addresses over.
	Leaving bool `json:"leaving,omitempty"`
	// Faulty: a link the peer tracks is down.
	Faulty        bool         `json:"faulty,omitempty"`
	LastHeartbeat time.Time    `json:"lastHeartbeat,omitzero"`
	Holds         []netip.Addr `json:"holds"`
	Links         []LinkStatus `json:"links"`
	ChannelErrors uint64       `json:"channelErrors"`
	RefusedHellos uint64       `json:"refusedHellos"`
	LastError     string       `json:"lastError,omitempty"`
}

// LinkStatus is one connection to a peer.
type LinkStatus struct {
	Address string    `json:"address"`
	Dialed  bool      `json:"dialed"`
	Since   time.Time `json:"since"`
}

// Status returns the set's state now.
func (s *Set) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	st := Status{Name: s.cfg.Name, Mode: s.cfg.Mode, Ready: s.v.ready, Leaving: s.v.leaving, Fault: s.fault, Standby: s.standby, SetHash: hex.EncodeToString(s.hash[:8]), Holds: s.v.held(), Serves: len(s.v.serves),
		Peers: []PeerStatus{}, Refused: slices.Clone(s.refused), Taken: s.v.taken, TakenOver: s.v.takenOver, Released: s.v.released}
	if st.Refused == nil {
		st.Refused = []Refusal{}
	}
	for _, pc := range s.cfg.Peers {
		p, ps := s.v.peers[pc.Name], s.peers[pc.Name]
		out := PeerStatus{Name: pc.Name, State: "unknown", LastHeartbeat: p.lastHeard, Holds: []netip.Addr{}, Links: []LinkStatus{},
			ChannelErrors: ps.errors, RefusedHellos: ps.refused, LastError: ps.lastErr}
		if p.known {
			out.State = "dead"
			if s.v.alive(p, now) {
				out.State = "alive"
			}
			out.Holds = sortedKeys(p.holds)
			out.Ready, out.Leaving, out.Faulty = p.ready, p.leaving, p.faulty
		}
		for l := range s.links {
			if l.peer == pc.Name {
				out.Links = append(out.Links, LinkStatus{Address: l.addr, Dialed: l.dialed, Since: l.since})
			}
		}
		slices.SortFunc(out.Links, func(a, b LinkStatus) int { return compareStrings(a.Address, b.Address) })
		st.Peers = append(st.Peers, out)
	}
	return st
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Register adds the Set's metrics to reg: nftgate_gateway_peer_up{peer},
// nftgate_gateway_owned_addresses, nftgate_gateway_faulty,
// nftgate_gateway_handovers_total{change},
// nftgate_gateway_hellos_refused_total{reason} and
// nftgate_gateway_channel_errors_total{peer}.
func (s *Set) Register(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{s.upMetric, s.refusals, s.chErrors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nftgate_gateway_owned_addresses", Help: "Floating addresses this gateway holds (answers for).",
		}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return float64(len(s.v.holds))
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nftgate_gateway_faulty", Help: "1 while a link this gateway tracks (track_interfaces) is down, or not up for track_up_after yet, else 0.",
		}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.fault != "" {
				return 1
			}
			return 0
		}),
	}
	for _, ch := range []string{"taken", "taken_over", "released"} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "nftgate_gateway_handovers_total",
			Help:        "Floating addresses taken (handed over by a live peer, or held by none), taken over from a dead peer, and released.",
			ConstLabels: prometheus.Labels{"change": ch},
		}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			switch ch {
			case "taken":
				return float64(s.v.taken)
			case "taken_over":
				return float64(s.v.takenOver)
			}
			return float64(s.v.released)
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
