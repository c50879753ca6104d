package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/model"
)

// TestMaglevDisruptionWithTraffic sends the same 600 UDP flows (8 client
// addresses × 75 source ports) to two Services with the same 10 endpoints,
// one annotated for Maglev and one choosing by hash mod N, before and
// after the fifth endpoint goes, and counts the flows whose endpoint
// changed. The gateway's conntrack is flushed between the rounds, so every
// flow is chosen anew by the rules. The kernel's "jhash … mod N" scales
// the hash to [0, N) rather than taking the remainder, so removing the
// fifth of ten endpoints moves about 28 % of the flows by hash (not 90 %);
// Maglev about 12 %.
func TestMaglevDisruptionWithTraffic(t *testing.T) {
	const n, gone = 10, 4
	topo := labtest.Gateway(t)
	var eps []gatewaytest.Endpoint
	for i := range n {
		a := topo.BackendIPv4[i]
		gatewaytest.Serve(t, topo.Backend, "udp", netip.AddrPortFrom(a, 5353))
		eps = append(eps, gatewaytest.Endpoint{Addr: a.String()})
	}
	g := gatewaytest.New(t, topo)
	dst := map[string]netip.AddrPort{"maglev": ap("198.19.0.71:53"), "hash": ap("198.19.0.72:53")}
	// Both Services in one file, so that a change reaches the gateway
	// as one sync: with a file each, the wait below (the removed
	// endpoint's shared chain gone, which the Maglev Service's change
	// alone does) could pass before the hash Service's file was read,
	// whose endpoints are a map's elements, and its first flows then
	// took the old endpoints.
	write := func(eps []gatewaytest.Endpoint) {
		var objs []any
		for name, d := range dst {
			svc := gatewaytest.Service("lb", name, "ClusterIP", []string{d.Addr().String()},
				gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
			svc.Annotations = map[string]string{model.AnnotationEndpointSelection: name}
			objs = append(objs, svc, gatewaytest.Slice("lb", name, name, "dns", corev1.ProtocolUDP, 5353, eps...))
		}
		g.Write("lb.yaml", objs...)
	}
	write(eps)
	g.Start()

	flush := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if out, err := topo.Gateway.Command(ctx, "conntrack", "-F").CombinedOutput(); err != nil {
			t.Fatalf("conntrack -F: %v\n%s", err, out)
		}
	}
	round := func() map[string][]string {
		t.Helper()
		flush()
		out := map[string][]string{}
		for name, d := range dst {
			for _, c := range topo.ClientIPv4 {
				for p := range 75 {
					r, err := topo.Client.Dial("udp", d, lab.DialOpts{Source: netip.AddrPortFrom(c, uint16(41000+p)), Timeout: 2 * time.Second})
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					out[name] = append(out[name], r.Backend)
				}
			}
		}
		return out
	}
	before := round()
	for name, got := range before {
		spread := map[string]bool{}
		for _, b := range got {
			spread[b] = true
		}
		if len(spread) != n {
			t.Fatalf("%s: 600 flows reached %d endpoints, want %d", name, len(spread), n)
		}
	}

	removed := topo.BackendIPv4[gone].String()
	write(append(eps[:gone:gone], eps[gone+1:]...))
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		if out := g.Nft("list", "ruleset"); strings.Contains(out, removed+":5353") {
			return fmt.Errorf("the ruleset still sends to %s", removed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	after := round()
	moved := map[string]float64{}
	for name := range dst {
		m := 0
		for i := range before[name] {
			if after[name][i] == removed {
				t.Fatalf("%s: flow %d still reaches the removed endpoint", name, i)
			}
			if before[name][i] != after[name][i] {
				m++
			}
		}
		moved[name] = float64(m) / float64(len(before[name]))
	}
	t.Logf("one of %d endpoints removed: %.1f %% of 600 flows moved with Maglev, %.1f %% by hash mod N", n, 100*moved["maglev"], 100*moved["hash"])
	// 1/N + 2 %, and the sampling error of 600 flows (1.3 % at 12 %).
	if moved["maglev"] > 1.0/n+0.02+0.03 {
		t.Errorf("Maglev moved %.3f of the flows, want about 1/%d", moved["maglev"], n)
	}
	if moved["hash"] < 0.2 {
		t.Errorf("hash mod N moved only %.3f of the flows; the comparison measures nothing", moved["hash"])
	}
}
