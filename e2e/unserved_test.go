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

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
)

// TestEdgeUnservedTrafficIsNotRouted: the gateway's default route points
// at the router, and the router routes the Service's LoadBalancer IP to the
// gateway (BGP), as at a real edge. A connection to a port no Service has
// and a packet conntrack takes for invalid (SYN and FIN together, to the
// Service's port) each cross the router once: the connection is refused,
// the packet dropped. With unserved_service_traffic = "route" (nftgate
// before it) both went back and forth between the router and the gateway
// until their TTL ran out.
func TestEdgeUnservedTrafficIsNotRouted(t *testing.T) {
	for _, tc := range []struct {
		unserved string
		loops    bool
	}{{"reject", false}, {"route", true}} {
		t.Run(tc.unserved, func(t *testing.T) {
			e := newEdgeLab(t)
			// The lab routes the Service ranges into a sink; an edge
			// gateway routes them by its default route, to the router.
			if out, err := e.topo.Gateway.Command(context.Background(), "ip", "route", "del", lab.VIPNet4.String()).CombinedOutput(); err != nil {
				t.Fatalf("ip route del %s: %v: %s", lab.VIPNet4, err, out)
			}
			if err := e.topo.Gateway.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), edgeRouterGW.Addr()); err != nil {
				t.Fatal(err)
			}
			text, err := os.ReadFile(e.config)
			if err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(cfg, append([]byte(fmt.Sprintf("unserved_service_traffic = %q\n", tc.unserved)), text...), 0o644); err != nil {
				t.Fatal(err)
			}
			g := gatewaytest.New(t, e.topo, "--config", cfg)
			gatewaytest.Serve(t, e.topo.Backend, "tcp", ap("198.18.2.10:8080"))
			g.Write("web.yaml", e.web(gatewaytest.Endpoint{Addr: "198.18.2.10"})...)
			g.Start()
			e.router.WaitRoute(t, edgeFirstRoute, true, 30*time.Second)
			vip := edgeFirst.String()
			wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", ap(vip+":80"), 3), "198.18.2.10:8080")

			// The router counts what it forwards to the address.
			for _, args := range [][]string{
				{"add", "table", "inet", "count"},
				{"add", "chain", "inet", "count", "seen", "{ type filter hook forward priority 0; }"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", vip, "tcp", "dport", "81", "counter"},
				{"add", "rule", "inet", "count", "seen", "ip", "daddr", vip, "tcp", "flags", "&", "(syn|fin)", "==", "syn|fin", "counter"},
			} {
				if out, err := e.routerHost.Command(context.Background(), "nft", args...).CombinedOutput(); err != nil {
					t.Fatalf("nft %v: %v: %s", args, err, out)
				}
			}

			_, dialErr := e.outside.Dial("tcp", ap(vip+":81"), lab.DialOpts{Timeout: 2 * time.Second})
			t.Logf("a connection to port 81: %v", dialErr)
			invalid := gatewayInvalid(t, e)
			if err := e.outside.SendTCP(ap(edgeOutside.Addr().String()+":40001"), ap(vip+":80"), 1000, 0, lab.TCPSyn|lab.TCPFin); err != nil {
				t.Fatal(err)
			}
			// The gateway took it for invalid; then a connection through
			// the gateway, after it.
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				if n := gatewayInvalid(t, e); n <= invalid {
					return fmt.Errorf("the gateway's conntrack counted %d invalid packets, %d before the SYN|FIN", n, invalid)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", ap(vip+":80"), 1), "198.18.2.10:8080")

			var toPort, synFin int
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				toPort, synFin = routerCounts(t, e)
				if tc.loops && (toPort < 5 || synFin < 5) {
					return fmt.Errorf("the router forwarded the SYN to port 81 %d times and the SYN|FIN %d times", toPort, synFin)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			t.Logf("the router forwarded the SYN to port 81 %d times, the SYN|FIN %d times", toPort, synFin)
			if tc.loops {
				return
			}
			if toPort != 1 || synFin != 1 {
				t.Errorf("the router forwarded the SYN to port 81 %d times and the SYN|FIN %d times, want each once", toPort, synFin)
			}
			if !errors.Is(dialErr, syscall.ECONNREFUSED) {
				t.Errorf("a connection to a port no Service has: %v, want it refused", dialErr)
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

// routerCounts reads the router's two counters: packets to port 81, and
// SYN|FIN packets, to the Service address.
func routerCounts(t *testing.T, e *edgeLab) (toPort, synFin int) {
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
	if len(n) != 2 {
		t.Fatalf("the router's counters: %s", strings.TrimSpace(string(out)))
	}
	return n[0], n[1]
}
