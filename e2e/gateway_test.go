package e2e_test

// End-to-end tests of the nftgate binary: a client namespace, the gateway
// namespace running nftgate on a manifests directory, and a backend
// namespace with echo servers; real TCP and UDP between them.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/ruleset"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// wantBackends checks that exactly the given backends answered.
func wantBackends(t *testing.T, seen map[string]int, want ...string) {
	t.Helper()
	if len(seen) != len(want) {
		t.Fatalf("answers from %v, want all and only %v", seen, want)
	}
	for _, w := range want {
		if seen[w] == 0 {
			t.Fatalf("answers from %v, want all and only %v", seen, want)
		}
	}
}

// awaitBackend waits until connections to dst are answered by want.
func awaitBackend(t *testing.T, client *lab.Host, dst netip.AddrPort, want string, within time.Duration) error {
	t.Helper()
	return lab.EventuallyWithin(within, func() error {
		r, err := client.Dial("tcp", dst, lab.DialOpts{})
		if err != nil {
			return err
		}
		if r.Backend != want {
			return fmt.Errorf("answered by %s", r.Backend)
		}
		return nil
	})
}

// newGateway prepares nftgate on one kind of source.
type newGateway func(testing.TB, *lab.Topology, ...string) *gatewaytest.Gateway

// eachSource runs a test once with Services and EndpointSlices written as
// manifest files, and once with them written to a real kube-apiserver.
func eachSource(t *testing.T, test func(t *testing.T, newGW newGateway)) {
	t.Run("manifests", func(t *testing.T) { test(t, gatewaytest.New) })
	t.Run("kubernetes", func(t *testing.T) { test(t, gatewaytest.NewWithAPI) })
}

// TestServicesAnswer programs one set of Services and checks each kind
// with real traffic.
func TestServicesAnswer(t *testing.T) { eachSource(t, testServicesAnswer) }

func testServicesAnswer(t *testing.T, newGW newGateway) {
	topo := labtest.Gateway(t)
	for _, a := range []string{"198.18.2.10:8080", "198.18.2.11:8080", "198.18.2.12:8080", "198.18.2.13:8080", "198.18.2.14:9090"} {
		gatewaytest.Serve(t, topo.Backend, "tcp", ap(a))
	}
	for _, a := range []string{"198.18.2.10:5353", "198.18.2.11:5353"} {
		gatewaytest.Serve(t, topo.Backend, "udp", ap(a))
	}
	g := newGW(t, topo, gatewaytest.VIPExternalIPs...)

	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"},
		gatewaytest.Port{Name: "http", Port: 80}, gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
	webHTTP := gatewaytest.Slice("default", "web-http", "web", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.10"}, gatewaytest.Endpoint{Addr: "198.18.2.11"}, gatewaytest.Endpoint{Addr: "198.18.2.12"})
	webDNS := gatewaytest.Slice("default", "web-dns", "web", "dns", corev1.ProtocolUDP, 5353,
		gatewaytest.Endpoint{Addr: "198.18.2.10"}, gatewaytest.Endpoint{Addr: "198.18.2.11"})
	np := gatewaytest.Service("default", "np", "NodePort", []string{"198.19.0.11"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30080})
	npSlice := gatewaytest.Slice("default", "np-1", "np", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.13"})
	ext := gatewaytest.Service("default", "ext", "ClusterIP", []string{"198.19.0.12"}, gatewaytest.Port{Name: "http", Port: 80})
	ext.Spec.ExternalIPs = []string{"198.19.1.2"}
	extSlice := gatewaytest.Slice("default", "ext-1", "ext", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.13"})
	lb := gatewaytest.Service("default", "lb", "LoadBalancer", []string{"198.19.0.13"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30081})
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.1.1"}}
	lbSlice := gatewaytest.Slice("default", "lb-1", "lb", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.12"})
	// A named target port that resolves to 8080 in one slice and 9090 in
	// the other, as during a rollout that renames a container port.
	multi := gatewaytest.Service("default", "multi", "ClusterIP", []string{"198.19.0.14"},
		gatewaytest.Port{Name: "web", Port: 80}, gatewaytest.Port{Name: "admin", Port: 81})
	multiA := gatewaytest.Slice("default", "multi-a", "multi", "web", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.13"})
	multiB := gatewaytest.Slice("default", "multi-b", "multi", "web", "", 9090, gatewaytest.Endpoint{Addr: "198.18.2.14"})
	multiAdmin := gatewaytest.Slice("default", "multi-c", "multi", "admin", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"})
	empty := gatewaytest.Service("default", "empty", "ClusterIP", []string{"198.19.0.15"}, gatewaytest.Port{Name: "http", Port: 80})

	g.Write("web.yaml", web, webHTTP, webDNS)
	g.Write("np.yaml", np, npSlice)
	g.Write("ext.yaml", ext, extSlice, lb, lbSlice)
	g.Write("multi.yaml", multi, multiA, multiB, multiAdmin, empty)
	g.Start()

	t.Run("ClusterIP TCP spreads over all endpoints", func(t *testing.T) {
		seen := gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.10:80"), 40)
		wantBackends(t, seen, "198.18.2.10:8080", "198.18.2.11:8080", "198.18.2.12:8080")
	})
	t.Run("ClusterIP UDP spreads over all endpoints", func(t *testing.T) {
		seen := gatewaytest.Backends(t, topo.Client, "udp", ap("198.19.0.10:53"), 30)
		wantBackends(t, seen, "198.18.2.10:5353", "198.18.2.11:5353")
	})
	t.Run("NodePort on the gateway address", func(t *testing.T) {
		seen := gatewaytest.Backends(t, topo.Client, "tcp", netip.AddrPortFrom(topo.GatewayClientIPv4, 30080), 3)
		wantBackends(t, seen, "198.18.2.13:8080")
	})
	t.Run("ExternalIP", func(t *testing.T) {
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.1.2:80"), 3), "198.18.2.13:8080")
	})
	t.Run("LoadBalancer ingress IP", func(t *testing.T) {
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.1.1:80"), 3), "198.18.2.12:8080")
	})
	t.Run("named target port resolved per slice", func(t *testing.T) {
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.14:80"), 30), "198.18.2.13:8080", "198.18.2.14:9090")
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.14:81"), 3), "198.18.2.10:8080")
	})
	t.Run("no endpoints is rejected at once", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			start := time.Now()
			_, err := topo.Client.Dial(proto, ap("198.19.0.15:80"), lab.DialOpts{Timeout: 3 * time.Second})
			if !lab.IsRefused(err) {
				t.Fatalf("%s to a Service without endpoints: got %v, want refused", proto, err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("%s reject took %s", proto, d)
			}
		}
	})
	t.Run("clients outside the cluster CIDRs are masqueraded", func(t *testing.T) {
		r, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{})
		if err != nil {
			t.Fatal(err)
		}
		if r.ObservedSource.Addr() != topo.GatewayBackendIPv4 {
			t.Errorf("backend saw %s, want the gateway's address %s", r.ObservedSource, topo.GatewayBackendIPv4)
		}
	})
	t.Run("the gateway itself reaches a ClusterIP", func(t *testing.T) {
		r, err := topo.Gateway.Dial("tcp", ap("198.19.0.14:81"), lab.DialOpts{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Backend != "198.18.2.10:8080" {
			t.Errorf("answered by %s", r.Backend)
		}
	})
	t.Run("rendered ruleset is readable by nft", func(t *testing.T) {
		out := g.Nft("list", "ruleset")
		for _, want := range []string{"pick-tcp-3", "198.19.0.10 . tcp . 80", "jhash ip saddr . th sport mod 3", "map @endpoints-2"} {
			if !strings.Contains(out, want) {
				t.Errorf("nft list ruleset lacks %q", want)
			}
		}
	})
}

// TestClusterCIDRKeepsClientAddress checks that a client inside the cluster
// CIDRs keeps its address under policy Cluster.
func TestClusterCIDRKeepsClientAddress(t *testing.T) {
	eachSource(t, testClusterCIDRKeepsClientAddress)
}

func testClusterCIDRKeepsClientAddress(t *testing.T, newGW newGateway) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g := newGW(t, topo, "--cluster-cidr", "198.18.1.0/24")
	g.Write("web.yaml", gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()
	r, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if r.ObservedSource != r.Local {
		t.Errorf("backend saw %s, want the client's own %s", r.ObservedSource, r.Local)
	}
}

// TestChangesReachTheKernel moves a Service's traffic to a new endpoint and
// then deletes the Service.
func TestChangesReachTheKernel(t *testing.T) { eachSource(t, testChangesReachTheKernel) }

func testChangesReachTheKernel(t *testing.T, newGW newGateway) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"), ap("198.18.2.12:8080"))
	g := newGW(t, topo)
	svc := gatewaytest.Service("shop", "cart", "ClusterIP", []string{"198.19.0.20"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("cart.yaml", svc, gatewaytest.Slice("shop", "cart-1", "cart", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.10"}, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	other := gatewaytest.Service("shop", "other", "ClusterIP", []string{"198.19.0.21"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("other.yaml", other, gatewaytest.Slice("shop", "other-1", "other", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.12"}))
	g.Start()
	wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.20:80"), 30), "198.18.2.10:8080", "198.18.2.11:8080")

	// The endpoints change: every new connection goes to the new one.
	g.Write("cart.yaml", svc, gatewaytest.Slice("shop", "cart-1", "cart", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.12"}))
	err := lab.EventuallyWithin(5*time.Second, func() error {
		seen := gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.20:80"), 10)
		if len(seen) != 1 || seen["198.18.2.12:8080"] == 0 {
			return fmt.Errorf("answers from %v", seen)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("traffic did not move to the new endpoint: %v", err)
	}

	// The Service is deleted: it stops answering, and nothing of it is
	// left in the tables.
	g.Remove("cart.yaml")
	err = lab.EventuallyWithin(5*time.Second, func() error {
		_, err := topo.Client.Dial("tcp", ap("198.19.0.20:80"), lab.DialOpts{Timeout: 300 * time.Millisecond})
		if err == nil {
			return fmt.Errorf("the deleted Service still answers")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"ip", "ip6"} {
		// The traffic sets are measurements, not rules: what the Service's
		// connections counted stays there until it expires, ten minutes
		// after its last packet (ruleset.TrafficTimeout).
		out := withoutTrafficSets(g.Nft("list", "ruleset", fam))
		if strings.Contains(out, "shop/cart") || strings.Contains(out, "198.19.0.20") {
			t.Errorf("the deleted Service left traces in the %s table:\n%s", fam, out)
		}
	}
	if _, err := topo.Client.Dial("tcp", ap("198.19.0.21:80"), lab.DialOpts{}); err != nil {
		t.Errorf("the other Service stopped answering: %v", err)
	}
}

// TestRestartKeepsTraffic kills nftgate and starts it again while a client
// keeps opening connections: none fails, because the rules stay in the
// kernel and a restart changes only what differs.
func TestRestartKeepsTraffic(t *testing.T) { eachSource(t, testRestartKeepsTraffic) }

func testRestartKeepsTraffic(t *testing.T, newGW newGateway) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	g := newGW(t, topo)
	g.Write("web.yaml", gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	g.Start()

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{Timeout: time.Second}); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			} else {
				ok.Add(1)
			}
		}
	}()
	waitFor := func(n int64) {
		target := ok.Load() + n
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			if ok.Load() < target {
				return fmt.Errorf("%d connections so far", ok.Load())
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(20)
	g.Kill() // as a crash would
	waitFor(20)
	g.Start()
	waitFor(20)
	g.Stop() // as an update would
	waitFor(20)
	g.Start()
	waitFor(20)
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d connections failed across restarts; first: %v", failed.Load(), failed.Load()+ok.Load(), firstErr.Load())
	}
	if !strings.Contains(g.Logs(), "changes=0") {
		t.Errorf("a restart on unchanged manifests should change nothing in the kernel; logs:\n%s", g.Logs())
	}
}

// TestMalformedManifest checks that a broken file is reported by name and
// nothing else is affected.
func TestMalformedManifest(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	g := gatewaytest.New(t, topo)
	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	api := gatewaytest.Service("default", "api", "ClusterIP", []string{"198.19.0.11"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("api.yaml", api, gatewaytest.Slice("default", "api-1", "api", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()

	// A file that is not YAML, and a Service with an impossible address.
	g.WriteRaw("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: broken\n")
	bad := gatewaytest.Service("default", "api", "ClusterIP", []string{"198.19.0.300"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("api.yaml", bad, gatewaytest.Slice("default", "api-1", "api", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	// A good change after them still applies.
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}))

	if err := awaitBackend(t, topo.Client, ap("198.19.0.10:80"), "198.18.2.11:8080", 5*time.Second); err != nil {
		t.Fatalf("a good change did not apply next to broken manifests: %v", err)
	}
	// Each file is read on its own: a known file renamed over at once, a
	// new one once it settles, so the good change may come first.
	for _, want := range []string{"broken.yaml", "198.19.0.300", "spec.clusterIPs[0]"} {
		if err := lab.EventuallyWithin(5*time.Second, func() error {
			if logs := g.Logs(); !strings.Contains(logs, want) {
				return fmt.Errorf("logs do not name %q:\n%s", want, logs)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	// The bad Service keeps its last good state.
	r, err := topo.Client.Dial("tcp", ap("198.19.0.11:80"), lab.DialOpts{})
	if err != nil || r.Backend != "198.18.2.10:8080" {
		t.Errorf("the Service with a bad update lost its previous state: %v %v", r.Backend, err)
	}
}

// TestStopKeepsRulesAndCleanupRemovesThem: a stopped gateway keeps serving
// from the kernel; `nftgate cleanup` removes everything it made.
func TestStopKeepsRulesAndCleanupRemovesThem(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g := gatewaytest.New(t, topo)
	g.Write("web.yaml", gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()
	g.Stop()
	if _, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{}); err != nil {
		t.Fatalf("the rules stopped serving when nftgate stopped: %v", err)
	}
	out, err := topo.Gateway.Command(context.Background(), gatewaytest.Binary(t), "cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("nftgate cleanup: %v\n%s", err, out)
	}
	if tables := g.Nft("list", "tables"); strings.Contains(tables, "nftgate") {
		t.Errorf("tables left after cleanup:\n%s", tables)
	}
	if _, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{Timeout: 300 * time.Millisecond}); err == nil {
		t.Error("the Service still answers after cleanup")
	}
	// A second cleanup has nothing to do, and says so by succeeding.
	if out, err := topo.Gateway.Command(context.Background(), gatewaytest.Binary(t), "cleanup").CombinedOutput(); err != nil {
		t.Errorf("second cleanup: %v\n%s", err, out)
	}
}

// withoutTrafficSets is an nft listing without the traffic sets' blocks.
func withoutTrafficSets(listing string) string {
	var out []string
	skip := false
	for _, line := range strings.Split(listing, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == "set "+ruleset.SetTrafficIn+" {" || t == "set "+ruleset.SetTrafficOut+" {":
			skip = true
		case skip && t == "}":
			skip = false
		case !skip:
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
