package status

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/source"
)

// problemSource is a Source whose problems and connection a test sets.
type problemSource struct {
	source.Source
	mu        sync.Mutex
	problems  []string
	connected bool
}

func (s *problemSource) Problems() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.problems)
}

func (s *problemSource) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected
}

func (s *problemSource) set(problems []string, connected bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problems, s.connected = problems, connected
}

// TestFollowSource: what a source (of either kind) cannot read reaches the
// snapshot and the gauge, and leaves them when it is read again.
func TestFollowSource(t *testing.T) {
	m := appliance.NewMetrics("test")
	rec := appliance.NewRecorder(appliance.Identity{}, m, 0)
	src := &problemSource{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { FollowSource(ctx, src, rec, 5*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	await := func(what string, ok func(appliance.Snapshot) bool) {
		t.Helper()
		if err := lab.EventuallyWithin(5*time.Second, func() error {
			if !ok(rec.Snapshot()) {
				return errors.New(what)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	src.set([]string{"/m/f.yaml: a FIFO, not a regular file; not read"}, false)
	await("problem shown", func(s appliance.Snapshot) bool { return len(s.SourceProblems) == 1 && !s.Identity.APIConnected })
	src.set(nil, true)
	await("problem gone", func(s appliance.Snapshot) bool { return len(s.SourceProblems) == 0 && s.Identity.APIConnected })
}
