package podroutes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Protocol is the routing protocol number (rtm_protocol, RTPROT) of every
// route nftgate installs: 246 (0xF6), in the range the kernel and
// iproute2 leave unassigned. `ip route show proto 246` lists them; a line
// "246 nftgate" in /etc/iproute2/rt_protos.d/nftgate.conf names them.
// Routes of any other protocol are never changed or deleted.
const Protocol netlink.RouteProtocol = 0xF6

// Options configure a Reconciler.
type Options struct {
	// Netns is the network namespace whose routes are kept; nil: the
	// namespace of the calling thread.
	Netns *netns.NsHandle
	// Policy gives the table and the repair interval (nil: the defaults).
	Policy *Policy
	// Registerer receives the metrics; nil: none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Reconciler keeps the kernel's routes of Protocol equal to a Plan.
type Reconciler struct {
	h      *netlink.Handle
	ns     *netns.NsHandle
	table  int
	period time.Duration
	log    *slog.Logger
	kick   chan struct{}

	mu        sync.Mutex
	plan      Plan
	installed map[netip.Prefix]netip.Addr // after the last pass
	kernel    []string                    // the last pass's refusals and conflicts
	repairs   uint64
	last      time.Time
	lastErr   error

	mInstalled *prometheus.GaugeVec
	mProblems  prometheus.Gauge
	mRepairs   prometheus.Counter
}

// New opens a netlink handle in the namespace. Close releases it.
func New(o Options) (*Reconciler, error) {
	pol := o.Policy
	if pol == nil {
		pol = &Policy{Mode: None, Table: DefaultTable, RepairInterval: DefaultRepairInterval}
	}
	var h *netlink.Handle
	var err error
	if o.Netns != nil {
		h, err = netlink.NewHandleAt(*o.Netns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("pod routes: netlink: %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{
		h: h, ns: o.Netns, table: pol.Table, period: pol.RepairInterval, log: log,
		kick:      make(chan struct{}, 1),
		plan:      Plan{Mode: pol.Mode},
		installed: map[netip.Prefix]netip.Addr{},
		mInstalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nftgate_pod_routes_installed",
			Help: "Routes to pods in the kernel (protocol 246), by pod_routes mode.",
		}, []string{"mode"}),
		mProblems: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nftgate_pod_routes_problems",
			Help: "Routes to pods wanted but not installed: input problems, refusals by the kernel, conflicts with routes of other protocols.",
		}),
		mRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftgate_pod_routes_repaired_total",
			Help: "Routes to pods put back after something else removed or changed them.",
		}),
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{r.mInstalled, r.mProblems, r.mRepairs} {
			if err := o.Registerer.Register(c); err != nil {
				h.Close()
				return nil, fmt.Errorf("pod routes: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Close releases the netlink handle. The routes stay.
func (r *Reconciler) Close() { r.h.Close() }

// Set makes p the desired state and reconciles the kernel with it at once.
// The error tells what the kernel refused; the rest is installed anyway.
func (r *Reconciler) Set(p Plan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plan = p
	return r.reconcileLocked(false)
}

// Reconcile compares the kernel's routes with the plan and repairs every
// difference.
func (r *Reconciler) Reconcile() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reconcileLocked(true)
}

// Run repairs the routes until ctx ends: on every route notification of
// the namespace that removes or changes a route of Protocol, on address
// changes (a next hop may have become reachable), and every repair
// interval as a backstop.
func (r *Reconciler) Run(ctx context.Context) error {
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	var routes chan netlink.RouteUpdate
	var addrs chan netlink.AddrUpdate
	var done chan struct{}
	subscribe := func() {
		if done != nil {
			close(done)
		}
		done = make(chan struct{})
		routes, addrs = make(chan netlink.RouteUpdate, 64), make(chan netlink.AddrUpdate, 16)
		errf := func(err error) { r.log.Warn("pod routes: netlink notifications", "err", err) }
		// A Set of thousands of routes echoes as many notifications: a
		// large buffer keeps the socket from overflowing meanwhile.
		opts := netlink.RouteSubscribeOptions{Namespace: r.ns, ErrorCallback: errf, ReceiveBufferSize: 4 << 20}
		if err := netlink.RouteSubscribeWithOptions(routes, done, opts); err != nil {
			r.log.Warn("pod routes: subscribing to route notifications; repairing every interval only", "err", err, "interval", r.period)
			routes = nil
		}
		if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{Namespace: r.ns, ErrorCallback: errf}); err != nil {
			addrs = nil
		}
	}
	subscribe()
	defer func() { close(done) }()
	// The subscription is in place: a pass now sees whatever happened
	// before it.
	r.trigger()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-routes:
			if !ok {
				// The subscription failed (its error is logged): a new
				// one, and a pass for what may have been missed.
				subscribe()
				r.trigger()
				continue
			}
			if u.Protocol == Protocol || u.Type == unix.RTM_DELROUTE {
				r.trigger()
			}
		case _, ok := <-addrs:
			if !ok {
				subscribe()
				r.trigger()
				continue
			}
			r.trigger()
		case <-tick.C:
			if routes == nil {
				subscribe()
			}
			r.trigger()
		case <-r.kick:
			if err := r.Reconcile(); err != nil {
				r.log.Warn("pod routes", "err", err)
			}
		}
	}
}

func (r *Reconciler) trigger() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// ours lists every route of Protocol, in every table.
func ours(h *netlink.Handle) ([]netlink.Route, error) {
	return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_UNSPEC},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
}

func prefixOf(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func (r *Reconciler) route(rt Route) *netlink.Route {
	return &netlink.Route{Dst: ipNet(rt.Dst), Gw: rt.Via.AsSlice(), Protocol: Protocol, Table: r.table}
}

func (r *Reconciler) reconcileLocked(repair bool) error {
	have, err := ours(r.h)
	if err != nil {
		r.lastErr = fmt.Errorf("pod routes: listing routes: %w", err)
		return r.lastErr
	}
	want := make(map[netip.Prefix]netip.Addr, len(r.plan.Routes))
	for _, rt := range r.plan.Routes {
		want[rt.Dst] = rt.Via
	}
	var errs []error
	var kernel []string
	inKernel := map[netip.Prefix]netip.Addr{}
	for _, k := range have {
		if k.Dst == nil {
			continue
		}
		dst := prefixOf(k.Dst)
		gw, _ := netip.AddrFromSlice(k.Gw)
		gw = gw.Unmap()
		if v, ok := want[dst]; ok && k.Table == r.table {
			if v == gw && len(k.MultiPath) == 0 {
				inKernel[dst] = gw
			}
			continue // ours with another next hop: replaced below
		}
		del := k
		if err := r.h.RouteDel(&del); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting %s (table %d): %w", dst, k.Table, err))
		}
	}
	ownedDst := map[netip.Prefix]bool{}
	for _, k := range have {
		if k.Dst != nil && k.Table == r.table {
			ownedDst[prefixOf(k.Dst)] = true
		}
	}
	repaired := 0
	for _, rt := range r.plan.Routes {
		if _, ok := inKernel[rt.Dst]; ok {
			continue
		}
		var err error
		if ownedDst[rt.Dst] {
			err = r.h.RouteReplace(r.route(rt)) // the occupant is ours
		} else {
			err = r.h.RouteAdd(r.route(rt)) // exclusive: never over another protocol's route
		}
		switch {
		case errors.Is(err, unix.EEXIST):
			kernel = append(kernel, fmt.Sprintf("%s: the table holds another route to %s (not nftgate's); left alone", rt, rt.Dst))
			continue
		case err != nil:
			kernel = append(kernel, fmt.Sprintf("%s: refused by the kernel: %v", rt, err))
			errs = append(errs, fmt.Errorf("%s: %w", rt, err))
			continue
		}
		if repair && r.installed[rt.Dst] == rt.Via {
			repaired++
			r.log.Info("pod routes: repaired a route removed or changed by something else", "route", rt.String())
		}
		inKernel[rt.Dst] = rt.Via
	}
	slices.Sort(kernel)
	r.installed, r.kernel, r.last = inKernel, kernel, time.Now()
	r.repairs += uint64(repaired)
	r.mRepairs.Add(float64(repaired))
	r.mInstalled.Reset()
	r.mInstalled.WithLabelValues(string(r.plan.Mode)).Set(float64(len(inKernel)))
	r.mProblems.Set(float64(len(r.plan.Problems) + len(kernel)))
	r.lastErr = errors.Join(errs...)
	if r.lastErr != nil {
		r.lastErr = fmt.Errorf("pod routes: %w", r.lastErr)
	}
	return r.lastErr
}

// Status is the reconciler's state for the status page and the API.
type Status struct {
	Mode      Mode     `json:"mode"`
	Desired   int      `json:"desired"`
	Installed int      `json:"installed"`
	Table     int      `json:"table"`
	Problems  []string `json:"problems,omitempty"`
	// Repaired counts routes put back after something else removed them.
	Repaired      uint64    `json:"repaired"`
	LastReconcile time.Time `json:"lastReconcile"`
	Error         string    `json:"error,omitempty"`
}

// Status returns the state after the last pass.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Status{
		Mode: r.plan.Mode, Desired: len(r.plan.Routes), Installed: len(r.installed), Table: r.table,
		Problems: slices.Concat(r.plan.Problems, r.kernel), Repaired: r.repairs, LastReconcile: r.last,
	}
	if r.lastErr != nil {
		s.Error = r.lastErr.Error()
	}
	return s
}

// Cleanup deletes every route of Protocol in every table of the namespace
// h works in (nil: the caller's), and only those, for `nftgate cleanup`. It
// returns how many it deleted.
func Cleanup(h *netlink.Handle) (int, error) {
	if h == nil {
		var err error
		if h, err = netlink.NewHandle(); err != nil {
			return 0, fmt.Errorf("pod routes: netlink: %w", err)
		}
		defer h.Close()
	}
	have, err := ours(h)
	if err != nil {
		return 0, fmt.Errorf("pod routes: listing routes: %w", err)
	}
	n := 0
	var errs []error
	for i := range have {
		if err := h.RouteDel(&have[i]); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("pod routes: deleting %s: %w", have[i].Dst, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
