package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/ruleset"
)

// TestEdgeUnservedTrafficIsNotRouted: the gateway's default route points
// at the router, and the router routes the Service's LoadBalancer IPs (one
// of each family) to the gateway (BGP), as at a real edge. A connection to
// a port no Service has and a packet conntrack takes for invalid (SYN and
// FIN together, to the Service's port) each cross the router once, over
// IPv4 and IPv6: the connection is refused, the packet dropped; so does
// such a packet to the Service's ClusterIP, which the router routes to the
// gateway too. With unserved_service_traffic = "route" (nftgate before it)
// each went back and forth between the router and the gateway until its
// TTL (hop limit) ran out.
func TestEdgeUnservedTrafficIsNotRouted(t *testing.T) {
	for _, tc := range []struct {
		unserved string
		loops    bool
	}{{"reject", false}, {"route", true}} {
		t.Run(tc.unserved, func(t *testing.T) {
			e := newUnservedLab(t, fmt.Sprintf("unserved_service_traffic = %q\n", tc.unserved), true)
			vip, vip6 := edgeFirst.String(), edgeFirst6.String()
			if err := e.routerHost.AddRoute(netip.MustParsePrefix(edgeClusterIP+"/32"), edgeGatewayGW.Addr()); err != nil {
				t.Fatal(err)
			}

			// The router counts what it forwards to the addresses, in
			// the order of routerCounted.
			for _, args := range [][]string{
				{"add", "table", "inet", "count"},
				{"add", "chain", "inet", "count", "seen", "{ type filter hook forward priority 0; }"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", vip, "tcp", "dport", "81", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", vip, "tcp", "flags", "&", "(syn|fin)", "==", "syn|fin", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", edgeClusterIP, "tcp", "flags", "&", "(syn|fin)", "==", "syn|fin", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip6", "daddr", vip6, "tcp", "dport", "81", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip6", "daddr", vip6, "tcp", "flags", "&", "(syn|fin)", "==", "syn|fin", "counter"},
			} {
				if out, err := e.routerHost.Command(context.Background(), "nft", args...).CombinedOutput(); err != nil {
					t.Fatalf("nft %v: %v: %s", args, err, out)
				}
			}

			var dialErrs []error
			for _, dst := range []netip.Addr{edgeFirst, edgeFirst6} {
				_, err := e.outside.Dial("tcp", netip.AddrPortFrom(dst, 81), lab.DialOpts{Timeout: 2 * time.Second})
				t.Logf("a connection to %s port 81: %v", dst, err)
				dialErrs = append(dialErrs, err)
			}
			invalid := gatewayInvalid(t, e)
			for _, seg := range []struct{ src, dst netip.AddrPort }{
				{netip.AddrPortFrom(edgeOutside.Addr(), 40001), ap(vip + ":80")},
				{netip.AddrPortFrom(edgeOutside.Addr(), 40001), ap(edgeClusterIP + ":80")},
				{netip.AddrPortFrom(edgeOutside6.Addr(), 40001), netip.AddrPortFrom(edgeFirst6, 80)},
			} {
				if err := e.outside.SendTCP(seg.src, seg.dst, 1000, 0, lab.TCPSyn|lab.TCPFin); err != nil {
					t.Fatal(err)
				}
			}
			// The gateway took them for invalid; then a connection
			// through the gateway, after them.
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				if n := gatewayInvalid(t, e); n < invalid+3 {
					return fmt.Errorf("the gateway's conntrack counted %d invalid packets, %d before the three SYN|FINs", n, invalid)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", ap(vip+":80"), 1), "198.18.2.10:8080")

			var counts []int
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				counts = routerCounts(t, e)
				for _, n := range counts {
					if tc.loops && n < 5 {
						return fmt.Errorf("the router forwarded %s", routerCounted(counts))
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			t.Logf("the router forwarded %s", routerCounted(counts))
			if tc.loops {
				return
			}
			for _, n := range counts {
				if n != 1 {
					t.Errorf("the router forwarded %s, want each once", routerCounted(counts))
					break
				}
			}
			for _, err := range dialErrs {
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("a connection to a port no Service has: %v, want it refused", err)
				}
			}
		})
	}
}

// newUnservedLab is the edge lab as at a real edge: the gateway's default
// route points at the router, and the router routes the Service's
// LoadBalancer IP to the gateway (BGP). The gateway runs with the lines
// config before the lab's; with v6, an IPv6 Service gets the pool's first
// IPv6 address too.
func newUnservedLab(t *testing.T, config string, v6 bool) *edgeLab {
	t.Helper()
	e := newEdgeLab(t)
	// The lab routes the Service ranges into a sink; an edge gateway routes
	// them by its default route, to the router.
	for _, r := range []struct{ sink, dflt, via netip.Prefix }{
		{lab.VIPNet4, netip.MustParsePrefix("0.0.0.0/0"), edgeRouterGW},
		{lab.VIPNet6, netip.MustParsePrefix("::/0"), edgeRouterGW6},
	} {
		if out, err := e.topo.Gateway.Command(context.Background(), "ip", "route", "del", r.sink.String()).CombinedOutput(); err != nil {
			t.Fatalf("ip route del %s: %v: %s", r.sink, err, out)
		}
		if err := e.topo.Gateway.AddRoute(r.dflt, r.via.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	text, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, append([]byte(config), text...), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, e.topo, "--config", cfg)
	gatewaytest.Serve(t, e.topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
	g.Write("web.yaml", e.web(gatewaytest.Endpoint{Addr: "198.18.2.10"})...)
	if v6 {
		svc := gatewaytest.Service("default", "web6", "LoadBalancer", []string{"fd42:ff::10"}, gatewaytest.Port{Name: "http", Port: 80})
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		sl := gatewaytest.Slice("default", "web6-1", "web6", "http", "", 8080, gatewaytest.Endpoint{Addr: "fd42:2::10"})
		sl.AddressType = discoveryv1.AddressTypeIPv6
		g.Write("web6.yaml", svc, sl)
	}
	g.Start()
	e.router.WaitRoute(t, edgeFirstRoute, true, 30*time.Second)
	wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", netip.AddrPortFrom(edgeFirst, 80), 3), "198.18.2.10:8080")
	if v6 {
		e.router.WaitRoute(t, netip.PrefixFrom(edgeFirst6, 128), true, 30*time.Second)
		wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", netip.AddrPortFrom(edgeFirst6, 80), 3), "[fd42:2::10]:8080")
	}
	return e
}

// TestEdgePingServiceAddress: an echo request from outside to the
// Service's LoadBalancer IPs, of each family, is answered by the gateway
// from the address (ruleset/unserved.go); with answer_service_address_ping
// off it is unserved traffic, refused with "port unreachable" (which also
// holds the unserved rules to real IPv6 traffic). Floods of requests with
// ever new identifiers are answered up to the limits (testEchoLimits): the
// defaults, and rates the configuration sets.
func TestEdgePingServiceAddress(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		answer       bool
		rate, source int
	}{
		{"answered", "", true, ruleset.DefaultEchoRate, ruleset.DefaultEchoSourceRate},
		{"rates set", "answer_service_address_ping_rate = 300\nanswer_service_address_ping_source_rate = 50\n", true, 300, 50},
		{"off", "answer_service_address_ping = false\n", false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newUnservedLab(t, tc.config, true)
			for i, vip := range []netip.Addr{edgeFirst, edgeFirst6} {
				r, err := e.outside.Ping(vip, 0x4e47, i+1, 3*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("ping %s: %v", vip, r)
				unreachable := r.Code == 3 && r.Type == ipv4.ICMPTypeDestinationUnreachable ||
					r.Code == 4 && r.Type == ipv6.ICMPTypeDestinationUnreachable
				switch {
				case tc.answer && (!r.Echoed() || r.From != vip):
					t.Errorf("ping %s: %v, want an echo reply from it", vip, r)
				case !tc.answer && !unreachable:
					t.Errorf("ping %s: %v, want port unreachable", vip, r)
				}
			}
			if !tc.answer {
				return
			}
			testEchoLimits(t, e, tc.rate, tc.source)
		})
	}
}

// testEchoLimits floods the gateway with echo requests to the Service's
// addresses, each a new flow (identifier), from addresses of the outside
// client: one source is answered up to sourceRate a second (and as many at
// once), and another source's requests right after its flood are answered
// (with the global limit alone they were not); two addresses of one IPv6
// /64 share that rate; sixteen sources flooding at once are answered up to
// rate all together (sixteen sources' own rates add up to more).
func testEchoLimits(t *testing.T, e *edgeLab, rate, sourceRate int) {
	flooder, flooder6, neighbour6 := netip.MustParseAddr("198.18.7.10"), netip.MustParseAddr("fd42:7::10"), netip.MustParseAddr("fd42:7::11")
	added := []netip.Prefix{netip.PrefixFrom(flooder, 24), netip.PrefixFrom(flooder6, 64), netip.PrefixFrom(neighbour6, 64)}
	var many []netip.Addr
	for i := range 16 {
		many = append(many, netip.AddrFrom4([4]byte{198, 18, 7, byte(20 + i)}))
		added = append(added, netip.PrefixFrom(many[i], 24))
	}
	if err := e.outside.AddAddress("router", added...); err != nil {
		t.Fatal(err)
	}
	// The most a limit of rate lets through in a window, with 100 ms for
	// the last requests to arrive.
	most := func(rate int, window time.Duration) int {
		return rate + int(float64(rate)*(window+100*time.Millisecond).Seconds())
	}

	// One source floods; another source's requests right after it are
	// all answered: the flood took its own credit, not the others'. (With
	// one limit for all, the flood left none, and a request was answered
	// only as the credit came back, one a millisecond.)
	f, err := lab.StartPingFlood(e.outside.Do, flooder, edgeFirst, 0x1000, 5000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-f.Sending()
	others := min(50, sourceRate) // within that source's credit
	o, err := lab.StartPingFlood(e.outside.Do, edgeOutside.Addr(), edgeFirst, 0x1800, others, time.Second)
	if err != nil {
		f.Wait()
		t.Fatal(err)
	}
	echoed, sent, sending, err := f.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one source: %d echo requests sent in %v: %d answered (at most %d by its rate)",
		sent, sending.Round(time.Millisecond), echoed, most(sourceRate, sending))
	if echoed > most(sourceRate, sending) || echoed < sourceRate/2 {
		t.Errorf("%d of %d echo requests from one source answered in %v, want %d to %d", echoed, sent, sending,
			sourceRate/2, most(sourceRate, sending))
	}
	oEchoed, _, oSending, err := o.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("another source right after: %d echo requests sent in %v, %v after the flood's last: %d answered",
		others, oSending.Round(time.Microsecond), o.Ended().Add(-oSending).Sub(f.Ended()).Round(time.Microsecond), oEchoed)
	// All are within that source's credit and the global one; a few may
	// still meet the flood's last packets in a full queue on a loaded
	// machine.
	if oEchoed < others*9/10 {
		t.Errorf("another source's %d echo requests right after one source's flood: %d answered, want all (at least %d)", others, oEchoed, others*9/10)
	}

	// Two addresses of one /64, and then sixteen sources, at once.
	for _, tc := range []struct {
		name string
		from []netip.Addr
		dst  netip.Addr
		rate int
	}{
		{"two addresses of one IPv6 /64", []netip.Addr{flooder6, neighbour6}, edgeFirst6, sourceRate},
		{"sixteen sources", many, edgeFirst, rate},
	} {
		start := time.Now()
		floods := make([]*lab.PingFlood, len(tc.from))
		for i, src := range tc.from {
			if floods[i], err = lab.StartPingFlood(e.outside.Do, src, tc.dst, 0x2000+0x100*i, 2000, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		var echoed, sent int
		var window time.Duration // from before the first began to the last's end
		for _, f := range floods {
			n, s, _, err := f.Wait()
			if err != nil {
				t.Fatal(err)
			}
			echoed, sent = echoed+n, sent+s
			window = max(window, f.Ended().Sub(start))
		}
		t.Logf("%s: %d echo requests sent in %v: %d answered (at most %d by the rate)", tc.name, sent, window.Round(time.Millisecond), echoed, most(tc.rate, window))
		if echoed > most(tc.rate, window) || echoed < tc.rate/2 {
			t.Errorf("%s: %d of %d echo requests answered in %v, want %d to %d", tc.name, echoed, sent, window, tc.rate/2, most(tc.rate, window))
		}
	}
}

// gatewayInvalid sums the gateway's conntrack invalid counts.
func gatewayInvalid(t *testing.T, e *edgeLab) int {
	t.Helper()
	out, err := e.topo.Gateway.Command(context.Background(), "conntrack", "-S").Output()
	if err != nil {
		t.Fatalf("conntrack -S: %v", err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`\binvalid=(\d+)`).FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// routerCounts reads the router's counters: packets to port 81 and
// SYN|FIN packets to the Service's IPv4 address, SYN|FIN packets to its
// ClusterIP, and the first two for its IPv6 address.
func routerCounts(t *testing.T, e *edgeLab) []int {
	t.Helper()
	out, err := e.routerHost.Command(context.Background(), "nft", "list", "chain", "inet", "count", "seen").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	var n []int
	for _, m := range regexp.MustCompile(`counter packets (\d+)`).FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.Atoi(m[1])
		n = append(n, v)
	}
	if len(n) != 5 {
		t.Fatalf("the router's counters: %s", strings.TrimSpace(string(out)))
	}
	return n
}

// routerCounted says what routerCounts counted.
func routerCounted(n []int) string {
	return fmt.Sprintf("the SYN to port 81 %d times, the SYN|FIN %d times, the one to the ClusterIP %d times; over IPv6 the SYN to port 81 %d times, the SYN|FIN %d times",
		n[0], n[1], n[2], n[3], n[4])
}
