package e2e_test

// The gateway set's modes with the binary: active-backup (the default),
// where one gateway holds every floating address, the Service addresses
// and the one floating masquerade address F alike, on L2 and over BGP; and
// active-active over BGP, where each gateway's masquerade address M is
// announced by it while it lives and by a survivor when it dies.

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
)

// abFloating is F, the masquerade address both gateways of the L2 lab
// share in active-backup mode, on the segment.
var abFloating = netip.MustParseAddr("198.18.8.100")

// TestGatewaysActiveBackupL2: two gateways in active-backup mode on one
// segment: exactly one MAC answers ARP/NDP for every Service address and
// for F, the same gateway's (gw-a, first by name); kill -9 it and cut its
// links, and the other answers for all of them.
func TestGatewaysActiveBackupL2(t *testing.T) {
	e := newGWLabMode(t, "active-backup", fmt.Sprintf("masquerade_addresses = [%q]\n", abFloating))
	all := append(slices.Clone(e.addrs), abFloating)
	e.ga.Launch()
	e.gb.Launch()
	e.ga.WaitReady()
	e.gb.WaitReady()
	allOn := func(name string, gs ...*gatewaytest.Gateway) error {
		h, err := e.holders(gs...)
		if err != nil {
			return err
		}
		for _, a := range all {
			if !slices.Equal(h[a], []string{name}) {
				return fmt.Errorf("%v held by %v, want %s alone", a, h[a], name)
			}
		}
		return nil
	}
	if err := lab.EventuallyWithin(20*time.Second, func() error { return allOn("gw-a", e.ga, e.gb) }); err != nil {
		t.Fatal(err)
	}
	answeredBy := func(name string) {
		t.Helper()
		for _, a := range all {
			if got := e.answerers(t, a, answerWindow); !slices.Equal(got, []string{name}) {
				t.Errorf("%v answered by %v, want %s alone", a, got, name)
			}
		}
	}
	answeredBy("gw-a")
	if st, err := gwStatus(e.gb); err != nil || st.Mode != "active-backup" || len(st.Holds) != 0 || !st.Ready {
		t.Errorf("the backup's status: %+v %v", st, err)
	}

	e.ga.Kill()
	killed := time.Now()
	setLink(t, e.topo.Gateway, e.seg[0], false)
	setLink(t, e.topo.Gateway, e.ab.A, false)
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		for _, a := range all {
			if got := e.answerers(t, a, 100*time.Millisecond); !slices.Equal(got, []string{"gw-b"}) {
				return fmt.Errorf("%v answered by %v", a, got)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("after gw-a was killed: %v\ngw-b logs:\n%s", err, e.gb.Logs())
	}
	t.Logf("gw-b answers for all %d addresses (F included) %v after the kill (heartbeat 100ms, dead after %d)",
		len(all), time.Since(killed).Round(time.Millisecond), gwDeadAfter)
	answeredBy("gw-b")
	if err := allOn("gw-b", e.gb); err != nil {
		t.Errorf("gw-b's holds: %v", err)
	}
}

// setSection is gateway i's own configuration in a set of n gateways
// (named gw1 … gwn, the channel over the router) in mode: its
// masquerade_addresses masq(i), and in active-active mode each peer's.
func setSection(t *testing.T, n int, mode string, masq func(i int) netip.Addr) func(i int) string {
	key := filepath.Join(t.TempDir(), "gateways.key")
	if err := os.WriteFile(key, []byte("the key of the BGP gateway set, 32+ bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(i int) string {
		text := fmt.Sprintf("masquerade_addresses = [%q]\n\n[gateways]\nname = \"gw%d\"\nkey_file = %q\nmode = %q\ndead_after = %d\n",
			masq(i), i, key, mode, gwDeadAfter)
		for j := 1; j <= n; j++ {
			if j == i {
				continue
			}
			text += fmt.Sprintf("\n[[gateways.peers]]\nname = \"gw%d\"\naddresses = [\"%s:7480\"]\n", j, setGatewaySide(j).Addr())
			if mode == "active-active" {
				text += fmt.Sprintf("masquerade_addresses = [%q]\n", masq(j))
			}
		}
		return text
	}
}

// announcers are the BGP sessions (gw1 …) BIRD has a route to a from,
// sorted.
func (s *gatewaySet) announcers(a netip.Addr) ([]string, error) {
	routes, err := s.bird.Routes(netip.PrefixFrom(a, 32))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range routes {
		out = append(out, r.Protocol)
	}
	slices.Sort(out)
	return out, nil
}

// waitAnnouncers waits until BIRD has the routes of want (address →
// sessions, sorted).
func (s *gatewaySet) waitAnnouncers(t *testing.T, what string, want map[netip.Addr][]string) {
	t.Helper()
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		for a, w := range want {
			got, err := s.announcers(a)
			if err != nil {
				return err
			}
			if !slices.Equal(got, w) {
				return fmt.Errorf("BIRD has %v from %v, want from %v", a, got, w)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// killGateway cuts gateway i's links and kills it, as a box losing power.
func (s *gatewaySet) killGateway(t *testing.T, i int) {
	t.Helper()
	cut(t, s.hosts[i-1])
	s.gws[i-1].Kill()
}

// TestGatewaysActiveBackupBGP: two gateways in active-backup mode: BIRD
// has the Service address and F from the active (gw1, first by name)
// only; kill -9 it and cut its links, and BIRD has both from the backup
// only.
func TestGatewaysActiveBackupBGP(t *testing.T) {
	f := netip.MustParseAddr("198.18.40.1")
	s := newGatewaySetOf(t, 2, 200*time.Millisecond, "", setSection(t, 2, "active-backup", func(int) netip.Addr { return f }))
	s.waitAnnouncers(t, "both up", map[netip.Addr][]string{setVIP: {"gw1"}, f: {"gw1"}})
	// Settled: it stays so (several dead times).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		for _, a := range []netip.Addr{setVIP, f} {
			if got, err := s.announcers(a); err != nil || !slices.Equal(got, []string{"gw1"}) {
				t.Fatalf("%v from %v (%v), want gw1 alone", a, got, err)
			}
		}
	}
	killed := time.Now()
	s.killGateway(t, 1)
	s.waitAnnouncers(t, "after gw1 was killed", map[netip.Addr][]string{setVIP: {"gw2"}, f: {"gw2"}})
	t.Logf("BIRD has the Service address and F from gw2 alone %v after the kill (BFD 200ms x 3, dead after %d x 100ms)",
		time.Since(killed).Round(time.Millisecond), gwDeadAfter)
}

// TestGatewaysActiveActiveBGP: three gateways in active-active mode: the
// Service address from all three (ECMP), each gateway's masquerade address
// M from itself; kill -9 one, and its M comes from a survivor, the others'
// from their own.
func TestGatewaysActiveActiveBGP(t *testing.T) {
	m := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(40 + i), 1}) }
	s := newGatewaySetOf(t, 3, 200*time.Millisecond, "", setSection(t, 3, "active-active", m))
	s.waitAnnouncers(t, "all up", map[netip.Addr][]string{setVIP: {"gw1", "gw2", "gw3"}, m(1): {"gw1"}, m(2): {"gw2"}, m(3): {"gw3"}})
	killed := time.Now()
	s.killGateway(t, 1)
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		got, err := s.announcers(m(1))
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] == "gw1" {
			return fmt.Errorf("BIRD has gw1's M %v from %v, want one survivor", m(1), got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	by, _ := s.announcers(m(1))
	t.Logf("gw1's M %v from %v %v after the kill", m(1), by, time.Since(killed).Round(time.Millisecond))
	s.waitAnnouncers(t, "after gw1 was killed", map[netip.Addr][]string{setVIP: {"gw2", "gw3"}, m(1): by, m(2): {"gw2"}, m(3): {"gw3"}})
}
