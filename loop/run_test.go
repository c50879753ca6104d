package loop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftgate/nftgate/internal/testing/lockedbuf"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
)

// Unit tests of the sync loop: a fake clock and a fake programmer, so that
// what they assert about time (coalescing, back-off, reconcile) depends on
// no wall clock and no machine load. The wall clock bounds only how long a
// test waits before it fails.

// t0 is the fake clock's start.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// call is one call of the fake programmer.
type call struct {
	full     bool
	services map[model.ServiceKey]*model.Service
	at       time.Time // on the fake clock
}

// names lists the Services of a call in order; a deletion is "-name".
func (c call) names() []string {
	var out []string
	for k, m := range c.services {
		if m == nil {
			out = append(out, "-"+k.Name())
		} else {
			out = append(out, k.Name())
		}
	}
	slices.Sort(out)
	return out
}

// fakeProgrammer records its calls; outcome, when set, decides each one's
// result.
type fakeProgrammer struct {
	clk   *clocktesting.FakeClock
	calls chan call
	stop  chan struct{} // closed when the test ends: calls are dropped

	mu      sync.Mutex
	outcome func(c call) (nft.Result, error)
}

func (p *fakeProgrammer) do(full bool, m map[model.ServiceKey]*model.Service) (nft.Result, error) {
	c := call{full: full, services: maps.Clone(m), at: p.clk.Now()}
	select {
	case p.calls <- c:
	case <-p.stop:
	}
	p.mu.Lock()
	outcome := p.outcome
	p.mu.Unlock()
	if outcome == nil {
		return nft.Result{Full: full}, nil
	}
	return outcome(c)
}

func (p *fakeProgrammer) Full(m map[model.ServiceKey]*model.Service) (nft.Result, error) {
	return p.do(true, m)
}

func (p *fakeProgrammer) Partial(m map[model.ServiceKey]*model.Service) (nft.Result, error) {
	return p.do(false, m)
}

func (p *fakeProgrammer) setOutcome(f func(c call) (nft.Result, error)) {
	p.mu.Lock()
	p.outcome = f
	p.mu.Unlock()
}

var errRefused = errors.New("netlink: the kernel refused the batch")

func failing(call) (nft.Result, error) { return nft.Result{}, errRefused }

// harness runs a Syncer on a fake clock until the test ends.
type harness struct {
	t      *testing.T
	clk    *clocktesting.FakeClock
	tr     *Tracker
	prog   *fakeProgrammer
	s      *Syncer
	events chan Event
}

// wait bounds how long a test waits for the loop before it fails.
const wait = 10 * time.Second

func startLoop(t *testing.T, minInterval, reconcile time.Duration, services ...string) *harness {
	t.Helper()
	return startLoopWith(t, nil, minInterval, reconcile, services...)
}

// startLoopWith is startLoop with set, when not nil, changing the Syncer
// before it runs.
func startLoopWith(t *testing.T, set func(*Syncer), minInterval, reconcile time.Duration, services ...string) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	h := &harness{t: t, clk: clk, tr: NewTracker(), events: make(chan Event, 100),
		prog: &fakeProgrammer{clk: clk, calls: make(chan call, 100), stop: make(chan struct{})}}
	for _, name := range services {
		h.tr.SetService(service(name, "http"))
	}
	h.tr.SetSynced()
	h.s = &Syncer{Tracker: h.tr, Programmer: h.prog, Clock: clk, MinInterval: minInterval, Reconcile: reconcile,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observers: []func(Event){func(ev Event) {
			select {
			case h.events <- ev:
			case <-h.prog.stop:
			}
		}}}
	if set != nil {
		set(h.s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); close(h.prog.stop); <-done })
	return h
}

// service is a ClusterIP Service with one TCP port of the given name
// (port names must be DNS labels: "Bad!" makes the Service invalid).
func service(name, portName string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(t0)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1",
			Ports: []corev1.ServicePort{{Name: portName, Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
}

func key(name string) model.ServiceKey { return model.NewServiceKey("ns", name) }

// sync waits for the loop's next programmer call and the end of that sync
// (its Event, sent after the Syncer's state is updated).
func (h *harness) sync() (call, Event) {
	h.t.Helper()
	var c call
	select {
	case c = <-h.prog.calls:
	case <-time.After(wait):
		h.t.Fatal("no sync")
	}
	select {
	case ev := <-h.events:
		return c, ev
	case <-time.After(wait):
		h.t.Fatal("the sync never ended")
	}
	panic("unreachable")
}

// expect waits for the next sync and checks its kind, Services and time.
func (h *harness) expect(full bool, at time.Duration, names ...string) Event {
	h.t.Helper()
	c, ev := h.sync()
	if c.full != full || !slices.Equal(c.names(), names) || !c.at.Equal(t0.Add(at)) {
		h.t.Fatalf("sync (full %v) of %v at t0+%s, want (full %v) of %v at t0+%s",
			c.full, c.names(), c.at.Sub(t0), full, names, at)
	}
	if ev.Full != full {
		h.t.Errorf("event Full %v, want %v", ev.Full, full)
	}
	return ev
}

// timers waits until the loop waits on n timers or tickers of the fake
// clock: it is blocked, and only a step of the clock (or a change) moves it.
func (h *harness) timers(n int) {
	h.t.Helper()
	deadline := time.Now().Add(wait)
	for h.clk.Waiters() != n {
		if time.Now().After(deadline) {
			h.t.Fatalf("the loop waits on %d timers, want %d", h.clk.Waiters(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A burst of changes while the loop waits out MinInterval goes to the
// programmer as one partial sync, MinInterval after the previous sync.
func TestLoopCoalescesABurst(t *testing.T) {
	h := startLoop(t, time.Second, 0, "a")
	h.expect(true, 0, "a")

	h.tr.SetService(service("b", "http"))
	h.timers(1) // the loop waits out MinInterval
	h.tr.SetService(service("c", "http"))
	h.tr.SetService(service("d", "http"))
	h.tr.DeleteService(key("a"))
	h.clk.Step(999 * time.Millisecond)
	h.clk.Step(time.Millisecond)
	h.expect(false, time.Second, "-a", "b", "c", "d")

	// The signals of the burst left one wake-up: it syncs nothing, and
	// the next change still waits out MinInterval.
	h.timers(1)
	h.tr.SetService(service("e", "http"))
	h.clk.Step(time.Second)
	h.expect(false, 2*time.Second, "e")
	if st, _ := h.s.Service(key("a")); st.Model != nil {
		t.Errorf("a still programmed: %+v", st)
	}
	if n := h.s.Programmed(); n != 4 {
		t.Errorf("%d Services programmed, want b, c, d and e", n)
	}
}

// A failed sync is followed by full syncs after 100 ms, 200 ms, 400 ms ...
// (changes meanwhile wait for them); a success resets the back-off.
func TestLoopBacksOff(t *testing.T) {
	h := startLoop(t, 0, 0, "a")
	h.expect(true, 0, "a")

	h.prog.setOutcome(failing)
	h.tr.SetService(service("b", "http"))
	if ev := h.expect(false, 0, "b"); ev.Err == nil || ev.Before != nil || ev.After != nil {
		t.Fatalf("failed sync's event %+v, want its error and no change", ev)
	}
	at := time.Duration(0)
	for _, backoff := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		h.timers(1)
		// A change during the back-off waits for the retry.
		h.tr.SetService(service("c", "http"))
		h.timers(1)
		h.clk.Step(backoff - time.Millisecond)
		h.timers(1)
		h.clk.Step(time.Millisecond)
		at += backoff
		// The retry is a full sync: the kernel is read back, and the
		// Services that changed meanwhile are in it.
		h.expect(true, at, "a", "b", "c")
	}

	h.prog.setOutcome(nil)
	h.timers(1)
	h.clk.Step(800 * time.Millisecond)
	at += 800 * time.Millisecond
	if ev := h.expect(true, at, "a", "b", "c"); ev.Err != nil || len(ev.After) != 2 {
		t.Fatalf("event %+v, want b and c programmed", ev)
	}

	// Back at 100 ms after the next failure.
	h.prog.setOutcome(failing)
	h.tr.SetService(service("d", "http"))
	h.expect(false, at, "d")
	h.prog.setOutcome(nil)
	h.timers(1)
	h.clk.Step(100 * time.Millisecond)
	h.expect(true, at+100*time.Millisecond, "a", "b", "c", "d")
}

func TestNextBackoff(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 12 {
		d = nextBackoff(d)
		got = append(got, d)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond, 12800 * time.Millisecond,
		25600 * time.Millisecond, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("back-off %v, want %v", got, want)
	}
}

// The first sync is full, with every Service; a change is a partial sync
// of that Service alone; every Reconcile a full sync repairs the kernel,
// handing the programmer the Services as programmed.
func TestLoopFullAndPartial(t *testing.T) {
	h := startLoop(t, 0, time.Minute, "a", "b")
	ev := h.expect(true, 0, "a", "b")
	if ev.Changed != 2 || ev.After[key("a")] == nil || ev.Before[key("a")] != nil {
		t.Errorf("first event %+v, want both Services new", ev)
	}
	programmed, _ := h.s.Service(key("a"))

	h.tr.SetService(service("b", "dns"))
	h.expect(false, 0, "b")

	h.timers(1) // the reconcile ticker
	h.clk.Step(time.Minute - time.Millisecond)
	h.timers(1)
	h.clk.Step(time.Millisecond)
	ev = h.expect(true, time.Minute, "a", "b")
	if ev.Changed != 0 {
		t.Errorf("reconcile changed %d Services, want none", ev.Changed)
	}
	if st, _ := h.s.Service(key("a")); st.Model != programmed.Model {
		t.Error("a reconcile rebuilt a Service that did not change")
	}
	if !h.s.FirstSyncDone() {
		t.Error("FirstSyncDone false after syncs")
	}
}

// Nothing reaches the programmer before the source's first complete view.
func TestLoopWaitsForTheSource(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	tr := NewTracker()
	prog := &fakeProgrammer{clk: clk, calls: make(chan call, 10), stop: make(chan struct{})}
	s := &Syncer{Tracker: tr, Programmer: prog, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); close(prog.stop); <-done }()
	tr.SetService(service("a", "http"))
	tr.SetService(service("b", "http"))
	tr.SetSynced()
	select {
	case c := <-prog.calls:
		if !c.full || !slices.Equal(c.names(), []string{"a", "b"}) {
			t.Errorf("first call full %v of %v, want a full sync of a and b", c.full, c.names())
		}
	case <-time.After(wait):
		t.Fatal("no sync after the source synced")
	}
}

// One Service going bad, in its objects or in the kernel, keeps its last
// good state and holds up no other; the kernel's refusal is tried again
// by the next full sync.
func TestLoopIsolatesFailures(t *testing.T) {
	h := startLoop(t, time.Second, time.Minute, "a", "b")
	h.expect(true, 0, "a", "b")
	good, _ := h.s.Service(key("a"))

	// Invalid objects: a stays as it was, b goes ahead.
	h.timers(2) // the reconcile ticker, and MinInterval
	h.tr.SetService(service("a", "Bad!"))
	h.tr.SetService(service("b", "dns"))
	h.clk.Step(time.Second)
	h.expect(false, time.Second, "b")
	st, _ := h.s.Service(key("a"))
	if st.Model != good.Model || st.Error == "" {
		t.Errorf("a after invalid objects: %+v, want its last good state and the error", st)
	}

	// The kernel refuses c: b goes ahead, c is not programmed.
	h.prog.setOutcome(func(c call) (nft.Result, error) {
		if _, ok := c.services[key("c")]; ok && !c.full {
			return nft.Result{Refused: map[model.ServiceKey]string{key("c"): "netlink: chain too long"}}, nil
		}
		return nft.Result{}, nil
	})
	h.timers(2)
	h.tr.SetService(service("c", "http"))
	h.tr.SetService(service("b", "http"))
	h.clk.Step(time.Second)
	ev := h.expect(false, 2*time.Second, "b", "c")
	if _, ok := ev.After[key("c")]; ok || ev.After[key("b")] == nil {
		t.Errorf("event after %v, want b and not c", ev.After)
	}
	st, _ = h.s.Service(key("c"))
	if st.Model != nil || st.KernelError != "netlink: chain too long" || h.s.KernelRefused() != 1 {
		t.Errorf("c after the refusal: %+v, want not programmed, with the kernel's error", st)
	}

	// The next full sync tries c again, and the kernel takes it.
	h.timers(2)
	h.clk.Step(58 * time.Second)
	ev = h.expect(true, time.Minute, "a", "b", "c")
	if len(ev.After) != 1 || ev.After[key("c")] == nil || ev.Before[key("c")] != nil {
		t.Errorf("full sync's event: before %v, after %v; want c alone, new", ev.Before, ev.After)
	}
	st, _ = h.s.Service(key("c"))
	if st.Model == nil || st.KernelError != "" || h.s.KernelRefused() != 0 {
		t.Errorf("c after the full sync: %+v, want programmed", st)
	}
	if st, _ := h.s.Service(key("a")); st.Model != good.Model || st.Error == "" {
		t.Errorf("a after the full sync: %+v, want still its last good state", st)
	}
}

// A reconcile that finds the Services no longer fit the shard count chosen
// at start (nft.Result.ShardsWanted) says so once for each count it would
// move to, and again only after they fitted in between.
func TestLoopWarnsWhenTheShardsNoLongerFit(t *testing.T) {
	var logs lockedbuf.Buffer
	h := startLoopWith(t, func(s *Syncer) { s.Log = slog.New(slog.NewTextHandler(&logs, nil)) }, 0, time.Minute, "a")
	var wanted atomic.Int64
	h.prog.setOutcome(func(c call) (nft.Result, error) {
		if !c.full {
			return nft.Result{}, nil
		}
		return nft.Result{Full: true, Shards: 1, ShardsWanted: int(wanted.Load())}, nil
	})
	const warning = "the Services no longer fit the shard count chosen at start"
	h.expect(true, 0, "a")
	at := time.Duration(0)
	for i, w := range []int64{4, 4, 8, 0, 8} {
		wanted.Store(w)
		before := strings.Count(logs.String(), warning)
		h.timers(1) // the reconcile ticker
		h.clk.Step(time.Minute)
		at += time.Minute
		h.expect(true, at, "a")
		said := strings.Count(logs.String(), warning) - before
		want := 0
		if i != 1 && w != 0 { // a count already said, and fitting, are not said
			want = 1
		}
		if said != want {
			t.Errorf("reconcile %d (would move to %d shards): the warning logged %d times, want %d\n%s", i, w, said, want, logs.String())
		}
		if want == 1 && !strings.Contains(logs.String(), fmt.Sprintf("shards=1 at_restart=%d", w)) {
			t.Errorf("reconcile %d: the warning does not name the counts:\n%s", i, logs.String())
		}
	}
}
