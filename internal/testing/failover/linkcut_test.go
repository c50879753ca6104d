package failover_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// A cut link, not a dead box: the active's link to the upstream segment
// loses its carrier (a pulled cable, a dead switch port) while the active
// lives and still hears its peer over the sync link and the cluster
// segment. Nothing in the set's heartbeats says it cannot carry what it
// holds; the link it tracks does.

// TestNftgateActiveBackupLinkCutHandsOver: two nftgates, active/backup, 100
// TCP connections and 20 UDP flows through gw-a; gw-a's upstream link is
// cut: gw-a (alive) hands the Service address and F to gw-b, every flow
// carries on through gw-b; the link mended, gw-a takes them back after
// track_up_after, and every flow, those of before and those opened during
// the cut, carries on through gw-a again. Without tracked links
// (track_interfaces = []) gw-a keeps the addresses behind its dark port
// and the flows are lost.
func TestNftgateActiveBackupLinkCutHandsOver(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 2})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{DeadAfter: testDeadAfter, TrackUpAfter: time.Second})
	gs := startNftgate(t, topo, cfg)
	active := waitHolder(t, gs)
	backup := 1 - active

	stop, err := failover.ServeEcho(topo.Endpoints, failover.Endpoints, failover.EndpointPort)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	run, err := failover.Start(topo.Client, cfg.Dst, testTraffic)
	if err != nil {
		t.Fatal(err)
	}
	defer run.Stop()
	if err := run.Established(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := replicatedTo(topo.Gateways[backup])(); err != nil {
		t.Fatal(err)
	}

	// One more connection that carries bulk during the cut: through the
	// backup, far beyond the window gw-a's own entry last saw, to which
	// it comes back after the mend.
	bulk, err := topo.Client.DialContext(context.Background(), "tcp", cfg.Dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer bulk.Close()
	bulkR := bufio.NewReader(bulk)
	if err := exchange(bulk, bulkR, "before the cut\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	local := netip.MustParseAddrPort(bulk.LocalAddr().String())
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if n, err := entries(topo.Gateways[backup], local); err != nil || n == 0 {
			return fmt.Errorf("%s holds %d entries of the bulk connection (%v)", failover.GatewayNames[backup], n, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	cut := time.Now()
	if err := topo.CutUpstream(active, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = topo.CutUpstream(active, true) })
	run.Failed(cut)
	var handedOver time.Duration
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		h, err := holderOf(gs)
		if err != nil {
			return err
		}
		if h != backup {
			return fmt.Errorf("%s still holds the addresses", failover.GatewayNames[h])
		}
		return nil
	}); err != nil {
		t.Errorf("after the cut: %v", err)
	} else {
		handedOver = time.Since(cut)
	}
	run.Settle()
	res := run.Result()
	t.Logf("link cut: %s (alive) handed over %v after the cut; %s", failover.GatewayNames[active], handedOver.Round(time.Millisecond), res)
	checkKept(t, "nftgate after the link cut", res)
	if t.Failed() {
		return
	}
	st := setStatus(t, gs[active])
	if !strings.Contains(st.Fault, topo.Upstream[active]) || gs[active].Ended() {
		t.Fatalf("%s after the cut: fault %q, ended %v; want alive and faulty for %s", failover.GatewayNames[active], st.Fault, gs[active].Ended(), topo.Upstream[active])
	}
	if p := setStatus(t, gs[backup]).Peers[0]; p.State != "alive" || !p.Faulty {
		t.Fatalf("%s sees its peer %s %s, faulty %v: want alive and faulty", failover.GatewayNames[backup], p.Name, p.State, p.Faulty)
	}
	if err := bulkEcho(bulk, bulkR, 16<<20); err != nil {
		t.Fatalf("bulk through %s during the cut: %v", failover.GatewayNames[backup], err)
	}

	// More flows, opened through the backup during the cut.
	if err := run.Add(topo.Client, cfg.Dst, testTraffic.TCP, testTraffic.UDP); err != nil {
		t.Fatal(err)
	}
	if err := run.Established(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := failover.Replicated([]*lab.Host{topo.Gateways[active]}, failover.ServiceAddr, 2*(testTraffic.TCP+testTraffic.UDP), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	run.RestartStalls()
	mended := time.Now()
	if err := topo.CutUpstream(active, true); err != nil {
		t.Fatal(err)
	}
	if h := waitHolder(t, gs); h != active {
		t.Fatalf("%s holds the addresses after the mend", failover.GatewayNames[h])
	}
	back := time.Since(mended)
	if back < time.Second {
		t.Errorf("%s took the addresses back %v after the mend, before track_up_after (1s)", failover.GatewayNames[active], back)
	}
	run.Failed(time.Now())
	// The bulk connection, back on gw-a's own entry, whose window saw
	// none of the 16 MiB each way: it carries on (window tracking is
	// liberal with tracked links).
	if err := exchange(bulk, bulkR, "after the mend\n", 5*time.Second); err != nil {
		t.Errorf("the bulk connection after the mend, through %s again: %v", failover.GatewayNames[active], err)
	}
	run.Settle()
	res = run.Stop()
	t.Logf("link mended: %s took the addresses back %v after; %s", failover.GatewayNames[active], back.Round(time.Millisecond), res)
	checkKept(t, "nftgate after the link was mended", res)
}

// bulkEcho writes n bytes on c and reads them back through r.
func bulkEcho(c net.Conn, r *bufio.Reader, n int) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = 'a' + byte(i%26)
	}
	chunk[len(chunk)-1] = '\n'
	errc := make(chan error, 1)
	go func() {
		for sent := 0; sent < n; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, len(chunk))
	for got := 0; got < n; got += len(chunk) {
		if _, err := io.ReadFull(r, buf); err != nil {
			return fmt.Errorf("after %d bytes back: %w", got, err)
		}
		if !bytes.Equal(buf, chunk) {
			return fmt.Errorf("after %d bytes back: a chunk came back changed", got)
		}
	}
	return <-errc
}

// TestNftgateECMPClusterLinkCutStandsBy: three nftgates behind BIRD,
// active/active; gw-a's link to the cluster segment is cut while it lives
// and its BGP session and BFD to the router stay up: gw-a hands its
// masquerade address to a survivor and withdraws its Service route
// (standby), so the router sends its flows to the two that reach the
// endpoints, which hold their replicas: every flow carries on. Without
// the standby the router would go on sending a third of the flows to a
// gateway that cannot reach any endpoint.
func TestNftgateECMPClusterLinkCutStandsBy(t *testing.T) {
	topo, cfg, router, gs := startECMP(t)
	n := testTraffic.TCP + testTraffic.UDP
	var withdrawn time.Duration
	res, err := failover.FailoverBy(topo, cfg.Dst, testTraffic,
		func() (time.Time, error) {
			at := time.Now()
			if err := topo.CutCluster(0, false); err != nil {
				return at, err
			}
			// Not fatal: the flows are followed either way.
			if err := failover.ECMPRoutes(router, len(topo.Gateways)-1, 10*time.Second); err != nil {
				t.Errorf("gw-a's route stays: %v", err)
			} else {
				withdrawn = time.Since(at)
			}
			return at, nil
		},
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, n, 30*time.Second)
		})
	t.Cleanup(func() { _ = topo.CutCluster(0, true) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster link cut: BIRD had gw-a's route withdrawn %v after the cut; %s", withdrawn.Round(time.Millisecond), res)
	checkKept(t, "nftgate after the cluster link cut", res)
	st := setStatus(t, gs[0])
	if gs[0].Ended() || !st.Standby || len(st.Holds) != 0 {
		t.Fatalf("gw-a after the cut: ended %v, standby %v, holds %v; want alive, on standby, holding nothing", gs[0].Ended(), st.Standby, st.Holds)
	}
	if got := metric(t, gs[0], "nftgate_gateway_faulty"); got != 1 {
		t.Errorf("gw-a after the cut: nftgate_gateway_faulty = %v, want 1", got)
	}
	// The page says so under the gateway set.
	const host = "127.0.0.1:9180"
	b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateways[0].Name()})
	b.Navigate("http://" + host + "/")
	b.Poll("the gateway set's summary tells the fault and the standby", fmt.Sprintf(
		"document.getElementById('gw-summary').textContent.includes(%q)",
		fmt.Sprintf("Faulty (link %s without carrier): on standby while a fit peer carries the traffic.", topo.Cluster[0])))
	b.Screenshot(browsertest.ArtifactDir(t, "failover"), "link-cut-standby.png")
	b.Check()
}

// TestNftgateECMPUplinkCutMovesItsMasqueradeAddress: the same three; gw-a's
// upstream link, towards its BGP peer, is cut: BFD takes its route out at
// BIRD, and gw-a (tracking the link towards its BGP peer by default)
// hands its masquerade address to a survivor, so the replies of its flows,
// which the router now sends to the other two, reach a gateway that can
// take them to the client: every flow carries on. Without tracking that
// link, gw-a would keep M1 and the replies would die at it.
func TestNftgateECMPUplinkCutMovesItsMasqueradeAddress(t *testing.T) {
	topo, cfg, _, gs := startECMP(t)
	n := testTraffic.TCP + testTraffic.UDP
	res, err := failover.FailoverBy(topo, cfg.Dst, testTraffic,
		func() (time.Time, error) { return time.Now(), topo.CutUpstream(0, false) },
		func() error {
			return failover.Replicated(topo.Gateways[1:], failover.ECMPServiceAddr, n, 30*time.Second)
		})
	t.Cleanup(func() { _ = topo.CutUpstream(0, true) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uplink cut: %s", res)
	checkKept(t, "nftgate after the uplink cut", res)
	st := setStatus(t, gs[0])
	if gs[0].Ended() || !strings.Contains(st.Fault, topo.Upstream[0]) || len(st.Holds) != 0 {
		t.Errorf("gw-a after the cut: ended %v, fault %q, holds %v; want alive, faulty for %s, holding nothing", gs[0].Ended(), st.Fault, st.Holds, topo.Upstream[0])
	}
}

// startECMP starts three nftgates behind BIRD, active/active, and waits
// until the router spreads the Service over them.
func startECMP(t *testing.T) (*failover.Topology, *failover.NftgateConfig, *bird.Router, []*failover.Nftgate) {
	t.Helper()
	topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier})
	router := startRouter(t, topo)
	gs := startNftgate(t, topo, cfg)
	if err := failover.ECMPRoutes(router, len(topo.Gateways), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return topo, cfg, router, gs
}

// setStatus is the gateway set's status as g's GET /api/v1/gateways says.
func setStatus(t *testing.T, g *failover.Nftgate) gateways.Status {
	t.Helper()
	_, body, err := g.Get("/api/v1/gateways")
	if err != nil {
		t.Fatal(err)
	}
	var st gateways.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("%s: /api/v1/gateways: %v", g.Host, err)
	}
	return st
}

// TestAnchorLinkCutHandsOver: the anchor in the same case. keepalived's
// VRRP runs on the upstream link itself: gw-b stops hearing gw-a's
// adverts there and becomes master, gw-a's instance goes to FAULT with its
// carrier, and conntrackd commits the replicas: every flow carries on.
func TestAnchorLinkCutHandsOver(t *testing.T) {
	topo := newTopology(t, failover.Options{Gateways: 2})
	a := startAnchor(t, topo, true)
	res, err := failover.FailoverBy(topo, netip.AddrPortFrom(failover.ServiceAddr, failover.ServicePort), testTraffic,
		func() (time.Time, error) {
			at := time.Now()
			return at, topo.CutUpstream(0, false)
		},
		func() error { return a.Synced(testTraffic.TCP+testTraffic.UDP, 30e9) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	checkKept(t, "the anchor after the link cut", res)
}
