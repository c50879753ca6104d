package ipam

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
)

// memLeases is a Lease in memory with the API server's optimistic
// concurrency: an update of another resourceVersion is a Conflict.
type memLeases struct {
	mu    sync.Mutex
	lease *coordinationv1.Lease
	rv    int
	fail  error // every request fails with it, when set
}

var leaseResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func (m *memLeases) get(context.Context) (*coordinationv1.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	if m.lease == nil {
		return nil, apierrors.NewNotFound(leaseResource, "l")
	}
	return m.lease.DeepCopy(), nil
}

func (m *memLeases) create(_ context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	if m.lease != nil {
		return nil, apierrors.NewAlreadyExists(leaseResource, "l")
	}
	return m.store(l), nil
}

func (m *memLeases) update(_ context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	if m.lease == nil {
		return nil, apierrors.NewNotFound(leaseResource, "l")
	}
	if l.ResourceVersion != m.lease.ResourceVersion {
		return nil, apierrors.NewConflict(leaseResource, "l", errors.New("changed"))
	}
	return m.store(l), nil
}

func (m *memLeases) store(l *coordinationv1.Lease) *coordinationv1.Lease {
	m.rv++
	m.lease = l.DeepCopy()
	m.lease.ResourceVersion = strconv.Itoa(m.rv)
	return m.lease.DeepCopy()
}

func (m *memLeases) record() leaseRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return recordOf(m.lease)
}

func (m *memLeases) setFail(err error) {
	m.mu.Lock()
	m.fail = err
	m.mu.Unlock()
}

func newTestElector(store leaseStore, clk *clocktesting.FakeClock, id string) *elector {
	return &elector{store: store, namespace: "nftgate", name: "l", id: id,
		leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second,
		clock: clk, log: slog.New(slog.DiscardHandler)}
}

// The Lease as client-go's election writes it: acquire and renew times,
// transitions counted on a change of holder only, a held Lease not taken
// before its duration has passed on the taker's clock since the taker saw
// it change, a released one taken at once.
func TestElectorAcquireRenewTakeOver(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	store := &memLeases{}
	a, b := newTestElector(store, clk, "a"), newTestElector(store, clk, "b")
	var seenByB []string
	b.newLeader = func(id string) { seenByB = append(seenByB, id) }
	ctx := context.Background()

	if !a.tryAcquireOrRenew(ctx) {
		t.Fatal("a did not create the Lease")
	}
	want := leaseRecord{holder: "a", duration: 15 * time.Second, acquired: t0, renewed: t0}
	if r := store.record(); r != want {
		t.Fatalf("created: %+v, want %+v", r, want)
	}
	if b.tryAcquireOrRenew(ctx) {
		t.Fatal("b took a Lease a holds")
	}

	clk.Step(5 * time.Second)
	if !a.tryAcquireOrRenew(ctx) {
		t.Fatal("a did not renew")
	}
	want.renewed = t0.Add(5 * time.Second)
	if r := store.record(); r != want {
		t.Fatalf("renewed: %+v, want %+v", r, want)
	}
	// b sees the renewal at 5 s: a's term runs until 20 s on b's clock.
	if b.tryAcquireOrRenew(ctx) {
		t.Fatal("b took a renewed Lease")
	}
	clk.Step(14 * time.Second) // 19 s
	if b.tryAcquireOrRenew(ctx) {
		t.Fatal("b took the Lease before its duration passed since it last changed")
	}
	clk.Step(2 * time.Second) // 21 s
	if !b.tryAcquireOrRenew(ctx) {
		t.Fatal("b did not take the expired Lease")
	}
	now := t0.Add(21 * time.Second)
	want = leaseRecord{holder: "b", duration: 15 * time.Second, acquired: now, renewed: now, transitions: 1}
	if r := store.record(); r != want {
		t.Fatalf("taken over: %+v, want %+v", r, want)
	}
	if a.tryAcquireOrRenew(ctx) || a.leading() {
		t.Fatal("a still holds the Lease b took")
	}
	if got := seenByB; len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("b saw the leaders %v, want [a b]", got)
	}

	b.release(ctx)
	want = leaseRecord{duration: time.Second, acquired: now, renewed: now, transitions: 1}
	if r := store.record(); r != want {
		t.Fatalf("released: %+v, want %+v", r, want)
	}
	if !a.tryAcquireOrRenew(ctx) {
		t.Fatal("a did not take the released Lease at once")
	}
	if r := store.record(); r.holder != "a" || r.transitions != 2 {
		t.Fatalf("after the release: %+v, want a with 2 transitions", r)
	}
}

// runningElector runs e in the background and records its terms.
type runningElector struct {
	e       *elector
	mu      sync.Mutex
	leadCtx context.Context
	stops   int
	// startedAt and stoppedAt are the real times of each term's start
	// and end.
	startedAt, stoppedAt []time.Time
	cancel               func()
	done                 chan struct{}
}

func runElector(e *elector) *runningElector {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningElector{e: e, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		e.run(ctx, func(l context.Context) {
			r.mu.Lock()
			r.leadCtx = l
			r.startedAt = append(r.startedAt, time.Now())
			r.mu.Unlock()
		}, func() {
			r.mu.Lock()
			r.stops++
			r.stoppedAt = append(r.stoppedAt, time.Now())
			r.mu.Unlock()
		})
	}()
	return r
}

func (r *runningElector) leading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leadCtx != nil && r.leadCtx.Err() == nil
}

func (r *runningElector) stopped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stops
}

// step advances clk by d once the elector waits on it.
func step(t *testing.T, clk *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	eventually(t, 5*time.Second, "the elector waits on its clock", clk.HasWaiters)
	clk.Step(d)
}

// A holder that cannot renew stops leading once the renew deadline has
// passed since its last renewal, not before; stopped on purpose it
// releases the Lease.
func TestElectorRenewDeadline(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := &memLeases{}
	r := runElector(newTestElector(store, clk, "a"))
	defer func() { r.cancel(); <-r.done }()
	eventually(t, 5*time.Second, "a leads", r.leading)

	step(t, clk, 2*time.Second) // renewed at 2 s
	eventually(t, 5*time.Second, "a renewed", func() bool { return store.record().renewed.Equal(clk.Now()) })
	store.setFail(errors.New("the API is unreachable"))
	for range 4 { // 4, 6, 8, 10 s: 8 s since the last renewal
		step(t, clk, 2*time.Second)
	}
	eventually(t, 5*time.Second, "the elector waits on its clock", clk.HasWaiters)
	if !r.leading() || r.stopped() != 0 {
		t.Fatal("a stopped leading before the renew deadline")
	}
	step(t, clk, 2*time.Second) // 12 s: the deadline
	eventually(t, 5*time.Second, "a stops leading at the renew deadline", func() bool { return !r.leading() && r.stopped() == 1 })

	// The API is back: a leads again, in the same term (its own Lease).
	store.setFail(nil)
	for !r.leading() {
		step(t, clk, 2*time.Second)
	}
	if rec := store.record(); rec.holder != "a" || rec.transitions != 0 {
		t.Errorf("after renewing again: %+v", rec)
	}

	r.cancel()
	<-r.done
	if rec := store.record(); rec.holder != "" || rec.duration != time.Second {
		t.Errorf("after a clean stop the Lease is %+v, want released", rec)
	}
}

// A holder that finds another holder in the Lease stops leading at once.
func TestElectorStopsWhenTaken(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := &memLeases{}
	r := runElector(newTestElector(store, clk, "a"))
	defer func() { r.cancel(); <-r.done }()
	eventually(t, 5*time.Second, "a leads", r.leading)

	store.mu.Lock()
	x := "x"
	store.lease.Spec.HolderIdentity = &x
	store.lease.ResourceVersion = "taken"
	store.mu.Unlock()
	step(t, clk, 2*time.Second)
	eventually(t, 5*time.Second, "a stops leading", func() bool { return !r.leading() && r.stopped() == 1 })
	r.cancel()
	<-r.done
	if rec := store.record(); rec.holder != "x" {
		t.Errorf("a stopping changed another holder's Lease: %+v", rec)
	}
}

func TestCheckTiming(t *testing.T) {
	for _, c := range []struct {
		lease, renew, retry time.Duration
		ok                  bool
	}{
		{15 * time.Second, 10 * time.Second, 2 * time.Second, true},
		{2 * time.Second, 1500 * time.Millisecond, 200 * time.Millisecond, true},
		{500 * time.Millisecond, 400 * time.Millisecond, 100 * time.Millisecond, false},
		{10 * time.Second, 10 * time.Second, 2 * time.Second, false},
		{15 * time.Second, 10 * time.Second, 9 * time.Second, false},
		{15 * time.Second, 10 * time.Second, 0, false},
	} {
		if err := checkTiming(c.lease, c.renew, c.retry); (err == nil) != c.ok {
			t.Errorf("checkTiming(%v, %v, %v) = %v", c.lease, c.renew, c.retry, err)
		}
	}
}

// terms returns the start and end times of r's terms so far.
func (r *runningElector) terms() (started, stopped []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.startedAt), slices.Clone(r.stoppedAt)
}

// cutStore is a leaseStore that can be cut off from the API.
type cutStore struct {
	leaseStore
	cut atomic.Bool
}

var errCut = errors.New("cut off from the API")

func (c *cutStore) get(ctx context.Context) (*coordinationv1.Lease, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.leaseStore.get(ctx)
}

func (c *cutStore) create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.leaseStore.create(ctx, l)
}

func (c *cutStore) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.leaseStore.update(ctx, l)
}
