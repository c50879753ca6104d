package failover_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/bird"
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

// startAnchor starts keepalived, and conntrackd when withSync, in topo,
// stopped by t's cleanup (their logs shown if t failed).
func startAnchor(t *testing.T, topo *failover.Topology, withSync bool) *failover.Anchor {
	t.Helper()
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
	return a
}

// anchor runs the active/backup topology with keepalived, and conntrackd
// when withSync, kills gw-a and returns the result.
func anchor(t *testing.T, withSync bool) failover.Result {
	topo := newTopology(t, failover.Options{Gateways: 2})
	a := startAnchor(t, topo, withSync)
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
	checkKept(t, "the anchor", anchor(t, true))
}

// checkKept fails t unless who kept every flow of res, none stalled beyond
// 10 s. The goal is 2 s on L2; the bound is generous so that a loaded
// machine does not fail the test (make bench measures).
func checkKept(t *testing.T, who string, res failover.Result) {
	t.Helper()
	if res.TCP.Lost > 0 || res.UDP.Lost > 0 {
		t.Errorf("%s lost connections: %s", who, res)
	}
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

// startRouter starts BIRD in topo's router and stops it at the end of the
// test, showing its log if the test failed.
func startRouter(t *testing.T, topo *failover.Topology) *bird.Router {
	t.Helper()
	router, err := failover.StartRouter(topo, t.TempDir(), testBFDMultiplier)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("BIRD:\n%s", router.Output(60))
		}
		router.Close()
	})
	return router
}

// testDeadAfter is the tests' [gateways] dead_after, 500 ms rather than
// 300 ms, so that a loaded machine stalling a process does not declare a
// live peer dead (see e2e/gateways_l2_test.go).
const testDeadAfter = 5

// testBFDMultiplier is the tests' BFD detection multiplier, 500 ms rather
// than 300 ms at 100 ms, for the same reason: a router or gateway starved
// for 300 ms on a loaded machine took every session down at once.
const testBFDMultiplier = 5

// startActiveBackup starts two nftgates, active/backup, and waits until
// one, gs[holder], holds the addresses.
func startActiveBackup(t *testing.T) (topo *failover.Topology, cfg *failover.NftgateConfig, gs []*failover.Nftgate, holder int) {
	t.Helper()
	return startActiveBackupWith(t, "")
}

// startActiveBackupWith is startActiveBackup with [gateways]
// conntrack_events = events ("": nftgate's default).
func startActiveBackupWith(t *testing.T, events string) (topo *failover.Topology, cfg *failover.NftgateConfig, gs []*failover.Nftgate, holder int) {
	t.Helper()
	topo = newTopology(t, failover.Options{Gateways: 2})
	cfg = nftgateConfig(t, topo, failover.NftgateOptions{DeadAfter: testDeadAfter, ConntrackEvents: events})
	gs = startNftgate(t, topo, cfg)
	return topo, cfg, gs, waitHolder(t, gs)
}

// replicatedTo waits until standby holds a replica of every test flow to
// the Service address.
func replicatedTo(standby *lab.Host) func() error {
	return func() error {
		return failover.Replicated([]*lab.Host{standby}, failover.ServiceAddr, testTraffic.TCP+testTraffic.UDP, 30*time.Second)
	}
}

// TestNftgateActiveBackupKeepsConnections: two nftgates, active/backup
// with F floating; kill -9 the one holding the addresses and cut its
// links: every TCP connection and UDP flow carries on through the other,
// which held a replica of each before the failure.
func TestNftgateActiveBackupKeepsConnections(t *testing.T) {
	topo, cfg, _, holder := startActiveBackup(t)
	res, err := failover.Failover(topo, cfg.Dst, testTraffic, holder, replicatedTo(topo.Gateways[1-holder]))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	checkKept(t, "nftgate", res)
}

// holderOf is the gateway of gs that holds the Service address and F
// (active/backup): an error while none or both do, or one holds only one
// of them.
func holderOf(gs []*failover.Nftgate) (int, error) {
	holder := -1
	for i, g := range gs {
		h, err := g.Holds()
		if err != nil {
			return -1, err
		}
		sa, f := slices.Contains(h, failover.ServiceAddr), slices.Contains(h, failover.Floating)
		if sa != f {
			return -1, fmt.Errorf("%s holds %v: the Service address and F apart", failover.GatewayNames[i], h)
		}
		if sa {
			if holder >= 0 {
				return -1, fmt.Errorf("both gateways hold %v", failover.ServiceAddr)
			}
			holder = i
		}
	}
	if holder < 0 {
		return -1, fmt.Errorf("no gateway holds %v", failover.ServiceAddr)
	}
	return holder, nil
}

// waitHolder waits until one gateway of gs holds the Service address and F
// (holderOf) and returns it.
func waitHolder(t *testing.T, gs []*failover.Nftgate) int {
	t.Helper()
	holder := -1
	if err := lab.EventuallyWithin(20*time.Second, func() (err error) {
		holder, err = holderOf(gs)
		// The active is the first gateway by name among the ready ones:
		// gw-a once both are ready (gw-b may hold everything until then).
		if err == nil && holder != 0 {
			err = fmt.Errorf("%s holds the addresses; waiting for %s, the first by name", failover.GatewayNames[holder], failover.GatewayNames[0])
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return holder
}

// restart starts nftgate again in gateway i (after Topology.Return) and
// waits until it answers /readyz; its logs are shown if the test fails.
func restart(t *testing.T, topo *failover.Topology, cfg *failover.NftgateConfig, i int) (*failover.Nftgate, error) {
	g, err := failover.StartNftgate(topo.Gateways[i], gatewaytest.Binary(t), cfg.Args[i])
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nftgate in %s after its return:\n%s", g.Host, g.Logs())
		}
		if err := failover.KillNamespace(g.Host); err != nil {
			t.Error(err)
		}
	})
	return g, g.WaitReady(30 * time.Second)
}

// checkReturn fails t unless every flow, those of before the failure and
// those opened after it, was kept through the failure and the return.
func checkReturn(t *testing.T, res failover.Return) {
	t.Helper()
	t.Logf("%s", res)
	if res.Failover.TCP.Lost > 0 || res.Failover.UDP.Lost > 0 {
		t.Errorf("nftgate lost connections at the failure: %s", res.Failover)
	}
	if res.Back.TCP.Flows != 2*testTraffic.TCP || res.Back.UDP.Flows != 2*testTraffic.UDP {
		t.Errorf("after the return: %d TCP and %d UDP flows, want %d and %d", res.Back.TCP.Flows, res.Back.UDP.Flows, 2*testTraffic.TCP, 2*testTraffic.UDP)
	}
	if res.Back.TCP.Lost > 0 || res.Back.UDP.Lost > 0 {
		t.Errorf("nftgate lost connections at the return: %s", res.Back)
	}
	if res.Back.TCP.StallMaxMs > 10000 || res.Back.UDP.StallMaxMs > 10000 {
		t.Errorf("stalls beyond 10 s at the return: %s", res.Back)
	}
}

// TestNftgateActiveBackupReturns: the active gateway fails as in
// TestNftgateActiveBackupKeepsConnections, and new connections open
// through the backup; then it comes back (links up, state lost, nftgate
// started again): it receives every flow from the backup, takes the
// Service address and F back only once it holds them, and every
// connection, old and new, carries on through it.
func TestNftgateActiveBackupReturns(t *testing.T) {
	topo, cfg, gs, holder := startActiveBackup(t)
	n := testTraffic.TCP + testTraffic.UDP
	res, err := failover.FailAndReturn(topo, cfg.Dst, testTraffic, holder, replicatedTo(topo.Gateways[1-holder]), nil,
		func() error {
			g, err := restart(t, topo, cfg, holder)
			if err != nil {
				return err
			}
			gs[holder] = g
			if err := lab.EventuallyWithin(60*time.Second, func() error {
				h, err := holderOf(gs)
				if err == nil && h != holder {
					err = fmt.Errorf("%s holds the addresses, not %s", failover.GatewayNames[h], failover.GatewayNames[holder])
				}
				return err
			}); err != nil {
				return err
			}
			// It took them holding every flow (the full resync).
			return failover.Replicated([]*lab.Host{topo.Gateways[holder]}, failover.ServiceAddr, 2*n, 0)
		})
	if err != nil {
		t.Fatal(err)
	}
	checkReturn(t, res)
}

// TestNftgateECMPKeepsConnections: three nftgates behind BIRD (ECMP, BFD),
// active/active, each masquerading to its own address; kill -9 one and
// cut its links: the flows it carried move to the others, which take its
// masquerade address over, and every flow continues. New connections,
// one every 10 ms, fail (those hashed to the dead gateway) only until the
// router has taken it out (the figures are measured in make bench; the
// bound here is generous, the machine being shared).
func TestNftgateECMPKeepsConnections(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier})
	router := startRouter(t, topo)
	startNftgate(t, topo, cfg)
	if err := failover.ECMPRoutes(router, len(topo.Gateways), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	n := testTraffic.TCP + testTraffic.UDP
	traffic := testTraffic
	traffic.NewEvery, traffic.NewTimeout = 10*time.Millisecond, time.Second
	res, err := failover.Failover(topo, cfg.Dst, traffic, 0,
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, n, 30*time.Second)
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	checkKept(t, "nftgate", res)
	if res.New.GapMs > 3000 || res.New.LastFailedMs > 3000 || res.New.Failed == res.New.Attempts {
		t.Errorf("new connections failed for too long after the kill: %s", res.New)
	}
}

// TestNftgateECMPDrainFailsNoNewConnection: `nftgate drain` on one of
// three gateways behind BIRD while a new connection opens every 10 ms:
// BIRD withdraws its route, new connections go to the other two, and the
// established flows carry on, and no new connection fails. One opened
// through the draining gateway a few milliseconds before the withdrawal
// sends its next packets to a peer before its state gets there: the peer
// drops them ([gateways] midstream_tcp = "wait") rather than masquerade
// them afresh, and the client's retransmission meets the replica.
func TestNftgateECMPDrainFailsNoNewConnection(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier})
	router := startRouter(t, topo)
	gs := startNftgate(t, topo, cfg)
	routes := func(want int) error { return failover.ECMPRoutes(router, want, 30*time.Second) }
	if err := routes(len(topo.Gateways)); err != nil {
		t.Fatal(err)
	}
	n := testTraffic.TCP + testTraffic.UDP
	traffic := testTraffic
	// A timeout long enough that only a connection sent into a gateway
	// that no longer serves it fails, not one slowed by the machine.
	traffic.NewEvery, traffic.NewTimeout = 10*time.Millisecond, 2*time.Second
	var withdrawn time.Duration
	res, err := failover.FailoverBy(topo, cfg.Dst, traffic,
		func() (time.Time, error) {
			start := time.Now()
			if err := gs[0].Drain(gatewaytest.Binary(t), cfg.Configs[0]); err != nil {
				return start, err
			}
			err := routes(len(topo.Gateways) - 1)
			withdrawn = time.Since(start)
			return start, err
		},
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, n, 30*time.Second)
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("drain: BIRD withdrew the route after %v; %s", withdrawn.Round(time.Millisecond), res)
	if res.New.Attempts < 100 || res.New.Failed > 0 {
		t.Errorf("new connections in the drain (BIRD withdrew the route after %v): %s, want at least 100, none failed", withdrawn, res.New)
	}
	checkKept(t, "nftgate in the drain", res)
}

// TestNftgateECMPReturns: gw-a fails as in TestNftgateECMPKeepsConnections
// and new connections open through the survivors; then gw-a comes back
// (links up, state lost, nftgate started again): the router gives it its
// buckets back once it announces the Service address, it takes its
// masquerade address back, and every flow, old and new, continues.
func TestNftgateECMPReturns(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier})
	router := startRouter(t, topo)
	gs := startNftgate(t, topo, cfg)
	routes := func(want int) error {
		return failover.ECMPRoutes(router, want, 60*time.Second)
	}
	if err := routes(len(topo.Gateways)); err != nil {
		t.Fatal(err)
	}
	n := testTraffic.TCP + testTraffic.UDP
	res, err := failover.FailAndReturn(topo, cfg.Dst, testTraffic, 0,
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, n, 30*time.Second)
		},
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, 2*n, 30*time.Second)
		},
		func() error {
			g, err := restart(t, topo, cfg, 0)
			if err != nil {
				return err
			}
			gs[0] = g
			if err := lab.EventuallyWithin(60*time.Second, func() error {
				h, err := g.Holds()
				if err == nil && !slices.Contains(h, failover.MasqueradeAddr(0)) {
					err = fmt.Errorf("gw-a holds %v, not its masquerade address %v", h, failover.MasqueradeAddr(0))
				}
				return err
			}); err != nil {
				return err
			}
			// It holds every flow (the full resync) before the router
			// sends it any.
			if err := failover.Replicated(topo.Gateways[:1], failover.ECMPServiceAddr, 2*n, 0); err != nil {
				return err
			}
			return routes(len(topo.Gateways))
		})
	if err != nil {
		t.Fatal(err)
	}
	checkReturn(t, res)
}

// TestNftgateActiveBackupDrainHandsOver: `nftgate drain` on the active
// gateway under live flows: it hands the Service address and F to the
// backup at once (both directions of every flow then pass the backup,
// which holds their replicas), exits with status 0 while the flows are
// still open (they moved), and every TCP connection and UDP flow carries
// on through the backup after its exit.
func TestNftgateActiveBackupDrainHandsOver(t *testing.T) {
	topo, cfg, gs, holder := startActiveBackup(t)
	standby := 1 - holder
	var handedOver, exited time.Duration
	res, err := failover.FailoverBy(topo, cfg.Dst, testTraffic,
		func() (time.Time, error) {
			start := time.Now()
			if err := gs[holder].Drain(gatewaytest.Binary(t), cfg.Configs[holder]); err != nil {
				return start, err
			}
			if err := lab.EventuallyWithin(10*time.Second, func() error {
				h, err := gs[standby].Holds()
				if err != nil {
					return err
				}
				if !slices.Contains(h, failover.ServiceAddr) || !slices.Contains(h, failover.Floating) {
					return fmt.Errorf("the backup holds %v, want %v and %v", h, failover.ServiceAddr, failover.Floating)
				}
				return nil
			}); err != nil {
				return start, err
			}
			handedOver = time.Since(start)
			// The flows are open: the draining gateway exits because they
			// moved, well before drain_period (30 s).
			if err := gs[holder].Exited(20 * time.Second); err != nil {
				return start, err
			}
			exited = time.Since(start)
			return time.Now(), nil
		},
		replicatedTo(topo.Gateways[standby]))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("drain: the backup held the Service address and F %v after it started, the draining gateway exited after %v; %s",
		handedOver.Round(time.Millisecond), exited.Round(time.Millisecond), res)
	checkKept(t, "nftgate in the drain", res)
}
