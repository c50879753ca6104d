package e2e_test

// The gateway set's modes with the binary: active-backup (the default),
// where one gateway holds every floating address, the Service addresses
// and the one floating masquerade address F alike, on L2 and over BGP; and
// active-active over BGP, where each gateway's masquerade address M is
// announced by it while it lives and by a survivor when it dies.

import (
	"fmt"
	"net/netip"
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
