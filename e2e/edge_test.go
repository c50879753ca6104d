package e2e_test

// The edge: a LoadBalancer Service gets an address from a pool, nftgate's
// BGP speaker announces it to a real router (BIRD), and a client behind
// that router reaches the backends through it.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// The upstream side of the edge lab: a router peering with the gateway,
// and an outside client that knows only the router.
var (
	edgeRouterGW   = netip.MustParsePrefix("198.18.6.1/24")
	edgeGatewayGW  = netip.MustParsePrefix("198.18.6.2/24")
	edgeRouterOut  = netip.MustParsePrefix("198.18.7.1/24")
	edgeOutside    = netip.MustParsePrefix("198.18.7.2/24")
	edgePool       = "198.19.200.8/29"
	edgeFirst      = netip.MustParseAddr("198.19.200.9") // skip_network_and_broadcast
	edgeFirstRoute = netip.PrefixFrom(edgeFirst, 32)

	edgeRouterGW6  = netip.MustParsePrefix("fd42:6::1/64")
	edgeGatewayGW6 = netip.MustParsePrefix("fd42:6::2/64")
	edgeRouterOut6 = netip.MustParsePrefix("fd42:7::1/64")
	edgeOutside6   = netip.MustParsePrefix("fd42:7::2/64")
	edgePool6      = "fd42:ff:200::9-fd42:ff:200::f"
	edgeFirst6     = netip.MustParseAddr("fd42:ff:200::9")
)

const (
	edgeRouterASN  = 64512
	edgeGatewayASN = 64513
)

type edgeLab struct {
	topo       *lab.Topology
	outside    *lab.Host
	routerHost *lab.Host
	router     *bird.Router
	config     string
}

// newEdgeLab adds the router (BIRD) and the outside client to the gateway
// topology, and writes nftgate's configuration: the pool and the BGP peer.
func newEdgeLab(t *testing.T) *edgeLab {
	t.Helper()
	topo := labtest.Gateway(t)
	router, err := topo.AddHost("router")
	if err != nil {
		t.Fatal(err)
	}
	outside, err := topo.AddHost("outside")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topo.Link(router, []netip.Prefix{edgeRouterGW, edgeRouterGW6}, topo.Gateway, []netip.Prefix{edgeGatewayGW, edgeGatewayGW6}); err != nil {
		t.Fatal(err)
	}
	if _, err := topo.Link(router, []netip.Prefix{edgeRouterOut, edgeRouterOut6}, outside, []netip.Prefix{edgeOutside, edgeOutside6}); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
		if err := router.Sysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []struct {
		h        *lab.Host
		dst, via netip.Prefix
	}{
		{outside, netip.MustParsePrefix("0.0.0.0/0"), edgeRouterOut},
		{outside, netip.MustParsePrefix("::/0"), edgeRouterOut6},
		{topo.Gateway, edgeOutside.Masked(), edgeRouterGW},
		{topo.Gateway, edgeOutside6.Masked(), edgeRouterGW6},
	} {
		if err := r.h.AddRoute(r.dst, r.via.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	b := bird.Start(t, router, bird.Upstream(edgeRouterGW.Addr(), edgeRouterASN, edgeGatewayGW.Addr(), edgeGatewayGW6.Addr(), edgeGatewayASN, ""))
	cfg := filepath.Join(t.TempDir(), "config.toml")
	text := fmt.Sprintf(`
[bgp]
asn = %d
router_id = %q
restart_deferral = "1s"

[[bgp.peer]]
address = %q
asn = %d
hold_time = "9s"
connect_retry = "1s"

[[bgp.peer]]
address = %q
asn = %d
hold_time = "9s"
connect_retry = "1s"

[[pools]]
name = "public"
addresses = [%q, %q]
skip_network_and_broadcast = true
`, edgeGatewayASN, edgeGatewayGW.Addr(), edgeRouterGW.Addr(), edgeRouterASN, edgeRouterGW6.Addr(), edgeRouterASN, edgePool, edgePool6)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return &edgeLab{topo: topo, outside: outside, routerHost: router, router: b, config: cfg}
}

// edgeClusterIP is the ClusterIP of the edge lab's Service.
const edgeClusterIP = "198.19.0.10"

func (e *edgeLab) web(eps ...gatewaytest.Endpoint) []any {
	svc := gatewaytest.Service("default", "web", "LoadBalancer", []string{edgeClusterIP}, gatewaytest.Port{Name: "http", Port: 80})
	return []any{svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, eps...)}
}

// TestEdgeBGPFromManifests: without a cluster, the pool gives the
// Service its address and BIRD learns it.
func TestEdgeBGPFromManifests(t *testing.T) {
	e := newEdgeLab(t)
	g := gatewaytest.New(t, e.topo, "--config", e.config)
	testEdgeBGP(t, e, g, nil)
}

// TestEdgeBGPFromKubernetes: the same with a real kube-apiserver: the
// address is written to the Service's status by the Lease holder.
func TestEdgeBGPFromKubernetes(t *testing.T) {
	e := newEdgeLab(t)
	g := newEdgeAPIGateway(t, e.topo, "--config", e.config)
	testEdgeBGP(t, e, g, ingressIs(g, "web", edgeFirst))
}

// newEdgeAPIGateway is gatewaytest.NewWithAPI with the namespace of the
// Lease that elects the writer of the Services' status, nftgate.
func newEdgeAPIGateway(t *testing.T, topo *lab.Topology, extra ...string) *gatewaytest.Gateway {
	t.Helper()
	g := gatewaytest.NewWithAPI(t, topo, extra...)
	if _, err := g.Client().CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nftgate"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return g
}

// ingressIs tells whether the status of Service default/name holds
// exactly the addresses want.
func ingressIs(g *gatewaytest.Gateway, name string, want ...netip.Addr) func() error {
	return func() error {
		svc, err := g.Client().CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		in := svc.Status.LoadBalancer.Ingress
		ok := len(in) == len(want)
		for i := 0; ok && i < len(in); i++ {
			ok = in[i].IP == want[i].String()
		}
		if !ok {
			return fmt.Errorf("status.loadBalancer.ingress %+v, want %s", in, want)
		}
		return nil
	}
}

func testEdgeBGP(t *testing.T, e *edgeLab, g *gatewaytest.Gateway, statusWritten func() error) {
	backends := []gatewaytest.Endpoint{{Addr: "198.18.2.10"}, {Addr: "198.18.2.11"}}
	gatewaytest.Serve(t, e.topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	g.Write("web.yaml", e.web(backends...)...)
	g.Start()
	if statusWritten != nil {
		if err := lab.EventuallyWithin(30*time.Second, statusWritten); err != nil {
			t.Fatal(err)
		}
	}
	e.router.WaitState(t, "gw4", "Established", false, 30*time.Second)
	e.router.WaitRoute(t, edgeFirstRoute, true, 30*time.Second)
	vip := netip.AddrPortFrom(edgeFirst, 80)
	wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", vip, 30), "198.18.2.10:8080", "198.18.2.11:8080")

	// The operator's view: the address, its pool, announced to the peer.
	var view struct {
		Services []struct {
			Name      string `json:"name"`
			Addresses []struct {
				Address   string   `json:"address"`
				Pool      string   `json:"pool"`
				Announced bool     `json:"announced"`
				Via       []string `json:"via"`
			} `json:"addresses"`
		} `json:"services"`
		Pools []struct {
			Pool string `json:"pool"`
			Used int    `json:"used"`
		} `json:"pools"`
		BGP []struct {
			State        string `json:"state"`
			PrefixesSent int    `json:"prefixesSent"`
		} `json:"bgp"`
	}
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		code, body, err := g.Get("/api/v1/edge")
		if err != nil || code != 200 {
			return fmt.Errorf("/api/v1/edge: %d %v %s", code, err, body)
		}
		if err := json.Unmarshal([]byte(body), &view); err != nil {
			return err
		}
		if len(view.Services) != 1 || len(view.Services[0].Addresses) != 1 || len(view.BGP) != 2 || len(view.Pools) != 1 {
			return fmt.Errorf("view %s", body)
		}
		a := view.Services[0].Addresses[0]
		if a.Address != edgeFirst.String() || a.Pool != "public" || !a.Announced ||
			len(a.Via) != 1 || a.Via[0] != "bgp "+edgeRouterGW.Addr().String() ||
			view.BGP[0].State != "established" || view.BGP[0].PrefixesSent != 1 || view.BGP[1].PrefixesSent != 0 || view.Pools[0].Used != 1 {
			return fmt.Errorf("view %s", body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, g, "nftgate_pool_addresses_used"); got != 1 {
		t.Errorf("nftgate_pool_addresses_used %v, want 1", got)
	}

	// Endpoints to zero: withdrawn within a second; back: announced.
	start := time.Now()
	g.Write("web.yaml", e.web()...)
	took := e.router.WaitRoute(t, edgeFirstRoute, false, 10*time.Second)
	t.Logf("withdrawn %v after the endpoints went to zero", time.Since(start).Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("withdrawal took %v, want at most 1s", took)
	}
	start = time.Now()
	g.Write("web.yaml", e.web(backends...)...)
	e.router.WaitRoute(t, edgeFirstRoute, true, 10*time.Second)
	t.Logf("announced again %v after the endpoints came back", time.Since(start).Round(time.Millisecond))
	wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", vip, 20), "198.18.2.10:8080", "198.18.2.11:8080")

	// A restart withdraws nothing: BIRD keeps the route, and a client
	// loop of connections sees no failure.
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := e.outside.Dial("tcp", vip, lab.DialOpts{Timeout: time.Second}); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			} else {
				ok.Add(1)
			}
		}
	})
	g.Stop()
	if g.Running() {
		t.Fatal("nftgate still runs after SIGTERM")
	}
	if has, err := e.router.HasRoute(edgeFirstRoute); err != nil || !has {
		t.Errorf("BIRD dropped the route when nftgate stopped: %v %v", has, err)
	}
	g.Start()
	e.router.WaitState(t, "gw4", "Established", false, 30*time.Second)
	// Past the restart deferral: the new speaker has announced and sent
	// its End-of-RIB, and BIRD flushed what was not announced again.
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		out, err := e.router.Run("show protocols all gw4")
		if err != nil {
			return err
		}
		if strings.Contains(out, "Neighbor graceful restart active") || strings.Contains(out, "stale") {
			return fmt.Errorf("graceful restart still running: %s", out)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	close(stop)
	wg.Wait()
	t.Logf("connections through the restart: %d answered, %d failed", ok.Load(), failed.Load())
	if failed.Load() > 0 || ok.Load() == 0 {
		t.Errorf("%d of %d connections failed through the restart (first: %v)", failed.Load(), ok.Load()+failed.Load(), firstErr.Load())
	}
	if has, err := e.router.HasRoute(edgeFirstRoute); err != nil || !has {
		t.Errorf("BIRD lost the route after the restart: %v %v", has, err)
	}
}

// TestEdgeBGPIPv6FromManifests: an IPv6 LoadBalancer Service gets the
// pool's first IPv6 address, announced as a /128 to the IPv6 peer only;
// the outside client reaches the backend over IPv6; endpoints to zero
// withdraw it.
func TestEdgeBGPIPv6FromManifests(t *testing.T) {
	e := newEdgeLab(t)
	testEdgeBGPIPv6(t, e, gatewaytest.New(t, e.topo, "--config", e.config), nil)
}

// TestEdgeBGPIPv6FromKubernetes: the same with a dual-stack Service
// created in a real kube-apiserver: it gets an address of each family
// from the pool (status written), BIRD learns the /32 from the IPv4 peer
// and the /128 from the IPv6 one, and the outside client reaches the
// backend over IPv6.
func TestEdgeBGPIPv6FromKubernetes(t *testing.T) {
	e := newEdgeLab(t)
	g := newEdgeAPIGateway(t, e.topo, "--config", e.config)
	testEdgeBGPIPv6(t, e, g, ingressIs(g, "web6", edgeFirst, edgeFirst6))
}

func testEdgeBGPIPv6(t *testing.T, e *edgeLab, g *gatewaytest.Gateway, statusWritten func() error) {
	gatewaytest.Serve(t, e.topo.Backend, "tcp", ap("[fd42:2::10]:8080"), ap("198.18.2.10:8080"))
	web6 := func(eps ...gatewaytest.Endpoint) []any {
		svc := gatewaytest.Service("default", "web6", "LoadBalancer", []string{"fd42:ff::10"}, gatewaytest.Port{Name: "http", Port: 80})
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		if statusWritten != nil {
			// Dual-stack, as a cluster's Service asks for it.
			policy := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &policy
			svc.Spec.ClusterIPs = []string{"198.19.0.16", "fd42:ff::10"}
			svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}
		sl := gatewaytest.Slice("default", "web6-1", "web6", "http", "", 8080, eps...)
		sl.AddressType = discoveryv1.AddressTypeIPv6 // also when empty: the API keeps it
		objs := []any{svc, sl}
		if statusWritten != nil {
			var v4 []gatewaytest.Endpoint
			if len(eps) > 0 {
				v4 = append(v4, gatewaytest.Endpoint{Addr: "198.18.2.10"})
			}
			objs = append(objs, gatewaytest.Slice("default", "web6-2", "web6", "http", "", 8080, v4...))
		}
		return objs
	}
	g.Write("web6.yaml", web6(gatewaytest.Endpoint{Addr: "fd42:2::10"})...)
	g.Start()
	if statusWritten != nil {
		if err := lab.EventuallyWithin(30*time.Second, statusWritten); err != nil {
			t.Fatal(err)
		}
	}
	route := netip.PrefixFrom(edgeFirst6, 128)
	e.router.WaitState(t, "gw6", "Established", false, 30*time.Second)
	e.router.WaitRoute(t, route, true, 30*time.Second)
	vip := netip.AddrPortFrom(edgeFirst6, 80)
	wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", vip, 10), "[fd42:2::10]:8080")
	if statusWritten != nil {
		// The dual-stack Service's IPv4 address goes to the IPv4 peer.
		e.router.WaitRoute(t, edgeFirstRoute, true, 30*time.Second)
		wantBackends(t, gatewaytest.Backends(t, e.outside, "tcp", netip.AddrPortFrom(edgeFirst, 80), 10), "198.18.2.10:8080")
	} else if n, err := e.router.RouteCount("gw4"); err != nil || n != 0 {
		t.Errorf("the IPv4 session carried %d routes (%v), want none", n, err)
	}
	start := time.Now()
	g.Write("web6.yaml", web6()...)
	e.router.WaitRoute(t, route, false, 10*time.Second)
	took := time.Since(start)
	t.Logf("IPv6: withdrawn %v after the endpoints went to zero", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("withdrawal took %v, want at most 1s", took)
	}
}

// TestEdgeL2FromManifests: with [l2] on the gateway's client-side
// interface, a client on that segment resolves the Service's pool address
// by ARP to the gateway and reaches the backends; when the endpoints go to
// zero the address is answered for no more.
func TestEdgeL2FromManifests(t *testing.T) {
	topo := labtest.Gateway(t)
	const pool = "198.19.201.8/29"
	addr := netip.MustParseAddr("198.19.201.9")
	// The pool is on the client's segment: the client asks ARP for it.
	if out, err := topo.Client.Command(context.Background(), "ip", "route", "add", pool, "dev", topo.ClientIface).CombinedOutput(); err != nil {
		t.Fatalf("ip route add: %v: %s", err, out)
	}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	text := fmt.Sprintf("[l2]\ninterfaces = [%q]\ngratuitous_interval = \"100ms\"\n\n[[pools]]\nname = \"segment\"\naddresses = [%q]\nskip_network_and_broadcast = true\n",
		topo.GatewayClientIface, pool)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, topo, "--config", cfg)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	web := func(eps ...gatewaytest.Endpoint) []any {
		svc := gatewaytest.Service("default", "web", "LoadBalancer", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
		return []any{svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, eps...)}
	}
	backends := []gatewaytest.Endpoint{{Addr: "198.18.2.10"}, {Addr: "198.18.2.11"}}
	g.Write("web.yaml", web(backends...)...)
	g.Start()
	vip := netip.AddrPortFrom(addr, 80)
	wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", vip, 20), "198.18.2.10:8080", "198.18.2.11:8080")
	if code, body, err := g.Get("/api/v1/edge"); err != nil || code != 200 || !strings.Contains(body, `"l2 `+topo.GatewayClientIface+`"`) {
		t.Errorf("/api/v1/edge does not show the L2 announcement: %d %v %s", code, err, body)
	}
	// The status page's Edge panel shows the address, its pool and how it
	// is announced.
	const host = "127.0.0.1:9180"
	b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateway.Name()})
	b.Navigate("http://" + host + "/")
	b.Poll("the edge panel", `!document.getElementById('edge').hidden && document.querySelectorAll('#edge-addrs-body tr').length === 1`)
	row := browsertest.Eval[[]string](b, `Array.from(document.querySelectorAll('#edge-addrs-body td'), td => td.textContent)`)
	if want := []string{"default/web", addr.String(), "segment", "l2 " + topo.GatewayClientIface}; !slices.Equal(row, want) {
		t.Errorf("edge panel row %q, want %q", row, want)
	}
	b.Screenshot(browsertest.ArtifactDir(t, "nftgate"), "edge.png")

	g.Write("web.yaml", web()...)
	if err := lab.EventuallyWithin(5*time.Second, func() error {
		code, body, err := g.Get("/api/v1/edge")
		if err != nil || code != 200 {
			return fmt.Errorf("%d %v", code, err)
		}
		if !strings.Contains(body, `"l2": []`) {
			return fmt.Errorf("still announced: %s", body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := topo.Client.Command(context.Background(), "ip", "neigh", "flush", "to", addr.String()).CombinedOutput(); err != nil {
		t.Fatalf("ip neigh flush: %v: %s", err, out)
	}
	if r, err := topo.Client.Dial("tcp", vip, lab.DialOpts{Timeout: 2 * time.Second}); err == nil {
		t.Errorf("%s still reachable (answered by %s) after its endpoints went away", vip, r.Backend)
	}
	out, _ := topo.Client.Command(context.Background(), "ip", "neigh", "show", "to", addr.String()).CombinedOutput()
	if strings.Contains(string(out), "lladdr") {
		t.Errorf("the client still resolves %s: %s", addr, out)
	}
}

// TestEdgeBGPDrainOnStop: with drain_on_stop, SIGTERM withdraws the
// routes before nftgate exits (the gateway leaves service), where the
// default leaves them to graceful restart (testEdgeBGP).
func TestEdgeBGPDrainOnStop(t *testing.T) {
	e := newEdgeLab(t)
	cfg, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.config, append([]byte("drain_on_stop = true\n"), cfg...), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, e.topo, "--config", e.config)
	gatewaytest.Serve(t, e.topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g.Write("web.yaml", e.web(gatewaytest.Endpoint{Addr: "198.18.2.10"})...)
	g.Start()
	e.router.WaitRoute(t, edgeFirstRoute, true, 30*time.Second)
	g.Stop()
	if has, err := e.router.HasRoute(edgeFirstRoute); err != nil || has {
		t.Errorf("after a drain, BIRD has the route: %v %v", has, err)
	}
}

// TestEdgeL2FromKubernetes: a dual-stack LoadBalancer Service created in
// a real kube-apiserver gets an address of each family from a pool on a
// segment (a Linux bridge) the gateway shares with a neighbour; the
// neighbour resolves them by ARP and by NDP to the gateway and reaches the
// backends; once the Service is deleted, neither address is answered for.
func TestEdgeL2FromKubernetes(t *testing.T) {
	topo := labtest.Gateway(t)
	neighbour, err := topo.AddHost("neighbour")
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	_, ifaces, err := topo.Segment("segment", []*lab.Host{topo.Gateway, neighbour},
		[][]netip.Prefix{{p("198.18.8.1/24"), p("fd42:8::1/64")}, {p("198.18.8.2/24"), p("fd42:8::2/64")}})
	if err != nil {
		t.Fatal(err)
	}
	addrs := []netip.Addr{netip.MustParseAddr("198.18.8.17"), netip.MustParseAddr("fd42:8::10")}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	text := fmt.Sprintf("[l2]\ninterfaces = [%q]\ngratuitous_interval = \"100ms\"\n\n[[pools]]\nname = \"segment\"\naddresses = [\"198.18.8.16/29\", \"fd42:8::10-fd42:8::1f\"]\nskip_network_and_broadcast = true\n", ifaces[0])
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	g := newEdgeAPIGateway(t, topo, "--config", cfg)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
	svc := gatewaytest.Service("default", "web", "LoadBalancer", []string{"198.19.0.10", "fd42:ff::10"}, gatewaytest.Port{Name: "http", Port: 80})
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc.Spec.IPFamilyPolicy = &policy
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	objs := []any{svc, gatewaytest.Slice("default", "web-4", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}),
		gatewaytest.Slice("default", "web-6", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "fd42:2::10"})}
	g.Start()
	// Nothing answers for the addresses before the Service exists.
	for _, a := range addrs {
		if r, err := neighbour.Dial("tcp", netip.AddrPortFrom(a, 80), lab.DialOpts{Timeout: 2 * time.Second}); err == nil {
			t.Fatalf("%s answered (by %s) before any Service has it", a, r.Backend)
		}
	}
	g.Write("web.yaml", objs...)
	if err := lab.EventuallyWithin(30*time.Second, ingressIs(g, "web", addrs...)); err != nil {
		t.Fatal(err)
	}
	backends := []string{"198.18.2.10:8080", "[fd42:2::10]:8080"}
	for i, a := range addrs {
		flush(t, neighbour, a)
		if err := awaitBackend(t, neighbour, netip.AddrPortFrom(a, 80), backends[i], 10*time.Second); err != nil {
			t.Fatalf("%s from the neighbour: %v", a, err)
		}
	}
	if code, body, err := g.Get("/api/v1/edge"); err != nil || code != 200 || strings.Count(body, `"l2 `+ifaces[0]+`"`) != 2 {
		t.Errorf("/api/v1/edge does not show both L2 announcements: %d %v %s", code, err, body)
	}

	g.Remove("web.yaml")
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		_, body, err := g.Get("/api/v1/edge")
		if err != nil || !strings.Contains(body, `"l2": []`) {
			return fmt.Errorf("still announced: %v %s", err, body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		flush(t, neighbour, a)
		if r, err := neighbour.Dial("tcp", netip.AddrPortFrom(a, 80), lab.DialOpts{Timeout: 2 * time.Second}); err == nil {
			t.Errorf("%s still reachable (answered by %s) after its Service was deleted", a, r.Backend)
		}
		out, _ := neighbour.Command(context.Background(), "ip", "neigh", "show", "to", a.String()).CombinedOutput()
		if strings.Contains(string(out), "lladdr") {
			t.Errorf("the neighbour still resolves %s: %s", a, out)
		}
	}
}

// flush forgets h's neighbour entry for a, so that the next packet asks
// for it afresh.
func flush(t *testing.T, h *lab.Host, a netip.Addr) {
	t.Helper()
	if out, err := h.Command(context.Background(), "ip", "neigh", "flush", "to", a.String()).CombinedOutput(); err != nil {
		t.Fatalf("ip neigh flush: %v: %s", err, out)
	}
}
