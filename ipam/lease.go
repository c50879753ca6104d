package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// leaseStore reads and writes the one coordination.k8s.io/v1 Lease of the
// election. A missing Lease is an apierrors NotFound; an update of a Lease
// changed meanwhile is a Conflict (resourceVersion).
type leaseStore interface {
	get(ctx context.Context) (*coordinationv1.Lease, error)
	create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
}

// restLeases is the Lease namespace/name through a coordination/v1 REST
// client.
type restLeases struct {
	client          rest.Interface
	namespace, name string
}

func (r restLeases) get(ctx context.Context) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	err := r.client.Get().Namespace(r.namespace).Resource("leases").Name(r.name).Do(ctx).Into(&l)
	return &l, err
}

func (r restLeases) create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	var out coordinationv1.Lease
	err := r.client.Post().Namespace(r.namespace).Resource("leases").Body(l).Do(ctx).Into(&out)
	return &out, err
}

func (r restLeases) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	var out coordinationv1.Lease
	err := r.client.Put().Namespace(r.namespace).Resource("leases").Name(r.name).Body(l).Do(ctx).Into(&out)
	return &out, err
}

// leaseRecord is what a Lease says of its holder: the spec fields of
// client-go's leader election.
type leaseRecord struct {
	holder            string
	duration          time.Duration // leaseDurationSeconds
	acquired, renewed time.Time
	transitions       int32
}

func recordOf(l *coordinationv1.Lease) leaseRecord {
	var r leaseRecord
	s := l.Spec
	if s.HolderIdentity != nil {
		r.holder = *s.HolderIdentity
	}
	if s.LeaseDurationSeconds != nil {
		r.duration = time.Duration(*s.LeaseDurationSeconds) * time.Second
	}
	if s.AcquireTime != nil {
		r.acquired = s.AcquireTime.Time
	}
	if s.RenewTime != nil {
		r.renewed = s.RenewTime.Time
	}
	if s.LeaseTransitions != nil {
		r.transitions = *s.LeaseTransitions
	}
	return r
}

// jitterFactor spreads the attempts to acquire, as client-go's does.
const jitterFactor = 1.2

// elector holds a Lease with the semantics of client-go's leader election
// (tools/leaderelection with a LeaseLock and ReleaseOnCancel), without
// linking it: client-go's election imports the typed clients of every API
// group.
//
//   - A Lease with a holder is taken by no one else until its holder has
//     not renewed it for leaseDurationSeconds, measured on the local clock
//     from the moment this elector last saw it change (so clocks need not
//     agree between gateways).
//   - Acquiring sets holderIdentity, leaseDurationSeconds, acquireTime and
//     renewTime, and counts leaseTransitions when the holder changes;
//     renewing sets renewTime. Writes are updates of the resourceVersion
//     read, so two electors never both succeed.
//   - The holder renews every retryPeriod; when it could not renew for
//     renewDeadline (shorter than the lease duration), or finds another
//     holder in the Lease, it stops leading before anyone else may start.
//   - Stopping on purpose releases the Lease (no holder, a one-second
//     duration), so that another gateway takes over at once.
//
// Only run's goroutine uses an elector.
type elector struct {
	store                                     leaseStore
	namespace, name, id                       string
	leaseDuration, renewDeadline, retryPeriod time.Duration
	clock                                     clock.Clock
	log                                       *slog.Logger
	// newLeader is told every holder seen, when it changes ("" for none).
	newLeader func(string)

	lease      *coordinationv1.Lease // as last read or written
	observed   leaseRecord
	observedAt time.Time // local time observed last changed
	reported   string
}

// checkTiming refuses timings with which two gateways could write at once
// or the holder could not renew in time, as client-go refuses them.
func checkTiming(leaseDuration, renewDeadline, retryPeriod time.Duration) error {
	switch {
	case leaseDuration < time.Second:
		return fmt.Errorf("lease duration %v: must be at least 1s (the Lease counts seconds)", leaseDuration)
	case renewDeadline <= 0 || renewDeadline >= leaseDuration:
		return fmt.Errorf("renew deadline %v: must be positive and shorter than the lease duration %v", renewDeadline, leaseDuration)
	case retryPeriod <= 0 || float64(renewDeadline) <= jitterFactor*float64(retryPeriod):
		return fmt.Errorf("retry period %v: must be positive and below the renew deadline %v / %v", retryPeriod, renewDeadline, jitterFactor)
	}
	return nil
}

// leading tells whether this elector holds the Lease as last observed.
func (e *elector) leading() bool { return e.observed.holder == e.id }

// valid tells whether the observed holder's term still runs at now.
func (e *elector) valid(now time.Time) bool {
	return e.observedAt.Add(e.observed.duration).After(now)
}

// observe takes l as the Lease's latest state, seen at now.
func (e *elector) observe(l *coordinationv1.Lease, now time.Time) {
	e.lease = l
	if r := recordOf(l); r != e.observed {
		e.observed, e.observedAt = r, now
	}
	if e.observed.holder != e.reported {
		e.reported = e.observed.holder
		if e.newLeader != nil {
			e.newLeader(e.reported)
		}
	}
}

// claim sets l's spec to this elector holding it from now on; acquired
// says the holder changes (a new term and one more transition).
func (e *elector) claim(l *coordinationv1.Lease, now time.Time, acquired bool) *coordinationv1.Lease {
	l = l.DeepCopy()
	s := &l.Spec
	id, secs := e.id, int32(e.leaseDuration/time.Second)
	t := metav1.NewMicroTime(now)
	s.HolderIdentity, s.LeaseDurationSeconds, s.RenewTime = &id, &secs, &t
	if acquired || s.AcquireTime == nil {
		s.AcquireTime = &t
	}
	if acquired {
		n := int32(0)
		if s.LeaseTransitions != nil {
			n = *s.LeaseTransitions + 1
		}
		s.LeaseTransitions = &n
	} else if s.LeaseTransitions == nil {
		s.LeaseTransitions = new(int32)
	}
	return l
}

// tryAcquireOrRenew makes one attempt to take or keep the Lease and tells
// whether this elector holds it now.
func (e *elector) tryAcquireOrRenew(ctx context.Context) bool {
	now := e.clock.Now()
	// The holder first writes over the Lease it last saw, with no read.
	if e.lease != nil && e.leading() && e.valid(now) {
		if l, err := e.store.update(ctx, e.claim(e.lease, now, false)); err == nil {
			e.observe(l, now)
			return true
		}
	}
	cur, err := e.store.get(ctx)
	if apierrors.IsNotFound(err) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: e.name}}
		l = e.claim(l, now, false)
		if l, err = e.store.create(ctx, l); err != nil {
			e.log.Debug("creating the Lease failed", "err", err)
			return false
		}
		e.observe(l, now)
		return true
	}
	if err != nil {
		e.log.Debug("reading the Lease failed", "err", err)
		return false
	}
	e.observe(cur, now)
	if e.observed.holder != "" && !e.leading() && e.valid(now) {
		return false
	}
	l, err := e.store.update(ctx, e.claim(cur, now, !e.leading()))
	if err != nil {
		e.log.Debug("writing the Lease failed", "err", err)
		return false
	}
	e.observe(l, now)
	return true
}

// release gives up the Lease if this elector holds it: no holder, a
// duration of one second.
func (e *elector) release(ctx context.Context) {
	for ctx.Err() == nil {
		cur, err := e.store.get(ctx)
		if err != nil {
			e.log.Debug("releasing the Lease: reading it failed", "err", err)
			return
		}
		now := e.clock.Now()
		e.observe(cur, now)
		if !e.leading() {
			return
		}
		l := cur.DeepCopy()
		none, one, t := "", int32(1), metav1.NewMicroTime(now)
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.AcquireTime, l.Spec.RenewTime = &none, &one, &t, &t
		l, err = e.store.update(ctx, l)
		if err == nil {
			e.observe(l, now)
			return
		}
		if !apierrors.IsConflict(err) {
			e.log.Warn("releasing the Lease failed; another gateway takes over when it expires", "err", err)
			return
		}
	}
}

// wait waits d on the elector's clock and tells whether ctx is still
// running.
func (e *elector) wait(ctx context.Context, d time.Duration) bool {
	t := e.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// acquire tries every retryPeriod (with jitter) until it holds the Lease,
// or ctx ends (false).
func (e *elector) acquire(ctx context.Context) bool {
	for {
		actx, cancel := context.WithTimeout(ctx, e.renewDeadline)
		ok := e.tryAcquireOrRenew(actx)
		cancel()
		if ok {
			return true
		}
		if !e.wait(ctx, e.retryPeriod+time.Duration(rand.Float64()*jitterFactor*float64(e.retryPeriod))) {
			return false
		}
	}
}

// renew renews every retryPeriod until ctx ends, or until the Lease is
// lost: not renewed for renewDeadline, or another holder in it.
func (e *elector) renew(ctx context.Context) error {
	last := e.clock.Now()
	for e.wait(ctx, e.retryPeriod) {
		left := e.renewDeadline - e.clock.Since(last)
		if left <= 0 {
			return fmt.Errorf("not renewed for %v", e.renewDeadline)
		}
		rctx, cancel := context.WithTimeout(ctx, left)
		ok := e.tryAcquireOrRenew(rctx)
		cancel()
		switch {
		case ok:
			last = e.clock.Now()
		case ctx.Err() != nil:
		case !e.leading() && e.observed.holder != "":
			return fmt.Errorf("held by %q", e.observed.holder)
		case e.clock.Since(last) >= e.renewDeadline:
			return fmt.Errorf("not renewed for %v", e.renewDeadline)
		}
	}
	return nil
}

// run campaigns until ctx ends. Each time this elector acquires the
// Lease, it calls started with a context that ends as soon as it stops
// leading, and stopped after that. When ctx ends while it leads, it
// releases the Lease.
func (e *elector) run(ctx context.Context, started func(context.Context), stopped func()) {
	for e.acquire(ctx) {
		lctx, cancel := context.WithCancel(ctx)
		started(lctx)
		err := e.renew(lctx)
		cancel()
		stopped()
		if err != nil {
			e.log.Warn("lost the Lease", "lease", e.namespace+"/"+e.name, "err", err)
		}
		if ctx.Err() != nil {
			rctx, cancelRelease := context.WithTimeout(context.WithoutCancel(ctx), e.renewDeadline)
			e.release(rctx)
			cancelRelease()
			return
		}
	}
}
