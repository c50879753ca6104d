package main

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/gateways"
)

// startGateways joins the gateway set of [gateways]: the L2 announcer then
// answers only for the addresses this gateway owns (the Set stands between
// the announce coordinator and the announcer).
func (e *edge) startGateways(cfg *Config, reg prometheus.Registerer, log *slog.Logger) error {
	if cfg.Gateways == nil {
		return nil
	}
	key, err := cfg.Gateways.ReadKey()
	if err != nil {
		return err
	}
	opts := gateways.Options{Key: key, Log: log}
	if e.l2 != nil {
		opts.OnChange = e.l2.Set
	}
	if e.statesync, err = newStateSync(cfg, reg, log); err != nil {
		return err
	}
	e.statesync.hook(&opts)
	s, err := gateways.New(*cfg.Gateways, opts)
	if err != nil {
		return err
	}
	e.gateways = s
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

// gatewaysView is GET /api/v1/gateways.
func (e *edge) gatewaysView() any { return e.gateways.Status() }

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
