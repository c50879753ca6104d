package appliance

import (
	"slices"
	"sync"
	"time"
)

// DefaultHistory is how many recent syncs a Recorder keeps.
const DefaultHistory = 120

// Recorder is a ready-made Source: the sync loop tells it what happened and it
// keeps the Snapshot the server shows. When created with a non-nil *Metrics it
// also updates those metrics, so a sync loop that uses a Recorder calls
// RecordSync and RecordConntrack instead of the matching Metrics methods (not
// both, or it counts twice).
//
// All methods are safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	snap     Snapshot
	history  []SyncSample // ring buffer of capacity cap(history)
	next     int
	full     bool
	metrics  *Metrics
	revision uint64
}

// SyncResult describes one finished sync attempt for RecordSync.
type SyncResult struct {
	// Kind is SyncFull or SyncPartial. The first successful SyncFull marks
	// the first complete sync (readiness).
	Kind string
	// End is when the sync finished; zero means now.
	End      time.Time
	Duration time.Duration
	// Messages is the number of netlink messages (objects changed) sent.
	Messages int
	Err      error
	// KernelMatches is the outcome of the reconcile that ended this sync:
	// the kernel holds exactly the desired ruleset.
	KernelMatches bool
	// ProgrammingLatencies has, for each Service or EndpointSlice change this
	// sync programmed, the time from the change in the source to now.
	ProgrammingLatencies []time.Duration
	// Totals of objects in the table after a successful sync, reported on
	// every successful sync, partial ones too.
	Chains, Rules, MapElements int
}

// NewRecorder returns a Recorder that starts with the given identity and keeps
// the last historyLen syncs (DefaultHistory when historyLen <= 0). m may be nil.
func NewRecorder(id Identity, m *Metrics, historyLen int) *Recorder {
	if historyLen <= 0 {
		historyLen = DefaultHistory
	}
	if id.StartTime.IsZero() {
		id.StartTime = time.Now()
	}
	return &Recorder{
		snap:    Snapshot{Identity: id},
		history: make([]SyncSample, historyLen),
		metrics: m,
	}
}

// Snapshot returns the current state. Services is shared with later
// snapshots until the next SetServices; callers must not modify it.
func (r *Recorder) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.snap
	if r.full {
		s.History = make([]SyncSample, 0, len(r.history))
		s.History = append(s.History, r.history[r.next:]...)
		s.History = append(s.History, r.history[:r.next]...)
	} else {
		s.History = append([]SyncSample(nil), r.history[:r.next]...)
	}
	return s
}

// SetIdentity replaces the identity (for example once the kernel release or
// node name is known).
func (r *Recorder) SetIdentity(id Identity) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id.StartTime.IsZero() {
		id.StartTime = r.snap.Identity.StartTime
	}
	r.snap.Identity = id
}

// SetAPIConnected records whether the Kubernetes API watch is established.
func (r *Recorder) SetAPIConnected(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := &r.snap.Identity
	switch {
	case ok:
		id.APILostAt = time.Time{}
	case id.APIConnected || id.APILostAt.IsZero():
		id.APILostAt = time.Now()
	}
	id.APIConnected = ok
}

// SetServices replaces the Services shown.
func (r *Recorder) SetServices(services ServiceList) {
	r.mu.Lock()
	r.snap.Services = services
	r.revision++
	r.snap.Sync.ServicesRevision = r.revision
	r.mu.Unlock()
	if r.metrics != nil {
		sum := services.Summary()
		r.metrics.SetServiceProblems(sum.KernelRefused, sum.WithWarnings)
	}
}

// SetSourceProblems replaces what the source could not read (see
// Snapshot.SourceProblems), and with Metrics sets nftgate_source_problems.
// The Recorder keeps a copy.
func (r *Recorder) SetSourceProblems(problems []string) {
	r.mu.Lock()
	if !slices.Equal(r.snap.SourceProblems, problems) {
		r.snap.SourceProblems = slices.Clone(problems)
	}
	r.mu.Unlock()
	if r.metrics != nil {
		r.metrics.SetSourceProblems(len(problems))
	}
}

// SetKernelMatches records the outcome of a reconcile done outside a sync
// (a periodic drift check).
func (r *Recorder) SetKernelMatches(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snap.Sync.KernelMatches = ok
}

// RecordSync records one finished sync attempt and, with Metrics, observes
// its duration, batch size, programming latencies and programmed objects.
func (r *Recorder) RecordSync(res SyncResult) {
	end := res.End
	if end.IsZero() {
		end = time.Now()
	}
	var maxLatency time.Duration
	for _, l := range res.ProgrammingLatencies {
		maxLatency = max(maxLatency, l)
	}
	sample := SyncSample{
		Time: end, Duration: res.Duration, Kind: res.Kind,
		Changes: res.Messages, ProgrammingLatency: maxLatency,
	}

	r.mu.Lock()
	st := &r.snap.Sync
	st.Syncs++
	st.LastAttempt = end
	st.LastDuration = res.Duration
	st.LastKind = res.Kind
	st.LastChanges = res.Messages
	st.KernelMatches = res.KernelMatches
	if res.Err != nil {
		st.Failures++
		st.LastError = res.Err.Error()
		st.LastErrorTime = end
		sample.Error = st.LastError
	} else {
		st.LastSync = end
		st.Chains, st.Rules, st.MapElements = res.Chains, res.Rules, res.MapElements
		if res.Kind == SyncFull {
			st.FirstSyncDone = true
		}
	}
	r.history[r.next] = sample
	r.next++
	if r.next == len(r.history) {
		r.next, r.full = 0, true
	}
	r.mu.Unlock()

	if m := r.metrics; m != nil {
		m.observeSyncAt(res.Kind, res.Duration, res.Messages, res.Err, end)
		for _, l := range res.ProgrammingLatencies {
			m.ObserveProgrammingLatency(l)
		}
		if res.Err == nil {
			m.SetProgrammed(res.Chains, res.Rules, res.MapElements)
		}
	}
}

// RecordConntrack records one stale-flow cleanup and, with Metrics, observes it.
func (r *Recorder) RecordConntrack(deleted int, d time.Duration, err error) {
	r.mu.Lock()
	c := &r.snap.Conntrack
	c.Cleanups++
	c.FlowsDeleted += uint64(max(deleted, 0))
	c.LastCleanup = time.Now()
	c.LastDuration = d
	if err != nil {
		c.Errors++
		c.LastError = err.Error()
	}
	r.mu.Unlock()
	if r.metrics != nil {
		r.metrics.ObserveConntrack(deleted, d, err)
	}
}
