package bgp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/internal/testing/lockedbuf"
	"github.com/vishvananda/netlink"
)

// The speaker runs in a child process (this test binary again, started
// through `ip netns exec`) so that every socket GoBGP opens, from any of
// its goroutines, is in the gateway's namespace, and so that a test can
// kill -9 it like a crashed or updated nftgate.
const speakerEnv = "NFTGATE_BGP_TEST_SPEAKER"

func TestMain(m *testing.M) {
	if path := os.Getenv(speakerEnv); path != "" {
		os.Exit(speakerChild(path))
	}
	os.Exit(m.Run())
}

// speakerChild runs a Speaker from the JSON Config in path. It reads one
// command a line on stdin, a JSON []Route to Set, "status" or "stop", and
// answers each with "ok" or "error: ..." on stdout; "status" with one line
// of JSON, a childStatus.
func speakerChild(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	// Its log goes to stderr, which the test keeps (speakerProc.Log).
	s, err := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	reg := prometheus.NewPedanticRegistry()
	if err := s.Register(reg); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ok")
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 64<<20)
	for in.Scan() {
		line := in.Text()
		if line == "stop" {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := s.Stop(ctx)
			cancel()
			reply(err)
			return 0
		}
		if line == "status" {
			b, err := json.Marshal(childStatusOf(s, reg))
			if err != nil {
				reply(err)
				continue
			}
			fmt.Println(string(b))
			continue
		}
		var routes []Route
		if err := json.Unmarshal([]byte(line), &routes); err != nil {
			reply(err)
			continue
		}
		reply(s.Set(routes))
	}
	return 0
}

// childStatus is the speaker's Status and its metrics, by series name and
// peer label ("" without one).
type childStatus struct {
	Peers   []PeerStatus                  `json:"peers"`
	Metrics map[string]map[string]float64 `json:"metrics"`
}

func childStatusOf(s *Speaker, reg prometheus.Gatherer) childStatus {
	st := childStatus{Peers: s.Status(), Metrics: map[string]map[string]float64{}}
	families, err := reg.Gather()
	if err != nil {
		return st
	}
	for _, f := range families {
		byPeer := map[string]float64{}
		for _, m := range f.GetMetric() {
			peer := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "peer" {
					peer = l.GetValue()
				}
			}
			byPeer[peer] = m.GetGauge().GetValue()
		}
		st.Metrics[f.GetName()] = byPeer
	}
	return st
}

func reply(err error) {
	if err != nil {
		fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	fmt.Println("ok")
}

// speakerProc is a speaker child process.
type speakerProc struct {
	t     testing.TB
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	done  chan struct{}
	mu    sync.Mutex
	ended bool
	log   lockedbuf.Buffer // what the speaker logs, also passed on to the test's stderr
}

// Log is what the speaker logged so far.
func (p *speakerProc) Log() string { return p.log.String() }

// startSpeaker starts a speaker with cfg in host's namespace; the test's
// cleanup kills it if it still runs.
func startSpeaker(t testing.TB, host *lab.Host, cfg Config) *speakerProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "speaker.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := host.Command(context.Background(), exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), speakerEnv+"="+path)
	p := &speakerProc{t: t, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = io.MultiWriter(os.Stderr, &p.log)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start speaker: %v", err)
	}
	p.in, p.out = in, bufio.NewScanner(outPipe)
	t.Cleanup(p.Kill)
	if err := p.await(); err != nil {
		t.Fatalf("speaker start: %v", err)
	}
	return p
}

func (p *speakerProc) await() error {
	if !p.out.Scan() {
		return fmt.Errorf("speaker ended: %v", p.out.Err())
	}
	if line := p.out.Text(); line != "ok" {
		return fmt.Errorf("speaker: %s", line)
	}
	return nil
}

// Set sends routes to the speaker and waits until its Set returned.
func (p *speakerProc) Set(routes ...Route) {
	p.t.Helper()
	b, err := json.Marshal(routes)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("speaker Set: %v", err)
	}
	if err := p.await(); err != nil {
		p.t.Fatalf("speaker Set: %v", err)
	}
}

// Status asks the speaker for its Status and metrics.
func (p *speakerProc) Status() childStatus {
	p.t.Helper()
	if _, err := io.WriteString(p.in, "status\n"); err != nil {
		p.t.Fatalf("speaker status: %v", err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("speaker ended: %v", p.out.Err())
	}
	var st childStatus
	if err := json.Unmarshal(p.out.Bytes(), &st); err != nil {
		p.t.Fatalf("speaker status %q: %v", p.out.Text(), err)
	}
	return st
}

// Stop calls the speaker's Stop (withdraw on purpose) and waits for the
// process to end.
func (p *speakerProc) Stop() {
	p.t.Helper()
	if _, err := io.WriteString(p.in, "stop\n"); err != nil {
		p.t.Fatalf("speaker Stop: %v", err)
	}
	if err := p.await(); err != nil {
		p.t.Fatalf("speaker Stop: %v", err)
	}
	p.wait()
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *speakerProc) Kill() {
	p.mu.Lock()
	ended := p.ended
	p.mu.Unlock()
	if !ended {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	p.wait()
}

func (p *speakerProc) wait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ended {
		p.ended = true
		_ = p.cmd.Wait()
	}
}

// edge is the test network: a client behind a BIRD router, the router
// peering with the gateway, where the speaker runs and an echo server
// answers on the announced addresses.
type edge struct {
	lab                     *lab.Lab
	client, router, gateway *lab.Host
}

var (
	routerGW4  = netip.MustParsePrefix("198.18.0.1/24")
	gatewayGW4 = netip.MustParsePrefix("198.18.0.2/24")
	routerCl4  = netip.MustParsePrefix("203.0.113.1/24")
	clientCl4  = netip.MustParsePrefix("203.0.113.2/24")
	routerGW6  = netip.MustParsePrefix("2001:db8::1/64")
	gatewayGW6 = netip.MustParsePrefix("2001:db8::2/64")
	routerCl6  = netip.MustParsePrefix("2001:db8:1::1/64")
	clientCl6  = netip.MustParsePrefix("2001:db8:1::2/64")
)

const (
	routerASN  = 64512
	gatewayASN = 64513
)

func newEdge(t testing.TB) *edge {
	t.Helper()
	l := labtest.New(t)
	e := &edge{lab: l}
	var err error
	for _, h := range []struct {
		name string
		p    **lab.Host
	}{{"client", &e.client}, {"router", &e.router}, {"gateway", &e.gateway}} {
		if *h.p, err = l.AddHost(h.name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Link(e.router, []netip.Prefix{routerGW4, routerGW6}, e.gateway, []netip.Prefix{gatewayGW4, gatewayGW6}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Link(e.router, []netip.Prefix{routerCl4, routerCl6}, e.client, []netip.Prefix{clientCl4, clientCl6}); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
		if err := e.router.Sysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	// The client knows only its router; the gateway reaches the client's
	// network through it too (the router learns the service addresses
	// from BGP and nothing else).
	for _, r := range []struct {
		h   *lab.Host
		dst netip.Prefix
		via netip.Prefix
	}{
		{e.client, netip.MustParsePrefix("0.0.0.0/0"), routerCl4},
		{e.client, netip.MustParsePrefix("::/0"), routerCl6},
		{e.gateway, clientCl4.Masked(), routerGW4},
		{e.gateway, clientCl6.Masked(), routerGW6},
	} {
		if err := r.h.AddRoute(r.dst, r.via.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// serve adds addr to the gateway's loopback and answers TCP echo on port
// 80 there.
func (e *edge) serve(t testing.TB, addr netip.Addr) netip.AddrPort {
	t.Helper()
	if err := e.gateway.AddAddress("lo", netip.PrefixFrom(addr, addr.BitLen())); err != nil {
		t.Fatal(err)
	}
	ap := netip.AddrPortFrom(addr, 80)
	if _, err := e.gateway.ServeEcho("tcp", ap); err != nil {
		t.Fatal(err)
	}
	return ap
}

// birdConf is the router's configuration (bird.Upstream); extra goes into
// each session.
func birdConf(extra string) string {
	return bird.Upstream(routerGW4.Addr(), routerASN, gatewayGW4.Addr(), gatewayGW6.Addr(), gatewayASN, extra)
}

// speakerConfig peers with the router over both families.
func speakerConfig() Config {
	return Config{
		ASN:      gatewayASN,
		RouterID: gatewayGW4.Addr().String(),
		Peers: []PeerConfig{
			{Address: routerGW4.Addr().String(), ASN: routerASN, HoldTime: 9 * time.Second, ConnectRetry: time.Second},
			{Address: routerGW6.Addr().String(), ASN: routerASN, HoldTime: 9 * time.Second, ConnectRetry: time.Second},
		},
	}
}

// kernelHasRoute looks prefix up in the main table of the calling
// thread's namespace (run it in Host.Do).
func kernelHasRoute(prefix netip.Prefix) error {
	family := netlink.FAMILY_V4
	if prefix.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	routes, err := netlink.RouteListFiltered(family, &netlink.Route{Dst: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}}, netlink.RT_FILTER_DST)
	if err != nil {
		return err
	}
	if len(routes) == 0 {
		return fmt.Errorf("no kernel route to %s", prefix)
	}
	return nil
}
