package failover_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/ruleset"
	"github.com/nftgate/nftgate/statesync"
)

// TestNftgateECMPMovedBeforeItsReplica: a connection opened through gw-a
// is moved by the router to gw-b before gw-b holds its replica
// (sync_batch_interval = 1s holds the replica back; in a drain the window
// is the milliseconds between a connection's first packets and BIRD's
// withdrawal). With midstream_tcp = "wait" gw-b drops the connection's
// packets until the replica is there and the client's retransmission
// carries it on; with "pickup" gw-b masquerades it afresh to its own
// address and the endpoint resets it, as every gateway did before the
// setting.
func TestNftgateECMPMovedBeforeItsReplica(t *testing.T) {
	for _, tc := range []struct {
		midstream string
		survives  bool
	}{{"wait", true}, {"pickup", false}} {
		t.Run(tc.midstream, func(t *testing.T) {
			topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
			cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier,
				SyncBatchInterval: time.Second, MidstreamTCP: tc.midstream})
			router := startRouter(t, topo)
			gs := startNftgate(t, topo, cfg)
			if err := failover.ECMPRoutes(router, len(topo.Gateways), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			waitSyncSettled(t, gs)
			stop, err := failover.ServeEcho(topo.Endpoints, failover.Endpoints, failover.EndpointPort)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()

			pinTo(t, topo, 0)
			c, err := topo.Client.DialContext(context.Background(), "tcp", cfg.Dst.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			if err := exchange(c, br, "through gw-a\n", 2*time.Second); err != nil {
				t.Fatalf("through gw-a: %v", err)
			}
			// The test is about the window before the replica: gw-b must
			// not hold it yet.
			local := netip.MustParseAddrPort(c.LocalAddr().String())
			if n, err := entries(topo.Gateways[1], local); err != nil || n != 0 {
				t.Fatalf("gw-b holds %d entries of the connection before it moved (%v): the sync was not held back", n, err)
			}
			pinTo(t, topo, 1)
			moved := time.Now()
			err = exchange(c, br, "through gw-b\n", 5*time.Second)
			took := time.Since(moved)
			n, cerr := entries(topo.Gateways[1], local)
			t.Logf("midstream_tcp = %q: the exchange after the move: %v after %v; gw-b then held %d entries of it (%v)",
				tc.midstream, err, took.Round(time.Millisecond), n, cerr)
			if tc.survives && err != nil {
				t.Errorf("the moved connection failed: %v", err)
			}
			if !tc.survives && err == nil {
				t.Errorf("the moved connection carried on, picked up mid-stream and masqueraded afresh: the test does not reach the window it is about")
			}
		})
	}
}

// pinTo routes the client's traffic to the Service address through
// gateway i only (a route in a table of the router's own, looked up
// before BGP's), replacing an earlier pin.
func pinTo(t *testing.T, topo *failover.Topology, i int) {
	t.Helper()
	vip := netip.PrefixFrom(failover.ECMPServiceAddr, 32).String()
	for _, args := range [][]string{
		{"route", "replace", vip, "via", failover.GatewayAddr(failover.UpstreamNet, i).String(), "table", "101"},
		{"rule", "add", "to", vip, "lookup", "101", "pref", "101"},
	} {
		out, err := topo.Router.Command(context.Background(), "ip", args...).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "File exists") {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
}

// exchange writes line on c and waits up to timeout for its echo.
func exchange(c net.Conn, br *bufio.Reader, line string, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, line); err != nil {
		return err
	}
	got, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line {
		return fmt.Errorf("echo %q for %q", got, line)
	}
	return nil
}

// entries counts h's conntrack entries of the client's connection from
// local.
func entries(h *lab.Host, local netip.AddrPort) (int, error) {
	out, err := listConn(h, local)
	return strings.Count(out, "\n"), err
}

// listConn is h's conntrack listing of the TCP entries from the client's
// local address and port.
func listConn(h *lab.Host, local netip.AddrPort) (string, error) {
	out, err := h.Command(context.Background(), "conntrack", "-L", "-p", "tcp",
		"-s", local.Addr().String(), "--sport", fmt.Sprint(local.Port())).Output()
	if err != nil {
		return "", fmt.Errorf("%s: conntrack -L: %w", h, err)
	}
	return string(out), nil
}

// TestNftgateGivesUpWaitingForAReplicaThatNeverComes: a connection's
// gateway fails within the sync's lag (sync_batch_interval = 1s holds the
// replica back; the gateway is failed right after the connection's first
// exchange), so no replica ever comes. The survivor drops the client's
// packets for midstream_tcp_wait (2 s here), then picks the next one up.
// Active/backup, one masquerade address that moves with the Service
// address and the client's port kept (masquerade_ports_by_cpu = false):
// picked up, it is the endpoint's connection again, and the line comes
// back. Active/active, three gateways: the survivor that took over the
// failed gateway's masquerade address (its successor) masquerades it to
// that address, the client's port kept, and the line comes back; so does
// the other survivor with state sync, whose pick-up's entry the sync
// carries to the successor, where the endpoint's answers are dropped until
// it comes (counted there; without that drop, mutation, the answer made an
// entry of its own there and the connection hung). Without state sync the other
// survivor masquerades it to its own address, the endpoint resets it, and
// the client learns at once. Without the bound the connection hangs
// either way; without the map of the dead gateway's addresses (mutation)
// the endpoint resets it at both survivors.
//
// Active/backup with masquerade ports by CPU (the default): the client
// opens the connection on one CPU from a port in that CPU's share, so its
// gateway keeps the port (checked), and sends the line after the failure on
// a CPU of another group, whose share does not hold it (on the path between
// namespaces a packet stays on the CPU that sent it). Picked up in that
// share, the connection would be masqueraded to another port and reset
// (mutation: 5 of 5 runs); picked up without a share, as it is, it keeps
// its port and carries on.
func TestNftgateGivesUpWaitingForAReplicaThatNeverComes(t *testing.T) {
	const wait = 2 * time.Second
	for _, tc := range []struct {
		name       string
		ecmp       bool
		reset      bool
		portsByCPU bool
		// successor: in active/active, the survivor the client's
		// packets reach after the failure is the one that took over
		// the failed gateway's masquerade address.
		successor bool
		// noSync: state_sync = false, hence midstream_tcp = "pickup":
		// the survivor picks the connection up at once.
		noSync bool
	}{
		{name: "active-backup"},
		{name: "active-backup-ports-by-cpu", portsByCPU: true},
		{name: "active-active-successor", ecmp: true, successor: true},
		{name: "active-active-other", ecmp: true},
		{name: "active-active-no-sync-successor", ecmp: true, successor: true, noSync: true},
		{name: "active-active-no-sync-other", ecmp: true, reset: true, noSync: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// With ports by CPU: the connection opened on CPU open, the
			// line after the failure sent on CPU after, of another group.
			var open, after, groups int
			if tc.portsByCPU {
				var ok bool
				if open, after, groups, ok = cpusOfTwoGroups(t); !ok {
					t.Skip("one CPU: no ports by CPU")
				}
			}
			o := failover.Options{Gateways: 2}
			if tc.ecmp {
				o = failover.Options{Gateways: 3, Router: true}
			}
			topo := newTopology(t, o)
			no := failover.NftgateOptions{ECMP: tc.ecmp, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier,
				SyncBatchInterval: time.Second, MidstreamTCPWait: wait, PortsByCPUOff: !tc.portsByCPU}
			if tc.noSync {
				no.NoStateSync, no.SyncBatchInterval, no.MidstreamTCPWait = true, 0, 0
			}
			cfg := nftgateConfig(t, topo, no)
			gs := startNftgate(t, topo, cfg)
			origin, survivor := routeThroughOne(t, topo, gs, tc.ecmp)
			var c *net.TCPConn
			var err error
			if tc.portsByCPU {
				// A first connection has the client resolve the
				// Service address (ARP, answered by nftgate's process,
				// which would send the queued SYN on its own CPU).
				first, err := dialLine(topo.Client, cfg.Dst, "first\n")
				if err != nil {
					t.Fatal(err)
				}
				first.Close()
				c, err = dialLineOnCPU(topo.Client, cfg.Dst, open, ruleset.GroupPorts(open&(groups-1), groups).Min+20000, "hello\n")
			} else {
				c, err = dialLine(topo.Client, cfg.Dst, "hello\n")
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.portsByCPU {
				local := netip.MustParseAddrPort(c.LocalAddr().String())
				if port, err := masqueradePort(topo.Gateways[origin], local); err != nil || port != local.Port() {
					t.Fatalf("the connection's gateway masqueraded it to port %d (%v), want the client's %d: the test's premise (the SYN on CPU %d) failed", port, err, local.Port(), open)
				}
			}
			failed, err := topo.Fail(origin)
			if err != nil {
				t.Fatal(err)
			}
			successor := -1
			if tc.ecmp {
				successor = waitSuccessor(t, gs, origin)
				if survivor = successor; !tc.successor {
					survivor = 3 - origin - successor
				}
				pinTo(t, topo, survivor)
			}
			local := netip.MustParseAddrPort(c.LocalAddr().String())
			if n, err := entries(topo.Gateways[survivor], local); err != nil || n != 0 {
				t.Fatalf("the survivor holds %d entries of the connection when its gateway failed (%v): the sync was not held back", n, err)
			}
			_ = c.SetDeadline(time.Now().Add(wait + 20*time.Second))
			if tc.portsByCPU {
				// CPU 1 kept busy until the line is back: an idle CPU's
				// timers (the client's retransmissions) may expire on
				// another CPU.
				busy := make(chan struct{})
				defer close(busy)
				go onCPU(after, func() error {
					for {
						select {
						case <-busy:
							return nil
						default:
						}
					}
				})
			}
			if err := onCPU(after, func() error { _, err := io.WriteString(c, "after\n"); return err }); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, len("after\n"))
			_, err = io.ReadFull(c, buf)
			took := time.Since(failed)
			t.Logf("the line after the failure: %v after %v (%q)", err, took.Round(time.Millisecond), buf)
			switch {
			case tc.reset && !errors.Is(err, syscall.ECONNRESET):
				t.Errorf("the connection ended by %v, want a reset by its endpoint once the survivor picked it up", err)
			case !tc.reset && err != nil:
				t.Errorf("the connection ended by %v, want it carried on, picked up with its masquerade address and port", err)
			case !tc.reset && string(buf) != "after\n":
				t.Errorf("read back %q, want %q", buf, "after\n")
			}
			if tc.ecmp {
				// The successor masquerades pickups to the one
				// failed gateway's address it holds; the other, with
				// state sync, to the same address held by the successor,
				// without it to its own.
				want := 0.0
				if tc.successor || !tc.noSync {
					want = 1
				}
				if got := metric(t, gs[survivor], "nftgate_midstream_homes_addresses"); got != want {
					t.Errorf("the survivor's nftgate_midstream_homes_addresses = %v, want %v", got, want)
				}
				// And GET /api/v1/gateways says which.
				wantHomes := `{"addresses":[],"held":[]}`
				switch {
				case tc.successor:
					wantHomes = fmt.Sprintf(`{"dead":%q,"addresses":[%q],"held":[%[2]q]}`, failover.GatewayNames[origin], failover.MasqueradeAddr(origin))
				case !tc.noSync:
					wantHomes = fmt.Sprintf(`{"dead":%q,"addresses":[%q],"held":[]}`, failover.GatewayNames[origin], failover.MasqueradeAddr(origin))
				}
				wantGatewaysField(t, gs[survivor], "midstreamHomes", wantHomes)
				if !tc.successor && !tc.noSync {
					// The successor held the endpoint's answers back
					// until the pick-up's replica came.
					waitStrayReplies(t, gs[successor])
				}
				if tc.successor == tc.noSync {
					// The page says it under the gateway set.
					const host = "127.0.0.1:9180"
					b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateways[survivor].Name()})
					b.Navigate("http://" + host + "/")
					where, shot := "held here", "midstream-homes.png"
					if !tc.successor {
						where, shot = "held by peers, which the state sync tells", "midstream-homes-synced.png"
					}
					say := fmt.Sprintf("Connections picked up in mid-stream are masqueraded to %s's %s (dead, %s).",
						failover.GatewayNames[origin], failover.MasqueradeAddr(origin), where)
					b.Poll("the gateway set's summary names the dead gateway's address", fmt.Sprintf(
						"document.getElementById('gw-summary').textContent.endsWith(%q)", say))
					b.Screenshot(browsertest.ArtifactDir(t, "failover"), shot)
					b.Check()
				}
			}
			if tc.noSync {
				return
			}
			if took < wait {
				t.Errorf("the connection ended its wait after %v, before midstream_tcp_wait (%v)", took, wait)
			}
			for outcome, want := range map[string]float64{"waited": 1, "given_up": 1} {
				if got := midstreamMetric(t, gs[survivor], outcome); got != want {
					t.Errorf("the survivor's nftgate_midstream_tcp_connections_total{outcome=%q} = %v, want %v", outcome, got, want)
				}
			}
		})
	}
}

// TestNftgateGivenUpConnectionsCarryOnAtEverySurvivor: many connections
// whose gateway failed within the sync's lag (sync_batch_interval = 1s
// holds their replicas back), spread by the router's hash over both
// survivors once the gateway is gone. With state sync each survivor gives
// up the ones it got after midstream_tcp_wait and masquerades them to the
// failed gateway's address, which the successor holds; the sync carries
// the other survivor's pick-ups to the successor, whose stray-replies
// chain drops the endpoint's answers until they are there. Every
// connection carries on. Mutations: the map holding only the addresses
// held here (as before pick-ups at the other survivors), the other
// survivor's connections were reset; without stray-replies they hung.
func TestNftgateGivenUpConnectionsCarryOnAtEverySurvivor(t *testing.T) {
	const n, wait, origin = 32, 2 * time.Second, 0
	topo := newTopology(t, failover.Options{Gateways: 3, Router: true})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{ECMP: true, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier,
		SyncBatchInterval: time.Second, MidstreamTCPWait: wait, PortsByCPUOff: true})
	gs := startNftgate(t, topo, cfg)
	router := startRouter(t, topo)
	if err := failover.ECMPRoutes(router, len(topo.Gateways), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	pinTo(t, topo, origin)
	waitSyncSettled(t, gs)
	serveSteps(t, topo)
	conns := make([]*net.TCPConn, n)
	for i := range conns {
		c, err := dialLine(topo.Client, cfg.Dst, "hello\n")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	failed, err := topo.Fail(origin)
	if err != nil {
		t.Fatal(err)
	}
	successor := waitSuccessor(t, gs, origin)
	other := 3 - origin - successor
	for _, s := range []int{successor, other} {
		for _, c := range conns {
			if k, err := entries(topo.Gateways[s], netip.MustParseAddrPort(c.LocalAddr().String())); err != nil || k != 0 {
				t.Fatalf("%s holds %d entries of a connection when its gateway failed (%v): the sync was not held back",
					failover.GatewayNames[s], k, err)
			}
		}
	}
	unpin(t, topo)
	type outcome struct {
		err  error
		took time.Duration
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Room for a pick-up that loses a packet more (each costs
			// the client a retransmission, doubling).
			_ = c.SetDeadline(time.Now().Add(wait + 40*time.Second))
			buf := make([]byte, len("after\n"))
			_, err := io.WriteString(c, "after\n")
			if err == nil {
				_, err = io.ReadFull(c, buf)
			}
			if err == nil && string(buf) != "after\n" {
				err = fmt.Errorf("read back %q", buf)
			}
			out[i] = outcome{err, time.Since(failed)}
		}()
	}
	wg.Wait()
	var kept []time.Duration
	ends := map[string]int{}
	for _, o := range out {
		switch {
		case o.err == nil:
			kept = append(kept, o.took)
		case errors.Is(o.err, syscall.ECONNRESET):
			ends["reset"]++
		case errors.Is(o.err, os.ErrDeadlineExceeded):
			ends["hung"]++
		default:
			ends[o.err.Error()]++
		}
	}
	slices.Sort(kept)
	given := map[string]float64{}
	for _, s := range []int{successor, other} {
		given[failover.GatewayNames[s]] = midstreamMetric(t, gs[s], "given_up")
	}
	t.Logf("%d connections, given up at %s (the successor) %v, at %s %v; carried on: %d (%v to %v after the failure); ended otherwise: %v",
		n, failover.GatewayNames[successor], given[failover.GatewayNames[successor]], failover.GatewayNames[other], given[failover.GatewayNames[other]],
		len(kept), first(kept).Round(time.Millisecond), last(kept).Round(time.Millisecond), ends)
	if given[failover.GatewayNames[successor]] == 0 || given[failover.GatewayNames[other]] == 0 {
		t.Errorf("connections given up per survivor %v: the router's hash did not spread them over both, the test does not reach the other survivor", given)
	}
	if len(kept) != n {
		t.Errorf("%d of %d connections carried on (the others: %v), want every one", len(kept), n, ends)
	}
	waitStrayReplies(t, gs[successor])
}

// TestNftgateWaitsLessWhileAPeerIsDead: midstream_tcp_wait = 10s (for a
// live peer's replica whose events were lost), midstream_tcp_wait_peer_dead
// = 2s. A connection whose gateway failed within the sync's lag
// (sync_batch_interval = 1s holds its replica back) reaches a survivor,
// which gives it up after the shorter wait, picks it up, and it carries
// on: active/backup and active/active, the line written once the survivor
// knows the gateway is dead; and active/active with the line written at
// once (dead_after = 30 heartbeats, 3 s, the window), so that the wait
// began before the death was known and is shortened when it is. The
// survivor's nftgate_midstream_tcp_wait_seconds, GET /api/v1/gateways and
// its page tell the wait in force. Mutation: the flag of a dead peer never
// written, each connection waited the 10 s (and the client's
// retransmission after, at 12.6 s).
func TestNftgateWaitsLessWhileAPeerIsDead(t *testing.T) {
	const wait, short = 10 * time.Second, 2 * time.Second
	for _, tc := range []struct {
		name   string
		ecmp   bool
		before bool // the line written before the survivor knows
	}{
		{name: "active-backup"},
		{name: "active-active", ecmp: true},
		{name: "active-active-before-the-death-is-known", ecmp: true, before: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := failover.Options{Gateways: 2}
			if tc.ecmp {
				o = failover.Options{Gateways: 3, Router: true}
			}
			topo := newTopology(t, o)
			no := failover.NftgateOptions{ECMP: tc.ecmp, DeadAfter: testDeadAfter, BFDMultiplier: testBFDMultiplier,
				SyncBatchInterval: time.Second, MidstreamTCPWait: wait, MidstreamTCPWaitPeerDead: short, PortsByCPUOff: true}
			if tc.before {
				no.DeadAfter = 30
			}
			cfg := nftgateConfig(t, topo, no)
			gs := startNftgate(t, topo, cfg)
			origin, survivor := routeThroughOne(t, topo, gs, tc.ecmp)
			c, err := dialLine(topo.Client, cfg.Dst, "hello\n")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := metric(t, gs[survivor], "nftgate_midstream_tcp_wait_seconds"); got != wait.Seconds() {
				t.Errorf("every gateway alive: the survivor's nftgate_midstream_tcp_wait_seconds = %v, want %v", got, wait.Seconds())
			}
			if _, err := topo.Fail(origin); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.before:
				pinTo(t, topo, survivor)
				// The premise: the survivor does not know yet.
				if got := metric(t, gs[survivor], "nftgate_midstream_tcp_wait_seconds"); got != wait.Seconds() {
					t.Fatalf("the survivor knew the death before the line was written (wait %vs): the test's premise failed", got)
				}
			case tc.ecmp:
				survivor = waitSuccessor(t, gs, origin)
				pinTo(t, topo, survivor)
			default:
				if err := lab.EventuallyWithin(20*time.Second, func() error {
					h, err := gs[survivor].Holds()
					if err == nil && !slices.Contains(h, cfg.Dst.Addr()) {
						err = fmt.Errorf("%s does not hold %v", failover.GatewayNames[survivor], cfg.Dst.Addr())
					}
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			local := netip.MustParseAddrPort(c.LocalAddr().String())
			if n, err := entries(topo.Gateways[survivor], local); err != nil || n != 0 {
				t.Fatalf("the survivor holds %d entries of the connection (%v): the sync was not held back", n, err)
			}
			_ = c.SetDeadline(time.Now().Add(wait + 20*time.Second))
			wrote := time.Now()
			buf := make([]byte, len("after\n"))
			_, err = io.WriteString(c, "after\n")
			if err == nil {
				_, err = io.ReadFull(c, buf)
			}
			took := time.Since(wrote)
			t.Logf("the line after the failure: %v, %v after it was written (%q)", err, took.Round(time.Millisecond), buf)
			if err != nil || string(buf) != "after\n" {
				t.Fatalf("the connection ended by %v (read back %q), want it carried on", err, buf)
			}
			if took < short || took >= wait {
				t.Errorf("the line came back %v after it was written, want after midstream_tcp_wait_peer_dead (%v) and before midstream_tcp_wait (%v)", took, short, wait)
			}
			for _, outcome := range []string{"waited", "given_up"} {
				waitMetric(t, gs[survivor], fmt.Sprintf("nftgate_midstream_tcp_connections_total{outcome=%q}", outcome), 1)
			}
			if got := metric(t, gs[survivor], "nftgate_midstream_tcp_wait_seconds"); got != short.Seconds() {
				t.Errorf("a peer dead: the survivor's nftgate_midstream_tcp_wait_seconds = %v, want %v", got, short.Seconds())
			}
			wantGatewaysField(t, gs[survivor], "midstreamTCPWait", fmt.Sprintf(`{"wait":"2s","peersDead":[%q]}`, failover.GatewayNames[origin]))
			if tc.name == "active-active" {
				// The page says it under the gateway set.
				const host = "127.0.0.1:9180"
				b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateways[survivor].Name()})
				b.Navigate("http://" + host + "/")
				b.Poll("the gateway set's summary tells the shorter wait", fmt.Sprintf(
					"document.getElementById('gw-summary').textContent.endsWith(%q)",
					fmt.Sprintf("Connections picked up in mid-stream wait 2s for their replicas while %s is dead.", failover.GatewayNames[origin])))
				b.Screenshot(browsertest.ArtifactDir(t, "failover"), "midstream-wait-peer-dead.png")
				b.Check()
			}
		})
	}
}

// routeThroughOne has the client's connections go through one gateway,
// the origin, and serves the steps: behind the router (ecmp) pinned to
// gateway 0, the survivor then 1 (the tests choose); in active/backup the
// holder, the survivor the other.
func routeThroughOne(t *testing.T, topo *failover.Topology, gs []*failover.Nftgate, ecmp bool) (origin, survivor int) {
	t.Helper()
	origin, survivor = 0, 1
	if ecmp {
		router := startRouter(t, topo)
		if err := failover.ECMPRoutes(router, len(topo.Gateways), 30*time.Second); err != nil {
			t.Fatal(err)
		}
		pinTo(t, topo, origin)
	} else {
		origin = waitHolder(t, gs)
		survivor = 1 - origin
	}
	waitSyncSettled(t, gs)
	serveSteps(t, topo)
	return origin, survivor
}

// waitSyncSettled waits until every gateway's sync with each peer is
// settled: up, the full resyncs of the start done both ways, nothing
// queued or unacknowledged. Until then a connection opened now may reach a
// peer at once (the updates queued during a resync follow it), where the
// tests need it held back by the batch interval. Without state sync there
// is nothing to wait for.
func waitSyncSettled(t *testing.T, gs []*failover.Nftgate) {
	t.Helper()
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		for _, g := range gs {
			code, body, err := g.Get("/api/v1/statesync")
			if err == nil && code == http.StatusNotFound {
				continue
			}
			var st statesync.Status
			if err == nil && code == http.StatusOK {
				err = json.Unmarshal([]byte(body), &st)
			} else if err == nil {
				err = fmt.Errorf("%s: GET /api/v1/statesync: %d", g.Host, code)
			}
			if err != nil {
				return err
			}
			if len(st.Peers) != len(gs)-1 {
				return fmt.Errorf("%s syncs with %d peers, want %d", g.Host, len(st.Peers), len(gs)-1)
			}
			for _, p := range st.Peers {
				if !p.Up || p.Resyncing || !p.ResyncDone || p.Queue != 0 || p.Unacked != 0 {
					return fmt.Errorf("%s's sync with %s not settled: %+v", g.Host, p.Name, p)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// wantGatewaysField checks field of g's GET /api/v1/gateways, compacted.
func wantGatewaysField(t *testing.T, g *failover.Nftgate, field, want string) {
	t.Helper()
	var v map[string]json.RawMessage
	code, body, err := g.Get("/api/v1/gateways")
	if err == nil {
		err = json.Unmarshal([]byte(body), &v)
	}
	var got bytes.Buffer
	if err == nil {
		err = json.Compact(&got, v[field])
	}
	if err != nil || code != 200 || got.String() != want {
		t.Errorf("%s's GET /api/v1/gateways: %d %v: %s %s, want %s", g.Host, code, err, field, got.String(), want)
	}
}

// unpin removes pinTo's pin: the router's multipath route again.
func unpin(t *testing.T, topo *failover.Topology) {
	t.Helper()
	vip := netip.PrefixFrom(failover.ECMPServiceAddr, 32).String()
	if out, err := topo.Router.Command(context.Background(), "ip", "rule", "del", "to", vip, "lookup", "101", "pref", "101").CombinedOutput(); err != nil {
		t.Fatalf("ip rule del: %v: %s", err, out)
	}
}

// first and last are a sorted slice's ends (zero when empty).
func first(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[0]
}

func last(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)-1]
}

// waitSuccessor waits until a gateway of gs other than failed holds
// failed's masquerade address, and returns it.
func waitSuccessor(t *testing.T, gs []*failover.Nftgate, failed int) int {
	t.Helper()
	successor := -1
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		for i, g := range gs {
			if i == failed {
				continue
			}
			h, err := g.Holds()
			if err != nil {
				return err
			}
			if slices.Contains(h, failover.MasqueradeAddr(failed)) {
				successor = i
				return nil
			}
		}
		return fmt.Errorf("no survivor holds %v", failover.MasqueradeAddr(failed))
	}); err != nil {
		t.Fatal(err)
	}
	return successor
}

// dialLineOnCPU is dialLine from local port port, the connection opened
// on CPU cpu (its SYN sent there).
func dialLineOnCPU(client *lab.Host, dst netip.AddrPort, cpu int, port uint16, line string) (*net.TCPConn, error) {
	var c net.Conn
	err := client.Do(func() error {
		return onCPU(cpu, func() (err error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{Port: int(port)}, Timeout: 5 * time.Second}
			c, err = d.Dial("tcp4", dst.String())
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return firstLine(c.(*net.TCPConn), line)
}

// cpusOfTwoGroups picks two of the CPUs the test may run on whose
// masquerade port groups differ (nftgate, in the same CPU set, has groups
// of them); ok is false when there is one group.
func cpusOfTwoGroups(t *testing.T) (a, b, groups int, ok bool) {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	groups = ruleset.MasqueradePortGroupsFor(runtime.NumCPU())
	a = -1
	for cpu := range 1024 {
		switch {
		case !set.IsSet(cpu):
		case a < 0:
			a = cpu
		case cpu&(groups-1) != a&(groups-1):
			return a, cpu, groups, true
		}
	}
	return 0, 0, groups, false
}

// onCPU runs fn on an OS thread bound to CPU cpu, and gives the thread its
// CPUs back after.
func onCPU(cpu int, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		return err
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("bind to CPU %d: %w", cpu, err)
	}
	defer unix.SchedSetaffinity(0, &was)
	return fn()
}

// masqueradePort is the port h masqueraded the client's connection from
// local to (its entry's reply destination port).
func masqueradePort(h *lab.Host, local netip.AddrPort) (uint16, error) {
	out, err := listConn(h, local)
	if err != nil {
		return 0, err
	}
	ports := regexp.MustCompile(`dport=(\d+)`).FindAllStringSubmatch(out, -1)
	if len(ports) != 2 {
		return 0, fmt.Errorf("%s: want one entry of the connection: %s", h, out)
	}
	port, err := strconv.ParseUint(ports[1][1], 10, 16)
	return uint16(port), err
}

// midstreamMetric reads g's count of the connections that waited for
// their replica, of outcome.
func midstreamMetric(t *testing.T, g *failover.Nftgate, outcome string) float64 {
	t.Helper()
	return metric(t, g, fmt.Sprintf("nftgate_midstream_tcp_connections_total{outcome=%q}", outcome))
}

// metric is the value of series (name and labels) in g's /metrics.
func metric(t *testing.T, g *failover.Nftgate, series string) float64 {
	t.Helper()
	v, err := metricValue(g, series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// metricValue is series' value in g's /metrics.
func metricValue(g *failover.Nftgate, series string) (float64, error) {
	code, body, err := g.Get("/metrics")
	if err != nil || code != 200 {
		return 0, fmt.Errorf("GET /metrics: %d %v", code, err)
	}
	prefix := series + " "
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s's /metrics", series, g.Host)
}

// waitMetric waits until series reads want in g's /metrics (the counters
// are read in the background, so a scrape may serve an older reading).
func waitMetric(t *testing.T, g *failover.Nftgate, series string, want float64) {
	t.Helper()
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		v, err := metricValue(g, series)
		if err == nil && v != want {
			err = fmt.Errorf("%s's %s = %v, want %v", g.Host, series, v, want)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
}

// waitStrayReplies waits until g counts a stray reply dropped (the
// counters are read in the background, so a scrape may serve an older
// reading).
func waitStrayReplies(t *testing.T, g *failover.Nftgate) {
	t.Helper()
	const series = "nftgate_midstream_stray_replies_dropped_total"
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		v, err := metricValue(g, series)
		if err == nil && v < 1 {
			err = fmt.Errorf("%s = %v", series, v)
		}
		return err
	}); err != nil {
		t.Errorf("the successor dropped no answer to the other survivor's pick-up: %v", err)
	}
}
