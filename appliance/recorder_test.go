package appliance

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRecorder(t *testing.T) {
	m := NewMetrics("t")
	r := NewRecorder(Identity{NodeName: "edge-1", Table: "inet nftgate"}, m, 3)
	if s := r.Snapshot(); s.Identity.StartTime.IsZero() || s.Sync.FirstSyncDone || len(s.History) != 0 {
		t.Fatalf("fresh recorder: %+v", s)
	}

	// A failed first attempt does not make the gateway ready.
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r.RecordSync(SyncResult{Kind: SyncFull, End: t0, Duration: time.Millisecond, Err: errors.New("EPERM")})
	s := r.Snapshot()
	if s.Sync.FirstSyncDone || s.Sync.Failures != 1 || !s.Sync.Failing() || s.Sync.LastError != "EPERM" {
		t.Fatalf("after failure: %+v", s.Sync)
	}
	// A partial sync alone is not a complete first sync.
	r.RecordSync(SyncResult{Kind: SyncPartial, End: t0.Add(time.Second), KernelMatches: true})
	if r.Snapshot().Sync.FirstSyncDone {
		t.Fatal("partial sync marked first sync done")
	}
	r.RecordSync(SyncResult{Kind: SyncFull, End: t0.Add(2 * time.Second), Duration: 3 * time.Millisecond, Messages: 50,
		KernelMatches: true, Chains: 7, Rules: 8, MapElements: 9,
		ProgrammingLatencies: []time.Duration{5 * time.Millisecond, 30 * time.Millisecond, 10 * time.Millisecond}})
	s = r.Snapshot()
	if !s.Sync.FirstSyncDone || s.Sync.Failing() || s.Sync.LastError != "EPERM" || s.Sync.Syncs != 3 ||
		s.Sync.Chains != 7 || s.Sync.LastChanges != 50 || !s.Sync.LastSync.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("after full sync: %+v", s.Sync)
	}
	if h := s.History; len(h) != 3 || h[0].Error != "EPERM" || h[2].ProgrammingLatency != 30*time.Millisecond {
		t.Fatalf("history = %+v", h)
	}

	// The ring keeps the newest three, oldest first.
	r.RecordSync(SyncResult{Kind: SyncPartial, End: t0.Add(3 * time.Second), Messages: 4, KernelMatches: false})
	r.RecordSync(SyncResult{Kind: SyncPartial, End: t0.Add(4 * time.Second), Messages: 5, KernelMatches: true,
		Chains: 8, Rules: 9, MapElements: 10})
	s = r.Snapshot()
	if len(s.History) != 3 || s.History[0].Changes != 50 || s.History[2].Changes != 5 {
		t.Fatalf("ring = %+v", s.History)
	}
	// A failed sync keeps the programmed counts of the last good one.
	r.RecordSync(SyncResult{Kind: SyncPartial, End: t0.Add(5 * time.Second), Err: errors.New("EBUSY")})
	if s := r.Snapshot(); s.Sync.Chains != 8 || s.Sync.MapElements != 10 || !s.Sync.Failing() {
		t.Fatalf("after failed partial: %+v", s.Sync)
	}

	r.SetKernelMatches(false)
	r.SetAPIConnected(true)
	r.SetServices(NewServiceList(fixtureServices()...))
	r.SetServices(NewServiceList(fixtureServices()...))
	r.RecordConntrack(4, time.Millisecond, nil)
	r.RecordConntrack(2, time.Millisecond, errors.New("ENOBUFS"))
	s = r.Snapshot()
	if s.Sync.KernelMatches || !s.Identity.APIConnected || s.Services.Len() != 5 || s.Sync.ServicesRevision != 2 {
		t.Fatalf("setters: %+v", s)
	}
	if c := s.Conntrack; c.Cleanups != 2 || c.FlowsDeleted != 6 || c.Errors != 1 || c.LastError != "ENOBUFS" {
		t.Fatalf("conntrack = %+v", c)
	}
	start := s.Identity.StartTime
	r.SetIdentity(Identity{NodeName: "edge-2"})
	if s := r.Snapshot(); s.Identity.NodeName != "edge-2" || !s.Identity.StartTime.Equal(start) {
		t.Fatalf("SetIdentity: %+v", s.Identity)
	}

	// Metrics were fed by the Recorder.
	if got := testutil.ToFloat64(m.syncFailures); got != 2 {
		t.Errorf("sync failures = %v", got)
	}
	if got := testutil.ToFloat64(m.programmedChains); got != 8 {
		t.Errorf("programmed chains = %v, want those of the last successful sync", got)
	}
	if got := testutil.ToFloat64(m.conntrackDeleted); got != 6 {
		t.Errorf("conntrack deleted = %v", got)
	}
	checkHistogram(t, m, "nftgate_network_programming_duration_seconds", 3, 0.045)
}

func TestRecorderSnapshotIsolated(t *testing.T) {
	r := NewRecorder(Identity{}, nil, 4)
	r.RecordSync(SyncResult{Kind: SyncFull, Messages: 1})
	s := r.Snapshot()
	s.History[0].Changes = 99
	if r.Snapshot().History[0].Changes != 1 {
		t.Fatal("snapshot history aliases the recorder's")
	}
}

func TestRecorderConcurrent(t *testing.T) {
	r := NewRecorder(Identity{}, NewMetrics("t"), 16)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 200 {
				r.RecordSync(SyncResult{Kind: SyncPartial, Messages: w*1000 + i})
			}
		}()
		go func() {
			defer wg.Done()
			for range 200 {
				_ = r.Snapshot()
			}
		}()
	}
	wg.Wait()
	if s := r.Snapshot(); s.Sync.Syncs != 800 || len(s.History) != 16 {
		t.Fatalf("syncs=%d history=%d", s.Sync.Syncs, len(s.History))
	}
}
