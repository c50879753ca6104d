package e2e_test

// The gateway's traffic counters and flows, read through the binary's API
// and metrics after real connections through it.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// trafficOf reads /api/v1/traffic and returns the port of a Service.
func trafficOf(g *gatewaytest.Gateway, ns, name, proto string, port uint16) (appliance.TrafficPort, error) {
	p, _, err := trafficRead(g, ns, name, proto, port)
	return p, err
}

// trafficRead is trafficOf with the time of the reading the API served.
func trafficRead(g *gatewaytest.Gateway, ns, name, proto string, port uint16) (appliance.TrafficPort, time.Time, error) {
	code, body, err := g.Get("/api/v1/traffic?sort=name")
	if err != nil {
		return appliance.TrafficPort{}, time.Time{}, err
	}
	if code != http.StatusOK {
		return appliance.TrafficPort{}, time.Time{}, fmt.Errorf("traffic: %d %s", code, body)
	}
	var tj appliance.TrafficJSON
	if err := json.Unmarshal([]byte(body), &tj); err != nil {
		return appliance.TrafficPort{}, time.Time{}, err
	}
	for _, p := range tj.Ports {
		if p.Namespace == ns && p.Name == name && p.Protocol == proto && p.Port == port {
			return p, tj.ReadAt, nil
		}
	}
	return appliance.TrafficPort{}, tj.ReadAt, fmt.Errorf("no %s/%s %s/%d in the traffic: %.600s", ns, name, proto, port, body)
}

// eventuallyTraffic waits until the port's counters satisfy ok (the API
// serves a reading up to a second old).
func eventuallyTraffic(t *testing.T, g *gatewaytest.Gateway, ns, name, proto string, port uint16, what string, ok func(appliance.TrafficPort) bool) appliance.TrafficPort {
	t.Helper()
	var last appliance.TrafficPort
	err := lab.EventuallyWithin(10*time.Second, func() error {
		p, err := trafficOf(g, ns, name, proto, port)
		if err != nil {
			return err
		}
		last = p
		if !ok(p) {
			return fmt.Errorf("%s/%s %s/%d: %+v, want %s", ns, name, proto, port, p, what)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return last
}

func TestTrafficCountersAndFlows(t *testing.T) {
	topo := labtest.Gateway(t)
	backend := netip.AddrPortFrom(topo.BackendIPv4[0], 8080)
	gatewaytest.Serve(t, topo.Backend, "tcp", backend)
	gatewaytest.Serve(t, topo.Backend, "udp", netip.AddrPortFrom(topo.BackendIPv4[0], 5353))
	g := gatewaytest.New(t, topo, append([]string{"--counters"}, gatewaytest.VIPExternalIPs...)...)
	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.101"},
		gatewaytest.Port{Name: "http", Port: 80}, gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
	empty := gatewaytest.Service("default", "empty", "ClusterIP", []string{"198.19.0.102"}, gatewaytest.Port{Name: "http", Port: 80})
	ranged := gatewaytest.Service("default", "ranged", "LoadBalancer", []string{"198.19.0.103"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30103})
	ranged.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.103"}}
	c := topo.ClientIPv4
	ranged.Spec.LoadBalancerSourceRanges = []string{c[0].String() + "/32"}
	g.Write("traffic.yaml", web,
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, ep("198.18.2.10", "")),
		gatewaytest.Slice("default", "web-2", "web", "dns", corev1.ProtocolUDP, 5353, ep("198.18.2.10", "")),
		empty,
		ranged, gatewaytest.Slice("default", "ranged-1", "ranged", "http", "", 8080, ep("198.18.2.10", "")))
	g.Start()
	l := &behaviourLab{topo: topo, g: g}
	l.eventuallyBackends(t, "tcp", ap("198.19.0.101:80"), 1, backend.String())

	t.Run("NewConnections", func(t *testing.T) {
		before, err := trafficOf(g, "default", "web", "TCP", 80)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if _, err := topo.Client.Dial("tcp", ap("198.19.0.101:80"), from(c[5])); err != nil {
				t.Fatal(err)
			}
		}
		eventuallyTraffic(t, g, "default", "web", "TCP", 80, "5 more new connections", func(p appliance.TrafficPort) bool {
			return p.NewConnections == before.NewConnections+5
		})
	})
	t.Run("ActiveFlowsPerEndpoint", func(t *testing.T) {
		// UDP flows stay in conntrack, open, until their timeout.
		for range 3 {
			if _, err := topo.Client.Dial("udp", ap("198.19.0.101:53"), from(c[6])); err != nil {
				t.Fatal(err)
			}
		}
		udp := netip.AddrPortFrom(topo.BackendIPv4[0], 5353).String()
		p := eventuallyTraffic(t, g, "default", "web", "UDP", 53, "3 active flows on "+udp, func(p appliance.TrafficPort) bool {
			return p.ActiveFlows >= 3 && len(p.Endpoints) == 1 && p.Endpoints[0].Endpoint == udp && p.Endpoints[0].ActiveFlows == p.ActiveFlows
		})
		t.Logf("web UDP/53: %+v", p)
		// The live flows, filtered by client: only c[6]'s.
		code, body, err := g.Get("/api/v1/services/default/web/flows?client=" + c[6].String() + "/32&limit=2")
		if err != nil || code != http.StatusOK {
			t.Fatalf("flows: %d %s %v", code, body, err)
		}
		var fj appliance.FlowsJSON
		if err := json.Unmarshal([]byte(body), &fj); err != nil {
			t.Fatal(err)
		}
		if fj.Total < 3 || len(fj.Flows) != 2 || !fj.Truncated {
			t.Fatalf("flows of %s, limit 2: %s", c[6], body)
		}
		for _, f := range fj.Flows {
			if !strings.HasPrefix(f.Client, c[6].String()+":") || f.Endpoint != udp || f.Destination != "198.19.0.101:53" {
				t.Errorf("flow %+v, want from %s to 198.19.0.101:53 via %s", f, c[6], udp)
			}
		}
	})
	t.Run("RejectedWithoutEndpoints", func(t *testing.T) {
		for range 2 {
			l.wantRefused(t, "tcp", ap("198.19.0.102:80"))
		}
		eventuallyTraffic(t, g, "default", "empty", "TCP", 80, "2 rejected", func(p appliance.TrafficPort) bool {
			return p.Rejected == 2 && p.NewConnections == 0
		})
	})
	t.Run("DroppedBySourceRanges", func(t *testing.T) {
		l.wantDropped(t, "tcp", ap("198.19.2.103:80"), from(c[1]))
		eventuallyTraffic(t, g, "default", "ranged", "TCP", 80, "drops", func(p appliance.TrafficPort) bool {
			return p.Dropped >= 1 && p.NewConnections == 0
		})
	})
	t.Run("Metrics", func(t *testing.T) {
		metrics := func() string {
			code, body, err := g.Get("/metrics")
			if err != nil || code != http.StatusOK {
				t.Fatalf("metrics: %d %v", code, err)
			}
			return body
		}
		const total = `nftgate_connections_total{kind="rejected"} 2`
		const perService = `nftgate_service_connections_total{kind="rejected",namespace="default",port="80",protocol="TCP",service="empty"} 2`
		body := metrics()
		if !strings.Contains(body, total) {
			t.Errorf("no %s in the metrics", total)
		}
		if strings.Contains(body, "nftgate_service_connections_total") {
			t.Errorf("per-Service series without metrics_per_service")
		}
		// Without per-Service series the totals are summed without a
		// row per port: they add up as the API's rows do.
		err := lab.EventuallyWithin(10*time.Second, func() error {
			code, tbody, err := g.Get("/api/v1/traffic")
			if err != nil || code != http.StatusOK {
				return fmt.Errorf("traffic: %d %v", code, err)
			}
			var tj appliance.TrafficJSON
			if err := json.Unmarshal([]byte(tbody), &tj); err != nil {
				return err
			}
			var tt appliance.TrafficTotals
			for i := range tj.Ports {
				tt.Add(&tj.Ports[i])
			}
			body := metrics()
			for kind, n := range map[string]uint64{"new": tt.NewConnections, "rejected": tt.Rejected, "dropped": tt.Dropped} {
				if want := fmt.Sprintf("nftgate_connections_total{kind=%q} %d\n", kind, n); !strings.Contains(body, want) {
					return fmt.Errorf("no %s in\n%s", strings.TrimSpace(want), grep(body, "nftgate_connections_total"))
				}
			}
			if tt.NewConnections == 0 {
				return fmt.Errorf("no new connections in the API's rows")
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		// The counters live in the kernel: a restart with per-Service
		// series finds them where they were.
		g.Stop()
		g.Args = append(g.Args, "--metrics-per-service")
		g.Start()
		body = metrics()
		if !strings.Contains(body, perService) || !strings.Contains(body, total) {
			t.Errorf("with metrics_per_service: want %s and %s in\n%s", perService, total, grep(body, "nftgate_"))
		}
	})
}

// grep returns the lines of s that hold sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
