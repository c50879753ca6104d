package main

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/ruleset"
)

// The map of homes holds the one dead peer's addresses this gateway holds:
// none while every peer lives, two are dead, or the dead one's addresses
// are held elsewhere; a peer not heard since the start counts as dead (the
// set decides whether its addresses are held here). The writer writes
// what changed, and writes again after a failed write.
func TestMidstreamHomesFollowTheSet(t *testing.T) {
	a, c := netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("198.18.3.3")
	pools := map[string][]netip.Addr{"gw-a": {a}, "gw-c": {c}}
	h := &midstreamHomes{cfg: ruleset.Config{PeerMasquerade: [][]netip.Addr{{a}, {c}}}, pools: pools,
		log: slog.New(slog.DiscardHandler), alive: map[string]bool{}, held: map[netip.Addr]bool{}, toldDead: map[string]bool{}, wake: make(chan struct{}, 1),
		addrs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})}
	var told []string // the set's own callbacks still run
	opts := gateways.Options{
		OnPeer:   func(peer string, alive bool, _ uint64) { told = append(told, peer) },
		OnChange: func(held []netip.Addr) { told = append(told, "held") },
	}
	h.hook(&opts)
	want := func(step string, addrs ...netip.Addr) {
		t.Helper()
		_, els := h.elements()
		var got []netip.Addr
		for _, e := range els {
			got = append(got, e.To.Addr())
		}
		if !slices.Equal(got, addrs) {
			t.Errorf("%s: the map holds %v, want %v", step, got, addrs)
		}
	}
	want("at the start, nobody heard")
	opts.OnPeer("gw-c", true, 1)
	want("gw-a not heard, its address not held here")
	opts.OnChange([]netip.Addr{a, netip.MustParseAddr("198.18.3.2")})
	want("gw-a not heard, its address held here", a)
	opts.OnPeer("gw-a", true, 1)
	want("both alive")
	opts.OnPeer("gw-a", false, 1)
	want("gw-a dead", a)
	opts.OnPeer("gw-c", false, 1)
	opts.OnChange([]netip.Addr{a, c})
	want("two dead, both their addresses held here")
	opts.OnPeer("gw-c", true, 2)
	opts.OnChange([]netip.Addr{a})
	want("gw-c back", a)
	opts.OnChange(nil)
	want("gw-a's address released")
	if len(told) != 9 {
		t.Errorf("the set's own callbacks ran %d times (%v), want 9", len(told), told)
	}
	opts.OnPeer("gw-a", false, 1)

	// The writer: what changed, once; again after a failure.
	writes := make(chan []ruleset.Element, 8)
	fail := true
	h.write = func(els []ruleset.Element) error {
		writes <- els
		if fail {
			fail = false
			return errors.New("refused")
		}
		return nil
	}
	select {
	case <-h.wake: // the steps above poked it; the writer starts from what holds now
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	next := func(step string, n int) {
		t.Helper()
		select {
		case els := <-writes:
			if len(els) != n {
				t.Errorf("%s: wrote %d elements, want %d", step, len(els), n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing written", step)
		}
	}
	opts.OnChange([]netip.Addr{a})
	next("held again (refused)", 1)
	next("written again after the refusal", 1)
	waitGauge(t, h, 1)
	opts.OnChange([]netip.Addr{a}) // nothing changed: no write
	opts.OnPeer("gw-a", true, 2)
	next("gw-a back", 0)
	waitGauge(t, h, 0)
	select {
	case els := <-writes:
		t.Errorf("wrote %v more, want nothing written for what did not change", els)
	default:
	}
}

// With state sync the map holds every address of the dead peer's pool,
// held here or not (the sync carries a pick-up's entry to the holder);
// the view tells which are held here, as the holdings change.
func TestMidstreamHomesWithStateSyncHoldTheWholePool(t *testing.T) {
	a1, a2, c := netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("198.18.3.11"), netip.MustParseAddr("198.18.3.3")
	h := &midstreamHomes{cfg: ruleset.Config{PeerMasquerade: [][]netip.Addr{{a1, a2}, {c}}},
		pools: map[string][]netip.Addr{"gw-a": {a1, a2}, "gw-c": {c}}, synced: true,
		log: slog.New(slog.DiscardHandler), alive: map[string]bool{}, held: map[netip.Addr]bool{}, toldDead: map[string]bool{}, wake: make(chan struct{}, 1),
		addrs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})}
	var opts gateways.Options
	h.hook(&opts)
	opts.OnPeer("gw-a", true, 1)
	opts.OnPeer("gw-c", true, 1)
	if _, els := h.elements(); len(els) != 0 {
		t.Fatalf("every peer alive: the map holds %v, want nothing", els)
	}
	opts.OnPeer("gw-a", false, 1)
	opts.OnChange([]netip.Addr{a2})
	dead, els := h.elements()
	got := map[netip.Addr]int{}
	for _, e := range els {
		got[e.To.Addr()]++
	}
	if dead != "gw-a" || len(els) != 2 || got[a1] != 1 || got[a2] != 1 {
		t.Fatalf("gw-a dead, one of its two addresses held here: the map holds %v (dead %q), want a bucket for each of %v", els, dead, []netip.Addr{a1, a2})
	}
	writes := make(chan []ruleset.Element, 8)
	h.write = func(els []ruleset.Element) error { writes <- els; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-writes:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing written")
	}
	waitGauge(t, h, 2)
	if v := h.view(); v.Dead != "gw-a" || !slices.Equal(v.Addresses, []netip.Addr{a1, a2}) || !slices.Equal(v.Held, []netip.Addr{a2}) {
		t.Errorf("the view: %+v, want gw-a's %v, %v held here", *v, []netip.Addr{a1, a2}, a2)
	}
	opts.OnChange([]netip.Addr{a1, a2})
	if v := h.view(); !slices.Equal(v.Held, []netip.Addr{a1, a2}) {
		t.Errorf("the view after taking %v: held %v, want both", a1, v.Held)
	}
}

// waitGauge waits until the homes' gauge reads want (it is set after the
// write returned).
func waitGauge(t *testing.T, h *midstreamHomes, want float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(h.addrs) != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nftgate_midstream_homes_addresses = %v, want %v", testutil.ToFloat64(h.addrs), want)
		}
	}
}

// The flag of a dead peer is written while a peer the set told dead has
// not come back (a peer not heard since the start is not dead for it), in
// either mode, with the map of homes or without it; the gauge and the view
// tell the wait in force.
func TestMidstreamPeerDeadFlagFollowsTheSet(t *testing.T) {
	for _, homes := range []bool{false, true} {
		cfg := ruleset.Config{DropMidstreamTCP: true, MidstreamWait: 10 * time.Second, MidstreamWaitPeerDead: 500 * time.Millisecond}
		a, c := netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("198.18.3.3")
		if homes {
			cfg.PeerMasquerade = [][]netip.Addr{{a}, {c}}
		}
		h := &midstreamHomes{cfg: cfg, pools: map[string][]netip.Addr{"gw-a": {a}, "gw-c": {c}}, synced: true,
			log: slog.New(slog.DiscardHandler), alive: map[string]bool{}, held: map[netip.Addr]bool{}, toldDead: map[string]bool{}, wake: make(chan struct{}, 1),
			addrs: newHomesGauge(), wait: newWaitGauge(cfg.MidstreamWait)}
		if (h.view() != nil) != homes {
			t.Errorf("homes %v: view of the map %+v", homes, h.view())
		}
		var opts gateways.Options
		h.hook(&opts)
		flag := func(step string, want bool) {
			t.Helper()
			dead, els := h.elements()
			_, got := splitMidstream(els)
			if got != want {
				t.Errorf("homes %v, %s: flag written %v, want %v (%v)", homes, step, got, want, els)
			}
			if homes && step == "gw-a dead" && dead != "gw-a" {
				t.Errorf("homes %v, %s: the map's dead peer %q, want gw-a", homes, step, dead)
			}
			if v := h.waitView(); (v.Wait == "500ms") != want || (len(v.PeersDead) > 0) != want {
				t.Errorf("homes %v, %s: the view %+v", homes, step, *v)
			}
		}
		flag("at the start, nobody heard", false)
		opts.OnPeer("gw-a", true, 1)
		opts.OnPeer("gw-c", true, 1)
		flag("both alive", false)
		opts.OnPeer("gw-a", false, 1)
		flag("gw-a dead", true)
		opts.OnPeer("gw-c", false, 1)
		flag("both dead", true)
		opts.OnPeer("gw-a", true, 2)
		flag("gw-c still dead", true)
		opts.OnPeer("gw-c", true, 2)
		flag("both back", false)

		writes := make(chan []ruleset.Element, 8)
		h.write = func(els []ruleset.Element) error { writes <- els; return nil }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { h.run(ctx); close(done) }()
		next := func(step string, want bool, wait float64) {
			t.Helper()
			select {
			case els := <-writes:
				if _, got := splitMidstream(els); got != want {
					t.Errorf("homes %v, %s: wrote %v, want the flag %v", homes, step, els, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("homes %v, %s: nothing written", homes, step)
			}
			for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(h.wait) != wait; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("homes %v, %s: nftgate_midstream_tcp_wait_seconds = %v, want %v", homes, step, testutil.ToFloat64(h.wait), wait)
				}
			}
		}
		h.poke()
		next("started", false, 10)
		opts.OnPeer("gw-c", false, 2)
		next("gw-c dead", true, 0.5)
		opts.OnPeer("gw-c", true, 3)
		next("gw-c back", false, 10)
		cancel()
		<-done
	}
}
