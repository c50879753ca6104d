package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// readyTimeout is gw1's ready_timeout in TestGatewaysActiveActiveRouteWaitsForReady:
// long enough that its BGP session is up well before it passes.
const readyTimeout = 10 * time.Second

// TestGatewaysActiveActiveRouteWaitsForReady: two gateways in active-active
// mode behind BIRD; gw2 runs without state sync, so gw1, which syncs,
// never gets a resync from it and becomes ready only when ready_timeout
// passes. gw1 is killed and returns: once its BGP session is up, BIRD has
// the Service route from gw2 alone for as long as gw1's /api/v1/gateways
// says it is not ready, and from both after the timeout.
func TestGatewaysActiveActiveRouteWaitsForReady(t *testing.T) {
	m := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(40 + i), 1}) }
	base := setSection(t, 2, "active-active", m)
	section := func(i int) string {
		own := fmt.Sprintf("ready_timeout = %q\n", readyTimeout.String())
		if i == 2 {
			own += "state_sync = false\n"
		}
		// The keys go into [gateways] itself, before its peers' tables.
		return strings.Replace(base(i), "[gateways]\n", "[gateways]\n"+own, 1)
	}
	s := newGatewaySetOf(t, 2, 200*time.Millisecond, "", section)
	both := map[netip.Addr][]string{setVIP: {"gw1", "gw2"}, m(1): {"gw1"}, m(2): {"gw2"}}
	s.waitAnnouncers(t, "both up", both)

	s.killGateway(t, 1)
	s.waitAnnouncers(t, "after gw1 was killed", map[netip.Addr][]string{setVIP: {"gw2"}, m(1): {"gw2"}, m(2): {"gw2"}})
	uncut(t, s.hosts[0])
	s.gws[0].Start()
	returned := time.Now()
	s.bird.WaitState(t, "gw1", "Established", false, readyTimeout)
	up := time.Since(returned)

	// While gw1 is not ready, BIRD has no Service route through it.
	notReady := 0
	for {
		// The routes are read before the readiness: gw1 marks itself ready
		// before it announces, so a route through it seen here, followed by
		// a readiness that is still false, was announced while it was not
		// ready. (Read the other way round, the timeout can pass between
		// the two reads and the route be rightly there.)
		got, err := s.announcers(setVIP)
		if err != nil {
			t.Fatal(err)
		}
		ready, err := gatewayReady(s, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ready {
			break
		}
		if slices.Contains(got, "gw1") {
			t.Fatalf("BIRD has the Service route from %v while gw1 is not ready (%v after its return)", got, time.Since(returned).Round(time.Millisecond))
		}
		notReady++
		if time.Since(returned) > readyTimeout+30*time.Second {
			t.Fatal("gw1 did not become ready")
		}
		time.Sleep(50 * time.Millisecond) // a polling interval, not a readiness wait
	}
	if notReady == 0 {
		t.Fatalf("gw1 was ready when its BGP session came up (%v after its return): nothing was checked", up.Round(time.Millisecond))
	}
	s.waitAnnouncers(t, "gw1 ready", both)
	t.Logf("gw1 returned: BGP session up after %v; no Service route through it in %d checks while not ready; both routes %v after its return (ready_timeout %v)",
		up.Round(time.Millisecond), notReady, time.Since(returned).Round(time.Millisecond), readyTimeout)
}

// gatewayReady is what gateway i's /api/v1/gateways says of its readiness.
func gatewayReady(s *gatewaySet, i int) (bool, error) {
	code, body, err := s.gws[i].Get("/api/v1/gateways")
	if err != nil {
		return false, err
	}
	if code != 200 {
		return false, fmt.Errorf("/api/v1/gateways: %d %s", code, body)
	}
	var st gateways.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return false, fmt.Errorf("/api/v1/gateways: %w", err)
	}
	return st.Ready, nil
}

// uncut undoes cut: host's interfaces pass packets again.
func uncut(t *testing.T, h *lab.Host) {
	t.Helper()
	if out, err := h.Command(t.Context(), "nft", "delete", "table", "netdev", "cut").CombinedOutput(); err != nil {
		t.Fatalf("nft delete table netdev cut: %v: %s", err, out)
	}
}
