package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/statesync"
)

// SyncLag is the time from A's kernel creating an entry to B's kernel
// creating its replica. It is measured twice. From the kernel's own
// clock: with nf_conntrack_timestamp on in both namespaces, every entry
// has its creation time (a translated flow's at its first packet's
// confirmation, a replica's at its creation through netlink), which the
// DESTROY event carries; the run's end flushes both tables, so every
// entry's DESTROY comes. And as a conntrack event listener in each
// namespace saw it (NEW of the translated flow on A, NEW of the replica,
// ct mark bit 31, on B), both in this process: that view includes how
// late this process read its events, and the difference between the two
// is the bench's own listeners falling behind. Flows are matched by their
// original tuple.
type SyncLag struct {
	// FlowsA: flows to the Service whose NEW A's kernel reported; SeenB:
	// those whose replica B's kernel reported; NeverOnB the rest,
	// NeverFraction their share. OnlyB: replicas whose flow A's listener
	// did not report (its events lost).
	FlowsA        int     `json:"flows_a"`
	SeenB         int     `json:"seen_b"`
	NeverOnB      int     `json:"never_on_b"`
	NeverFraction float64 `json:"never_fraction"`
	OnlyB         int     `json:"only_b,omitempty"`
	// ReusedA: NEW events on A of a tuple already reported in the run
	// (the first one is what is matched).
	ReusedA int `json:"reused_a,omitempty"`
	// Kernel is the lag from the kernels' creation times; KernelFlows how
	// many flows had both (the others' DESTROY was not read).
	Kernel      Quantiles `json:"kernel"`
	KernelFlows int       `json:"kernel_flows"`
	// Listener is the lag as the listeners saw it (the NEW events' read
	// times); ReadDelayA and ReadDelayB how long after the kernel created
	// an entry this process read its NEW event, on A and on B.
	Listener   Quantiles `json:"listener"`
	ReadDelayA Quantiles `json:"read_delay_a"`
	ReadDelayB Quantiles `json:"read_delay_b"`
	// MaxBy500ms is the longest kernel lag of the flows A created in each
	// half second of the run, in ms: when the tail happened.
	MaxBy500ms []float64 `json:"max_by_500ms,omitempty"`
	// ListenerErrors: the listeners' socket errors (an overflow loses
	// events).
	ListenerErrors []string `json:"listener_errors,omitempty"`
}

// Quantiles are p50, p90, p99 and the maximum of a set of durations, in
// milliseconds.
type Quantiles struct {
	P50Ms float64 `json:"p50_ms"`
	P90Ms float64 `json:"p90_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

func quantilesOf(ms []float64) Quantiles {
	return Quantiles{percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), percentile(ms, 100)}
}

func (q Quantiles) String() string {
	return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f", q.P50Ms, q.P90Ms, q.P99Ms, q.MaxMs)
}

// seen is what the listeners learnt of one flow (or replica).
type seen struct {
	read  time.Time // when its NEW event was read
	start time.Time // its creation, from its DESTROY event
}

// syncWatch is the pair of listeners.
type syncWatch struct {
	svc   netip.AddrPort
	hosts [2]*lab.Host
	conns []*netlink.Conn
	wg    sync.WaitGroup

	mu      sync.Mutex
	a, b    map[netip.AddrPort]*seen
	reusedA int
	errs    []string
}

// watchReadBuffer is each listener's receive buffer: the flush at the
// end of a run sends every entry's DESTROY at once (about 1 KiB each).
const watchReadBuffer = 256 << 20

// watchSync turns on conntrack timestamps in A's and B's namespaces and
// starts listening to their NEW and DESTROY events for flows to svc.
// Close stops it.
func watchSync(a, b *lab.Host, svc netip.AddrPort) (*syncWatch, error) {
	w := &syncWatch{svc: svc, hosts: [2]*lab.Host{a, b}, a: map[netip.AddrPort]*seen{}, b: map[netip.AddrPort]*seen{}}
	for i, h := range w.hosts {
		if err := h.Sysctl("net/netfilter/nf_conntrack_timestamp", "1"); err != nil {
			return nil, errors.Join(err, w.Close())
		}
		if err := w.listen(h, i == 1); err != nil {
			return nil, errors.Join(err, w.Close())
		}
	}
	return w, nil
}

func (w *syncWatch) listen(h *lab.Host, replica bool) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: h.FD()})
	if err != nil {
		return fmt.Errorf("%s: conntrack events: %w", h, err)
	}
	w.conns = append(w.conns, c)
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("%s: conntrack events: %w", h, err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchReadBuffer)
	}); err != nil || serr != nil {
		return fmt.Errorf("%s: conntrack events: receive buffer: %w", h, errors.Join(err, serr))
	}
	for _, g := range []uint32{ctnetlink.GroupNew, ctnetlink.GroupDestroy} {
		if err := c.JoinGroup(g); err != nil {
			return fmt.Errorf("%s: conntrack events: %w", h, err)
		}
	}
	flows, mine := w.a, &w.reusedA
	if replica {
		flows, mine = w.b, nil
	}
	w.wg.Go(func() {
		for {
			msgs, err := c.Receive()
			now := time.Now()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				w.mu.Lock()
				w.errs = append(w.errs, fmt.Sprintf("%s: %v", h, err))
				w.mu.Unlock()
				if !errors.Is(err, unix.ENOBUFS) {
					return
				}
				continue
			}
			for _, m := range msgs {
				var ev ct.Event
				if ev.Unmarshal(m) != nil || ev.Flow == nil {
					continue
				}
				f := ev.Flow
				if f.TupleOrig.Proto.Protocol != 6 ||
					netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort) != w.svc ||
					(f.Mark&statesync.ReplicaMark != 0) != replica {
					continue
				}
				k := netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort)
				w.mu.Lock()
				s := flows[k]
				if s == nil {
					s = &seen{}
					flows[k] = s
				}
				switch ev.Type {
				case ct.EventNew:
					if !s.read.IsZero() {
						if mine != nil {
							*mine++
						}
					} else {
						s.read = now
					}
				case ct.EventDestroy:
					// The first one: a tuple used again is a later flow.
					if st := f.Timestamp.Start; !st.IsZero() && s.start.IsZero() {
						s.start = st
					}
				}
				w.mu.Unlock()
			}
		}
	})
	return nil
}

// Close stops the listeners and turns the timestamps off again.
func (w *syncWatch) Close() error {
	var err error
	for _, c := range w.conns {
		err = errors.Join(err, c.Close())
	}
	w.wg.Wait()
	for _, h := range w.hosts {
		err = errors.Join(err, h.Sysctl("net/netfilter/nf_conntrack_timestamp", "0"))
	}
	return err
}

// allSeen tells whether every flow A reported has its replica on B.
func (w *syncWatch) allSeen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, all := 0, 0
	for k, s := range w.a {
		if s.read.IsZero() {
			continue
		}
		all++
		if sb := w.b[k]; sb == nil || sb.read.IsZero() {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%d of %d flows not on B", n, all)
	}
	return nil
}

// allStarted tells whether every flow A reported, and every replica B
// reported, has its creation time (its DESTROY was read).
func (w *syncWatch) allStarted() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range []map[netip.AddrPort]*seen{w.a, w.b} {
		for _, s := range m {
			if !s.read.IsZero() && s.start.IsZero() {
				n++
			}
		}
	}
	if n > 0 {
		return fmt.Errorf("%d entries without their creation time", n)
	}
	return nil
}

// endTables flushes A's and B's conntrack tables, so that every entry's
// DESTROY (with its creation time) comes, and waits for them.
func (w *syncWatch) endTables() error {
	for _, h := range w.hosts {
		if err := flushConntrack(h); err != nil {
			return err
		}
	}
	return lab.EventuallyWithin(30*time.Second, w.allStarted)
}

// result matches the two sides.
func (w *syncWatch) result(syncOn bool) SyncLag {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := SyncLag{ReusedA: w.reusedA, ListenerErrors: slices.Clone(w.errs)}
	ms := func(d time.Duration) float64 { return max(d, 0).Seconds() * 1000 }
	var readA, readB, listener, kernel []float64
	var t0 time.Time
	for _, s := range w.a {
		if s.read.IsZero() {
			continue
		}
		r.FlowsA++
		if !s.start.IsZero() {
			readA = append(readA, ms(s.read.Sub(s.start)))
			if t0.IsZero() || s.start.Before(t0) {
				t0 = s.start
			}
		}
	}
	r.ReadDelayA = quantilesOf(readA)
	if !syncOn {
		return r
	}
	series := map[int]float64{}
	last := 0
	for k, sa := range w.a {
		if sa.read.IsZero() {
			continue
		}
		sb := w.b[k]
		if sb == nil || sb.read.IsZero() {
			r.NeverOnB++
			continue
		}
		listener = append(listener, ms(sb.read.Sub(sa.read)))
		if sa.start.IsZero() || sb.start.IsZero() {
			continue
		}
		l := ms(sb.start.Sub(sa.start))
		kernel = append(kernel, l)
		s := int(sa.start.Sub(t0) / (500 * time.Millisecond))
		series[s] = max(series[s], l)
		last = max(last, s)
	}
	for k, sb := range w.b {
		if sb.read.IsZero() {
			continue
		}
		if !sb.start.IsZero() {
			readB = append(readB, ms(sb.read.Sub(sb.start)))
		}
		if sa := w.a[k]; sa == nil || sa.read.IsZero() {
			r.OnlyB++
		}
	}
	r.SeenB = len(listener)
	r.KernelFlows = len(kernel)
	if len(kernel) > 0 {
		for s := range last + 1 {
			r.MaxBy500ms = append(r.MaxBy500ms, math.Round(series[s]))
		}
	}
	if r.FlowsA > 0 {
		r.NeverFraction = float64(r.NeverOnB) / float64(r.FlowsA)
	}
	r.Kernel, r.Listener, r.ReadDelayB = quantilesOf(kernel), quantilesOf(listener), quantilesOf(readB)
	return r
}

// heldByB waits up to timeout until B's kernel holds a replica of every
// entry to svc A's kernel holds as its own, but those about to expire (a
// replica may expire up to the timeout's one-second resolution, plus the
// lag, before its origin: nftgate does not resend an entry for less). It returns whether it did,
// how many were missing at the first look and at the last, and how many
// entries A had at the last.
func heldByB(a, b *lab.Host, svc netip.AddrPort, timeout time.Duration) (held bool, first, missing, entries int, err error) {
	keys := func(h *lab.Host, replica bool) (map[netip.AddrPort]bool, error) {
		c, err := ct.Dial(&netlink.Config{NetNS: h.FD()})
		if err != nil {
			return nil, fmt.Errorf("%s: conntrack: %w", h, err)
		}
		defer c.Close()
		fs, err := c.Dump(nil)
		if err != nil {
			return nil, fmt.Errorf("%s: conntrack dump: %w", h, err)
		}
		out := map[netip.AddrPort]bool{}
		for _, f := range fs {
			if f.TupleOrig.Proto.Protocol == 6 && netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort) == svc &&
				(f.Mark&statesync.ReplicaMark != 0) == replica && (replica || f.Timeout > expiringSoon) {
				out[netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort)] = true
			}
		}
		return out, nil
	}
	var hard error
	first = -1
	werr := lab.EventuallyWithin(timeout, func() error {
		ka, err := keys(a, false)
		if err != nil {
			hard = err
			return nil
		}
		kb, err := keys(b, true)
		if err != nil {
			hard = err
			return nil
		}
		missing, entries = 0, len(ka)
		for k := range ka {
			if !kb[k] {
				missing++
			}
		}
		if first < 0 {
			first = missing
		}
		if missing > 0 {
			return fmt.Errorf("%d of A's %d entries not on B", missing, entries)
		}
		return nil
	})
	return werr == nil && hard == nil, first, missing, entries, hard
}

// expiringSoon: A's entries with this many seconds left or fewer are not
// looked for on B.
const expiringSoon = 2

// lagBuckets is nftgate_statesync_lag_seconds of one peer: cumulative
// counts by upper bound (seconds), +Inf last.
type lagBuckets []struct {
	le    float64
	count uint64
}

// lagHistogram reads A's lag histogram and refresh count from its
// /metrics.
func lagHistogram(g *failover.Nftgate) (lagBuckets, uint64, error) {
	code, body, err := g.Get("/metrics")
	if err != nil {
		return nil, 0, err
	}
	if code != 200 {
		return nil, 0, fmt.Errorf("%s: /metrics: %d", g.Host, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: /metrics: %w", g.Host, err)
	}
	var refreshes uint64
	if f := fams["nftgate_statesync_refreshes_total"]; f != nil && len(f.Metric) == 1 {
		refreshes = uint64(f.Metric[0].GetCounter().GetValue())
	}
	var out lagBuckets
	if f := fams["nftgate_statesync_lag_seconds"]; f != nil {
		for _, m := range f.Metric {
			h := m.GetHistogram()
			for _, bk := range h.GetBucket() {
				out = append(out, struct {
					le    float64
					count uint64
				}{bk.GetUpperBound(), bk.GetCumulativeCount()})
			}
			out = append(out, struct {
				le    float64
				count uint64
			}{math.Inf(1), h.GetSampleCount()})
		}
	}
	return out, refreshes, nil
}

// sub is l minus an earlier reading of the same histogram.
func (l lagBuckets) sub(o lagBuckets) lagBuckets {
	out := slices.Clone(l)
	if len(o) == len(l) {
		for i := range out {
			out[i].count -= o[i].count
		}
	}
	return out
}

func (l lagBuckets) count() uint64 {
	if len(l) == 0 {
		return 0
	}
	return l[len(l)-1].count
}

// quantile is the upper bound of the bucket that holds quantile q; -1
// when that is past the last finite bound.
func (l lagBuckets) quantile(q float64) float64 {
	n := l.count()
	if n == 0 {
		return 0
	}
	for _, b := range l {
		if float64(b.count) >= q*float64(n) {
			if math.IsInf(b.le, 1) {
				return -1
			}
			return b.le
		}
	}
	return -1
}
