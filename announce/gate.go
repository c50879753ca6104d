package announce

import (
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/nftgate/nftgate/announce/bgp"
)

// Gate stands between the Coordinator and the announcers when a gateway
// set shares the floating addresses out (package gateways): the
// Coordinator's served addresses go to the set (its AddrSetter), the set
// hands the ones this gateway holds to Held, and the announcers carry
// those: the L2 announcer all of them, the BGP speaker those routes whose
// address is held, and those Shared says every gateway announces whether
// it holds them or not (in active-active mode the Service addresses, which
// the router spreads by ECMP). So over BGP as on L2, a floating address
// (a masquerade address; in active-backup mode every address) is announced
// by its holder alone.
type Gate struct {
	L2  AddrSetter  // nil: no L2 announcement
	BGP RouteSetter // nil: no BGP
	// Shared tells which addresses BGP announces held or not; nil: none.
	Shared func(netip.Addr) bool
	// SharedWaits holds the Shared routes back until Ready: a gateway
	// that (re)joins the set must not draw flows from the router before
	// it holds their conntrack entries (the state sync's resync).
	SharedWaits bool
	Log         *slog.Logger

	mu     sync.Mutex
	held   map[netip.Addr]bool
	routes []bgp.Route
	// routed: the Coordinator set the routes at least once (the speaker
	// opens its sessions with the first Set, so it is not called before).
	routed bool
	ready  bool
	// standby: this gateway is faulty while a fit peer lives (the
	// gateway set's OnStandby); the Shared routes are withdrawn.
	standby bool
}

// Ready lets the Shared routes out (SharedWaits): this gateway holds its
// peers' flow state, or gave up waiting. It is the gateway set's
// OnReady, and does not call back into the set.
func (g *Gate) Ready() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ready = true
	g.reannounce()
}

// Standby withdraws the Shared routes while this gateway is faulty (a
// link it tracks is down) and a fit peer lives, which the router then
// sends the flows to, and announces them again after. It is the gateway
// set's OnStandby, and does not call back into the set.
func (g *Gate) Standby(standby bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.standby = standby
	g.reannounce()
}

// Held is the gateway set's OnChange: the addresses this gateway holds.
// It does not call back into the set.
func (g *Gate) Held(addrs []netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		g.held[a.Unmap()] = true
	}
	if g.L2 != nil {
		g.L2.Set(slices.Clone(addrs))
	}
	g.reannounce()
}

// Routes is the RouteSetter the Coordinator hands its routes to (its BGP).
func (g *Gate) Routes() RouteSetter { return gateRoutes{g} }

type gateRoutes struct{ g *Gate }

func (r gateRoutes) Set(routes []bgp.Route) error {
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.routes, g.routed = slices.Clone(routes), true
	return g.setRoutes()
}

// reannounce sets the routes again once the Coordinator has set them (the
// speaker opens its sessions with the first Set); a failure is logged.
// g.mu is held.
func (g *Gate) reannounce() {
	if !g.routed {
		return
	}
	if err := g.setRoutes(); err != nil && g.Log != nil {
		g.Log.Error("BGP announcement failed", "err", err)
	}
}

// setRoutes announces the routes of held or shared addresses; g.mu is held.
func (g *Gate) setRoutes() error {
	if g.BGP == nil {
		return nil
	}
	out := make([]bgp.Route, 0, len(g.routes))
	for _, r := range g.routes {
		if g.passes(r.Prefix.Addr()) {
			out = append(out, r)
		}
	}
	return g.BGP.Set(out)
}

// passes tells whether a route to a goes out over BGP; g.mu is held.
func (g *Gate) passes(a netip.Addr) bool {
	a = a.Unmap()
	return g.held[a] || g.Shared != nil && (g.ready || !g.SharedWaits) && !g.standby && g.Shared(a)
}

// Passes tells whether the Coordinator's route to a goes out over BGP
// now (for the status page).
func (g *Gate) Passes(a netip.Addr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.passes(a)
}
