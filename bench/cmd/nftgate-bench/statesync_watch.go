package main

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/statesync"
)

// SyncLag is the time from A's kernel creating an entry to B's kernel
// holding its replica, measured outside nftgate: a conntrack event
// listener in each namespace (NEW of the translated flow on A, NEW of the
// replica, ct mark bit 31, on B), both in this process, so both times are
// from one clock; the flows are matched by their original tuple.
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
	ReusedA int     `json:"reused_a,omitempty"`
	P50Ms   float64 `json:"p50_ms"`
	P90Ms   float64 `json:"p90_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	// MaxBy500ms is the longest lag of the flows A created in each half
	// second of the run, in ms: when the tail happened.
	MaxBy500ms []float64 `json:"max_by_500ms,omitempty"`
	// ListenerErrors: the listeners' socket errors (an overflow loses
	// events and stops one of the listener's readers).
	ListenerErrors []string `json:"listener_errors,omitempty"`
}

// syncWatch is the pair of listeners.
type syncWatch struct {
	svc   netip.AddrPort
	conns []*ct.Conn
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	a, b    map[netip.AddrPort]time.Time
	reusedA int
	errs    []string
}

// watchSync starts listening to NEW events in A's and B's namespaces for
// flows to svc. Close stops it.
func watchSync(a, b *lab.Host, svc netip.AddrPort) (*syncWatch, error) {
	w := &syncWatch{svc: svc, done: make(chan struct{}), a: map[netip.AddrPort]time.Time{}, b: map[netip.AddrPort]time.Time{}}
	for i, h := range []*lab.Host{a, b} {
		if err := w.listen(h, i == 1); err != nil {
			return nil, errors.Join(err, w.Close())
		}
	}
	return w, nil
}

func (w *syncWatch) listen(h *lab.Host, replica bool) error {
	c, err := ct.Dial(&netlink.Config{NetNS: h.FD()})
	if err != nil {
		return fmt.Errorf("%s: conntrack events: %w", h, err)
	}
	w.conns = append(w.conns, c)
	// net.core.rmem_max bounds it (4 MiB here: about 1.5 s of 10,000 NEW
	// events a second).
	if err := c.SetReadBuffer(64 << 20); err != nil {
		return fmt.Errorf("%s: conntrack events: %w", h, err)
	}
	evs := make(chan ct.Event, 1<<14)
	errs, err := c.Listen(evs, 2, []netfilter.NetlinkGroup{netfilter.GroupCTNew})
	if err != nil {
		return fmt.Errorf("%s: conntrack events: %w", h, err)
	}
	seen, mine := w.a, &w.reusedA
	if replica {
		seen, mine = w.b, nil
	}
	w.wg.Go(func() {
		for {
			select {
			case <-w.done:
				return
			case err := <-errs:
				w.mu.Lock()
				w.errs = append(w.errs, fmt.Sprintf("%s: %v", h, err))
				w.mu.Unlock()
			case ev := <-evs:
				now := time.Now()
				f := ev.Flow
				if ev.Type != ct.EventNew || f == nil || f.TupleOrig.Proto.Protocol != 6 ||
					netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort) != w.svc ||
					(f.Mark&statesync.ReplicaMark != 0) != replica {
					continue
				}
				k := netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort)
				w.mu.Lock()
				if _, ok := seen[k]; ok {
					if mine != nil {
						*mine++
					}
				} else {
					seen[k] = now
				}
				w.mu.Unlock()
			}
		}
	})
	return nil
}

// Close stops the listeners.
func (w *syncWatch) Close() error {
	var err error
	for _, c := range w.conns {
		err = errors.Join(err, c.Close())
	}
	close(w.done)
	w.wg.Wait()
	return err
}

// allSeen tells whether every flow A reported has its replica on B.
func (w *syncWatch) allSeen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k := range w.a {
		if _, ok := w.b[k]; !ok {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%d of %d flows not on B", n, len(w.a))
	}
	return nil
}

// result matches the two sides.
func (w *syncWatch) result(syncOn bool) SyncLag {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := SyncLag{FlowsA: len(w.a), ReusedA: w.reusedA, ListenerErrors: slices.Clone(w.errs)}
	if !syncOn {
		return r
	}
	var lags []float64
	for k, ta := range w.a {
		tb, ok := w.b[k]
		if !ok {
			r.NeverOnB++
			continue
		}
		lags = append(lags, max(tb.Sub(ta), 0).Seconds()*1000)
	}
	for k := range w.b {
		if _, ok := w.a[k]; !ok {
			r.OnlyB++
		}
	}
	r.SeenB = len(lags)
	var t0 time.Time
	for _, ta := range w.a {
		if t0.IsZero() || ta.Before(t0) {
			t0 = ta
		}
	}
	series := map[int]float64{}
	last := 0
	for k, ta := range w.a {
		if tb, ok := w.b[k]; ok {
			s := int(ta.Sub(t0) / (500 * time.Millisecond))
			series[s] = max(series[s], tb.Sub(ta).Seconds()*1000)
			last = max(last, s)
		}
	}
	for s := range last + 1 {
		r.MaxBy500ms = append(r.MaxBy500ms, math.Round(series[s]))
	}
	if r.FlowsA > 0 {
		r.NeverFraction = float64(r.NeverOnB) / float64(r.FlowsA)
	}
	r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs = percentile(lags, 50), percentile(lags, 90), percentile(lags, 99), percentile(lags, 100)
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
