package loop

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
)

// Programmer is what the Syncer drives: nft.Programmer in production.
type Programmer interface {
	Full(map[model.ServiceKey]*model.Service) (nft.Result, error)
	Partial(map[model.ServiceKey]*model.Service) (nft.Result, error)
}

// Event reports one sync attempt to observers (metrics, status page, logs,
// conntrack cleanup).
type Event struct {
	Full    bool
	Start   time.Time
	Result  nft.Result
	Err     error
	Changed int // Services whose model changed
	// Triggers are when the EndpointSlice changes this sync carried
	// happened in the cluster (their last-change-trigger-time).
	Triggers []time.Time
	// Repair says why the full sync was asked for at once (RequestRepair):
	// what another program did to the tables. Empty otherwise.
	Repair string
	// Before and After hold the models of the changed Services (nil where
	// a Service did not exist), for observers that act on differences.
	Before, After map[model.ServiceKey]*model.Service
}

// ServiceState is one Service as the Syncer sees it.
type ServiceState struct {
	Key     model.ServiceKey
	Model   *model.Service // as programmed; nil if never programmed
	Skipped string         // why it is not proxied at all
	Error   string         // why its latest objects were not applied
	// KernelError is the kernel's error when it refused the Service's
	// rules: Model stays its last good state.
	KernelError string
	// Warnings say what of the Service is not served, and why: addresses
	// the Exposure refuses, elements an older Service holds.
	Warnings []string
}

// Syncer turns tracked changes into ruleset syncs.
type Syncer struct {
	Tracker    *Tracker
	Programmer Programmer
	Options    model.Options
	// Exposure decides which externalIPs and LoadBalancer IPs are
	// served; nil is the zero Exposure (no externalIP). SetExposure
	// changes it while running.
	Exposure *model.Exposure
	Log      *slog.Logger
	// MinInterval is the least time between two syncs: changes arriving
	// meanwhile are coalesced into the next one.
	MinInterval time.Duration
	// Reconcile is how often a full sync reads the kernel back and repairs
	// drift; zero disables it.
	Reconcile time.Duration
	// Observers are told of every sync attempt, in order, from the
	// Syncer's goroutine.
	Observers []func(Event)
	// Touched, when set, is told which Services' state (model, error,
	// skip reason) may have changed: nil after a full sync means all.
	Touched func(keys []model.ServiceKey)
	// BeforeFull, when set, is called before every full sync, from the
	// Syncer's goroutine: a full sync holds the whole ruleset, built or
	// read back from the kernel, for a moment.
	BeforeFull func()
	// MinRepairInterval is the least time between two full syncs that
	// RequestRepair asks for.
	MinRepairInterval time.Duration
	// Clock is what Run waits with (minimum interval, back-off, periodic
	// reconcile) and what Event.Start reads; nil is the real clock.
	Clock clock.WithTicker

	mu         sync.Mutex
	programmed map[model.ServiceKey]*model.Service
	errs       map[model.ServiceKey]string
	skipped    map[model.ServiceKey]string
	// refused are the Services whose rules the kernel refused: the model
	// it refused (nil for a deletion), tried again by every full sync and
	// whenever the Service changes, and the kernel's error.
	refused   map[model.ServiceKey]refusal
	firstDone bool
	// shardsWarned is the shard count a full sync last said a restart
	// would move to (nft.Result.ShardsWanted), so that it is said once.
	shardsWarned int
	exposure     *model.Exposure // as set by SetExposure
	// exposed are the Services that ask for externalIPs or LoadBalancer
	// IPs: those an Exposure change may change. unserved holds what the
	// Exposure left out of them, and conflicts what older Services hold.
	exposed   map[model.ServiceKey]struct{}
	unserved  map[model.ServiceKey][]string
	conflicts map[model.ServiceKey][]string
	repair    repairs
}

type refusal struct {
	want *model.Service
	err  string
}

// SetExposure changes which external addresses are served (the
// gateway's own addresses changed, say): the Services it may concern are
// synced again.
func (s *Syncer) SetExposure(e *model.Exposure) {
	s.mu.Lock()
	if s.currentExposure().Equal(e) {
		s.mu.Unlock()
		return
	}
	s.exposure = e
	keys := make([]model.ServiceKey, 0, len(s.exposed))
	for k := range s.exposed {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	s.Tracker.MarkDirty(keys, nil)
}

func (s *Syncer) currentExposure() *model.Exposure {
	switch {
	case s.exposure != nil:
		return s.exposure
	case s.Exposure != nil:
		return s.Exposure
	}
	return &model.Exposure{}
}

// Run syncs until ctx ends. It changes nothing in the kernel before the
// tracker's source has delivered its complete initial view.
func (s *Syncer) Run(ctx context.Context) error {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	clk := s.clock()
	s.reset()

	for !s.Tracker.Synced() {
		select {
		case <-ctx.Done():
			return nil
		case <-s.Tracker.Changed():
		}
	}

	var reconcile <-chan time.Time
	if s.Reconcile > 0 {
		t := clk.NewTicker(s.Reconcile)
		defer t.Stop()
		reconcile = t.C()
	}
	needFull := true
	var backoff time.Duration
	var last, nextFull, lastRepair time.Time
	var repairWhy string
	for {
		if needFull && !clk.Now().Before(nextFull) {
			// A request already waiting is carried by this sync, which
			// reads the kernel after it; left in the channel, it would
			// ask for another repair once this one is done.
			select {
			case why := <-s.repair.c():
				if repairWhy == "" {
					repairWhy = why
				}
			default:
			}
			if repairWhy != "" {
				lastRepair = clk.Now()
			}
			err := s.full(log, repairWhy)
			repairWhy = ""
			last = clk.Now()
			if err != nil {
				backoff = nextBackoff(backoff)
				nextFull = last.Add(backoff)
				log.Error("full sync failed; the rules in the kernel are unchanged", "err", err, "retry_in", backoff)
			} else {
				needFull, backoff = false, 0
			}
		}
		var retry clock.Timer
		var retryC <-chan time.Time
		if needFull {
			retry = clk.NewTimer(nextFull.Sub(clk.Now()))
			retryC = retry.C()
		}
		select {
		case <-ctx.Done():
			stopTimer(retry)
			return nil
		case <-retryC:
			continue
		case <-reconcile:
			stopTimer(retry)
			needFull = true
			continue
		case why := <-s.repair.c():
			stopTimer(retry)
			if !needFull {
				needFull, repairWhy = true, why
				nextFull = s.repairAt(clk.Now(), lastRepair)
			} else if repairWhy == "" {
				repairWhy = why // the pending full sync repairs it
			}
			continue
		case <-s.Tracker.Changed():
			stopTimer(retry)
			if needFull {
				continue // the pending full sync will carry it
			}
		}
		if wait := s.MinInterval - clk.Since(last); wait > 0 {
			t := clk.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
		}
		err := s.partial(log)
		last = clk.Now()
		if err != nil {
			// The kernel refused the batch and is unchanged; the next
			// attempt reads it back and syncs everything.
			needFull = true
			backoff = nextBackoff(backoff)
			nextFull = last.Add(backoff)
			log.Error("sync failed; the rules in the kernel are unchanged", "err", err, "retry_in", backoff)
		}
	}
}

// reset empties what the Syncer knows of the Services.
func (s *Syncer) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.programmed = map[model.ServiceKey]*model.Service{}
	s.errs = map[model.ServiceKey]string{}
	s.skipped = map[model.ServiceKey]string{}
	s.refused = map[model.ServiceKey]refusal{}
	s.exposed = map[model.ServiceKey]struct{}{}
	s.unserved = map[model.ServiceKey][]string{}
	s.conflicts = map[model.ServiceKey][]string{}
}

// clock is the Syncer's clock: Clock, or the real one.
func (s *Syncer) clock() clock.WithTicker {
	if s.Clock != nil {
		return s.Clock
	}
	return clock.RealClock{}
}

// stopTimer stops t, if there is one.
func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// nextBackoff is the wait after a failed sync that followed a wait of d:
// 100 ms, doubled after each failure, at most 30 s.
func nextBackoff(d time.Duration) time.Duration {
	if d == 0 {
		return 100 * time.Millisecond
	}
	return min(2*d, 30*time.Second)
}

// build makes the model of one Service from its objects. ok is false when
// the objects are invalid: the Service's last good state stays programmed.
func (s *Syncer) build(k model.ServiceKey, o Objects) (m *model.Service, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.skipped, k)
	if o.Service == nil {
		delete(s.errs, k)
		s.unexpose(k)
		return nil, true
	}
	if why := o.Service.Skip(s.Options); why != "" {
		delete(s.errs, k)
		s.unexpose(k)
		s.skipped[k] = why
		return nil, true
	}
	m, err := model.Build(o.Service, o.Slices, s.Options)
	if err != nil {
		s.errs[k] = err.Error()
		return nil, false
	}
	if s.Options.ExternalOnly && !m.ExternallyAccessible() {
		s.skipped[k] = "not externally reachable, and the gateway serves only external traffic"
		delete(s.errs, k)
		s.unexpose(k)
		return nil, true
	}
	delete(s.errs, k)
	s.unexpose(k)
	// What the Service asks for that is not served: its own fields'
	// warnings, then the addresses the Exposure leaves out.
	unserved := m.Warnings()
	if len(m.ExternalIPs())+len(m.LoadBalancerIPs()) > 0 {
		s.exposed[k] = struct{}{}
		var more []string
		if m, more = s.currentExposure().Apply(m); len(more) > 0 {
			unserved = append(slices.Clip(unserved), more...)
		}
	}
	if len(unserved) > 0 {
		s.unserved[k] = unserved
	}
	return m, true
}

// unexpose forgets what the Exposure decided for a Service.
func (s *Syncer) unexpose(k model.ServiceKey) {
	delete(s.exposed, k)
	delete(s.unserved, k)
}

// noteConflicts records the conflicts a sync changed, and returns the
// Services they concern.
func (s *Syncer) noteConflicts(changed map[model.ServiceKey][]string) []model.ServiceKey {
	if len(changed) == 0 {
		return nil
	}
	keys := make([]model.ServiceKey, 0, len(changed))
	s.mu.Lock()
	for k, c := range changed {
		if len(c) == 0 {
			delete(s.conflicts, k)
		} else {
			s.conflicts[k] = c
		}
		keys = append(keys, k)
	}
	s.mu.Unlock()
	return keys
}

// warningsLocked are a Service's warnings: addresses refused, then
// conflicts lost.
func (s *Syncer) warningsLocked(k model.ServiceKey) []string {
	r, c := s.unserved[k], s.conflicts[k]
	if len(c) == 0 {
		return r
	}
	return append(slices.Clip(r), c...)
}

func (s *Syncer) full(log *slog.Logger, repair string) error {
	if s.BeforeFull != nil {
		s.BeforeFull()
	}
	start := s.clock().Now()
	s.mu.Lock()
	before := s.programmed
	incremental := s.firstDone
	s.mu.Unlock()
	// After the first full sync, the models of the Services that did not
	// change since the last sync are the ones programmed: a reconcile
	// repairs the kernel; rebuilding every model (and every row of the
	// status page) each time cost more than the rest of it.
	var objs map[model.ServiceKey]Objects
	var triggers []time.Time
	var desired map[model.ServiceKey]*model.Service
	var retried []model.ServiceKey // refused before, tried again
	if incremental {
		objs, triggers = s.Tracker.TakeDirty()
		desired = maps.Clone(before)
		// A full sync tries again what the kernel refused.
		s.mu.Lock()
		retried = slices.Collect(maps.Keys(s.refused))
		for k, r := range s.refused {
			if r.want != nil {
				desired[k] = r.want
			} else {
				delete(desired, k)
			}
		}
		s.mu.Unlock()
	} else {
		objs, triggers = s.Tracker.All()
		desired = make(map[model.ServiceKey]*model.Service, len(objs))
	}
	for k, o := range objs {
		m, ok := s.build(k, o)
		if !ok {
			m = before[k] // keep the last good state of a Service gone bad
			log.Warn("service not applied; its previous state stays in effect", "service", k, "err", s.errorOf(k))
		} else if prev := desired[k]; m != nil && prev != nil && reflect.DeepEqual(m, prev) {
			// The same Service as programmed: keeping its pointer tells
			// the Programmer and the observers that nothing changed, so a
			// periodic full sync costs a read-back, not a re-render.
			m = prev
		}
		if m != nil {
			desired[k] = m
		} else {
			delete(desired, k)
		}
	}
	res, err := s.Programmer.Full(desired)
	ev := Event{Full: true, Start: start, Result: res, Err: err, Triggers: triggers, Repair: repair}
	keys := make([]model.ServiceKey, 0, len(objs))
	for k := range objs {
		keys = append(keys, k)
	}
	var conflicted []model.ServiceKey
	if err == nil {
		conflicted = s.noteConflicts(res.ServiceConflicts)
	}
	if s.Touched != nil {
		if incremental {
			defer func() { s.Touched(append(keys, conflicted...)) }()
		} else {
			defer s.Touched(nil)
		}
	}
	if err != nil && incremental {
		s.Tracker.MarkDirty(keys, triggers)
	}
	if err == nil {
		// What the kernel refused stays as it was programmed, and is
		// tried again at the next full sync.
		refused := make(map[model.ServiceKey]refusal, len(res.Refused))
		for k, msg := range res.Refused {
			refused[k] = refusal{want: desired[k], err: msg}
			if m := before[k]; m != nil {
				desired[k] = m
			} else {
				delete(desired, k)
			}
			log.Error("the kernel refused the service's rules; its last good state stays in effect", "service", k, "err", msg)
			keys = append(keys, k)
		}
		ev.Before, ev.After = map[model.ServiceKey]*model.Service{}, map[model.ServiceKey]*model.Service{}
		differs := func(k model.ServiceKey) {
			if b, d := before[k], desired[k]; b != d {
				ev.Before[k], ev.After[k] = b, d
			}
		}
		if incremental {
			// Only the Services built again, refused or tried again
			// may differ: a walk over every Service cost more than
			// the rest of a reconcile that changes nothing.
			for k := range objs {
				differs(k)
			}
			for _, k := range retried {
				differs(k)
			}
			for k := range res.Refused {
				differs(k)
			}
		} else {
			for k := range desired {
				differs(k)
			}
			for k := range before {
				differs(k)
			}
		}
		ev.Changed = len(ev.After)
		s.mu.Lock()
		for k := range s.refused {
			keys = append(keys, k) // their rows change when they are programmed at last
		}
		s.programmed = desired
		s.refused = refused
		s.firstDone = true
		s.mu.Unlock()
		for _, d := range res.Drift {
			log.Warn("kernel ruleset had drifted; repaired", "drift", d)
		}
		attrs := []any{"services", len(desired), "changes", res.Counts.Changes(), "messages", res.Messages, "duration", res.Duration, "kernel", res.Kernel, "tables_read", res.ReadTables}
		if res.Shards > 0 {
			attrs = append(attrs, "shards", res.Shards)
		}
		if res.FirstServed > 0 {
			// Onto no tables: the busiest shard's Services were served
			// from then on.
			attrs = append(attrs, "first_served", res.FirstServed)
		}
		log.Info("full sync", attrs...)
		if res.ShardsWanted > 0 && res.ShardsWanted != s.shardsWarned {
			// "auto" chose at start for the Services then: changes now
			// cost more than they would in the count it would choose.
			log.Warn("the Services no longer fit the shard count chosen at start; a restart moves them to the count they fit", "services", len(desired), "shards", res.Shards, "at_restart", res.ShardsWanted)
		}
		s.shardsWarned = res.ShardsWanted
	}
	s.notify(ev)
	return err
}

func (s *Syncer) partial(log *slog.Logger) error {
	start := s.clock().Now()
	dirty, triggers := s.Tracker.TakeDirty()
	if len(dirty) == 0 {
		return nil
	}
	var conflicted []model.ServiceKey
	if s.Touched != nil {
		defer func() {
			keys := make([]model.ServiceKey, 0, len(dirty)+len(conflicted))
			for k := range dirty {
				keys = append(keys, k)
			}
			s.Touched(append(keys, conflicted...))
		}()
	}
	changes := map[model.ServiceKey]*model.Service{}
	s.mu.Lock()
	before := s.programmed
	s.mu.Unlock()
	for k, o := range dirty {
		m, ok := s.build(k, o)
		if !ok {
			log.Warn("service not applied; its previous state stays in effect", "service", k, "err", s.errorOf(k))
			continue
		}
		if m == nil && before[k] == nil {
			s.mu.Lock()
			delete(s.refused, k) // gone before the kernel ever took it
			s.mu.Unlock()
			continue
		}
		changes[k] = m
	}
	if len(changes) == 0 {
		return nil
	}
	res, err := s.Programmer.Partial(changes)
	ev := Event{Start: start, Result: res, Err: err, Changed: len(changes), Triggers: triggers}
	if err != nil {
		keys := make([]model.ServiceKey, 0, len(dirty))
		for k := range dirty {
			keys = append(keys, k)
		}
		s.Tracker.MarkDirty(keys, triggers)
	} else {
		// Only the changed Services are touched: copying the whole map
		// on every sync would cost as much as the sync at scale.
		ev.Before, ev.After = map[model.ServiceKey]*model.Service{}, map[model.ServiceKey]*model.Service{}
		s.mu.Lock()
		for k, m := range changes {
			if msg, ok := res.Refused[k]; ok {
				s.refused[k] = refusal{want: m, err: msg}
				continue
			}
			delete(s.refused, k)
			ev.Before[k], ev.After[k] = s.programmed[k], m
			if m == nil {
				delete(s.programmed, k)
			} else {
				s.programmed[k] = m
			}
		}
		s.mu.Unlock()
		ev.Changed = len(ev.After)
		for k, msg := range res.Refused {
			log.Error("the kernel refused the service's rules; its last good state stays in effect", "service", k, "err", msg)
		}
		conflicted = s.noteConflicts(res.ServiceConflicts)
		log.Debug("sync", "services", len(changes), "changes", res.Counts.Changes(), "messages", res.Messages, "duration", res.Duration)
	}
	s.notify(ev)
	return err
}

func (s *Syncer) notify(ev Event) {
	for _, o := range s.Observers {
		o(ev)
	}
}

func (s *Syncer) errorOf(k model.ServiceKey) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs[k]
}

// Service returns one Service as the Syncer sees it.
func (s *Syncer) Service(k model.ServiceKey) (ServiceState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ServiceState{Key: k, Model: s.programmed[k], Error: s.errs[k], Skipped: s.skipped[k], KernelError: s.refused[k].err, Warnings: s.warningsLocked(k)}
	return st, st.Model != nil || st.Error != "" || st.Skipped != "" || st.KernelError != ""
}

// FirstSyncDone tells whether the kernel holds a complete view.
func (s *Syncer) FirstSyncDone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstDone
}

// Services lists every Service known to the Syncer, in no order (the
// status page's list orders them itself: sorting a hundred thousand here
// cost as much again).
func (s *Syncer) Services() []ServiceState {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Nearly every Service is programmed: the others (refused, skipped,
	// in error) are added where the programmed do not hold them, without
	// a set of every key.
	out := make([]ServiceState, 0, len(s.programmed)+len(s.errs)+len(s.skipped)+len(s.refused))
	add := func(k model.ServiceKey) {
		out = append(out, ServiceState{Key: k, Model: s.programmed[k], Error: s.errs[k], Skipped: s.skipped[k], KernelError: s.refused[k].err, Warnings: s.warningsLocked(k)})
	}
	for k := range s.programmed {
		add(k)
	}
	seen := map[model.ServiceKey]bool{}
	for _, others := range []iter.Seq[model.ServiceKey]{maps.Keys(s.errs), maps.Keys(s.skipped), maps.Keys(s.refused)} {
		for k := range others {
			if _, programmed := s.programmed[k]; !programmed && !seen[k] {
				seen[k] = true
				add(k)
			}
		}
	}
	return out
}

// Programmed counts the Services programmed.
func (s *Syncer) Programmed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.programmed)
}

// KernelRefused counts the Services whose rules the kernel refused.
func (s *Syncer) KernelRefused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.refused)
}

// ErrNotSynced is returned by operations that need a first sync.
var ErrNotSynced = errors.New("not synced yet")
