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
// at the router, and the router routes the Service's LoadBalancer IP to the
// gateway (BGP), as at a real edge. A connection to a port no Service has
// and a packet conntrack takes for invalid (SYN and FIN together, to the
// Service's port) each cross the router once: the connection is refused,
// the packet dropped; so does such a packet to the Service's ClusterIP,
// which the router routes to the gateway too. With unserved_service_traffic
// = "route" (nftgate before it) each went back and forth between the router
// and the gateway until its TTL ran out.
func TestEdgeUnservedTrafficIsNotRouted(t *testing.T) {
	for _, tc := range []struct {
		unserved string
		loops    bool
	}{{"reject", false}, {"route", true}} {
		t.Run(tc.unserved, func(t *testing.T) {
			e := newUnservedLab(t, fmt.Sprintf("unserved_service_traffic = %q\n", tc.unserved), false)
			vip := edgeFirst.String()
			if err := e.routerHost.AddRoute(netip.MustParsePrefix(edgeClusterIP+"/32"), edgeGatewayGW.Addr()); err != nil {
				t.Fatal(err)
			}

			// The router counts what it forwards to the addresses.
			for _, args := range [][]string{
				{"add", "table", "inet", "count"},
				{"add", "chain", "inet", "count", "seen", "{ type filter hook forward priority 0; }"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", vip, "tcp", "dport", "81", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", vip, "tcp", "flags", "&", "(syn|fin)", "==", "syn|fin", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", edgeClusterIP, "tcp", "flags", "&", "(syn|fin)", "==", "syn|fin", "counter"},
			} {
				if out, err := e.routerHost.Command(context.Background(), "nft", args...).CombinedOutput(); err != nil {
					t.Fatalf("nft %v: %v: %s", args, err, out)
				}
			}

			_, dialErr := e.outside.Dial("tcp", ap(vip+":81"), lab.DialOpts{Timeout: 2 * time.Second})
			t.Logf("a connection to port 81: %v", dialErr)
			invalid := gatewayInvalid(t, e)
			for _, dst := range []string{vip, edgeClusterIP} {
				if err := e.outside.SendTCP(ap(edgeOutside.Addr().String()+":40001"), ap(dst+":80"), 1000, 0, lab.TCPSyn|lab.TCPFin); err != nil {
					t.Fatal(err)
				}
			}
			// The gateway took them for invalid; then a connection
			// through the gateway, after them.
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				if n := gatewayInvalid(t, e); n < invalid+2 {
					return fmt.Errorf("the gateway's conntrack counted %d invalid packets, %d before the two SYN|FINs", n, invalid)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", ap(vip+":80"), 1), "198.18.2.10:8080")

			var toPort, synFin, clusterIP int
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				toPort, synFin, clusterIP = routerCounts(t, e)
				if tc.loops && (toPort < 5 || synFin < 5 || clusterIP < 5) {
					return fmt.Errorf("the router forwarded the SYN to port 81 %d times, the SYN|FIN %d times, the one to the ClusterIP %d times",
						toPort, synFin, clusterIP)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			t.Logf("the router forwarded the SYN to port 81 %d times, the SYN|FIN %d times, the one to the ClusterIP %d times", toPort, synFin, clusterIP)
			if tc.loops {
				return
			}
			if toPort != 1 || synFin != 1 || clusterIP != 1 {
				t.Errorf("the router forwarded the SYN to port 81 %d times, the SYN|FIN %d times, the one to the ClusterIP %d times, want each once",
					toPort, synFin, clusterIP)
			}
			if !errors.Is(dialErr, syscall.ECONNREFUSED) {
				t.Errorf("a connection to a port no Service has: %v, want it refused", dialErr)
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
// holds the unserved rules to real IPv6 traffic). A flood of requests with
// ever new identifiers is answered up to ruleset.EchoRate a second (and as
// many at once).
func TestEdgePingServiceAddress(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		answer       bool
	}{{"answered", "", true}, {"off", "answer_service_address_ping = false\n", false}} {
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
			// A flood of requests, each a new flow (identifier), is
			// answered up to the rule's rate.
			const n = 5000
			echoed, sending, err := lab.PingFlood(e.outside.Do, edgeFirst, 0x4e48, n, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			most := ruleset.EchoRate + int(float64(ruleset.EchoRate)*(sending+100*time.Millisecond).Seconds())
			t.Logf("%d echo requests sent in %v: %d answered (at most %d by the rate)", n, sending.Round(time.Millisecond), echoed, most)
			if echoed > most || echoed < ruleset.EchoRate/2 {
				t.Errorf("%d of %d echo requests sent in %v answered, want %d to %d", echoed, n, sending, ruleset.EchoRate/2, most)
			}
		})
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

// routerCounts reads the router's three counters: packets to port 81 and
// SYN|FIN packets to the Service address, SYN|FIN packets to its
// ClusterIP.
func routerCounts(t *testing.T, e *edgeLab) (toPort, synFin, clusterIP int) {
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
	if len(n) != 3 {
		t.Fatalf("the router's counters: %s", strings.TrimSpace(string(out)))
	}
	return n[0], n[1], n[2]
}
