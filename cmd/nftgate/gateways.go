package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/announce"
	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/ruleset"
)

// startGateways joins the gateway set of [gateways]: the announcers then
// carry only the addresses this gateway holds (the Set and an
// announce.Gate stand between the announce coordinator and them): on L2
// every address; over BGP the masquerade addresses, and in active-backup
// mode every address, while the Service addresses of active-active mode go
// over BGP from every gateway, once this gateway is ready. With the state
// sync on, its Ready is the Set's ready gate (Options.Ready) and its OnPeer
// the Set's; with the map of homes (homes.go) the Set tells it too. A
// Tracker of the tracked links makes the Set faulty while one is down.
func (e *edge) startGateways(cfg *Config, homes func([]ruleset.Element) error, reg prometheus.Registerer, log *slog.Logger) error {
	if cfg.Gateways == nil {
		return nil
	}
	key, err := cfg.Gateways.ReadKey()
	if err != nil {
		return err
	}
	e.gate = &announce.Gate{Log: log}
	if e.l2 != nil {
		e.gate.L2 = e.l2
	}
	if e.speaker != nil {
		e.gate.BGP = e.speaker
	}
	if cfg.Gateways.Mode == gateways.ModeActiveActive {
		floating := map[netip.Addr]bool{}
		for _, a := range cfg.floatingMasquerade() {
			floating[a] = true
		}
		e.gate.Shared = func(a netip.Addr) bool { return !floating[a] }
	}
	if e.statesync, err = newStateSync(cfg, reg, log); err != nil {
		return err
	}
	opts := gateways.Options{Key: key, Log: log, OnChange: e.gate.Held, OnReady: e.gate.Ready, OnStandby: e.gate.Standby}
	e.statesync.hook(&opts)
	h := newMidstreamHomes(cfg, homes, log)
	if err := h.register(reg); err != nil {
		return fmt.Errorf("midstream: %w", err)
	}
	h.hook(&opts)
	// The Service routes every gateway announces in active-active mode
	// wait for the same ready gate as the addresses.
	e.gate.SharedWaits = opts.Ready != nil
	s, err := gateways.New(*cfg.Gateways, opts)
	if err != nil {
		return err
	}
	tracker, err := gateways.NewTracker(*cfg.Gateways, gateways.TrackOptions{Fault: s.SetFault, Log: log, Towards: cfg.trackTowards()})
	if err != nil {
		_ = s.Close()
		return err
	}
	e.gateways = s
	if tracker != nil {
		// A link down at the start counts before anything is taken.
		s.SetFault(tracker.Fault())
		e.stopTracker = goUntilStopped(tracker.Run)
	}
	e.homes = h
	if h != nil {
		e.stopHomes = goUntilStopped(h.run)
	}
	if e.statesync != nil {
		if err := e.statesync.s.Attach(s); err != nil {
			return err
		}
	}
	if err := s.Register(reg); err != nil {
		return fmt.Errorf("gateways: %w", err)
	}
	return nil
}

// trackTowards are the addresses whose links are tracked besides
// track_interfaces: by default (track_interfaces not given), the BGP
// peers'.
func (c *Config) trackTowards() []netip.Addr {
	var out []netip.Addr
	if c.trackDefault && c.BGP != nil {
		for _, p := range c.BGP.Peers {
			if a, err := netip.ParseAddr(p.Address); err == nil {
				out = append(out, a)
			}
		}
	}
	return out
}

// tracksLinks tells whether the gateway set tracks links (the Tracker).
func (c *Config) tracksLinks() bool {
	return c.Gateways != nil && (len(c.Gateways.TrackInterfaces) > 0 || len(c.trackTowards()) > 0)
}

// goUntilStopped runs fn in a goroutine of its own until stop cancels its
// context; stop returns once fn has.
func goUntilStopped(fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx) }()
	return func() { cancel(); <-done }
}

// announceThroughGateways puts the gateway set between the coordinator and
// the announcers (startGateways).
func (e *edge) announceThroughGateways() {
	if e.gateways == nil {
		return
	}
	e.coord.L2 = e.gateways
	if e.speaker != nil {
		e.coord.BGP = e.gate.Routes()
	}
}

// gatewaysView is GET /api/v1/gateways: the set's status, in
// active-active mode what the map of homes holds, and with the shorter
// wait while a peer is dead the wait in force.
func (e *edge) gatewaysView() any {
	return struct {
		gateways.Status
		MidstreamHomes   *homesView `json:"midstreamHomes,omitempty"`
		MidstreamTCPWait *waitView  `json:"midstreamTCPWait,omitempty"`
	}{e.gateways.Status(), e.homes.view(), e.homes.waitView()}
}

// gatewaysAPI is the appliance's Gateways option: nil without [gateways].
func (e *edge) gatewaysAPI() func() any {
	if e.gateways == nil {
		return nil
	}
	return e.gatewaysView
}

// heldByPeers maps the addresses the other gateways of the set hold to
// their names; nil without [gateways].
func (e *edge) heldByPeers() map[netip.Addr]string {
	if e.gateways == nil {
		return nil
	}
	out := map[netip.Addr]string{}
	for _, p := range e.gateways.Status().Peers {
		if p.State != "alive" {
			continue
		}
		for _, a := range p.Holds {
			out[a] = p.Name
		}
	}
	return out
}
