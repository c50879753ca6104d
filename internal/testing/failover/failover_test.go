package failover_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

func TestMain(m *testing.M) { gatewaytest.Main(m) }

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

// nftgateConfig writes nftgate's configurations for topo; it skips the
// test when the binary lacks state sync.
func nftgateConfig(t *testing.T, topo *failover.Topology, o failover.NftgateOptions) *failover.NftgateConfig {
	t.Helper()
	cfg, err := failover.WriteNftgate(topo, t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := failover.NftgateSupports(gatewaytest.Binary(t), cfg.Configs[0]); err != nil {
		t.Skipf("skipping until nftgate has state sync: %v", err)
	}
	return cfg
}

// startNftgate starts nftgate in every gateway of topo with cfg and waits
// until each is ready.
func startNftgate(t *testing.T, topo *failover.Topology, cfg *failover.NftgateConfig) []*failover.Nftgate {
	t.Helper()
	bin := gatewaytest.Binary(t)
	var gs []*failover.Nftgate
	t.Cleanup(func() {
		for _, g := range gs {
			if t.Failed() {
				t.Logf("nftgate in %s:\n%s", g.Host, g.Logs())
			}
			if err := failover.KillNamespace(g.Host); err != nil {
				t.Error(err)
			}
		}
	})
	for i, h := range topo.Gateways {
		g, err := failover.StartNftgate(h, bin, cfg.Args[i])
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	for _, g := range gs {
		if err := g.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return gs
}

// testDeadAfter is the tests' [gateways] dead_after, 500 ms rather than
// 300 ms, so that a loaded machine stalling a process does not declare a
// live peer dead (see e2e/gateways_l2_test.go).
const testDeadAfter = 5

// TestNftgateActiveBackupKeepsConnections: two nftgates, active/backup
// with F floating; kill -9 the one holding the addresses and cut its
// links: every TCP connection and UDP flow carries on through the other,
// which held a replica of each before the failure.
func TestNftgateActiveBackupKeepsConnections(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 2})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{DeadAfter: testDeadAfter})
	gs := startNftgate(t, topo, cfg)
	holder := -1
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		holder = -1
		for i, g := range gs {
			h, err := g.Holds()
			if err != nil {
				return err
			}
			sa, f := slices.Contains(h, failover.ServiceAddr), slices.Contains(h, failover.Floating)
			if sa != f {
				return fmt.Errorf("%s holds %v: the Service address and F apart", failover.GatewayNames[i], h)
			}
			if sa {
				if holder >= 0 {
					return fmt.Errorf("both gateways hold %v", failover.ServiceAddr)
				}
				holder = i
			}
		}
		if holder < 0 {
			return fmt.Errorf("no gateway holds %v", failover.ServiceAddr)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	standby := topo.Gateways[1-holder]
	n := testTraffic.TCP + testTraffic.UDP
	res, err := failover.Failover(topo, cfg.Dst, testTraffic, holder,
		func() error {
			return failover.Replicated([]*lab.Host{standby}, failover.ServiceAddr, n, 30*time.Second)
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	if res.TCP.Lost > 0 || res.UDP.Lost > 0 {
		t.Errorf("nftgate lost connections: %s", res)
	}
	if res.TCP.StallMaxMs > 10000 || res.UDP.StallMaxMs > 10000 {
		t.Errorf("stalls beyond 10 s: %s", res)
	}
}

// TestNftgateECMPKeepsConnections: three nftgates behind BIRD (ECMP, BFD),
// active/active, each masquerading to its own address; kill -9 one and
// cut its links: the flows it carried move to the others, which take its
// masquerade address over, and every flow continues.
func TestNftgateECMPKeepsConnections(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter})
	router, err := failover.StartRouter(topo, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("BIRD:\n%s", router.Output(60))
		}
		router.Close()
	})
	startNftgate(t, topo, cfg)
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		routes, err := router.Routes(netip.PrefixFrom(failover.ECMPServiceAddr, 32))
		if err != nil {
			return err
		}
		if len(routes) != len(topo.Gateways) {
			return fmt.Errorf("BIRD has %d routes to %v, want %d", len(routes), failover.ECMPServiceAddr, len(topo.Gateways))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n := testTraffic.TCP + testTraffic.UDP
	res, err := failover.Failover(topo, cfg.Dst, testTraffic, 0,
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, n, 30*time.Second)
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	if res.TCP.Lost > 0 || res.UDP.Lost > 0 {
		t.Errorf("nftgate lost connections: %s", res)
	}
	if res.TCP.StallMaxMs > 10000 || res.UDP.StallMaxMs > 10000 {
		t.Errorf("stalls beyond 10 s: %s", res)
	}
}
