package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
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

// TestServiceRowCounts: a row counts its endpoints, and those in use, as
// the list the page makes from the model says.
func TestServiceRowCounts(t *testing.T) {
	ep := func(a string, ready bool) model.Endpoint {
		return model.Endpoint{Port: 8080, Ready: ready, Serving: ready}.WithAddr(netip.MustParseAddr(a))
	}
	m := &model.Service{Key: model.NewServiceKey("ns", "web"), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{ep("10.1.0.1", true), ep("10.1.0.2", false), ep("10.1.0.3", true)}},
			{Name: "dns", Protocol: model.UDP, Port: 53, Endpoints: []model.Endpoint{ep("10.1.0.1", false)}},
			{Name: "https", Protocol: model.TCP, Port: 443, Endpoints: []model.Endpoint{ep("10.1.0.4", true), ep("10.1.0.5", true)}},
		}}
	row, ok := serviceRow(loop.ServiceState{Key: m.Key, Model: m}, &model.Node{})
	if !ok {
		t.Fatal("no row")
	}
	used := 0
	eps := row.EndpointsFunc()
	for _, e := range eps {
		if e.Used {
			used++
		}
	}
	if row.EndpointCount != 6 || row.UsedCount != 4 || len(eps) != 6 || used != 4 {
		t.Errorf("row counts %d endpoints, %d used; the list has %d, %d used; want 6, 4", row.EndpointCount, row.UsedCount, len(eps), used)
	}
}

// benchStates are n Services of 4 ready endpoints each, as after the first
// full sync.
func benchStates(n int) []loop.ServiceState {
	states := make([]loop.ServiceState, n)
	for i := range states {
		eps := make([]model.Endpoint, 4)
		for j := range eps {
			eps[j] = model.Endpoint{Port: 8080 + uint16(j), Ready: true, Serving: true}.WithAddr(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		}
		m := &model.Service{Key: model.NewServiceKey("ns", fmt.Sprintf("s%d", i)), Type: model.TypeClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps}}}
		states[i] = loop.ServiceState{Key: m.Key, Model: m}
	}
	return states
}

// BenchmarkServiceRows makes the rows of 100,000 Services.
func BenchmarkServiceRows(b *testing.B) {
	states := benchStates(100_000)
	node := &model.Node{}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, st := range states {
			if row, ok := serviceRow(st, node); !ok || row.UsedCount != 4 {
				b.Fatalf("row of %s: %+v, %v", st.Key, row, ok)
			}
		}
	}
}

// BenchmarkRebuild makes the page's list of 100,000 Services, as after the
// first full sync.
func BenchmarkRebuild(b *testing.B) {
	states := benchStates(100_000)
	p := NewPublisher(nil, appliance.NewRecorder(appliance.Identity{}, nil, 1), model.Node{}, slog.New(slog.DiscardHandler))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p.rebuild(states)
		if n := p.rows.Len(); n != len(states) {
			b.Fatalf("%d rows, want %d", n, len(states))
		}
	}
}

// TestRebuildLogsWarningsOnce: rebuilding every row logs a warning that
// appeared, not one already logged, and that a Service with warnings has
// none any more, whether it lost them or is gone.
func TestRebuildLogsWarningsOnce(t *testing.T) {
	var logged bytes.Buffer
	p := NewPublisher(nil, appliance.NewRecorder(appliance.Identity{}, nil, 1), model.Node{}, slog.New(slog.NewTextHandler(&logged, nil)))
	key := func(name string) model.ServiceKey { return model.NewServiceKey("ns", name) }
	p.warned = map[model.ServiceKey][]string{key("kept"): {"old"}, key("gone"): {"old"}, key("healed"): {"old"}}
	p.rebuild([]loop.ServiceState{
		{Key: key("kept"), Warnings: []string{"old"}},
		{Key: key("new"), Warnings: []string{"fresh"}},
		{Key: key("healed")},
		{Key: key("plain")},
	})
	if want := map[model.ServiceKey][]string{key("kept"): {"old"}, key("new"): {"fresh"}}; !reflect.DeepEqual(p.warned, want) {
		t.Errorf("warned %v, want %v", p.warned, want)
	}
	out := logged.String()
	for _, want := range []string{`msg="service not served in full" service=ns/new warning=fresh`, `msg="service served in full" service=ns/gone`, `msg="service served in full" service=ns/healed`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "level="); n != 3 {
		t.Errorf("%d lines logged, want 3:\n%s", n, out)
	}
}

// TestRowsAsServiceRowMakesThem: the list the page reads shows every
// Service as serviceRow makes its row, whether it is kept as its model
// alone (served as programmed) or as its state (an error, a kernel error,
// warnings), and counts them in the summary; a Service never programmed
// and without error has no row.
func TestRowsAsServiceRowMakesThem(t *testing.T) {
	states := benchStates(3)
	states[1].Warnings = []string{"externalIP 192.0.2.1 is outside external_ip_cidrs"}
	states[2].KernelError = "no such file or directory"
	states = append(states,
		loop.ServiceState{Key: model.NewServiceKey("ns", "refused"), Error: `spec.ports[0].port: invalid value 0`},
		loop.ServiceState{Key: model.NewServiceKey("ns", "skipped"), Skipped: "type ExternalName"})
	p := NewPublisher(nil, appliance.NewRecorder(appliance.Identity{}, nil, 1), model.Node{}, slog.New(slog.DiscardHandler))
	p.rebuild(states)
	if n := p.rows.Len(); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
	for _, st := range states {
		want, ok := serviceRow(st, &p.node)
		got, found := p.rows.Get(st.Key.Namespace(), st.Key.Name())
		if found != ok {
			t.Errorf("%s: row found %v, want %v", st.Key, found, ok)
			continue
		}
		if !ok {
			continue
		}
		if got.EndpointsFunc != nil {
			if !reflect.DeepEqual(got.EndpointsFunc(), want.EndpointsFunc()) {
				t.Errorf("%s: endpoints %+v, want %+v", st.Key, got.EndpointsFunc(), want.EndpointsFunc())
			}
		}
		got.EndpointsFunc, want.EndpointsFunc = nil, nil
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("%s: row\n%+v\nwant\n%+v", st.Key, *got, want)
		}
	}
	if sum, want := p.rows.Summary(), (appliance.SummaryJSON{Total: 4, Rejected: 1, Endpoints: 12, KernelRefused: 1, WithWarnings: 1}); sum != want {
		t.Errorf("summary %+v, want %+v", sum, want)
	}
}

// BenchmarkRowsKept reports the bytes the page's list of 100,000 Services
// keeps (B/kept), beside the models it is made from.
func BenchmarkRowsKept(b *testing.B) {
	states := benchStates(100_000)
	p := NewPublisher(nil, appliance.NewRecorder(appliance.Identity{}, nil, 1), model.Node{}, slog.New(slog.DiscardHandler))
	var kept float64
	for range b.N {
		p.rows = appliance.ServiceList{}
		p.rec.SetServices(p.rows)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		p.rebuild(states)
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept = float64(after.HeapAlloc) - float64(before.HeapAlloc)
	}
	runtime.KeepAlive(states)
	b.ReportMetric(kept, "B/kept")
}

// Rebuilt is called after every row was made anew (the first full sync
// touches them all), and not after a few rows changed.
func TestRebuiltAfterEveryRowOnly(t *testing.T) {
	p := NewPublisher(&loop.Syncer{}, appliance.NewRecorder(appliance.Identity{}, nil, 1), model.Node{}, slog.New(slog.DiscardHandler))
	rebuilt := make(chan struct{}, 4)
	p.Rebuilt = func() { rebuilt <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	defer stop()
	p.Touch(nil)
	select {
	case <-rebuilt:
	case <-time.After(5 * time.Second):
		t.Fatal("every row touched: Rebuilt not called")
	}
	p.Touch([]model.ServiceKey{model.NewServiceKey("default", "a")})
	// The touched row is published (gone: the Syncer does not know it)
	// within the second Run waits between publications.
	if err := lab.EventuallyWithin(5*time.Second, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.touched) > 0 {
			return errors.New("the touched row is not taken yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stop() // Run has published the row, and returned
	if len(rebuilt) != 0 {
		t.Fatal("one row touched: Rebuilt called")
	}
}
