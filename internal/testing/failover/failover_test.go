package failover_test

import (
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// The test size: small enough for make test; make bench runs 1,000 TCP
// and 100 UDP (bench/cmd/nftgate-bench, --failover).
var testTraffic = failover.Traffic{TCP: 100, UDP: 20}

// newTopology builds the harness's topology for t, removed by its cleanup.
func newTopology(t *testing.T, o failover.Options) *failover.Topology {
	t.Helper()
	labtest.RequireRoot(t)
	if _, err := lab.RemoveStale(); err != nil {
		t.Logf("removing stale lab namespaces: %v", err)
	}
	o.Name = "failover"
	topo, err := failover.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("closing the lab: %v", err)
		}
		if left, err := topo.Namespaces(); err != nil || len(left) > 0 {
			t.Errorf("namespaces left behind: %v %v", left, err)
		}
	})
	return topo
}

// anchor runs the active/backup topology with keepalived, and conntrackd
// when withSync, kills gw-a and returns the result.
func anchor(t *testing.T, withSync bool) failover.Result {
	topo := newTopology(t, failover.Options{Gateways: 2})
	a, err := failover.StartAnchor(topo, t.TempDir(), withSync)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("anchor logs:\n%s", a.Logs())
		}
		if err := a.Close(); err != nil {
			t.Errorf("stopping the anchor: %v", err)
		}
	})
	res, err := failover.Failover(topo, netip.AddrPortFrom(failover.ServiceAddr, failover.ServicePort), testTraffic, 0,
		func() error { return a.Synced(testTraffic.TCP+testTraffic.UDP, 30e9) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	return res
}

// TestAnchorKeepsConnections: keepalived and conntrackd (Debian's) carry
// every TCP connection and UDP flow over to gw-b when gw-a dies.
func TestAnchorKeepsConnections(t *testing.T) {
	res := anchor(t, true)
	if res.TCP.Lost > 0 || res.UDP.Lost > 0 {
		t.Errorf("the anchor lost connections: %s", res)
	}
	// The goal is 2 s on L2; the bound is generous so that a loaded
	// machine does not fail the test (make bench measures).
	if res.TCP.StallMaxMs > 10000 || res.UDP.StallMaxMs > 10000 {
		t.Errorf("stalls beyond 10 s: %s", res)
	}
}

// TestFloorLosesConnections: keepalived alone moves the addresses but no
// state, and the harness sees the TCP connections die. (UDP flows are
// taken for new ones by gw-b and keep echoing: the echo does not care
// which endpoint answers.)
func TestFloorLosesConnections(t *testing.T) {
	res := anchor(t, false)
	if res.TCP.Lost == 0 {
		t.Errorf("without state sync no TCP connection was lost: %s", res)
	}
}
