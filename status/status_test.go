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
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/source"
)

func TestMergeRows(t *testing.T) {
	row := func(ns, name, typ string) appliance.Service {
		return appliance.Service{Namespace: ns, Name: name, Type: typ}
	}
	old := []appliance.Service{row("a", "api", "ClusterIP"), row("a", "web", "ClusterIP"), row("b", "db", "ClusterIP")}
	kept := slices.Clone(old)
	touched := map[model.ServiceKey]struct{}{
		{Namespace: "a", Name: "web"}:  {}, // changed
		{Namespace: "b", Name: "db"}:   {}, // gone
		{Namespace: "a", Name: "aaa"}:  {}, // new, first
		{Namespace: "a", Name: "mail"}: {}, // new, between
		{Namespace: "c", Name: "last"}: {}, // new, last
		{Namespace: "c", Name: "none"}: {}, // never was, still is not
	}
	got := mergeRows(old, touched, func(k model.ServiceKey) (appliance.Service, bool) {
		switch k.Name {
		case "db", "none":
			return appliance.Service{}, false
		}
		return row(k.Namespace, k.Name, "NodePort"), true
	})
	want := []appliance.Service{row("a", "aaa", "NodePort"), row("a", "api", "ClusterIP"), row("a", "mail", "NodePort"),
		row("a", "web", "NodePort"), row("c", "last", "NodePort")}
	if !slices.EqualFunc(got, want, func(a, b appliance.Service) bool {
		return a.Namespace == b.Namespace && a.Name == b.Name && a.Type == b.Type
	}) {
		t.Errorf("merged rows:\n%+v\nwant\n%+v", got, want)
	}
	if !slices.EqualFunc(old, kept, func(a, b appliance.Service) bool { return a.Name == b.Name && a.Type == b.Type }) {
		t.Errorf("the published rows were modified: %+v", old)
	}
	if got := mergeRows(nil, nil, nil); got == nil || len(got) != 0 {
		t.Errorf("merge of nothing = %#v, want an empty list", got)
	}
}

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
