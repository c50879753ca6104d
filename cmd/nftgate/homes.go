package main

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/ruleset"
)

// midstreamHomes keeps the map of homes (ruleset.MapMidstreamHomes) of an
// active-active set: while exactly one peer is dead, a connection picked
// up here in mid-stream (at once, or given up after the wait for a replica
// that never came: most likely that peer's) is masqueraded to the address
// of the dead peer's pool its client hashes to, and carries on wherever
// its gateway kept the client's port. Without state sync only where this
// gateway holds that address (the replies to it come here); with it,
// wherever the address is held, since the sync carries the picked-up
// connection's entry to the holder (whose rules drop the endpoint's
// answers until it is there: ruleset.ChainStrayReplies). See
// docs/design/gateways.md, "A connection given up in active/active".
type midstreamHomes struct {
	cfg   ruleset.Config
	pools map[string][]netip.Addr // each peer's home pool, by name
	// synced: with state sync, every address of the dead pool, held
	// here or not.
	synced bool
	write  func([]ruleset.Element) error
	log    *slog.Logger
	// addrs is how many of the dead peer's addresses the map holds.
	addrs prometheus.Gauge

	mu sync.Mutex
	// alive are the peers the set last told alive; the others are dead
	// (or not heard since the start: their addresses are held here only
	// if the set decided so).
	alive map[string]bool
	held  map[netip.Addr]bool
	wake  chan struct{}
	// shown is what the map holds, as last written.
	shown homesView
}

// homesView is what the map of homes holds, for GET /api/v1/gateways:
// the dead peer and its addresses that connections picked up here are
// masqueraded to (none: to this gateway's own).
type homesView struct {
	Dead      string       `json:"dead,omitempty"`
	Addresses []netip.Addr `json:"addresses"`
	// Held are those of Addresses this gateway holds now (the others
	// are held by a peer, which the state sync tells of each connection
	// picked up here).
	Held []netip.Addr `json:"held"`
}

// view is what the map holds; nil without the map.
func (h *midstreamHomes) view() *homesView {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.shown
	v.Addresses = append([]netip.Addr{}, v.Addresses...) // a copy; [] rather than null
	v.Held = []netip.Addr{}
	for _, a := range v.Addresses {
		if h.held[a] {
			v.Held = append(v.Held, a)
		}
	}
	return &v
}

// newMidstreamHomes is nil unless the ruleset has the map.
func newMidstreamHomes(cfg *Config, write func([]ruleset.Element) error, log *slog.Logger) *midstreamHomes {
	rcfg := cfg.ruleset()
	if !ruleset.HasMidstreamHomes(&rcfg) {
		return nil
	}
	pools := map[string][]netip.Addr{}
	for _, p := range cfg.Gateways.Peers {
		pools[p.Name] = cfg.Gateways.Homes[p.Name]
	}
	synced := cfg.Gateways.StateSync != nil && *cfg.Gateways.StateSync
	return &midstreamHomes{cfg: rcfg, pools: pools, synced: synced, write: write, log: log,
		alive: map[string]bool{}, held: map[netip.Addr]bool{}, wake: make(chan struct{}, 1),
		addrs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftgate_midstream_homes_addresses",
			Help: "Masquerade addresses of the one dead peer gateway that this gateway masquerades connections picked up in mid-stream to: those it holds, or with state sync all (0 unless exactly one peer is dead)."})}
}

// register registers the homes' gauge.
func (h *midstreamHomes) register(reg prometheus.Registerer) error {
	if h == nil {
		return nil
	}
	return reg.Register(h.addrs)
}

// hook has the gateway set tell the homes of its peers' deaths and
// returns and of the addresses this gateway holds, besides what opts
// already does with them.
func (h *midstreamHomes) hook(opts *gateways.Options) {
	if h == nil {
		return
	}
	onPeer, onChange := opts.OnPeer, opts.OnChange
	opts.OnPeer = func(peer string, alive bool, incarnation uint64) {
		if onPeer != nil {
			onPeer(peer, alive, incarnation)
		}
		h.mu.Lock()
		if alive {
			h.alive[peer] = true
		} else {
			delete(h.alive, peer)
		}
		h.mu.Unlock()
		h.poke()
	}
	opts.OnChange = func(held []netip.Addr) {
		if onChange != nil {
			onChange(held)
		}
		h.mu.Lock()
		clear(h.held)
		for _, a := range held {
			h.held[a] = true
		}
		h.mu.Unlock()
		h.poke()
	}
}

func (h *midstreamHomes) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// elements are the map's elements now: those of the one dead peer's pool
// (that this gateway holds, without state sync); none unless exactly one
// peer is dead.
func (h *midstreamHomes) elements() (dead string, els []ruleset.Element) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for n := range h.pools {
		if !h.alive[n] {
			if dead != "" {
				return "", nil // two dead: whose a connection was is not known
			}
			dead = n
		}
	}
	if dead == "" {
		return "", nil
	}
	held := func(a netip.Addr) bool { return h.synced || h.held[a] }
	for _, f := range ruleset.Families {
		els = append(els, ruleset.MidstreamHomeElements(&h.cfg, f, h.pools[dead], held)...)
	}
	return dead, els
}

// homesRetry is how long after a failed write the map is written again.
const homesRetry = time.Second

// run writes the map whenever what it should hold changes, until ctx
// ends. The gateway set's callbacks hold its lock, so the write (which
// may wait for a sync in progress) is made here.
func (h *midstreamHomes) run(ctx context.Context) {
	if h == nil {
		return
	}
	var last []ruleset.Element
	written := false
	retry := time.NewTimer(0)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-retry.C:
		}
		dead, els := h.elements()
		if written && slices.Equal(els, last) {
			continue
		}
		if err := h.write(els); err != nil {
			h.log.Warn("midstream: the map of the dead gateway's masquerade addresses was not written; trying again", "error", err)
			retry.Reset(homesRetry)
			continue
		}
		quiet := len(els) == 0 && len(last) == 0
		last, written = els, true
		if quiet {
			continue
		}
		var addrs []netip.Addr
		for _, e := range els {
			if !slices.Contains(addrs, e.To.Addr()) {
				addrs = append(addrs, e.To.Addr())
			}
		}
		h.addrs.Set(float64(len(addrs)))
		h.mu.Lock()
		h.shown = homesView{Addresses: addrs}
		if len(addrs) > 0 {
			h.shown.Dead = dead
		}
		h.mu.Unlock()
		if len(els) > 0 {
			h.log.Info("midstream: connections picked up here in mid-stream are masqueraded to the dead gateway's addresses", "dead", dead, "addresses", addrs, "all", h.synced)
		} else {
			h.log.Info("midstream: connections picked up here in mid-stream are masqueraded to this gateway's own addresses")
		}
	}
}
