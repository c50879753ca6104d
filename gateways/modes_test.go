package gateways

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"
)

// kill makes name silent (both ways) and lets the dead time pass.
func (s *sim) kill(name string) {
	for n := range s.views {
		s.cut[name][n], s.cut[n][name] = true, true
	}
	for range 10 { // the others keep hearing each other
		s.now = s.now.Add(100 * time.Millisecond)
		s.round()
	}
}

// restart brings name back as a new incarnation that serves as and is not
// ready yet.
func (s *sim) restart(name string, as []netip.Addr, inc uint64) *view {
	old := s.views[name]
	var peers []string
	for p := range old.peers {
		peers = append(peers, p)
	}
	v := newView(name, peers, inc, old.dead, s.now.Add(time.Second))
	v.activeBackup, v.home, v.ready = old.activeBackup, old.home, false
	v.setServed(as)
	s.views[name] = v
	for n := range s.views {
		s.cut[name][n], s.cut[n][name] = false, false
	}
	return v
}

func (s *sim) heldBy(name string) []netip.Addr { return s.views[name].held() }

// activeBackupSim is gw-a and gw-b, active/backup, both serving n Service
// addresses and the one floating masquerade address f, settled: gw-a (first
// by name) holds all of as.
func activeBackupSim(t *testing.T, n int) (s *sim, f netip.Addr, as []netip.Addr) {
	t.Helper()
	s = newSim(t, "gw-a", "gw-b")
	s.setActiveBackup()
	f = netip.MustParseAddr("198.51.100.1")
	as = append(addrs(n), f)
	slices.SortFunc(as, netip.Addr.Compare)
	for _, v := range s.views {
		v.setServed(as)
	}
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) || len(s.heldBy("gw-b")) != 0 {
		t.Fatalf("active-backup: a holds %v, b %v; want a (first by name) all", got, s.heldBy("gw-b"))
	}
	return s, f, as
}

func (s *sim) setActiveBackup() {
	for _, v := range s.views {
		v.activeBackup = true
	}
}

func TestActiveBackupOneGatewayHoldsEverything(t *testing.T) {
	s, _, as := activeBackupSim(t, 20)

	// The active dies: the backup takes everything.
	s.kill("gw-a")
	if got := s.heldBy("gw-b"); !slices.Equal(got, as) {
		t.Fatalf("after a's death b holds %v, want all", got)
	}

	// a returns, not ready: it takes nothing from b, however long.
	a := s.restart("gw-a", as, 77)
	s.settle()
	s.now = s.now.Add(10 * time.Second)
	s.settle()
	if got := s.heldBy("gw-a"); len(got) != 0 {
		t.Fatalf("a returned, not ready, and holds %v", got)
	}
	if got := s.heldBy("gw-b"); !slices.Equal(got, as) {
		t.Fatalf("while a is not ready b holds %v, want all", got)
	}
	// Ready: everything comes back to a, never two holders (deliver
	// checks every step).
	a.setReady()
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) || len(s.heldBy("gw-b")) != 0 {
		t.Fatalf("a ready: a holds %v, b %v; want a all", got, s.heldBy("gw-b"))
	}
}

// Two gateways that start together, neither ready: the first by name takes
// everything and keeps it while the other gets ready first.
func TestActiveBackupStartNotReadyDoesNotFlap(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	as := addrs(8)
	for _, v := range s.views {
		v.activeBackup, v.ready = true, false
		v.setServed(as)
	}
	s.now = s.now.Add(2 * time.Second)
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) {
		t.Fatalf("none ready: a holds %v, want all", got)
	}
	s.views["gw-b"].setReady()
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) || s.views["gw-b"].released+s.views["gw-a"].released != 0 {
		t.Fatalf("b ready first: a holds %v (released a %d, b %d), want all kept", got, s.views["gw-a"].released, s.views["gw-b"].released)
	}
}

func TestActiveActiveMasqueradeAddressesStayHomeMoveAndReturn(t *testing.T) {
	names := []string{"gw-a", "gw-b", "gw-c"}
	s := newSim(t, names...)
	home := map[netip.Addr]string{}
	own := map[string][]netip.Addr{}
	var all []netip.Addr
	for i, n := range names {
		for j := range 6 {
			m := netip.AddrFrom4([4]byte{203, 0, 113, byte(16*i + j + 1)})
			home[m], own[n] = n, append(own[n], m)
			all = append(all, m)
		}
	}
	svc := addrs(12)
	all = append(all, svc...)
	for _, v := range s.views {
		v.home = home
		v.setServed(all)
	}
	s.settle()
	dead := ""
	holderOf := func() map[netip.Addr]string {
		out := map[netip.Addr]string{}
		for a, h := range s.holders() {
			h = slices.DeleteFunc(h, func(n string) bool { return n == dead })
			if len(h) != 1 {
				t.Fatalf("%v held by %v", a, h)
			}
			out[a] = h[0]
		}
		return out
	}
	h := holderOf()
	for m, n := range home {
		if h[m] != n {
			t.Errorf("%v, %s's masquerade address, held by %q", m, n, h[m])
		}
	}
	spread := map[string]int{}
	for _, a := range svc {
		spread[h[a]]++
	}
	if len(spread) < 2 {
		t.Errorf("the Service addresses are not spread: %v", spread)
	}

	s.kill("gw-a")
	dead = "gw-a"
	h = holderOf()
	moved := map[string]int{}
	for _, m := range own["gw-a"] {
		if h[m] == "" || h[m] == "gw-a" {
			t.Errorf("after a's death its %v held by %q", m, h[m])
		}
		moved[h[m]]++
	}
	t.Logf("gw-a's masquerade addresses taken over by %v", moved)
	for _, n := range []string{"gw-b", "gw-c"} {
		for _, m := range own[n] {
			if h[m] != n {
				t.Errorf("after a's death %s's %v held by %q", n, m, h[m])
			}
		}
	}

	a := s.restart("gw-a", all, 55)
	dead = ""
	s.settle()
	h = holderOf()
	for _, m := range own["gw-a"] {
		if h[m] == "gw-a" {
			t.Errorf("a returned, not ready, and took its %v back", m)
		}
	}
	a.setReady()
	s.settle()
	h = holderOf()
	for m, n := range home {
		if h[m] != n {
			t.Errorf("a ready: %v, %s's, held by %q", m, n, h[m])
		}
	}
}

// readyPair starts, on clk, gw-b alone until it holds the addresses, then
// gw-a with a Ready that is never closed, ready_timeout timeout and
// ReadyHold hold (nil: none), and waits until they hear each other. gw-a
// sorts first: ready, it takes everything (active-backup).
func readyPair(t *testing.T, clk *clocktesting.FakeClock, timeout time.Duration, hold func() bool) (a *Set, ha, hb *held, as []netip.Addr, started time.Time) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	ha, hb = &held{}, &held{}
	lnA, lnB := listen(t), listen(t)
	b, err := New(Config{Name: "gw-b", Listen: lnB.Addr().String(), KeyFile: "k", StartupWait: time.Millisecond,
		Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}},
		Options{Key: testKey, OnChange: hb.set, Listener: lnB, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	as = addrs(4)
	b.Set(as)
	wait(t, func() error {
		clk.Step(100 * time.Millisecond) // b alone, after the startup wait, takes all
		return disjointCover(as, hb.get(), nil)
	})

	ready := make(chan struct{})
	t.Cleanup(func() { close(ready) })
	started = clk.Now()
	a, err = New(Config{Name: "gw-a", Listen: lnA.Addr().String(), KeyFile: "k", ReadyTimeout: timeout,
		Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{lnB.Addr().String()}}}},
		Options{Key: testKey, OnChange: ha.set, Listener: lnA, Clock: clk, Ready: ready, ReadyHold: hold})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	a.Set(as)
	wait(t, func() error {
		clk.Step(100 * time.Millisecond)
		if st := b.Status(); st.Peers[0].State != "alive" {
			return fmt.Errorf("b sees a %s", st.Peers[0].State)
		}
		if st := a.Status(); st.Peers[0].State != "alive" || !st.Peers[0].Ready || st.Ready {
			return fmt.Errorf("a: %+v", st)
		}
		return nil
	})
	return a, ha, hb, as, started
}

// holdsNothingUntil steps clk 100 ms at a time until until after started,
// each tick once a has heard b at that time (and so decided then), and
// fails t if a holds anything meanwhile.
func holdsNothingUntil(t *testing.T, clk *clocktesting.FakeClock, a *Set, ha *held, started time.Time, until time.Duration) {
	t.Helper()
	for clk.Since(started) < until {
		clk.Step(100 * time.Millisecond)
		wait(t, func() error {
			if st := a.Status(); !st.Peers[0].LastHeartbeat.Equal(clk.Now()) {
				return fmt.Errorf("a last heard b at %v, now is %v", st.Peers[0].LastHeartbeat, clk.Now())
			}
			return nil
		})
		if got := ha.get(); len(got) != 0 {
			t.Fatalf("a, not ready, holds %v after %v: %+v", got, clk.Since(started), a.Status())
		}
	}
}

// takesAll steps clk until a, ready, holds every address.
func takesAll(t *testing.T, clk *clocktesting.FakeClock, a *Set, ha *held, as []netip.Addr) {
	t.Helper()
	wait(t, func() error {
		clk.Step(100 * time.Millisecond)
		return disjointCover(as, ha.get(), nil)
	})
	if got := ha.get(); len(got) != len(as) || !a.Status().Ready {
		t.Fatalf("a holds %v, ready %v", got, a.Status().Ready)
	}
}

// The Set's ready gate, on the injected clock: a gateway whose Ready is not
// closed takes nothing from a live ready peer until ready_timeout, then
// everything (active-backup, it sorts first).
func TestSetReadyGateAndTimeout(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a, ha, hb, as, started := readyPair(t, clk, 10*time.Second, nil)
	holdsNothingUntil(t, clk, a, ha, started, 9900*time.Millisecond)
	if err := disjointCover(as, hb.get(), nil); err != nil {
		t.Fatalf("b while a is not ready: %v", err)
	}
	// The timeout: a counts as ready and, first by name, takes all.
	takesAll(t, clk, a, ha, as)
}

// Past ready_timeout, ReadyHold keeps the gate closed while it answers
// true (the flow state still arrives), and a takes everything once it
// answers false; or, held on, at ReadyHoldMax times ready_timeout.
func TestSetReadyHoldWaitsPastTheTimeout(t *testing.T) {
	const timeout = time.Second
	t.Run("until the hold ends", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		var holding atomic.Bool
		holding.Store(true)
		asked := atomic.Int32{}
		a, ha, _, as, started := readyPair(t, clk, timeout, func() bool { asked.Add(1); return holding.Load() })
		holdsNothingUntil(t, clk, a, ha, started, 3*timeout)
		if asked.Load() == 0 {
			t.Fatal("ReadyHold never asked")
		}
		holding.Store(false)
		takesAll(t, clk, a, ha, as)
		if d := clk.Since(started); d > 3*timeout+ReadyHoldEvery+500*time.Millisecond {
			t.Errorf("a took part %v after its start, want within %v of the hold's end", d, ReadyHoldEvery)
		}
	})
	t.Run("held to the bound", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		a, ha, _, as, started := readyPair(t, clk, timeout, func() bool { return true })
		holdsNothingUntil(t, clk, a, ha, started, ReadyHoldMax*timeout-200*time.Millisecond)
		takesAll(t, clk, a, ha, as)
	})
}

// Closing Ready is what lets a take over, long before the timeout.
func TestSetReadyChannelHandsOver(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	ha, hb := &held{}, &held{}
	lnA, lnB := listen(t), listen(t)
	b, err := New(Config{Name: "gw-b", Listen: lnB.Addr().String(), KeyFile: "k", StartupWait: time.Millisecond,
		Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}},
		Options{Key: testKey, OnChange: hb.set, Listener: lnB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	as := addrs(4)
	b.Set(as)
	wait(t, func() error { return disjointCover(as, hb.get(), nil) })
	ready := make(chan struct{})
	a, err := New(Config{Name: "gw-a", Listen: lnA.Addr().String(), KeyFile: "k", ReadyTimeout: 10 * time.Minute,
		Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{lnB.Addr().String()}}}},
		Options{Key: testKey, OnChange: ha.set, Listener: lnA, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	a.Set(as)
	wait(t, func() error {
		if st := a.Status(); st.Peers[0].State != "alive" || st.Serves != len(as) {
			return fmt.Errorf("a: %+v", st)
		}
		if st := b.Status(); st.Peers[0].State != "alive" {
			return fmt.Errorf("b: %+v", st)
		}
		return nil
	})
	if got := ha.get(); len(got) != 0 {
		t.Fatalf("a, not ready, holds %v", got)
	}
	close(ready)
	wait(t, func() error { return disjointCover(as, ha.get(), nil) })
	if got := hb.get(); len(got) != 0 {
		t.Fatalf("a ready: b still holds %v", got)
	}
}

// A gateway that becomes ready takes an address only once every live peer
// has acked a state in which it is ready: a peer still holding the older
// view (not ready) would take the same address on an ack of its own.
func TestReadyTakesOnlyAfterThePeersSawIt(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	a, b := s.views["gw-a"], s.views["gw-b"]
	s.setActiveBackup()
	a.ready = false
	base := addrs(2)
	for _, v := range s.views {
		v.setServed(base)
	}
	s.settle()
	if got := b.held(); len(got) != 2 {
		t.Fatalf("a not ready: b holds %v", got)
	}
	// A new address served by both at once; the states cross, then a
	// heartbeat of b's acks a's (messages by hand: no answers, no
	// decisions in between).
	x := netip.MustParseAddr("198.51.100.7")
	withX := append(slices.Clone(base), x)
	a.setServed(withX)
	b.setServed(withX)
	mA, mB := a.message("gw-b", true), b.message("gw-a", true)
	b.receive("gw-a", a.incarnation, mA, s.now)
	a.receive("gw-b", b.incarnation, mB, s.now)
	a.receive("gw-b", b.incarnation, b.message("gw-a", false), s.now)
	// a becomes ready and decides; then a heartbeat of a's (its ack of
	// b's state with x) reaches b before a's new state does, and b, which
	// still sees a not ready, decides.
	a.setReady()
	a.decide(s.now)
	b.receive("gw-a", a.incarnation, a.message("gw-b", false), s.now)
	b.decide(s.now)
	s.check()
	s.settle()
	if h := s.holders()[x]; len(h) != 1 {
		t.Fatalf("%v held by %v", x, h)
	}
}

// A draining active (leaving) hands every address, the Service addresses
// and F alike, to the backup by handover, never two holders; one that is
// left alone keeps what no other gateway can hold.
func TestActiveBackupLeavingHandsEverythingOver(t *testing.T) {
	s, f, as := activeBackupSim(t, 5)
	// The drain withdraws the Service addresses; a still serves F.
	a := s.views["gw-a"]
	a.setServed([]netip.Addr{f})
	a.setLeaving()
	s.settle()
	if got := s.heldBy("gw-b"); !slices.Equal(got, as) || len(s.heldBy("gw-a")) != 0 {
		t.Fatalf("a leaving: b holds %v, a %v; want b all", got, s.heldBy("gw-a"))
	}

	// b dies: a, leaving but alone, takes F back (its flows' replies).
	s.kill("gw-b")
	if got := s.heldBy("gw-a"); !slices.Equal(got, []netip.Addr{f}) {
		t.Fatalf("a leaving and alone holds %v, want F", got)
	}
}

// A faulty active (a tracked link down) hands everything to the fit
// backup by handover, never two holders, and takes it back once fit; a
// faulty gateway whose peer is faulty too, or leaving, keeps what it holds.
func TestActiveBackupFaultyHandsOverAndTakesBack(t *testing.T) {
	s, _, as := activeBackupSim(t, 5)
	a, b := s.views["gw-a"], s.views["gw-b"]
	if !a.setFaulty(true) || a.setFaulty(true) {
		t.Fatal("setFaulty(true) twice: want a change, then none")
	}
	if !a.standby() {
		t.Error("a faulty while b is fit: want standby")
	}
	s.settle()
	if got := s.heldBy("gw-b"); !slices.Equal(got, as) || len(s.heldBy("gw-a")) != 0 {
		t.Fatalf("a faulty: b holds %v, a %v; want b all", got, s.heldBy("gw-a"))
	}
	// a fit again: first by name, it takes everything back by handover.
	a.setFaulty(false)
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) || len(s.heldBy("gw-b")) != 0 {
		t.Fatalf("a fit again: a holds %v, b %v; want a all", got, s.heldBy("gw-b"))
	}
	// Both faulty (a switch that serves both): as if neither were, and
	// neither on standby.
	a.setFaulty(true)
	b.setFaulty(true)
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) || a.standby() || b.standby() {
		t.Fatalf("both faulty: a holds %v (want all), standby a %v b %v (want neither)", got, a.standby(), b.standby())
	}
	// A faulty gateway ranks before a leaving one.
	b.setFaulty(false)
	b.setLeaving()
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) {
		t.Fatalf("a faulty, b leaving: a holds %v, want all", got)
	}
	// Faulty and alone: it keeps (or takes) what no other can hold.
	a.setFaulty(true)
	s.kill("gw-b")
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) {
		t.Fatalf("a faulty and alone holds %v, want all", got)
	}
}

// The faulty gateway's fit state must be acked before it takes back: a
// peer that took an address on the faulty state, which crossed the fit
// one, never holds it at the same time.
func TestFitAgainTakesOnlyAfterThePeerSawIt(t *testing.T) {
	s, _, as := activeBackupSim(t, 3)
	a, b := s.views["gw-a"], s.views["gw-b"]
	// a goes faulty and releases; its state reaches b only after a is
	// fit again and has decided (messages by hand).
	a.setFaulty(true)
	a.decide(s.now)
	faultyMsg := a.message("gw-b", true)
	a.setFaulty(false)
	a.decide(s.now)
	if len(a.held()) != 0 {
		t.Fatalf("a fit again took %v before b acked its fit state", a.held())
	}
	b.receive("gw-a", a.incarnation, faultyMsg, s.now)
	b.decide(s.now)
	s.check()
	s.settle()
	if got := s.heldBy("gw-a"); !slices.Equal(got, as) || len(s.heldBy("gw-b")) != 0 {
		t.Fatalf("settled: a holds %v, b %v; want a all", got, s.heldBy("gw-b"))
	}
}
