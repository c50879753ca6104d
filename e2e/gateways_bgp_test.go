package e2e_test

// Several gateways: three nftgate processes, each in its own namespace,
// announce the same Service address over BGP to one BIRD router, which
// spreads the client's connections over them by ECMP with L4 hashing. The
// backends are reachable from all three; every gateway masquerades to its
// own address on the backend network, so the backend's view of a flow's
// source names the gateway that carried it.
//
//	client ── router (BIRD) ─┬─ gw1 ─┐
//	198.18.7.2      .1       ├─ gw2 ─┼─ backend (endpoints 198.18.30.10-13)
//	                         └─ gw3 ─┘

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

var (
	setClient    = netip.MustParsePrefix("198.18.7.2/24")
	setClient2   = netip.MustParsePrefix("198.18.7.3/24")
	setRouterOut = netip.MustParsePrefix("198.18.7.1/24")
	setVIP       = netip.MustParseAddr("198.19.50.1")
	setVIPPort   = netip.AddrPortFrom(setVIP, 80)
	setEndpoints = []netip.Addr{
		netip.MustParseAddr("198.18.30.10"), netip.MustParseAddr("198.18.30.11"),
		netip.MustParseAddr("198.18.30.12"), netip.MustParseAddr("198.18.30.13"),
	}
)

const setGateways = 3

// setRouterSide is the router's address towards gateway i (1-based), and
// setGatewaySide the gateway's; setBackendSide the gateway's address on
// its link to the backend, which it masquerades to.
func setRouterSide(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("198.18.%d.1/24", 10+i))
}
func setGatewaySide(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("198.18.%d.2/24", 10+i))
}
func setBackendSide(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("198.18.%d.1/24", 20+i))
}

type gatewaySet struct {
	lab                     *lab.Lab
	client, router, backend *lab.Host
	hosts                   []*lab.Host
	gws                     []*gatewaytest.Gateway
	bird                    *bird.Router
}

// newGatewaySet builds the topology, starts BIRD (with BFD at bfd, 0: none)
// and the three nftgates with the same Service, the same hash_seed, and
// extra configuration, and waits until the router has a path through each.
func newGatewaySet(t *testing.T, bfd time.Duration, extra string) *gatewaySet {
	t.Helper()
	s := newGatewaySetOf(t, setGateways, bfd, extra, nil)
	s.waitPaths(t, setGateways)
	return s
}

// newGatewaySetOf is newGatewaySet with n gateways, each with its own
// configuration section(i) (1-based; top-level keys, then sections) before
// its [bgp] section, and waits only until every BGP session is up.
func newGatewaySetOf(t *testing.T, n int, bfd time.Duration, extra string, section func(i int) string) *gatewaySet {
	t.Helper()
	l := labtest.New(t)
	s := &gatewaySet{lab: l}
	var err error
	for _, h := range []struct {
		name string
		p    **lab.Host
	}{{"client", &s.client}, {"router", &s.router}, {"backend", &s.backend}} {
		if *h.p, err = l.AddHost(h.name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Link(s.router, []netip.Prefix{setRouterOut}, s.client, []netip.Prefix{setClient, setClient2}); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.fib_multipath_hash_policy", "1"}} {
		if err := s.router.Sysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.client.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), setRouterOut.Addr()); err != nil {
		t.Fatal(err)
	}
	for _, ep := range setEndpoints {
		if err := s.backend.AddAddress("lo", netip.PrefixFrom(ep, 32)); err != nil {
			t.Fatal(err)
		}
		serveLines(t, s.backend, netip.AddrPortFrom(ep, 8080))
	}
	var neighbours []netip.Addr
	for i := 1; i <= n; i++ {
		h, err := l.AddHost(fmt.Sprintf("gw%d", i))
		if err != nil {
			t.Fatal(err)
		}
		s.hosts = append(s.hosts, h)
		if err := h.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Link(s.router, []netip.Prefix{setRouterSide(i)}, h, []netip.Prefix{setGatewaySide(i)}); err != nil {
			t.Fatal(err)
		}
		backendSide := netip.PrefixFrom(setBackendSide(i).Addr().Next(), 24)
		if _, err := l.Link(h, []netip.Prefix{setBackendSide(i)}, s.backend, []netip.Prefix{backendSide}); err != nil {
			t.Fatal(err)
		}
		if err := h.AddRoute(setClient.Masked(), setRouterSide(i).Addr()); err != nil {
			t.Fatal(err)
		}
		if err := h.AddRoute(netip.MustParsePrefix("198.18.30.0/24"), backendSide.Addr()); err != nil {
			t.Fatal(err)
		}
		// The other gateways (their channel), through the router.
		if err := h.AddRoute(netip.MustParsePrefix("198.18.8.0/21"), setRouterSide(i).Addr()); err != nil {
			t.Fatal(err)
		}
		neighbours = append(neighbours, setGatewaySide(i).Addr())
	}
	s.bird = bird.Start(t, s.router, bird.Several(setRouterOut.Addr(), edgeRouterASN, neighbours, edgeGatewayASN, bfd, 0))
	for i, h := range s.hosts {
		peer := fmt.Sprintf(`
[[bgp.peer]]
address = %q
asn = %d
hold_time = "9s"
connect_retry = "1s"
`, setRouterSide(i+1).Addr(), edgeRouterASN)
		if bfd > 0 {
			peer += fmt.Sprintf("bfd = true\nbfd_interval = %q\n", bfd.String())
		}
		own := ""
		if section != nil {
			own = section(i + 1)
		}
		cfg := filepath.Join(t.TempDir(), "config.toml")
		text := fmt.Sprintf("hash_seed = 4242\n%s\n%s\n[bgp]\nasn = %d\nrouter_id = %q\nlisten_port = -1\nrestart_deferral = \"1s\"\n%s",
			extra, own, edgeGatewayASN, setGatewaySide(i+1).Addr(), peer)
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		g := gatewaytest.NewOn(t, &lab.Topology{Lab: l, Gateway: h}, h, append([]string{"--config", cfg, "--node-name", fmt.Sprintf("gw%d", i+1)}, gatewaytest.VIPExternalIPs...)...)
		svc := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
		svc.Spec.ExternalIPs = []string{setVIP.String()}
		var eps []gatewaytest.Endpoint
		for _, ep := range setEndpoints {
			eps = append(eps, gatewaytest.Endpoint{Addr: ep.String()})
		}
		g.Write("web.yaml", svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, eps...))
		g.Start()
		s.gws = append(s.gws, g)
	}
	for i := range s.gws {
		s.bird.WaitState(t, fmt.Sprintf("gw%d", i+1), "Established", false, 30*time.Second)
	}
	return s
}

// waitPaths waits until BIRD holds n routes to the Service address (one
// per gateway announcing it).
func (s *gatewaySet) waitPaths(t *testing.T, n int) {
	t.Helper()
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		routes, err := s.bird.Routes(netip.PrefixFrom(setVIP, 32))
		if err != nil {
			return err
		}
		if len(routes) != n {
			return fmt.Errorf("BIRD has %d routes to %s, want %d", len(routes), setVIP, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// gatewayOf names the gateway (1-based) whose masquerade address the
// backend saw, 0 if none.
func gatewayOf(src netip.AddrPort) int {
	for i := 1; i <= setGateways; i++ {
		if src.Addr() == setBackendSide(i).Addr() {
			return i
		}
	}
	return 0
}

// serveLines answers every line on a connection with the address it
// listens on and the peer's address:port, and keeps the connection open
// until the peer closes it: long-lived connections and short ones alike.
func serveLines(t *testing.T, h *lab.Host, addr netip.AddrPort) {
	t.Helper()
	ln, err := h.Listen("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "%s %s\n", addr, c.RemoteAddr()); err != nil {
						return
					}
				}
			})
		}
	})
}

// lineConn is a client connection to serveLines.
type lineConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialLines(h *lab.Host, src netip.AddrPort, timeout time.Duration) (*lineConn, error) {
	d := net.Dialer{Timeout: timeout}
	if src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	}
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = d.Dial("tcp", setVIPPort.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return &lineConn{c: c, r: bufio.NewReader(c)}, nil
}

// exchange sends a line and reads the answer: the endpoint that served and
// the source it saw.
func (l *lineConn) exchange(timeout time.Duration) (endpoint string, seen netip.AddrPort, err error) {
	if err := l.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", seen, err
	}
	if _, err := fmt.Fprintln(l.c, "ping"); err != nil {
		return "", seen, err
	}
	line, err := l.r.ReadString('\n')
	if err != nil {
		return "", seen, err
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return "", seen, fmt.Errorf("answer %q", line)
	}
	seen, err = netip.ParseAddrPort(f[1])
	return f[0], seen, err
}

// once is one short connection: connect, one exchange, close.
func once(h *lab.Host, src netip.AddrPort, timeout time.Duration) (string, netip.AddrPort, error) {
	l, err := dialLines(h, src, timeout)
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	if src.Port() != 0 {
		// Reset instead of a close that would leave the fixed port in
		// TIME_WAIT: the same flow is sent again through the next gateway.
		_ = l.c.(*net.TCPConn).SetLinger(0)
	}
	defer l.c.Close()
	return l.exchange(timeout)
}

// openFlowsFrom counts the TCP flows conntrack -L lists from src that the
// drain counts open: being opened or established.
func openFlowsFrom(list string, src netip.Addr) int {
	n := 0
	for line := range strings.Lines(list) {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "tcp" {
			continue
		}
		switch f[3] {
		case "SYN_SENT", "SYN_RECV", "ESTABLISHED":
		default:
			continue
		}
		// The first src= is the original direction's: the client.
		for _, w := range f {
			if a, ok := strings.CutPrefix(w, "src="); ok {
				if a == src.String() {
					n++
				}
				break
			}
		}
	}
	return n
}

// pin makes the router send packets to the Service address (from src, or
// from anyone when src is invalid) to gateway i alone, bypassing the
// ECMP route BIRD installs: a policy rule and a table of its own.
func (s *gatewaySet) pin(t *testing.T, src netip.Addr, table, i int) {
	t.Helper()
	args := []string{"rule", "add", "to", setVIP.String() + "/32"}
	if src.IsValid() {
		args = append(args, "from", src.String()+"/32")
	}
	args = append(args, "lookup", fmt.Sprint(table), "pref", fmt.Sprint(table))
	for _, cmd := range [][]string{
		{"route", "replace", setVIP.String() + "/32", "via", setGatewaySide(i).Addr().String(), "table", fmt.Sprint(table)},
		args,
	} {
		out, err := s.router.Command(context.Background(), "ip", cmd...).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "File exists") {
			t.Fatalf("ip %s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
}

func (s *gatewaySet) unpin(t *testing.T, table int) {
	t.Helper()
	if out, err := s.router.Command(context.Background(), "ip", "rule", "del", "pref", fmt.Sprint(table)).CombinedOutput(); err != nil {
		t.Fatalf("ip rule del: %v: %s", err, out)
	}
}

// TestGatewaySetECMPAndConsistentChoice: new connections through the
// router spread over all three gateways; 1,000 flows (source ports) sent
// through each gateway in turn reach the same endpoint on every one.
func TestGatewaySetECMPAndConsistentChoice(t *testing.T) {
	s := newGatewaySet(t, 0, "")
	per := map[int]int{}
	for range 300 {
		_, seen, err := once(s.client, netip.AddrPort{}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		per[gatewayOf(seen)]++
	}
	t.Logf("300 connections through the router, per gateway: %v", per)
	for i := 1; i <= setGateways; i++ {
		if per[i] < 30 {
			t.Errorf("gateway %d carried %d of 300 connections, want at least 30 (ECMP over all three)", i, per[i])
		}
	}

	const flows = 1000
	chosen := make([][]string, setGateways+1)
	for i := 1; i <= setGateways; i++ {
		s.pin(t, netip.Addr{}, 100, i)
		chosen[i] = make([]string, flows)
		for f := range flows {
			src := netip.AddrPortFrom(setClient.Addr(), uint16(30000+f))
			ep, seen, err := once(s.client, src, 2*time.Second)
			if err != nil {
				t.Fatalf("flow %s through gateway %d: %v", src, i, err)
			}
			if g := gatewayOf(seen); g != i {
				t.Fatalf("flow %s pinned to gateway %d went through %d (%s)", src, i, g, seen)
			}
			chosen[i][f] = ep
		}
		s.unpin(t, 100)
	}
	spread, differ := map[string]int{}, 0
	for f := range flows {
		spread[chosen[1][f]]++
		if chosen[2][f] != chosen[1][f] || chosen[3][f] != chosen[1][f] {
			if differ++; differ <= 5 {
				t.Errorf("flow from port %d: endpoints %s, %s, %s through gateways 1, 2, 3", 30000+f, chosen[1][f], chosen[2][f], chosen[3][f])
			}
		}
	}
	t.Logf("%d flows, endpoints chosen: %v; %d differ between gateways", flows, spread, differ)
	if differ > 0 {
		t.Errorf("%d of %d flows reach different endpoints through different gateways", differ, flows)
	}
	if len(spread) != len(setEndpoints) {
		t.Errorf("the flows reached %d endpoints, want all %d", len(spread), len(setEndpoints))
	}
}

// attempt is one short connection of a stream.
type attempt struct {
	start, end time.Time
	err        error
	gw         int
}

// streamer opens a new short connection through the router every interval
// until stop, and records when each started and whether it failed.
type streamer struct {
	done     atomic.Int64 // connections finished so far
	results  chan []attempt
	stop     chan struct{}
	stopOnce sync.Once
	all      []attempt
}

// stream starts a streamer from h; a test that ends before finish stops it
// before the lab goes (its connections run in h's namespace).
func stream(t *testing.T, h *lab.Host, interval, timeout time.Duration) *streamer {
	s := &streamer{results: make(chan []attempt, 1), stop: make(chan struct{})}
	t.Cleanup(func() { s.finish() })
	go func() {
		var mu sync.Mutex
		var all []attempt
		var wg sync.WaitGroup
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				wg.Wait()
				s.results <- all
				return
			case <-t.C:
			}
			wg.Go(func() {
				a := attempt{start: time.Now()}
				var seen netip.AddrPort
				_, seen, a.err = once(h, netip.AddrPort{}, timeout)
				a.end = time.Now()
				a.gw = gatewayOf(seen)
				mu.Lock()
				all = append(all, a)
				mu.Unlock()
				s.done.Add(1)
			})
		}
	}()
	return s
}

// await waits until n more connections have finished.
func (s *streamer) await(t *testing.T, n int64) {
	t.Helper()
	want := s.done.Load() + n
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		if got := s.done.Load(); got < want {
			return fmt.Errorf("%d connections finished, waiting for %d", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// finish stops the stream and returns every attempt.
func (s *streamer) finish() []attempt {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.all = <-s.results
	})
	return s.all
}

// cut makes host's interfaces drop every packet both ways without taking
// them down (no carrier change the router could see): as if the box had
// lost power.
func cut(t *testing.T, h *lab.Host) {
	t.Helper()
	links, err := h.Netlink().LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var rules strings.Builder
	rules.WriteString("table netdev cut {\n")
	for _, l := range links {
		name := l.Attrs().Name
		if name == "lo" {
			continue
		}
		fmt.Fprintf(&rules, "  chain in_%[1]s { type filter hook ingress device %[1]q priority -500; policy drop; }\n", name)
		fmt.Fprintf(&rules, "  chain out_%[1]s { type filter hook egress device %[1]q priority -500; policy drop; }\n", name)
	}
	rules.WriteString("}\n")
	cmd := h.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s\n%s", err, out, rules.String())
	}
}

// TestGatewaySetKillWithBFD: kill -9 one gateway and cut its links; BFD
// takes its session down and the router stops using it; new connections
// fail (those hashed to it) only for a short gap, measured.
func TestGatewaySetKillWithBFD(t *testing.T) {
	const bfd = 200 * time.Millisecond
	s := newGatewaySet(t, bfd, "")
	for i := range s.gws {
		proto := fmt.Sprintf("gw%d", i+1)
		out, err := s.bird.Run("show bfd sessions")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, setGatewaySide(i+1).Addr().String()) {
			t.Fatalf("BIRD has no BFD session with %s: %s", proto, out)
		}
	}
	st := stream(t, s.client, 10*time.Millisecond, 500*time.Millisecond)
	st.await(t, 50)
	// The links first, then the process: no FIN of the dying process
	// reaches the router, as when a box loses power.
	killed := time.Now()
	cut(t, s.hosts[0])
	s.gws[0].Kill()
	s.bird.WaitState(t, "gw1", "Established", true, 10*time.Second)
	down := time.Since(killed)
	s.waitPaths(t, setGateways-1)
	withdrawn := time.Since(killed)
	// New connections keep being opened after the router moved.
	st.await(t, 150)
	all := st.finish()
	var first, last time.Time // of the failed attempts
	failed, total := 0, len(all)
	for _, a := range all {
		if a.err == nil {
			continue
		}
		failed++
		if first.IsZero() || a.start.Before(first) {
			first = a.start
		}
		if a.start.After(last) {
			last = a.start
		}
	}
	gap := time.Duration(0) // from the kill to the start of the last failed connection
	if failed > 0 {
		gap = last.Sub(killed)
	} else {
		first = killed
	}
	t.Logf("kill -9 and cut: BIRD's session down after %v, route through it gone after %v; %d of %d new connections failed (500ms timeout), the first started %v, the last %v after the kill (BFD %v x 3)",
		down.Round(time.Millisecond), withdrawn.Round(time.Millisecond), failed, total, first.Sub(killed).Round(time.Millisecond), gap.Round(time.Millisecond), bfd)
	// Generous bounds: the figures are logged, and measured in make bench.
	if down > 3*time.Second {
		t.Errorf("BFD took %v to take the session down, want within 3s (3 x %v and BIRD's reaction)", down, bfd)
	}
	if gap > 3*time.Second {
		t.Errorf("new connections failed until %v after the kill, want within 3s", gap)
	}
	per := map[int]int{}
	for _, a := range all {
		if a.err == nil && a.start.After(killed) {
			per[a.gw]++
		}
	}
	t.Logf("connections after the kill that succeeded, per gateway: %v", per)
	for _, a := range all {
		if a.err == nil && a.start.After(killed.Add(withdrawn)) && a.gw == 1 {
			t.Errorf("a connection went through the killed gateway after the router withdrew it")
		}
	}
}

// TestGatewaySetDrain: `nftgate drain` on one gateway of three while new
// connections arrive all the time: none fails (the router moves new ones to
// the others once the routes are withdrawn), a long-lived connection whose
// path stays on the drained gateway keeps flowing through it, and nftgate
// exits once that connection has ended, not before (at the period's end when
// a connection in flight as the routes changed left its flow open there).
func TestGatewaySetDrain(t *testing.T) {
	const drainPeriod = 20 * time.Second
	s := newGatewaySet(t, 0, fmt.Sprintf("drain_period = %q\n", drainPeriod))
	// The long-lived connection's path stays on gateway 1 whatever BGP
	// says (a policy rule in the router for its source address).
	s.pin(t, setClient2.Addr(), 101, 1)
	long, err := dialLines(s.client, netip.AddrPortFrom(setClient2.Addr(), 0), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer long.c.Close()
	var longFailed atomic.Value
	var longExchanges atomic.Int64
	longStop, longDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(longDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-longStop:
				return
			case <-tick.C:
			}
			if _, seen, err := long.exchange(2 * time.Second); err != nil || gatewayOf(seen) != 1 {
				longFailed.Store(fmt.Sprintf("%v via %s", err, seen))
				return
			}
			longExchanges.Add(1)
		}
	}()

	st := stream(t, s.client, 10*time.Millisecond, 2*time.Second)
	st.await(t, 30)
	drainStarted := time.Now()
	out, err := s.hosts[0].Command(context.Background(), gatewaytest.Binary(t), "drain", "--url", "http://127.0.0.1:9180", "--wait=false").CombinedOutput()
	if err != nil {
		t.Fatalf("nftgate drain: %v: %s", err, out)
	}
	t.Logf("nftgate drain: %s", strings.TrimSpace(string(out)))
	s.waitPaths(t, setGateways-1)
	// and the router's kernel forwards by them.
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		out, err := s.router.Command(context.Background(), "ip", "route", "show", setVIP.String()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip route show %s: %v: %s", setVIP, err, out)
		}
		if n := strings.Count(string(out), "nexthop"); n != setGateways-1 {
			return fmt.Errorf("the router's kernel has %d paths to %s: %s", n, setVIP, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	routeSeen := time.Now()
	t.Logf("the router dropped the drained gateway's route after %v", routeSeen.Sub(drainStarted).Round(time.Millisecond))
	if code, body, err := s.gws[0].Get("/readyz"); err != nil || code != 503 || !strings.HasPrefix(body, "draining: ") {
		t.Errorf("/readyz while draining: %d %q %v", code, body, err)
	}
	// New connections go on through the other two, and the long-lived
	// one through the draining gateway, which does not exit meanwhile.
	st.await(t, 100)
	want := longExchanges.Load() + 20
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if n := longExchanges.Load(); n < want && longFailed.Load() == nil {
			return fmt.Errorf("%d exchanges on the long-lived connection", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !s.gws[0].Running() {
		t.Fatalf("nftgate exited while a flow through it was open:\n%s", s.gws[0].Logs())
	}
	close(longStop)
	<-longDone
	if v := longFailed.Load(); v != nil {
		t.Errorf("the long-lived connection through the draining gateway failed: %v", v)
	}
	closed := time.Now()
	long.c.Close()
	// The drain waits for the flows it counts open in the gateway's
	// conntrack table. The long-lived connection's must end there; a
	// short one that moved off the gateway when the router's paths
	// changed may stay open in it (its backend retransmits to the
	// gateway's address, its client's reset goes the other way), and
	// then nftgate exits when drain_period ends.
	var leftover string
	if err := lab.EventuallyWithin(15*time.Second, func() error {
		if !s.gws[0].Running() {
			return nil
		}
		out, err := s.hosts[0].Command(context.Background(), "conntrack", "-L", "-d", setVIP.String()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("conntrack -L: %v: %s", err, out)
		}
		if n := openFlowsFrom(string(out), setClient2.Addr()); n > 0 {
			return fmt.Errorf("nftgate still runs, the long-lived connection's flow open:\n%s", out)
		}
		if openFlowsFrom(string(out), setClient.Addr()) == 0 {
			return fmt.Errorf("nftgate still runs with no flow open:\n%s", out)
		}
		leftover = string(out)
		return nil
	}); err != nil {
		code, state, _ := s.gws[0].Get("/readyz")
		t.Fatalf("%v; /readyz %d %q", err, code, state)
	}
	if leftover != "" {
		t.Logf("a connection that moved off the drained gateway left its flow open there:\n%s", leftover)
		if err := lab.EventuallyWithin(time.Until(drainStarted.Add(drainPeriod+5*time.Second)), func() error {
			if s.gws[0].Running() {
				return fmt.Errorf("nftgate still runs past drain_period")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("nftgate exited %v after the drain began (drain_period %v)", time.Since(drainStarted).Round(time.Millisecond), drainPeriod)
	} else {
		t.Logf("nftgate exited %v after the last flow through it closed", time.Since(closed).Round(time.Millisecond))
	}
	all := st.finish()
	// A connection in flight when the router's paths changed may have
	// moved: off the drained gateway, and between the other two (the
	// kernel's ECMP hash-threshold moves a sixth of the flows between
	// survivors when one of three paths goes). Without state sync no
	// gateway has a moved connection's state, and the backend resets it.
	// Half of those in flight at most; every other one must succeed.
	failed, moved, inFlight, per := 0, 0, 0, map[int]int{}
	for _, a := range all {
		across := !a.start.After(routeSeen) && !a.end.Before(drainStarted)
		if across {
			inFlight++
		}
		switch {
		case a.err != nil && across:
			moved++
			t.Logf("a connection in flight while the router's paths changed failed: %v", a.err)
		case a.err != nil:
			if failed++; failed <= 5 {
				t.Errorf("a new connection failed during the drain: %v", a.err)
			}
		default:
			per[a.gw]++
		}
	}
	if moved > (inFlight+1)/2 {
		t.Errorf("%d of the %d connections in flight while the router's paths changed failed; at most half may have moved", moved, inFlight)
	}
	t.Logf("%d new connections during the drain, %d failed, %d of %d in flight while the paths changed; per gateway: %v", len(all), failed, moved, inFlight, per)
	if !strings.Contains(s.gws[0].Logs(), "drained") {
		t.Errorf("no drained in the log:\n%s", s.gws[0].Logs())
	}
}
