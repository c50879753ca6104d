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
//
// It keeps too the flag of a dead peer (ruleset.SetMidstreamPeerDead,
// with ruleset.Config.MidstreamShortens, in either mode): while a peer the
// set heard alive is dead, a connection waits for its replica
// midstream_tcp_wait_peer_dead rather than midstream_tcp_wait.
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
	// wait is the wait in force (ruleset.Config.MidstreamWait, or
	// MidstreamWaitPeerDead while the flag is written), in seconds.
	wait prometheus.Gauge

	mu sync.Mutex
	// alive are the peers the set last told alive; the others are dead
	// (or not heard since the start: their addresses are held here only
	// if the set decided so).
	alive map[string]bool
	held  map[netip.Addr]bool
	// toldDead are the peers the set told dead after they were alive
	// (the flag's peers; a peer not heard since the start is not one).
	toldDead map[string]bool
	wake     chan struct{}
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
	if h == nil || !ruleset.HasMidstreamHomes(&h.cfg) {
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

// waitView is the wait in force, for GET /api/v1/gateways: the shorter
// one while a peer told dead has not come back.
type waitView struct {
	Wait      string   `json:"wait"`
	PeersDead []string `json:"peersDead"`
}

// waitView is the wait in force; nil without the shorter wait.
func (h *midstreamHomes) waitView() *waitView {
	if h == nil || !h.cfg.MidstreamShortens() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v := &waitView{Wait: h.cfg.MidstreamWait.String(), PeersDead: []string{}}
	for p := range h.toldDead {
		v.PeersDead = append(v.PeersDead, p)
	}
	slices.Sort(v.PeersDead)
	if len(v.PeersDead) > 0 {
		v.Wait = h.cfg.MidstreamWaitPeerDead.String()
	}
	return v
}

// newMidstreamHomes is nil unless the ruleset has the map or the flag.
func newMidstreamHomes(cfg *Config, write func([]ruleset.Element) error, log *slog.Logger) *midstreamHomes {
	rcfg := cfg.ruleset()
	if !ruleset.HasMidstreamHomes(&rcfg) && !rcfg.MidstreamShortens() {
		return nil
	}
	pools := map[string][]netip.Addr{}
	for _, p := range cfg.Gateways.Peers {
		pools[p.Name] = cfg.Gateways.Homes[p.Name]
	}
	synced := cfg.Gateways.StateSync != nil && *cfg.Gateways.StateSync
	return &midstreamHomes{cfg: rcfg, pools: pools, synced: synced, write: write, log: log,
		alive: map[string]bool{}, held: map[netip.Addr]bool{}, toldDead: map[string]bool{}, wake: make(chan struct{}, 1),
		addrs: newHomesGauge(), wait: newWaitGauge(rcfg.MidstreamWait)}
}

func newHomesGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftgate_midstream_homes_addresses",
		Help: "Masquerade addresses of the one dead peer gateway that this gateway masquerades connections picked up in mid-stream to: those it holds, or with state sync all (0 unless exactly one peer is dead)."})
}

// newWaitGauge starts at the wait while every peer lives.
func newWaitGauge(wait time.Duration) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftgate_midstream_tcp_wait_seconds",
		Help: "How long a TCP connection picked up in mid-stream waits for its replica before it is given up: midstream_tcp_wait, or midstream_tcp_wait_peer_dead while a peer gateway is dead."})
	g.Set(wait.Seconds())
	return g
}

// register registers the gauges of what is written (the map, the flag).
func (h *midstreamHomes) register(reg prometheus.Registerer) error {
	if h == nil {
		return nil
	}
	if ruleset.HasMidstreamHomes(&h.cfg) {
		if err := reg.Register(h.addrs); err != nil {
			return err
		}
	}
	if h.cfg.MidstreamShortens() {
		return reg.Register(h.wait)
	}
	return nil
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
			delete(h.toldDead, peer)
		} else {
			delete(h.alive, peer)
			h.toldDead[peer] = true // the set tells only a live peer's death
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

// elements are what the map and the flag hold now: the map, those of the
// one dead peer's pool (that this gateway holds, without state sync), none
// unless exactly one peer is dead; the flag, its element while a peer told
// dead has not come back.
func (h *midstreamHomes) elements() (dead string, els []ruleset.Element) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfg.MidstreamShortens() && len(h.toldDead) > 0 {
		els = append(els, ruleset.MidstreamPeerDeadElement)
	}
	if !ruleset.HasMidstreamHomes(&h.cfg) {
		return "", els
	}
	for n := range h.pools {
		if !h.alive[n] {
			if dead != "" {
				return "", els // two dead: whose a connection was is not known (the flag alone)
			}
			dead = n
		}
	}
	if dead == "" {
		return "", els
	}
	held := func(a netip.Addr) bool { return h.synced || h.held[a] }
	for _, f := range ruleset.Families {
		els = append(els, ruleset.MidstreamHomeElements(&h.cfg, f, h.pools[dead], held)...)
	}
	return dead, els
}

// splitMidstream parts what elements gives: the map's elements, and whether the
// flag is written.
func splitMidstream(els []ruleset.Element) (homes []ruleset.Element, flag bool) {
	for _, e := range els {
		if e.Map == ruleset.SetMidstreamPeerDead {
			flag = true
		} else {
			homes = append(homes, e)
		}
	}
	return homes, flag
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
			h.log.Warn("midstream: the dead gateway's elements (masquerade addresses, shorter wait) were not written; trying again", "error", err)
			retry.Reset(homesRetry)
			continue
		}
		homes, flag := splitMidstream(els)
		lastHomes, lastFlag := splitMidstream(last)
		first := !written
		last, written = els, true
		if h.cfg.MidstreamShortens() && flag != lastFlag {
			wait := h.cfg.MidstreamWait
			if flag {
				wait = h.cfg.MidstreamWaitPeerDead
				h.log.Info("midstream: a peer gateway is dead: connections picked up in mid-stream wait less for their replicas", "wait", wait)
			} else {
				h.log.Info("midstream: every peer gateway lives again: connections picked up in mid-stream wait as long as before for their replicas", "wait", wait)
			}
			h.wait.Set(wait.Seconds())
		}
		if !ruleset.HasMidstreamHomes(&h.cfg) || (first && len(homes) == 0) || (!first && slices.Equal(homes, lastHomes)) {
			continue
		}
		var addrs []netip.Addr
		for _, e := range homes {
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
		if len(homes) > 0 {
			h.log.Info("midstream: connections picked up here in mid-stream are masqueraded to the dead gateway's addresses", "dead", dead, "addresses", addrs, "all", h.synced)
		} else {
			h.log.Info("midstream: connections picked up here in mid-stream are masqueraded to this gateway's own addresses")
		}
	}
}
