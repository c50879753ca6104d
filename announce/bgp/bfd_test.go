package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// BIRD's side of BFD: a BFD protocol on every interface, at the interval
// and multiplier the speaker is given, and BFD on in both sessions, whose
// hold time is long enough that only BFD can notice a failure in the time
// the test allows.
const (
	bfdInterval   = 100 * time.Millisecond
	bfdMultiplier = 3
	bfdHoldTime   = 90 * time.Second
)

func bfdBirdConf() string {
	return birdConf(fmt.Sprintf("bfd on; hold time %d;", int(bfdHoldTime/time.Second))) + fmt.Sprintf(`
protocol bfd {
  interface "*" { min rx interval %d ms; min tx interval %d ms; multiplier %d; };
}
`, bfdInterval/time.Millisecond, bfdInterval/time.Millisecond, bfdMultiplier)
}

// Single-hop BFD with BIRD: the BFD sessions come up on both sides (the
// speaker's status and nftgate_bgp_bfd_up, BIRD's show bfd sessions), and
// when the link fails silently (the router drops every packet from and to
// the gateway, no interface goes down) BIRD withdraws the gateway's
// routes within BFD's detection time, long before the 90 s hold time.
func TestBFDWithBIRD(t *testing.T) {
	e, b, sp, prefixes := startBFDEdge(t)
	for _, protocol := range []string{"gw4", "gw6"} {
		out, err := b.Run("show protocols all " + protocol)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("/%d", int(bfdHoldTime/time.Second)); !strings.Contains(out, "Hold timer:") || !strings.Contains(out, want) {
			t.Fatalf("BIRD's %s: no hold timer of %v:\n%s", protocol, bfdHoldTime, out)
		}
	}
	gateways := []netip.Addr{gatewayGW4.Addr(), gatewayGW6.Addr()}
	if err := lab.EventuallyWithin(30*time.Second, func() error { return birdBFD(b, gateways, "Up") }); err != nil {
		t.Fatal(err)
	}
	if err := lab.EventuallyWithin(30*time.Second, func() error { return speakerBFD(sp, "up", 1) }); err != nil {
		t.Fatal(err)
	}

	// The silent failure: the router drops everything from and to the
	// gateway's addresses; both ends of the link stay up.
	drop := fmt.Sprintf(`table inet silent {
  chain in { type filter hook input priority 0; ip saddr %s drop; ip6 saddr %s drop; }
  chain out { type filter hook output priority 0; ip daddr %s drop; ip6 daddr %s drop; }
}`, gatewayGW4.Addr(), gatewayGW6.Addr(), gatewayGW4.Addr(), gatewayGW6.Addr())
	cmd := e.router.Command(t.Context(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(drop)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	// Well before the hold time: BFD detects the failure in interval x
	// multiplier (0.3 s here); the bound leaves room for a loaded machine.
	bound := bfdHoldTime / 6
	for _, p := range prefixes {
		b.WaitRoute(t, p, false, bound)
	}
	took := time.Since(start)
	t.Logf("BIRD withdrew the gateway's routes %v after the link failed (BFD detection time %v, hold time %v)",
		took, bfdInterval*bfdMultiplier, bfdHoldTime)
	if err := lab.EventuallyWithin(bound, func() error { return birdBFD(b, gateways, "Down") }); err != nil {
		t.Error(err)
	}
	if err := lab.EventuallyWithin(bound, func() error { return speakerBFD(sp, "down", 0) }); err != nil {
		t.Error(err)
	}
}

// bfdSpeakerConfig is speakerConfig with BFD on every session, at the
// interval and multiplier of BIRD's side (bfdBirdConf).
func bfdSpeakerConfig() Config {
	cfg := speakerConfig()
	for i := range cfg.Peers {
		cfg.Peers[i].HoldTime = bfdHoldTime
		cfg.Peers[i].BFD = true
		cfg.Peers[i].BFDInterval = bfdInterval
		cfg.Peers[i].BFDMultiplier = bfdMultiplier
	}
	return cfg
}

// A router starved of CPU for longer than the BFD window (BIRD frozen by
// SIGSTOP) makes the speaker's BFD expire and reset the sessions. Once
// the router runs again, the sessions and the routes are back within a
// few seconds: the speaker waits idle_hold_after_reset (default 3 s)
// after a reset, not GoBGP's own 30 s, and the router's error wait time
// is short (bird.Upstream sets 1 s, as the README tells operators to).
func TestBFDResetRecoversWithinSeconds(t *testing.T) {
	_, b, sp, prefixes := startBFDEdge(t)
	if err := lab.EventuallyWithin(30*time.Second, func() error { return speakerBFD(sp, "up", 1) }); err != nil {
		t.Fatal(err)
	}

	if err := b.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { _ = b.Thaw() })
	// The router is frozen until the speaker's BFD has reset every
	// session (interval x multiplier = 0.3 s after the freeze).
	err := lab.EventuallyWithin(30*time.Second, func() error {
		for _, p := range sp.Status().Peers {
			if p.State == StateEstablished {
				return fmt.Errorf("the session with %s is still established", p.Address)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	t.Logf("BIRD frozen for %v; the speaker's BFD reset the sessions", thawed.Sub(frozen))

	// The bound is the behaviour: a few seconds, where GoBGP's default
	// idle hold after a reset kept the sessions down for 30 s.
	const bound = 10 * time.Second
	err = lab.EventuallyWithin(bound, func() error {
		for _, p := range sp.Status().Peers {
			if p.State != StateEstablished || !p.Since.After(frozen) {
				return fmt.Errorf("the session with %s is %s (since %v), want established again", p.Address, p.State, p.Since)
			}
		}
		for i, protocol := range []string{"gw4", "gw6"} {
			if st, err := b.ProtocolState(protocol); err != nil || st != "Established" {
				return fmt.Errorf("BIRD's %s is %q (%v)", protocol, st, err)
			}
			if has, err := b.HasRoute(prefixes[i]); err != nil || !has {
				return fmt.Errorf("BIRD has no route to %s (%v)", prefixes[i], err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v after BIRD resumed: %v", bound, err)
	}
	t.Logf("sessions and routes back %v after BIRD resumed", time.Since(thawed))
	since := map[string]time.Time{}
	for _, p := range sp.Status().Peers {
		since[p.Address] = p.Since
	}
	// And they stay up: BFD comes up on both sides with these sessions
	// (a BFD left paired with the router's old BFD session expires and
	// resets them again).
	if err := lab.EventuallyWithin(bound, func() error { return speakerBFD(sp, "up", 1) }); err != nil {
		t.Fatal(err)
	}
	if err := lab.EventuallyWithin(bound, func() error { return birdBFD(b, []netip.Addr{gatewayGW4.Addr(), gatewayGW6.Addr()}, "Up") }); err != nil {
		t.Fatal(err)
	}
	for _, p := range sp.Status().Peers {
		if p.State != StateEstablished || !p.Since.Equal(since[p.Address]) {
			t.Errorf("the session with %s was reset again: %s since %v, was up since %v", p.Address, p.State, p.Since, since[p.Address])
		}
	}
}

// birdBFD checks that BIRD's show bfd sessions lists each address in
// state.
func birdBFD(b *bird.Router, addrs []netip.Addr, state string) error {
	out, err := b.Run("show bfd sessions")
	if err != nil {
		return err
	}
	for _, a := range addrs {
		found := false
		for _, line := range strings.Split(out, "\n") {
			// IP address  Interface  State  Since  Interval  Timeout
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == a.String() {
				found = true
				if f[2] != state {
					return fmt.Errorf("BIRD's BFD session with %s is %s, want %s:\n%s", a, f[2], state, out)
				}
			}
		}
		if !found {
			return fmt.Errorf("BIRD has no BFD session with %s:\n%s", a, out)
		}
	}
	return nil
}

// speakerBFD checks that the speaker reports every peer's BFD session in
// state, and nftgate_bgp_bfd_up as up.
func speakerBFD(sp *speakerProc, state string, up float64) error {
	st := sp.Status()
	for _, p := range st.Peers {
		if p.BFD != state {
			return fmt.Errorf("speaker: BFD with %s is %q, want %q", p.Address, p.BFD, state)
		}
		if got, ok := st.Metrics["nftgate_bgp_bfd_up"][p.Address]; !ok || got != up {
			return fmt.Errorf("speaker: nftgate_bgp_bfd_up{peer=%q} = %v (present: %v), want %v", p.Address, got, ok, up)
		}
	}
	if len(st.Peers) == 0 {
		return fmt.Errorf("speaker reports no peers")
	}
	return nil
}

// startBFDEdge starts BIRD in the router and a speaker in the gateway,
// both with BFD, announcing service4 and service6, and waits until BIRD
// has both sessions established and both routes (prefixes, in the order
// of the sessions gw4, gw6).
func startBFDEdge(t *testing.T) (e *edge, b *bird.Router, sp *speakerProc, prefixes []netip.Prefix) {
	t.Helper()
	e = newEdge(t)
	b = bird.Start(t, e.router, bfdBirdConf())
	sp = startSpeaker(t, e.gateway, bfdSpeakerConfig())
	sp.Set(HostRoute(service4, ""), HostRoute(service6, ""))
	prefixes = []netip.Prefix{netip.PrefixFrom(service4, 32), netip.PrefixFrom(service6, 128)}
	for i, protocol := range []string{"gw4", "gw6"} {
		b.WaitState(t, protocol, "Established", false, 30*time.Second)
		b.WaitRoute(t, prefixes[i], true, 30*time.Second)
	}
	return e, b, sp, prefixes
}
