package failover_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// TestNewConnsMeasuresTheGap: new connections to an echo server that
// stops listening for a while fail (refused) for that while and no
// longer; the failure window covers it, and every attempt that
// started after the server was back echoed.
func TestNewConnsMeasuresTheGap(t *testing.T) {
	client, server, addr := clientServer(t, "198.18.41.0/24")
	stop, err := failover.ServeEcho(server, []netip.Addr{addr}, 8080)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() })
	const down = 500 * time.Millisecond
	n := failover.StartNewConns(client, netip.AddrPortFrom(addr, 8080), 10*time.Millisecond, 300*time.Millisecond)
	defer n.Stop()
	if err := n.Succeeded(10, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	n.Failed(at)
	stop()
	// Down for at least `down`, and until some attempts have failed.
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if s := n.Result(); s.Failed < 5 || time.Since(at) < down {
			return fmt.Errorf("%d failed so far", s.Failed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if stop, err = failover.ServeEcho(server, []netip.Addr{addr}, 8080); err != nil {
		t.Fatal(err)
	}
	// Back once it listens: an attempt that started while ServeEcho was
	// still opening its sockets may rightly have been refused.
	healed := time.Now()
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if s := n.Result(); s.Attempts-s.Failed < 10 {
			return fmt.Errorf("%d of %d echoed since the failure", s.Attempts-s.Failed, s.Attempts)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s := n.Stop()
	t.Logf("server down %v: %s", healed.Sub(at).Round(time.Millisecond), s)
	// Refused; or reset, when the listener closed with the connection
	// already in its backlog.
	if s.Failed < 5 || s.Reasons["refused"]+s.Reasons["reset"] != s.Failed || s.Reasons["refused"] == 0 || s.FailedBefore != 0 {
		t.Errorf("failed %d %v (before the failure %d), want refusals (and resets of the closing listener's backlog) only, at least 5", s.Failed, s.Reasons, s.FailedBefore)
	}
	if s.GapMs < float64(down.Milliseconds())/2 {
		t.Errorf("failure window %.0f ms, want about the %v the server was down", s.GapMs, down)
	}
	if limit := float64(healed.Sub(at).Milliseconds()); s.LastFailedMs > limit {
		t.Errorf("an attempt started %.0f ms after the failure failed, after the server was back at %.0f ms", s.LastFailedMs, limit)
	}
}
