package conntrack

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// destEndpoints maps each UDP and SCTP destination of the ruleset to the
// endpoints its rules translate new flows to. A destination that exists but
// rejects or drops new flows (no usable endpoint) has an empty set.
type destEndpoints map[ruleset.Destination]map[netip.AddrPort]struct{}

// add records the destinations of one Service as the ruleset renders them
// with cfg; nil adds nothing. Only UDP and SCTP count: a TCP client of a
// vanished endpoint gets a reset.
func (d destEndpoints) add(cfg *ruleset.Config, svc *model.Service) {
	if svc == nil || !slices.ContainsFunc(svc.Ports, func(p model.ServicePort) bool { return p.Protocol == UDP || p.Protocol == SCTP }) {
		return
	}
	rendered := ruleset.RenderService(cfg, svc)
	ruleset.Translations(&rendered, func(dst ruleset.Destination, eps []netip.AddrPort) {
		if dst.Proto != UDP && dst.Proto != SCTP || !dst.NodePort && !usableVIP(dst.Addr) {
			return
		}
		set := d[dst]
		if set == nil {
			set = map[netip.AddrPort]struct{}{}
			d[dst] = set
		}
		for _, ap := range eps {
			if usableEndpoint(ap) {
				set[ap] = struct{}{}
			}
		}
	})
}

// usableEndpoint tells whether a flow can be translated to ap; anything else
// the cleaner would refuse as input.
func usableEndpoint(ap netip.AddrPort) bool {
	a := ap.Addr()
	return a.IsValid() && !a.IsUnspecified() && !a.Is4In6() && a.Zone() == "" && ap.Port() != 0
}

// usableVIP tells whether a is an address the cleaner accepts as a service
// address.
func usableVIP(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.Is4In6() && a.Zone() == ""
}

// StaleFlows computes the conntrack flows that one successful sync from
// before to after leaves pointing where the ruleset no longer sends traffic.
// before and after are Event.Before and Event.After (nil for a Service that
// did not exist); cfg is the configuration the ruleset was rendered with
// (its Node and NodePortAddresses matter). Only UDP and SCTP count: a TCP
// client of a vanished endpoint gets a reset.
//
//   - An endpoint a destination used before and does not use after: its
//     flows to that destination (reply source the endpoint) are stale.
//   - A destination that is gone after (Service deleted, port or address
//     removed or changed) or has no endpoint left (scaled to zero, no ready
//     endpoint, Local policy without a local one): all its flows are stale,
//     so that the next datagram meets the reject (or drop) rule instead of
//     the old translation. A node port is one destination for both
//     families in the kernel's eyes; when only one family loses all its
//     endpoints, its old endpoints are named one by one instead, so the
//     other family's flows stay.
//   - A destination that had no endpoint before and has some after: flows
//     sent to it meanwhile were not translated (reply source is the
//     destination itself) and would keep bypassing the new rules for as
//     long as the client keeps sending; those are stale too
//     (StaleService.Untranslated). Flows rejected for lack of endpoints
//     leave no entry; these come from before the destination existed.
//
// Destinations are compared across all the changed Services, so an address
// and port that moves from one Service to another in one sync is judged by
// its endpoints, not by which Service owns it. The result is sorted and free
// of duplicates, and always valid input for Cleaner.Clean.
func StaleFlows(cfg *ruleset.Config, before, after map[model.ServiceKey]*model.Service) ([]StaleEndpoint, []StaleService) {
	was, now := destEndpoints{}, destEndpoints{}
	for _, svc := range before {
		was.add(cfg, svc)
	}
	for _, svc := range after {
		now.add(cfg, svc)
	}
	// nodePortServed tells whether a node port still translates flows in
	// some family after the sync.
	nodePortServed := func(proto Protocol, port uint16) bool {
		for _, f := range ruleset.Families {
			if len(now[ruleset.Destination{Proto: proto, Family: f, Port: port, NodePort: true}]) > 0 {
				return true
			}
		}
		return false
	}
	epSet := map[StaleEndpoint]struct{}{}
	svcSet := map[StaleService]struct{}{}
	staleEndpoint := func(dst ruleset.Destination, ep netip.AddrPort) {
		epSet[StaleEndpoint{Protocol: dst.Proto, VIP: dst.Addr, Port: dst.Port, NodePort: dst.NodePort, Endpoint: ep}] = struct{}{}
	}
	for dst, old := range was {
		cur := now[dst]
		switch {
		case len(old) == 0:
			// Nothing was translated; see the untranslated case below.
		case len(cur) > 0:
			for ep := range old {
				if _, ok := cur[ep]; !ok {
					staleEndpoint(dst, ep)
				}
			}
		case dst.NodePort && nodePortServed(dst.Proto, dst.Port):
			for ep := range old {
				staleEndpoint(dst, ep)
			}
		default:
			svcSet[StaleService{Protocol: dst.Proto, VIP: dst.Addr, Port: dst.Port, NodePort: dst.NodePort}] = struct{}{}
		}
	}
	for dst, cur := range now {
		if len(cur) > 0 && len(was[dst]) == 0 {
			svcSet[StaleService{Protocol: dst.Proto, VIP: dst.Addr, Port: dst.Port, NodePort: dst.NodePort, Untranslated: true}] = struct{}{}
		}
	}
	eps := make([]StaleEndpoint, 0, len(epSet))
	for e := range epSet {
		eps = append(eps, e)
	}
	svcs := make([]StaleService, 0, len(svcSet))
	for v := range svcSet {
		svcs = append(svcs, v)
	}
	slices.SortFunc(eps, compareStaleEndpoint)
	slices.SortFunc(svcs, compareStaleService)
	return eps, svcs
}

func compareStaleService(a, b StaleService) int {
	return cmp.Or(
		cmp.Compare(a.Protocol, b.Protocol),
		compareBool(a.NodePort, b.NodePort),
		a.VIP.Compare(b.VIP),
		cmp.Compare(a.Port, b.Port),
		compareBool(a.Untranslated, b.Untranslated))
}

func compareStaleEndpoint(a, b StaleEndpoint) int {
	return cmp.Or(
		compareStaleService(
			StaleService{Protocol: a.Protocol, VIP: a.VIP, Port: a.Port, NodePort: a.NodePort},
			StaleService{Protocol: b.Protocol, VIP: b.VIP, Port: b.Port, NodePort: b.NodePort}),
		a.Endpoint.Compare(b.Endpoint))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// FlowCleaner deletes stale flows: *Cleaner in production.
type FlowCleaner interface {
	Clean(ctx context.Context, endpoints []StaleEndpoint, services []StaleService) (Result, error)
}

// Report describes one cleanup attempt.
type Report struct {
	// Endpoints and Services count the stale destinations handed to the
	// cleaner, Retried those among them that had failed before.
	Endpoints, Services, Retried int
	Result                       Result
	Err                          error
	// GaveUp counts stale destinations dropped after this attempt because
	// they failed MaxAttempts times; their flows are left to time out.
	GaveUp int
}

// Defaults of Runner.
const (
	DefaultMaxAttempts = 10
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 30 * time.Second
)

// Runner deletes the flows each successful sync leaves stale. Its
// Observe method is a Syncer observer: it only computes what is stale (a
// pure function of the changed Services) and queues it, so the sync loop
// never waits for the kernel's conntrack table. Run deletes the queued flows
// on its own goroutine; work queued while a cleanup runs is merged into the
// next one. A failed cleanup is retried with exponential backoff, while new
// work still goes out at once.
type Runner struct {
	Cleaner FlowCleaner
	// Ruleset is the configuration the Programmer renders with: its Node
	// decides the Local-policy endpoints and its NodePortAddresses the
	// families that have node ports, exactly as in the ruleset.
	Ruleset ruleset.Config
	// Report, when set, is called from Run's goroutine after every cleanup
	// attempt.
	Report func(Report)
	Log    *slog.Logger
	// MaxAttempts bounds how often one stale destination is tried; zero
	// means DefaultMaxAttempts.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait before a retry; zero means
	// the defaults.
	MinBackoff, MaxBackoff time.Duration

	mu      sync.Mutex
	fresh   staleSet
	wake    chan struct{}
	started bool
}

// staleSet holds stale destinations with the attempts already made on each.
type staleSet struct {
	eps  map[StaleEndpoint]int
	svcs map[StaleService]int
}

func (s *staleSet) empty() bool { return len(s.eps) == 0 && len(s.svcs) == 0 }

func (s *staleSet) addEndpoint(e StaleEndpoint, attempts int) {
	if s.eps == nil {
		s.eps = map[StaleEndpoint]int{}
	}
	if n, ok := s.eps[e]; !ok || attempts < n {
		s.eps[e] = attempts
	}
}

func (s *staleSet) addService(v StaleService, attempts int) {
	if s.svcs == nil {
		s.svcs = map[StaleService]int{}
	}
	if n, ok := s.svcs[v]; !ok || attempts < n {
		s.svcs[v] = attempts
	}
}

func (s *staleSet) merge(o staleSet) {
	for e, n := range o.eps {
		s.addEndpoint(e, n)
	}
	for v, n := range o.svcs {
		s.addService(v, n)
	}
}

// init makes the wake channel; c.mu must be held.
func (c *Runner) init() {
	if c.wake == nil {
		c.wake = make(chan struct{}, 1)
	}
}

// Observe queues the flows a successful sync left stale. It never blocks on
// the cleanup, and it may be called before Run starts.
func (c *Runner) Observe(ev loop.Event) {
	if ev.Err != nil {
		return // nothing changed in the kernel
	}
	eps, svcs := StaleFlows(&c.Ruleset, ev.Before, ev.After)
	if len(eps) == 0 && len(svcs) == 0 {
		return
	}
	c.mu.Lock()
	c.init()
	for _, e := range eps {
		c.fresh.addEndpoint(e, 0)
	}
	for _, v := range svcs {
		c.fresh.addService(v, 0)
	}
	wake := c.wake
	c.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default: // a wake-up is already pending; it will see this work
	}
}

// Pending tells how many stale destinations wait for a first attempt.
func (c *Runner) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fresh.eps) + len(c.fresh.svcs)
}

// Run cleans queued work until ctx ends. Call it once.
func (c *Runner) Run(ctx context.Context) {
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	maxAttempts := cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	minBackoff := cmp.Or(c.MinBackoff, DefaultMinBackoff)
	maxBackoff := max(cmp.Or(c.MaxBackoff, DefaultMaxBackoff), minBackoff)

	c.mu.Lock()
	c.init()
	if c.started {
		c.mu.Unlock()
		panic("conntrack: Runner.Run called twice")
	}
	c.started = true
	wake := c.wake
	c.mu.Unlock()

	// retry holds work whose last attempt failed; it waits until retryAt.
	var retry staleSet
	var retryAt time.Time
	var backoff time.Duration
	for {
		var retryTimer <-chan time.Time
		var timer *time.Timer
		if !retry.empty() {
			timer = time.NewTimer(time.Until(retryAt))
			retryTimer = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-wake:
		case <-retryTimer:
		}
		if timer != nil {
			timer.Stop()
		}

		c.mu.Lock()
		batch := c.fresh
		c.fresh = staleSet{}
		c.mu.Unlock()
		retried := 0
		if !retry.empty() && !time.Now().Before(retryAt) {
			retried = len(retry.eps) + len(retry.svcs)
			batch.merge(retry)
			retry = staleSet{}
		}
		if batch.empty() {
			continue
		}

		eps := make([]StaleEndpoint, 0, len(batch.eps))
		for e := range batch.eps {
			eps = append(eps, e)
		}
		svcs := make([]StaleService, 0, len(batch.svcs))
		for v := range batch.svcs {
			svcs = append(svcs, v)
		}
		slices.SortFunc(eps, compareStaleEndpoint)
		slices.SortFunc(svcs, compareStaleService)

		res, err := c.Cleaner.Clean(ctx, eps, svcs)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return // shutting down: the rest is left to time out
		}
		rep := Report{Endpoints: len(eps), Services: len(svcs), Retried: retried, Result: res, Err: err}
		if err == nil {
			if retried > 0 {
				backoff = 0
			}
			log.Debug("stale conntrack flows deleted", "deleted", res.Deleted, "endpoints", len(eps), "services", len(svcs), "requests", res.Requests, "duration", res.Duration)
		} else {
			// Which destinations failed is only known as text, so the
			// whole batch is tried again; deleting flows that are already
			// gone costs one filtered walk and deletes nothing.
			for e, n := range batch.eps {
				if n+1 < maxAttempts {
					retry.addEndpoint(e, n+1)
				} else {
					rep.GaveUp++
				}
			}
			for v, n := range batch.svcs {
				if n+1 < maxAttempts {
					retry.addService(v, n+1)
				} else {
					rep.GaveUp++
				}
			}
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			retryAt = time.Now().Add(backoff)
			if rep.GaveUp > 0 {
				log.Error("stale conntrack cleanup failed; giving up on some destinations, their flows are left to time out",
					"err", err, "gave_up", rep.GaveUp, "attempts", maxAttempts)
			}
			if !retry.empty() {
				log.Warn("stale conntrack cleanup failed; retrying", "err", err, "deleted", res.Deleted, "retry_in", backoff)
			}
		}
		if c.Report != nil {
			c.Report(rep)
		}
	}
}
