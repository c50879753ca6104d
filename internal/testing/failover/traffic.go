package failover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// Traffic is what the generator sends.
type Traffic struct {
	// TCP long-lived connections and UDP flows.
	TCP, UDP int
	// Interval between two lines (TCP) or datagrams (UDP) of one flow;
	// 100 ms when zero.
	Interval time.Duration
	// LossTimeout: a flow with no correct echo for this long is lost;
	// 10 s when zero.
	LossTimeout time.Duration
	// Survive is how long after the failure a flow must still echo
	// correctly to count as kept; 3 s when zero.
	Survive time.Duration
	// NewEvery, when not zero, also opens a new short TCP connection
	// this often from the start to the end (NewConns), each failing
	// when it has not echoed within NewTimeout (1 s when zero).
	NewEvery, NewTimeout time.Duration
}

func (t *Traffic) defaults() {
	if t.Interval == 0 {
		t.Interval = 100 * time.Millisecond
	}
	if t.LossTimeout == 0 {
		t.LossTimeout = 10 * time.Second
	}
	if t.Survive == 0 {
		t.Survive = 3 * time.Second
	}
}

// ServeEcho starts echo servers on every endpoint address in h: TCP
// (every byte back) and UDP (every datagram back, from the address it was
// sent to). They stop when the lab closes or the returned func is called.
func ServeEcho(h *lab.Host, addrs []netip.Addr, port uint16) (func(), error) {
	var closers []io.Closer
	stop := func() {
		for _, c := range closers {
			c.Close()
		}
	}
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, port).String()
		ln, err := h.Listen("tcp", ap)
		if err != nil {
			stop()
			return nil, err
		}
		closers = append(closers, ln)
		lab.ServeConns(ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
		pc, err := h.ListenPacket("udp", ap)
		if err != nil {
			stop()
			return nil, err
		}
		closers = append(closers, pc)
		lab.ServeDatagrams(pc, func(req []byte) []byte { return req })
	}
	return stop, nil
}

// flow is one connection's record.
type flow struct {
	mu     sync.Mutex
	id     int
	proto  string
	echoes int
	last   time.Time // last correct echo
	maxGap time.Duration
	lost   string // why it was lost; "" while alive
}

func (f *flow) echo(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost != "" {
		return
	}
	if f.echoes > 0 {
		gap := now.Sub(f.last)
		f.maxGap = max(f.maxGap, gap)
	}
	f.echoes++
	f.last = now
}

func (f *flow) lose(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost == "" {
		f.lost = why
	}
}

// Run is traffic under way.
type Run struct {
	cfg    Traffic
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	flows  []*flow
	failed time.Time
	mu     sync.Mutex
	// newConns: the new connections, when Traffic.NewEvery asks for them.
	newConns *NewConns
}

// Start opens the flows from client to dst (TCP and UDP on the same
// address and port) and keeps them busy until Stop.
func Start(client *lab.Host, dst netip.AddrPort, cfg Traffic) (*Run, error) {
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Run{cfg: cfg, ctx: ctx, cancel: cancel}
	if err := r.Add(client, dst, cfg.TCP, cfg.UDP); err != nil {
		cancel()
		return nil, err
	}
	if cfg.NewEvery > 0 {
		r.newConns = StartNewConns(client, dst, cfg.NewEvery, cfg.NewTimeout)
	}
	return r, nil
}

// Add opens tcp more connections and udp more flows from client to dst
// into the run (new ones after a failure), followed like the first. On
// error none of them is added.
func (r *Run) Add(client *lab.Host, dst netip.AddrPort, tcp, udp int) error {
	r.mu.Lock()
	first := len(r.flows)
	r.mu.Unlock()
	var conns []net.Conn
	var flows []*flow
	for i := range tcp + udp {
		proto := "tcp"
		if i >= tcp {
			proto = "udp"
		}
		dctx, dcancel := context.WithTimeout(r.ctx, 10*time.Second)
		c, err := client.DialContext(dctx, proto, dst.String())
		dcancel()
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return fmt.Errorf("failover: %s flow %d to %v: %w", proto, first+i, dst, err)
		}
		conns = append(conns, c)
		flows = append(flows, &flow{id: first + i, proto: proto})
	}
	r.mu.Lock()
	r.flows = append(r.flows, flows...)
	r.mu.Unlock()
	for i, c := range conns {
		f := flows[i]
		r.wg.Add(1)
		if f.proto == "tcp" {
			go r.tcp(f, c)
		} else {
			go r.udp(f, c)
		}
	}
	return nil
}

// all is a copy of the flows.
func (r *Run) all() []*flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.flows)
}

// classify names a flow's end for the results.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, io.EOF):
		return "closed"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return err.Error()
	}
}

// tcp writes a numbered line every interval and waits for its echo,
// which must be the same line.
func (r *Run) tcp(f *flow, c net.Conn) {
	defer r.wg.Done()
	defer c.Close()
	stop := context.AfterFunc(r.ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	br := bufio.NewReader(c)
	next := time.Now()
	for seq := 1; ; seq++ {
		line := fmt.Sprintf("flow %d line %d\n", f.id, seq)
		_ = c.SetDeadline(time.Now().Add(r.cfg.LossTimeout))
		if _, err := io.WriteString(c, line); err != nil {
			if r.ctx.Err() == nil {
				f.lose(classify(err))
			}
			return
		}
		got, err := br.ReadString('\n')
		if err != nil {
			if r.ctx.Err() == nil {
				f.lose(classify(err))
			}
			return
		}
		if got != line {
			f.lose(fmt.Sprintf("wrong bytes: %q for %q", got, line))
			return
		}
		f.echo(time.Now())
		next = next.Add(r.cfg.Interval)
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-r.ctx.Done():
				return
			}
		} else {
			next = time.Now()
		}
	}
}

// udp sends a numbered datagram every interval; every echo must be one
// of them, and one must come at least every LossTimeout.
func (r *Run) udp(f *flow, c net.Conn) {
	defer r.wg.Done()
	defer c.Close()
	stop := context.AfterFunc(r.ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	var sent atomic.Int64 // the highest sequence number sent
	go func() {
		tick := time.NewTicker(r.cfg.Interval)
		defer tick.Stop()
		for seq := 1; ; seq++ {
			sent.Store(int64(seq))
			_, _ = fmt.Fprintf(c, "flow %d datagram %d\n", f.id, seq)
			select {
			case <-tick.C:
			case <-r.ctx.Done():
				return
			}
		}
	}()
	buf := make([]byte, 2048)
	for {
		_ = c.SetReadDeadline(time.Now().Add(r.cfg.LossTimeout))
		n, err := c.Read(buf)
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			// An ICMP error reported on the connected socket (a
			// gateway's or the endpoint's unreachable) is a loss too.
			f.lose(classify(err))
			return
		}
		var id, seq int
		if _, err := fmt.Sscanf(string(buf[:n]), "flow %d datagram %d\n", &id, &seq); err != nil || id != f.id ||
			string(buf[:n]) != fmt.Sprintf("flow %d datagram %d\n", id, seq) {
			f.lose(fmt.Sprintf("wrong bytes: %q", buf[:n]))
			return
		}
		if int64(seq) > sent.Load() {
			f.lose(fmt.Sprintf("echo of datagram %d never sent", seq))
			return
		}
		f.echo(time.Now())
	}
}

// Established waits until every flow has echoed at least twice, or one is
// lost, and new connections (if any) have echoed.
func (r *Run) Established(timeout time.Duration) error {
	if r.newConns != nil {
		if err := r.newConns.Succeeded(10, timeout); err != nil {
			return err
		}
	}
	return lab.EventuallyWithin(timeout, func() error {
		waiting := 0
		for _, f := range r.all() {
			f.mu.Lock()
			lost, n := f.lost, f.echoes
			f.mu.Unlock()
			if lost != "" {
				return fmt.Errorf("%s flow %d lost before any failure: %s", f.proto, f.id, lost)
			}
			if n < 2 {
				waiting++
			}
		}
		if waiting > 0 {
			return fmt.Errorf("%d of %d flows have not echoed twice yet", waiting, len(r.flows))
		}
		return nil
	})
}

// Failed records the moment the failure was injected.
func (r *Run) Failed(at time.Time) {
	r.mu.Lock()
	r.failed = at
	r.mu.Unlock()
	if r.newConns != nil {
		r.newConns.Failed(at)
	}
}

// RestartStalls makes each flow's longest stall count again from now
// (a second event after the failure: the failed gateway's return).
func (r *Run) RestartStalls() {
	for _, f := range r.all() {
		f.mu.Lock()
		f.maxGap = 0
		f.mu.Unlock()
	}
}

// Settle waits until every flow is decided: kept (a correct echo at least
// Survive after the failure) or lost (a reset, a wrong byte, or no echo
// for LossTimeout). It returns once all are decided, at the latest
// Survive + LossTimeout + 5 s after the failure.
func (r *Run) Settle() {
	r.mu.Lock()
	failed := r.failed
	r.mu.Unlock()
	deadline := failed.Add(r.cfg.Survive + r.cfg.LossTimeout + 5*time.Second)
	_ = lab.EventuallyWithin(time.Until(deadline), func() error {
		for _, f := range r.all() {
			f.mu.Lock()
			undecided := f.lost == "" && f.last.Before(failed.Add(r.cfg.Survive))
			f.mu.Unlock()
			if undecided {
				return errors.New("undecided")
			}
		}
		return nil
	})
}

// Stop ends the traffic and returns the result (Result).
func (r *Run) Stop() Result {
	r.cancel()
	r.wg.Wait()
	if r.newConns != nil {
		r.newConns.Stop()
	}
	return r.Result()
}

// Result is the outcome so far: a flow that never echoed Survive after
// the failure counts as lost ("timeout").
func (r *Run) Result() Result {
	r.mu.Lock()
	failed := r.failed
	r.mu.Unlock()
	res := Result{TCP: Stats{Reasons: map[string]int{}}, UDP: Stats{Reasons: map[string]int{}}}
	var stalls = map[string][]time.Duration{}
	for _, f := range r.all() {
		st := &res.TCP
		if f.proto == "udp" {
			st = &res.UDP
		}
		st.Flows++
		f.mu.Lock()
		lost, last, gap := f.lost, f.last, f.maxGap
		f.mu.Unlock()
		if lost == "" && !failed.IsZero() && last.Before(failed.Add(r.cfg.Survive)) {
			lost = "timeout"
		}
		if lost != "" {
			st.Lost++
			if strings.HasPrefix(lost, "wrong bytes") {
				lost = "wrong bytes"
			}
			st.Reasons[lost]++
			continue
		}
		stalls[f.proto] = append(stalls[f.proto], gap)
	}
	for proto, st := range map[string]*Stats{"tcp": &res.TCP, "udp": &res.UDP} {
		s := stalls[proto]
		if len(s) == 0 {
			continue
		}
		slices.Sort(s)
		st.StallMaxMs = ms(s[len(s)-1])
		st.StallP99Ms = ms(s[(len(s)*99+99)/100-1])
		st.StallP50Ms = ms(s[(len(s)-1)/2])
	}
	if r.newConns != nil {
		n := r.newConns.Result()
		res.New = &n
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Result is one run's outcome, per protocol.
type Result struct {
	TCP Stats `json:"tcp"`
	UDP Stats `json:"udp"`
	// New: the new connections opened during the run (Traffic.NewEvery).
	New *NewConnStats `json:"new_connections,omitempty"`
}

// Stats: flows, how many were lost and why, and over the flows kept the
// longest gap between two echoes (the stall the failure caused plus one
// interval), its median, p99 and max.
type Stats struct {
	Flows      int            `json:"flows"`
	Lost       int            `json:"lost"`
	Reasons    map[string]int `json:"lost_reasons,omitempty"`
	StallP50Ms float64        `json:"stall_p50_ms"`
	StallP99Ms float64        `json:"stall_p99_ms"`
	StallMaxMs float64        `json:"stall_max_ms"`
}

func (s Stats) String() string {
	return fmt.Sprintf("lost %d/%d %v, longest stall p50 %.0f ms p99 %.0f ms max %.0f ms",
		s.Lost, s.Flows, s.Reasons, s.StallP50Ms, s.StallP99Ms, s.StallMaxMs)
}

func (r Result) String() string {
	s := "TCP " + r.TCP.String() + "; UDP " + r.UDP.String()
	if r.New != nil {
		s += "; " + r.New.String()
	}
	return s
}
