package conntrack_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/nftgate/nftgate/conntrack"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

var (
	dnsKey = model.NewServiceKey("ns", "dns")
	vip4   = netip.MustParseAddr("10.96.0.10")
	vip6   = netip.MustParseAddr("fd00:96::10")
	ext4   = netip.MustParseAddr("192.0.2.10")
	lb4    = netip.MustParseAddr("192.0.2.20")
)

const nodeName = "gw"

// ep is a ready endpoint on another node at target port 5353.
func ep(addr string) model.Endpoint {
	return model.Endpoint{Port: 5353, Place: model.On("other"), Ready: true, Serving: true}.WithAddr(netip.MustParseAddr(addr))
}

// localEp is a ready endpoint on the gateway's node.
func localEp(addr string) model.Endpoint {
	e := ep(addr)
	e.Place = model.On(nodeName)
	return e
}

func terminating(e model.Endpoint) model.Endpoint {
	e.Ready, e.Terminating = false, true
	return e
}

func notReady(e model.Endpoint) model.Endpoint {
	e.Ready = false
	return e
}

// svc builds an IPv4 ClusterIP Service with one UDP port 53 (named dns) and
// the given endpoints; mods adjust it.
func svc(eps []model.Endpoint, mods ...func(*model.Service)) *model.Service {
	s := &model.Service{
		Key: dnsKey, Type: model.TypeClusterIP, IPv4: true,
		ClusterIPs: []netip.Addr{vip4},
		Ports:      []model.ServicePort{{Name: "dns", Protocol: model.UDP, Port: 53, Endpoints: eps}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func eps(e ...model.Endpoint) []model.Endpoint { return e }

func withNodePort(np uint16) func(*model.Service) {
	return func(s *model.Service) {
		s.Type = model.TypeNodePort
		s.Ports[0].NodePort = np
	}
}

func withProtocol(p model.Protocol) func(*model.Service) {
	return func(s *model.Service) { s.Ports[0].Protocol = p }
}

func dualStack(s *model.Service) {
	s.IPv6 = true
	s.ClusterIPs = []netip.Addr{vip4, vip6}
}

func staleEP(vip string, port uint16, endpoint string) conntrack.StaleEndpoint {
	return conntrack.StaleEndpoint{Protocol: conntrack.UDP, VIP: netip.MustParseAddr(vip), Port: port, Endpoint: netip.MustParseAddrPort(endpoint)}
}

func staleNodeEP(port uint16, endpoint string) conntrack.StaleEndpoint {
	return conntrack.StaleEndpoint{Protocol: conntrack.UDP, Port: port, NodePort: true, Endpoint: netip.MustParseAddrPort(endpoint)}
}

func staleSvc(vip string, port uint16) conntrack.StaleService {
	return conntrack.StaleService{Protocol: conntrack.UDP, VIP: netip.MustParseAddr(vip), Port: port}
}

func staleNode(port uint16) conntrack.StaleService {
	return conntrack.StaleService{Protocol: conntrack.UDP, Port: port, NodePort: true}
}

func untranslated(s conntrack.StaleService) conntrack.StaleService {
	s.Untranslated = true
	return s
}

func one(s *model.Service) map[model.ServiceKey]*model.Service {
	if s == nil {
		return map[model.ServiceKey]*model.Service{dnsKey: nil}
	}
	return map[model.ServiceKey]*model.Service{s.Key: s}
}

func TestStaleFlows(t *testing.T) {
	cfg := &ruleset.Config{Node: model.Node{Name: nodeName}}
	v4Only := &ruleset.Config{Node: model.Node{Name: nodeName}, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	other := model.NewServiceKey("ns", "other")

	cases := []struct {
		name          string
		cfg           *ruleset.Config
		before, after map[model.ServiceKey]*model.Service
		wantEPs       []conntrack.StaleEndpoint
		wantSvcs      []conntrack.StaleService
	}{
		{
			name:    "only endpoint replaced",
			before:  one(svc(eps(ep("10.0.0.1")))),
			after:   one(svc(eps(ep("10.0.0.2")))),
			wantEPs: []conntrack.StaleEndpoint{staleEP("10.96.0.10", 53, "10.0.0.1:5353")},
		},
		{
			name:   "endpoint added",
			before: one(svc(eps(ep("10.0.0.1")))),
			after:  one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")))),
		},
		{
			name:   "same content in a new model (full resync)",
			before: one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")), withNodePort(30053))),
			after:  one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")), withNodePort(30053))),
		},
		{
			name:   "target port changed",
			before: one(svc(eps(ep("10.0.0.1")))),
			after: one(svc(eps(func() model.Endpoint {
				e := ep("10.0.0.1")
				e.Port = 5454
				return e
			}()))),
			wantEPs: []conntrack.StaleEndpoint{staleEP("10.96.0.10", 53, "10.0.0.1:5353")},
		},
		{
			name: "endpoint removed from every address and the node port",
			before: one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")), withNodePort(30053), func(s *model.Service) {
				s.EditRare().ExternalIPs = []netip.Addr{ext4}
				s.EditRare().LoadBalancerIPs = []netip.Addr{lb4}
			})),
			after: one(svc(eps(ep("10.0.0.2")), withNodePort(30053), func(s *model.Service) {
				s.EditRare().ExternalIPs = []netip.Addr{ext4}
				s.EditRare().LoadBalancerIPs = []netip.Addr{lb4}
			})),
			wantEPs: []conntrack.StaleEndpoint{
				staleEP("10.96.0.10", 53, "10.0.0.1:5353"),
				staleEP("192.0.2.10", 53, "10.0.0.1:5353"),
				staleEP("192.0.2.20", 53, "10.0.0.1:5353"),
				staleNodeEP(30053, "10.0.0.1:5353"),
			},
		},
		{
			name:     "scaled to zero",
			before:   one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")), withNodePort(30053))),
			after:    one(svc(nil, withNodePort(30053))),
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53), staleNode(30053)},
		},
		{
			name:     "no endpoint ready or serving any more",
			before:   one(svc(eps(ep("10.0.0.1")))),
			after:    one(svc(eps(notReady(ep("10.0.0.1"))))),
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53)},
		},
		{
			name:     "Service deleted",
			before:   one(svc(eps(ep("10.0.0.1")), withNodePort(30053))),
			after:    one(nil),
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53), staleNode(30053)},
		},
		{
			name: "port removed, the other port unchanged",
			before: one(svc(eps(ep("10.0.0.1")), func(s *model.Service) {
				s.Ports = append(s.Ports, model.ServicePort{Name: "b", Protocol: model.UDP, Port: 54, Endpoints: eps(ep("10.0.0.1"))})
			})),
			after: one(svc(eps(ep("10.0.0.1")))),
			wantSvcs: []conntrack.StaleService{
				staleSvc("10.96.0.10", 54),
			},
		},
		{
			name:   "port number changed: the old one is stale, the new one had nothing",
			before: one(svc(eps(ep("10.0.0.1")))),
			after:  one(svc(eps(ep("10.0.0.1")), func(s *model.Service) { s.Ports[0].Port = 54 })),
			// Flows sent to the new port before it existed went untranslated.
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53), untranslated(staleSvc("10.96.0.10", 54))},
		},
		{
			name:     "ClusterIP changed",
			before:   one(svc(eps(ep("10.0.0.1")))),
			after:    one(svc(eps(ep("10.0.0.1")), func(s *model.Service) { s.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")} })),
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53), untranslated(staleSvc("10.96.0.11", 53))},
		},
		{
			name:     "new Service with endpoints: untranslated flows to its address and node port",
			before:   one(nil),
			after:    one(svc(eps(ep("10.0.0.1")), withNodePort(30053))),
			wantSvcs: []conntrack.StaleService{untranslated(staleSvc("10.96.0.10", 53)), untranslated(staleNode(30053))},
		},
		{
			name:   "new Service without endpoints",
			before: one(nil),
			after:  one(svc(nil)),
		},
		{
			name:     "back up from zero",
			before:   one(svc(nil)),
			after:    one(svc(eps(ep("10.0.0.2")))),
			wantSvcs: []conntrack.StaleService{untranslated(staleSvc("10.96.0.10", 53))},
		},
		{
			name:   "TCP is never cleaned",
			before: one(svc(eps(ep("10.0.0.1")), withNodePort(30080), withProtocol(model.TCP))),
			after:  one(nil),
		},
		{
			name:   "SCTP is cleaned like UDP",
			before: one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")), withProtocol(model.SCTP))),
			after:  one(svc(eps(ep("10.0.0.2")), withProtocol(model.SCTP))),
			wantEPs: []conntrack.StaleEndpoint{{Protocol: conntrack.SCTP, VIP: vip4, Port: 53,
				Endpoint: netip.MustParseAddrPort("10.0.0.1:5353")}},
		},
		{
			name:    "endpoint no longer ready while another is",
			before:  one(svc(eps(ep("10.0.0.1"), ep("10.0.0.2")))),
			after:   one(svc(eps(notReady(ep("10.0.0.1")), ep("10.0.0.2")))),
			wantEPs: []conntrack.StaleEndpoint{staleEP("10.96.0.10", 53, "10.0.0.1:5353")},
		},
		{
			name:   "the last endpoint terminating keeps serving",
			before: one(svc(eps(ep("10.0.0.1")))),
			after:  one(svc(eps(terminating(ep("10.0.0.1"))))),
		},
		{
			name:    "a ready endpoint replaces the terminating one in use",
			before:  one(svc(eps(terminating(ep("10.0.0.1"))))),
			after:   one(svc(eps(terminating(ep("10.0.0.1")), ep("10.0.0.2")))),
			wantEPs: []conntrack.StaleEndpoint{staleEP("10.96.0.10", 53, "10.0.0.1:5353")},
		},
		{
			name: "internal policy Local loses its local endpoint: ClusterIP drops now",
			before: one(svc(eps(localEp("10.0.0.1"), ep("10.0.0.2")), func(s *model.Service) {
				s.InternalLocal = true
			})),
			after: one(svc(eps(ep("10.0.0.2")), func(s *model.Service) {
				s.InternalLocal = true
			})),
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53)},
		},
		{
			name: "internal policy Local ignores remote endpoints",
			before: one(svc(eps(localEp("10.0.0.1"), ep("10.0.0.2")), func(s *model.Service) {
				s.InternalLocal = true
			})),
			after: one(svc(eps(localEp("10.0.0.1")), func(s *model.Service) {
				s.InternalLocal = true
			})),
		},
		{
			name: "external policy Local: a remote endpoint is still in use for cluster and gateway traffic",
			before: one(svc(eps(localEp("10.0.0.1"), ep("10.0.0.2")), withNodePort(30053), func(s *model.Service) {
				s.ExternalLocal = true
			})),
			after: one(svc(eps(localEp("10.0.0.1")), withNodePort(30053), func(s *model.Service) {
				s.ExternalLocal = true
			})),
			wantEPs: []conntrack.StaleEndpoint{
				staleEP("10.96.0.10", 53, "10.0.0.2:5353"),
				staleNodeEP(30053, "10.0.0.2:5353"),
			},
		},
		{
			name: "external policy Local loses every endpoint: node port rejects now",
			before: one(svc(eps(localEp("10.0.0.1")), withNodePort(30053), func(s *model.Service) {
				s.ExternalLocal = true
			})),
			after: one(svc(nil, withNodePort(30053), func(s *model.Service) {
				s.ExternalLocal = true
			})),
			wantSvcs: []conntrack.StaleService{staleSvc("10.96.0.10", 53), staleNode(30053)},
		},
		{
			name:   "dual stack: IPv6 scaled to zero, IPv4 still served",
			before: one(svc(eps(ep("10.0.0.1"), ep("fd00::1")), withNodePort(30053), dualStack)),
			after:  one(svc(eps(ep("10.0.0.1")), withNodePort(30053), dualStack)),
			// The node port keeps its IPv4 flows: only the IPv6 endpoint's
			// flows go.
			wantEPs:  []conntrack.StaleEndpoint{staleNodeEP(30053, "[fd00::1]:5353")},
			wantSvcs: []conntrack.StaleService{staleSvc("fd00:96::10", 53)},
		},
		{
			name: "dual stack: endpoints are chosen per family",
			// IPv6 has only a terminating endpoint and uses it although
			// IPv4 has a ready one; a ready IPv6 endpoint replaces it.
			before: one(svc(eps(ep("10.0.0.1"), terminating(ep("fd00::1"))), dualStack)),
			after:  one(svc(eps(ep("10.0.0.1"), terminating(ep("fd00::1")), ep("fd00::2")), dualStack)),
			wantEPs: []conntrack.StaleEndpoint{
				staleEP("fd00:96::10", 53, "[fd00::1]:5353"),
			},
		},
		{
			name:   "a family the Service does not have is ignored",
			before: one(svc(eps(ep("10.0.0.1"), ep("fd00::1")), withNodePort(30053))),
			after:  one(svc(eps(ep("10.0.0.1")), withNodePort(30053))),
		},
		{
			name:    "node port limited to IPv4 addresses",
			cfg:     v4Only,
			before:  one(svc(eps(ep("10.0.0.1"), ep("fd00::1"), ep("fd00::2")), withNodePort(30053), dualStack)),
			after:   one(svc(eps(ep("10.0.0.1"), ep("fd00::2")), withNodePort(30053), dualStack)),
			wantEPs: []conntrack.StaleEndpoint{staleEP("fd00:96::10", 53, "[fd00::1]:5353")},
		},
		{
			name: "address moved to another Service with the same endpoint",
			before: map[model.ServiceKey]*model.Service{
				dnsKey: svc(eps(ep("10.0.0.1"))),
				other:  nil,
			},
			after: map[model.ServiceKey]*model.Service{
				dnsKey: nil,
				other:  svc(eps(ep("10.0.0.1")), func(s *model.Service) { s.Key = other }),
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			if c == nil {
				c = cfg
			}
			gotEPs, gotSvcs := conntrack.StaleFlows(c, tc.before, tc.after)
			if len(gotEPs) == 0 {
				gotEPs = nil
			}
			if len(gotSvcs) == 0 {
				gotSvcs = nil
			}
			if !reflect.DeepEqual(gotEPs, tc.wantEPs) {
				t.Errorf("stale endpoints:\n got %v\nwant %v", gotEPs, tc.wantEPs)
			}
			if !reflect.DeepEqual(gotSvcs, tc.wantSvcs) {
				t.Errorf("stale services:\n got %v\nwant %v", gotSvcs, tc.wantSvcs)
			}
		})
	}
}

// cleanCall is one call of fakeCleaner.Clean.
type cleanCall struct {
	eps  []conntrack.StaleEndpoint
	svcs []conntrack.StaleService
	at   time.Time
}

// fakeCleaner stands in for the kernel: it records every call, and answer
// decides each call's outcome (it may block).
type fakeCleaner struct {
	calls  chan cleanCall
	answer func(n int, c cleanCall) (conntrack.Result, error)
	n      int
}

func newFakeCleaner(answer func(n int, c cleanCall) (conntrack.Result, error)) *fakeCleaner {
	return &fakeCleaner{calls: make(chan cleanCall, 100), answer: answer}
}

func (f *fakeCleaner) Clean(ctx context.Context, eps []conntrack.StaleEndpoint, svcs []conntrack.StaleService) (conntrack.Result, error) {
	c := cleanCall{eps: eps, svcs: svcs, at: time.Now()}
	f.calls <- c
	f.n++
	return f.answer(f.n, c)
}

// next waits for the next Clean call.
func (f *fakeCleaner) next(t *testing.T) cleanCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no cleanup happened")
	}
	panic("unreachable")
}

// replaced is an Event of a successful sync that replaced the only endpoint
// of a Service at address vip: exactly one stale endpoint.
func replaced(vip string) loop.Event {
	s := func(e string) *model.Service {
		return svc(eps(ep(e)), func(s *model.Service) {
			s.Key = model.NewServiceKey(s.Key.Namespace(), vip)
			s.ClusterIPs = []netip.Addr{netip.MustParseAddr(vip)}
		})
	}
	k := s("10.0.0.1").Key
	return loop.Event{
		Before: map[model.ServiceKey]*model.Service{k: s("10.0.0.1")},
		After:  map[model.ServiceKey]*model.Service{k: s("10.0.0.2")},
	}
}

func staleOf(vip string) conntrack.StaleEndpoint {
	return staleEP(vip, 53, "10.0.0.1:5353")
}

// runCleaner starts c.Run for the duration of the test and returns the
// channel of its reports.
func runCleaner(t *testing.T, c *conntrack.Runner) <-chan conntrack.Report {
	t.Helper()
	reports := make(chan conntrack.Report, 100)
	c.Report = func(r conntrack.Report) { reports <- r }
	c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return reports
}

func nextReport(t *testing.T, reports <-chan conntrack.Report) conntrack.Report {
	t.Helper()
	select {
	case r := <-reports:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no report")
	}
	panic("unreachable")
}

// observeWithin calls Observe and fails the test if it does not return at
// once: the sync loop must never wait for a cleanup.
func observeWithin(t *testing.T, c *conntrack.Runner, ev loop.Event) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		c.Observe(ev)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Observe blocked")
	}
}

func TestConntrackCleanerMergesWorkQueuedDuringACleanup(t *testing.T) {
	release := make(chan struct{})
	fc := newFakeCleaner(func(n int, c cleanCall) (conntrack.Result, error) {
		if n == 1 {
			<-release // a slow kernel
		}
		return conntrack.Result{Deleted: len(c.eps) + len(c.svcs), Duration: time.Millisecond}, nil
	})
	c := &conntrack.Runner{Cleaner: fc, Ruleset: ruleset.Config{Node: model.Node{Name: nodeName}}}
	reports := runCleaner(t, c)

	observeWithin(t, c, replaced("10.96.0.1"))
	if got := fc.next(t); !reflect.DeepEqual(got.eps, []conntrack.StaleEndpoint{staleOf("10.96.0.1")}) {
		t.Fatalf("first cleanup got %v", got.eps)
	}
	// The first cleanup hangs in the kernel; syncs go on.
	observeWithin(t, c, replaced("10.96.0.2"))
	observeWithin(t, c, replaced("10.96.0.3"))
	observeWithin(t, c, replaced("10.96.0.2")) // the same work twice is done once
	if got := c.Pending(); got != 2 {
		t.Errorf("Pending() = %d while the cleanup runs, want 2", got)
	}
	close(release)
	if r := nextReport(t, reports); r.Err != nil || r.Result.Deleted != 1 || r.Endpoints != 1 {
		t.Errorf("first report %+v", r)
	}
	got := fc.next(t)
	want := []conntrack.StaleEndpoint{staleOf("10.96.0.2"), staleOf("10.96.0.3")}
	if !reflect.DeepEqual(got.eps, want) || len(got.svcs) != 0 {
		t.Fatalf("second cleanup got %v %v, want the merged %v", got.eps, got.svcs, want)
	}
	if r := nextReport(t, reports); r.Err != nil || r.Result.Deleted != 2 || r.Endpoints != 2 || r.Result.Duration != time.Millisecond {
		t.Errorf("second report %+v", r)
	}
	if got := c.Pending(); got != 0 {
		t.Errorf("Pending() = %d after the cleanups, want 0", got)
	}
}

func TestConntrackCleanerIgnoresFailedSyncsAndNoops(t *testing.T) {
	fc := newFakeCleaner(func(int, cleanCall) (conntrack.Result, error) { return conntrack.Result{}, nil })
	c := &conntrack.Runner{Cleaner: fc}
	reports := runCleaner(t, c)
	failed := replaced("10.96.0.1")
	failed.Err = errors.New("kernel refused the batch")
	observeWithin(t, c, failed)
	observeWithin(t, c, loop.Event{Full: true}) // nothing changed
	observeWithin(t, c, replaced("10.96.0.2"))
	if got := fc.next(t); !reflect.DeepEqual(got.eps, []conntrack.StaleEndpoint{staleOf("10.96.0.2")}) {
		t.Fatalf("cleanup got %v, want only the successful sync's work", got.eps)
	}
	nextReport(t, reports)
}

func TestConntrackCleanerRetriesWithBackoff(t *testing.T) {
	fc := newFakeCleaner(func(n int, c cleanCall) (conntrack.Result, error) {
		if n <= 2 {
			return conntrack.Result{Failed: 1}, fmt.Errorf("attempt %d: no buffer space", n)
		}
		return conntrack.Result{Deleted: 1}, nil
	})
	c := &conntrack.Runner{Cleaner: fc, MinBackoff: 20 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
	reports := runCleaner(t, c)
	observeWithin(t, c, replaced("10.96.0.1"))
	want := []conntrack.StaleEndpoint{staleOf("10.96.0.1")}
	var last time.Time
	for i := 1; i <= 3; i++ {
		got := fc.next(t)
		if !reflect.DeepEqual(got.eps, want) {
			t.Fatalf("attempt %d got %v, want %v", i, got.eps, want)
		}
		if i > 1 && got.at.Sub(last) < 20*time.Millisecond {
			t.Errorf("attempt %d came %s after the previous one, want a backoff of at least 20ms", i, got.at.Sub(last))
		}
		last = got.at
		r := nextReport(t, reports)
		if (i <= 2) != (r.Err != nil) {
			t.Errorf("report %d: err %v", i, r.Err)
		}
		if wantRetried := min(i-1, 1); r.Retried != wantRetried {
			t.Errorf("report %d: Retried %d, want %d", i, r.Retried, wantRetried)
		}
	}
}

func TestConntrackCleanerNewWorkDoesNotWaitForRetries(t *testing.T) {
	fc := newFakeCleaner(func(n int, c cleanCall) (conntrack.Result, error) {
		if n == 1 {
			return conntrack.Result{}, errors.New("dump interrupted")
		}
		return conntrack.Result{Deleted: 1}, nil
	})
	// The retry would come only after an hour.
	c := &conntrack.Runner{Cleaner: fc, MinBackoff: time.Hour}
	reports := runCleaner(t, c)
	observeWithin(t, c, replaced("10.96.0.1"))
	fc.next(t)
	if r := nextReport(t, reports); r.Err == nil {
		t.Fatal("first cleanup should have failed")
	}
	observeWithin(t, c, replaced("10.96.0.2"))
	if got := fc.next(t); !reflect.DeepEqual(got.eps, []conntrack.StaleEndpoint{staleOf("10.96.0.2")}) {
		t.Fatalf("got %v, want the new work alone, at once", got.eps)
	}
	if r := nextReport(t, reports); r.Err != nil || r.Retried != 0 {
		t.Errorf("report %+v", r)
	}
}

func TestConntrackCleanerGivesUp(t *testing.T) {
	fc := newFakeCleaner(func(n int, c cleanCall) (conntrack.Result, error) {
		for _, e := range c.eps {
			if e == staleOf("10.96.0.1") {
				return conntrack.Result{}, errors.New("permanent failure")
			}
		}
		return conntrack.Result{}, nil
	})
	c := &conntrack.Runner{Cleaner: fc, MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	reports := runCleaner(t, c)
	observeWithin(t, c, replaced("10.96.0.1"))
	for i := 1; i <= 3; i++ {
		fc.next(t)
		r := nextReport(t, reports)
		if r.Err == nil {
			t.Fatalf("attempt %d succeeded", i)
		}
		if wantGaveUp := map[bool]int{true: 1}[i == 3]; r.GaveUp != wantGaveUp {
			t.Errorf("attempt %d: GaveUp %d, want %d", i, r.GaveUp, wantGaveUp)
		}
	}
	// Later work goes out alone: the abandoned destination is not retried.
	observeWithin(t, c, replaced("10.96.0.2"))
	if got := fc.next(t); !reflect.DeepEqual(got.eps, []conntrack.StaleEndpoint{staleOf("10.96.0.2")}) {
		t.Fatalf("got %v after giving up, want only the new work", got.eps)
	}
	if r := nextReport(t, reports); r.Err != nil {
		t.Errorf("report %+v", r)
	}
}
