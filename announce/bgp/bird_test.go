package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

var (
	service4 = netip.MustParseAddr("198.19.0.1")
	service6 = netip.MustParseAddr("2001:db8:ff::1")
)

// The router learns the gateway's service addresses from the speaker,
// installs them in its kernel, and the client behind it reaches the
// gateway; a withdrawn address leaves the router's table within a second,
// and comes back when announced again.
func TestBIRDLearnsAndForgetsServiceAddresses(t *testing.T) {
	e := newEdge(t)
	b := bird.Start(t, e.router, birdConf(""))
	sp := startSpeaker(t, e.gateway, speakerConfig())
	for _, svc := range []netip.Addr{service4, service6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[svc.Is4()], func(t *testing.T) {
			dst := e.serve(t, svc)
			prefix := netip.PrefixFrom(svc, svc.BitLen())
			protocol := map[bool]string{true: "gw4", false: "gw6"}[svc.Is4()]
			sp.Set(HostRoute(svc, ""))
			b.WaitState(t, protocol, "Established", false, 30*time.Second)
			took := b.WaitRoute(t, prefix, true, 30*time.Second)
			t.Logf("%s in BIRD %v after Set", prefix, took)
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				return e.router.Do(func() error { return kernelHasRoute(prefix) })
			}); err != nil {
				t.Fatal(err)
			}
			rep, err := e.client.Dial("tcp", dst, lab.DialOpts{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatalf("client to %s through the router: %v", dst, err)
			}
			if rep.Backend != dst.String() {
				t.Fatalf("answered by %s, want the gateway's %s", rep.Backend, dst)
			}

			start := time.Now()
			sp.Set()
			b.WaitRoute(t, prefix, false, 5*time.Second)
			took = time.Since(start)
			t.Logf("withdrawal of %s reached BIRD in %v", prefix, took)
			if took > time.Second {
				t.Errorf("withdrawal took %v, want within 1s", took)
			}
			sp.Set(HostRoute(svc, ""))
			b.WaitRoute(t, prefix, true, 5*time.Second)
			// BIRD's table first, then its export into the router's
			// kernel: the client's packets need the latter.
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				return e.router.Do(func() error { return kernelHasRoute(prefix) })
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.client.Dial("tcp", dst, lab.DialOpts{Timeout: 2 * time.Second}); err != nil {
				t.Fatalf("client after re-announcement: %v", err)
			}
			sp.Set()
			b.WaitRoute(t, prefix, false, 5*time.Second)
		})
	}
}

// kill -9 of the speaker's process and a new one in its place: the router
// keeps the routes (stale, graceful restart) while the session is down,
// the new speaker refreshes them, and a client's connections never fail.
func TestRestartKeepsRoutesAndTraffic(t *testing.T) {
	for _, svc := range []netip.Addr{service4, service6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[svc.Is4()], func(t *testing.T) {
			e := newEdge(t)
			b := bird.Start(t, e.router, birdConf(""))
			dst := e.serve(t, svc)
			prefix := netip.PrefixFrom(svc, svc.BitLen())
			protocol := map[bool]string{true: "gw4", false: "gw6"}[svc.Is4()]
			sp := startSpeaker(t, e.gateway, speakerConfig())
			sp.Set(HostRoute(svc, ""))
			b.WaitState(t, protocol, "Established", false, 30*time.Second)
			b.WaitRoute(t, prefix, true, 10*time.Second)

			// A client connects over and over until told to stop.
			stop := make(chan struct{})
			type result struct {
				n    int
				errs []error
			}
			done := make(chan result)
			go func(stop <-chan struct{}) {
				var r result
				for {
					select {
					case <-stop:
						done <- r
						return
					default:
					}
					if _, err := e.client.Dial("tcp", dst, lab.DialOpts{Timeout: time.Second}); err != nil {
						r.errs = append(r.errs, err)
					}
					r.n++
				}
			}(stop)
			var once sync.Once
			var r result
			stopClient := func() result {
				once.Do(func() {
					close(stop)
					r = <-done
				})
				return r
			}
			defer stopClient()

			sp.Kill()
			// The router sees the session go and keeps the route.
			b.WaitState(t, protocol, "Established", true, 30*time.Second)
			if has, err := b.HasRoute(prefix); err != nil || !has {
				t.Fatalf("after kill -9, while the session is down: route %s in BIRD %v (%v), want kept", prefix, has, err)
			}
			if err := e.router.Do(func() error { return kernelHasRoute(prefix) }); err != nil {
				t.Fatalf("after kill -9: the router's kernel lost the route: %v", err)
			}
			out, _ := b.Run("show route all " + prefix.String())
			t.Logf("while the speaker is gone:\n%s", out)

			sp2 := startSpeaker(t, e.gateway, speakerConfig())
			sp2.Set(HostRoute(svc, ""))
			b.WaitState(t, protocol, "Established", false, 30*time.Second)
			// End-of-RIB received: BIRD ends its graceful restart and
			// keeps the refreshed route.
			if err := lab.EventuallyWithin(15*time.Second, func() error {
				out, err := b.Run("show protocols all " + protocol)
				if err != nil {
					return err
				}
				if strings.Contains(out, "Neighbor graceful restart active") || strings.Contains(out, "stale") {
					return fmt.Errorf("graceful restart still running: %s", out)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if has, err := b.HasRoute(prefix); err != nil || !has {
				t.Fatalf("after the restart: route %s in BIRD %v (%v)", prefix, has, err)
			}
			r = stopClient()
			t.Logf("%d connections during kill -9 and restart, %d failed", r.n, len(r.errs))
			if len(r.errs) > 0 {
				t.Errorf("connections failed during the restart: %v", r.errs[0])
			}
			if r.n < 10 {
				t.Errorf("only %d connections during the restart", r.n)
			}
		})
	}
}

// A restarted speaker whose first sync takes a while (a cluster to list,
// the ruleset to program) must not end the peer's graceful restart before
// it holds that sync's routes: the router keeps every route meanwhile, and
// the session opens with the routes, then End-of-RIB.
func TestRestartWithSlowFirstSyncKeepsRoutes(t *testing.T) {
	e := newEdge(t)
	b := bird.Start(t, e.router, birdConf(""))
	prefix := netip.PrefixFrom(service4, 32)
	sp := startSpeaker(t, e.gateway, speakerConfig())
	sp.Set(HostRoute(service4, ""))
	b.WaitState(t, "gw4", "Established", false, 30*time.Second)
	b.WaitRoute(t, prefix, true, 10*time.Second)
	sp.Kill()
	b.WaitState(t, "gw4", "Established", true, 30*time.Second)

	// Watch BIRD's table from here to the end: the route must never go.
	var lost atomic.Int32
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if has, err := b.HasRoute(prefix); err == nil && !has {
				lost.Add(1)
			}
		}
	}()
	defer func() { close(stop); <-watched }()

	sp2 := startSpeaker(t, e.gateway, speakerConfig())
	// No Set yet: the first sync is still being built. Give a session
	// the time it would need to open (BIRD and the speaker retry every
	// second) and the peers' End-of-RIB to cross.
	err := lab.EventuallyWithin(4*time.Second, func() error {
		if st, err := b.ProtocolState("gw4"); err != nil || st != "Established" {
			return fmt.Errorf("session %s (%v)", st, err)
		}
		return nil
	})
	if err == nil {
		t.Errorf("a session opened before the first Set")
	}
	sp2.Set(HostRoute(service4, ""))
	b.WaitState(t, "gw4", "Established", false, 30*time.Second)
	if err := lab.EventuallyWithin(15*time.Second, func() error {
		out, err := b.Run("show protocols all gw4")
		if err != nil {
			return err
		}
		if strings.Contains(out, "Neighbor graceful restart active") {
			return fmt.Errorf("graceful restart still running")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b.WaitRoute(t, prefix, true, 10*time.Second)
	if n := lost.Load(); n > 0 {
		t.Errorf("BIRD lost %s in %d polls between the restart and the first sync", prefix, n)
	}
}

// A withdrawal on purpose (Stop) takes the routes away at once; graceful
// restart is for restarts only.
func TestStopWithdraws(t *testing.T) {
	e := newEdge(t)
	b := bird.Start(t, e.router, birdConf(""))
	sp := startSpeaker(t, e.gateway, speakerConfig())
	prefix := netip.PrefixFrom(service4, 32)
	sp.Set(HostRoute(service4, ""))
	b.WaitRoute(t, prefix, true, 30*time.Second)
	start := time.Now()
	sp.Stop()
	b.WaitRoute(t, prefix, false, 5*time.Second)
	t.Logf("Stop: route gone from BIRD after %v", time.Since(start))
}

// A session coming up and going down is logged, for the gateway's
// timeline.
func TestSessionUpAndDownLogged(t *testing.T) {
	e := newEdge(t)
	b := bird.Start(t, e.router, birdConf(""))
	sp := startSpeaker(t, e.gateway, speakerConfig())
	sp.Set(HostRoute(service4, ""))
	b.WaitState(t, "gw4", "Established", false, 30*time.Second)
	up := `msg="bgp: session up" peer=` + routerGW4.Addr().String() + ` asn=` + fmt.Sprint(routerASN)
	waitLog(t, sp, up)
	if _, err := b.Run("disable gw4"); err != nil {
		t.Fatal(err)
	}
	waitLog(t, sp, `msg="bgp: session down" peer=`+routerGW4.Addr().String()+` asn=`+fmt.Sprint(routerASN)+` reason=`)
	if strings.Contains(sp.Log(), `msg="bgp: session down" peer=`+routerGW6.Addr().String()) {
		t.Errorf("the IPv6 session, still up, logged as down:\n%s", sp.Log())
	}
}

// waitLog waits until the speaker logged a line holding want.
func waitLog(t *testing.T, sp *speakerProc, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(sp.Log(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the speaker never logged %q:\n%s", want, sp.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TCP-MD5 (RFC 2385): with the router's password the session comes up and
// the route arrives; with another one the router's kernel drops every
// segment (counted as TCPMD5Failure) and nothing is learned.
func TestTCPMD5Password(t *testing.T) {
	for _, tc := range []struct {
		name, password string
		ok             bool
	}{{"right", "s3cret-edge", true}, {"wrong", "not-the-secret", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEdge(t)
			b := bird.Start(t, e.router, birdConf(`password "s3cret-edge";`))
			file := filepath.Join(t.TempDir(), "bgp-password")
			if err := os.WriteFile(file, []byte(tc.password+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := speakerConfig()
			cfg.Peers = cfg.Peers[:1]
			cfg.Peers[0].PasswordFile = file
			sp := startSpeaker(t, e.gateway, cfg)
			sp.Set(HostRoute(service4, ""))
			prefix := netip.PrefixFrom(service4, 32)
			if tc.ok {
				b.WaitState(t, "gw4", "Established", false, 30*time.Second)
				b.WaitRoute(t, prefix, true, 10*time.Second)
				return
			}
			if err := lab.EventuallyWithin(30*time.Second, func() error {
				n, err := md5Failures(e.router)
				if err == nil && n == 0 {
					err = errors.New("no TCP-MD5 failure counted yet")
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if st, err := b.ProtocolState("gw4"); err != nil || st == "Established" {
				t.Fatalf("with the wrong password: session %s (%v)", st, err)
			}
			if has, err := b.HasRoute(prefix); err != nil || has {
				t.Fatalf("with the wrong password: route in BIRD %v (%v)", has, err)
			}
		})
	}
}

// md5Failures reads TcpExt TCPMD5Failure of the host's namespace.
func md5Failures(h *lab.Host) (int, error) {
	out, err := h.Command(context.Background(), "cat", "/proc/net/netstat").Output()
	if err != nil {
		return 0, err
	}
	lines := strings.Split(string(out), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j, n := range names {
			if n == "TCPMD5Failure" && j < len(values) {
				return strconv.Atoi(values[j])
			}
		}
	}
	return 0, errors.New("no TCPMD5Failure in /proc/net/netstat")
}

// 10,000 addresses announced in one Set: the time until BIRD holds all of
// them, and the cost of the same Set again (nothing changes).
func TestTenThousandPrefixes(t *testing.T) {
	const n = 10000
	e := newEdge(t)
	b := bird.Start(t, e.router, birdConf(""))
	cfg := speakerConfig()
	cfg.Peers = cfg.Peers[:1]
	sp := startSpeaker(t, e.gateway, cfg)
	sp.Set()
	b.WaitState(t, "gw4", "Established", false, 30*time.Second)
	base := netip.MustParseAddr("198.19.64.0")
	routes := make([]Route, n)
	a := base
	for i := range routes {
		routes[i] = HostRoute(a, "")
		a = a.Next()
	}
	start := time.Now()
	sp.Set(routes...)
	setTook := time.Since(start)
	var got int
	if err := lab.EventuallyWithin(60*time.Second, func() error {
		var err error
		if got, err = b.RouteCount("gw4"); err == nil && got != n {
			err = fmt.Errorf("BIRD has %d of %d routes", got, n)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	all := time.Since(start)
	start = time.Now()
	sp.Set(routes...)
	again := time.Since(start)
	start = time.Now()
	sp.Set(routes[1:]...)
	b.WaitRoute(t, routes[0].Prefix, false, 5*time.Second)
	one := time.Since(start)
	t.Logf("%d prefixes: Set returned after %v, BIRD had all after %v; the same Set again %v; one withdrawal among %d reached BIRD in %v",
		n, setTook, all, again, n, one)
}

// The router sees the gateway's MED and the AS path with the prepends, and
// a pool's own values for the pool's addresses.
func TestBIRDSeesMEDAndPathLength(t *testing.T) {
	e := newEdge(t)
	b := bird.Start(t, e.router, birdConf(""))
	cfg := speakerConfig()
	med, poolMED, none := uint32(50), uint32(7), 0
	cfg.MED, cfg.ASPathPrepend = &med, 2
	cfg.Pools = map[string]PoolConfig{"primary": {MED: &poolMED, ASPathPrepend: &none}}
	sp := startSpeaker(t, e.gateway, cfg)
	other := netip.MustParseAddr("198.19.0.2")
	sp.Set(HostRoute(service4, ""), HostRoute(other, "primary"))
	for _, tc := range []struct {
		addr      netip.Addr
		med, path string
	}{
		{service4, "50", "64513 64513 64513"},
		{other, "7", "64513"},
	} {
		prefix := netip.PrefixFrom(tc.addr, 32)
		b.WaitRoute(t, prefix, true, 30*time.Second)
		routes, err := b.Routes(prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(routes) != 1 {
			t.Fatalf("%s: BIRD has %d routes, want 1: %+v", prefix, len(routes), routes)
		}
		a := routes[0].Attributes
		if a["BGP.med"] != tc.med || a["BGP.as_path"] != tc.path {
			t.Errorf("%s: BIRD sees MED %q, AS path %q; want %q, %q (all: %v)", prefix, a["BGP.med"], a["BGP.as_path"], tc.med, tc.path, a)
		}
	}
}
