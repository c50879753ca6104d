package e2e_test

// Every Service behaviour of the Kubernetes documentation, as kube-proxy's
// nftables mode implements it, proven with real traffic through the
// nftgate binary: session affinity, both traffic policies and the
// healthCheckNodePort, endpoint conditions, topology, source ranges,
// dual-stack, SCTP and the edge cases kube-proxy handles. The ruleset-level
// cases of the same behaviours are in nft/trace_test.go.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/healthcheck"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// behaviourLab is one gateway shared by the subtests of a behaviour test;
// each subtest owns its Services and their addresses.
type behaviourLab struct {
	topo *lab.Topology
	g    *gatewaytest.Gateway
}

// b4 is backend i's IPv4 address with port p; b6 its IPv6 one.
func (l *behaviourLab) b4(i int, p uint16) string {
	return netip.AddrPortFrom(l.topo.BackendIPv4[i], p).String()
}

func (l *behaviourLab) b6(i int, p uint16) string {
	return netip.AddrPortFrom(l.topo.BackendIPv6[i], p).String()
}

// nodePort4 and nodePort6 are the gateway's node port on the client network.
func (l *behaviourLab) nodePort4(p uint16) netip.AddrPort {
	return netip.AddrPortFrom(l.topo.GatewayClientIPv4, p)
}

func (l *behaviourLab) nodePort6(p uint16) netip.AddrPort {
	return netip.AddrPortFrom(l.topo.GatewayClientIPv6, p)
}

// from is DialOpts sending from the client's address a, on a fresh port.
func from(a netip.Addr) lab.DialOpts { return lab.DialOpts{Source: netip.AddrPortFrom(a, 0)} }

// backendsFrom dials dst n times with opts and counts the answering backends.
func (l *behaviourLab) backendsFrom(t *testing.T, proto string, dst netip.AddrPort, opts lab.DialOpts, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		r, err := l.topo.Client.Dial(proto, dst, opts)
		if err != nil {
			t.Fatalf("%s %s from %s: %v", proto, dst, opts.Source, err)
		}
		seen[r.Backend]++
	}
	return seen
}

// eventuallyBackends waits until n connections to dst are answered by
// exactly the wanted backends: the gateway has applied a change.
func (l *behaviourLab) eventuallyBackends(t *testing.T, proto string, dst netip.AddrPort, n int, want ...string) {
	t.Helper()
	err := lab.EventuallyWithin(10*time.Second, func() error {
		seen := map[string]int{}
		for i := 0; i < n; i++ {
			r, err := l.topo.Client.Dial(proto, dst, lab.DialOpts{Timeout: time.Second})
			if err != nil {
				return err
			}
			seen[r.Backend]++
		}
		if len(seen) != len(want) {
			return fmt.Errorf("answers from %v, want all and only %v", seen, want)
		}
		for _, w := range want {
			if seen[w] == 0 {
				return fmt.Errorf("answers from %v, want all and only %v", seen, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s %s: %v", proto, dst, err)
	}
}

// dropTimeout bounds a dial that must go unanswered: long enough that an
// answer between namespaces would certainly have come.
const dropTimeout = 700 * time.Millisecond

// wantDropped checks that a connection to dst is silently dropped, not
// rejected and not answered.
func (l *behaviourLab) wantDropped(t *testing.T, proto string, dst netip.AddrPort, opts lab.DialOpts) {
	t.Helper()
	opts.Timeout = dropTimeout
	r, err := l.topo.Client.Dial(proto, dst, opts)
	if !lab.IsTimeout(err) {
		t.Errorf("%s %s from %s: got %v %v, want a drop (timeout)", proto, dst, opts.Source, r.Backend, err)
	}
}

// wantRefused checks that a connection to dst is rejected at once.
func (l *behaviourLab) wantRefused(t *testing.T, proto string, dst netip.AddrPort) {
	t.Helper()
	r, err := l.topo.Client.Dial(proto, dst, lab.DialOpts{Timeout: 2 * time.Second})
	if !lab.IsRefused(err) {
		t.Errorf("%s %s: got %v %v, want refused", proto, dst, r.Backend, err)
	}
}

// eventuallyRefused waits until connections to dst are rejected.
func (l *behaviourLab) eventuallyRefused(t *testing.T, proto string, dst netip.AddrPort) {
	t.Helper()
	err := lab.EventuallyWithin(10*time.Second, func() error {
		r, err := l.topo.Client.Dial(proto, dst, lab.DialOpts{Timeout: time.Second})
		if !lab.IsRefused(err) {
			return fmt.Errorf("got %v %v, want refused", r.Backend, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s %s: %v", proto, dst, err)
	}
}

// healthCheck fetches a healthCheckNodePort from the client namespace.
func (l *behaviourLab) healthCheck(addr netip.Addr, port uint16) (code int, body, weight string, err error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return l.topo.Client.DialContext(ctx, network, address)
		},
	}}
	resp, err := client.Get("http://" + netip.AddrPortFrom(addr, port).String() + "/")
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), err
}

// eventuallyHealth waits until the health check of svc on port answers
// code with the given local endpoint count, in kube-proxy's exact format.
func (l *behaviourLab) eventuallyHealth(t *testing.T, svc model.ServiceKey, port uint16, code, local int) {
	t.Helper()
	want := healthcheck.Body(svc, local, true)
	err := lab.EventuallyWithin(10*time.Second, func() error {
		got, body, weight, err := l.healthCheck(l.topo.GatewayClientIPv4, port)
		if err != nil {
			return err
		}
		if got != code || body != want || weight != fmt.Sprint(local) {
			return fmt.Errorf("got %d, weight %q, body %q; want %d, weight %d, body %q", got, weight, body, code, local, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("health check of %s on port %d: %v", svc, port, err)
	}
}

// ep builds a slice endpoint; node "" leaves nodeName unset.
func ep(addr, node string) gatewaytest.Endpoint {
	return gatewaytest.Endpoint{Addr: addr, NodeName: node}
}

// withHints sets zone hints on a slice's endpoints, one list per endpoint
// (nil: no hints), and node hints where nodes[i] is not empty.
func withHints(sl *discoveryv1.EndpointSlice, zones [][]string, nodes []string) *discoveryv1.EndpointSlice {
	for i := range sl.Endpoints {
		var h discoveryv1.EndpointHints
		for _, z := range zones[i] {
			h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
		}
		if i < len(nodes) && nodes[i] != "" {
			h.ForNodes = []discoveryv1.ForNode{{Name: nodes[i]}}
		}
		if len(h.ForZones) > 0 || len(h.ForNodes) > 0 {
			sl.Endpoints[i].Hints = &h
		}
	}
	return sl
}

func ptrTo[T any](v T) *T { return &v }

// TestServiceBehaviour runs every behaviour on one gateway serving
// manifests (IPv6 ClusterIPs and hand-picked ports need no allocator).
func TestServiceBehaviour(t *testing.T) {
	topo := labtest.Gateway(t)
	l := &behaviourLab{topo: topo}
	for i := 0; i < 20; i++ {
		gatewaytest.Serve(t, topo.Backend, "tcp", netip.AddrPortFrom(topo.BackendIPv4[i], 8080))
	}
	for i := 0; i < 4; i++ {
		gatewaytest.Serve(t, topo.Backend, "tcp", netip.AddrPortFrom(topo.BackendIPv6[i], 8080))
	}
	gatewaytest.Serve(t, topo.Backend, "udp", netip.AddrPortFrom(topo.BackendIPv4[0], 5353))
	l.g = gatewaytest.New(t, topo, append([]string{"--zone", "zone-a"}, gatewaytest.VIPExternalIPs...)...)
	// Something to serve from the start; each subtest adds its own.
	l.g.Write("base.yaml", gatewaytest.Service("default", "base", "ClusterIP", []string{"198.19.0.2"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "base-1", "base", "http", "", 8080, ep("198.18.2.10", "")))
	l.g.Start()

	t.Run("SessionAffinity", l.testSessionAffinity)
	t.Run("ExternalTrafficPolicyLocal", l.testExternalTrafficPolicyLocal)
	t.Run("HealthCheckNodePort", l.testHealthCheckNodePort)
	t.Run("InternalTrafficPolicyLocal", l.testInternalTrafficPolicyLocal)
	t.Run("TerminatingEndpoints", l.testTerminatingEndpoints)
	t.Run("Topology", l.testTopology)
	t.Run("LoadBalancerSourceRanges", l.testLoadBalancerSourceRanges)
	t.Run("DualStack", l.testDualStack)
	t.Run("EdgeCases", l.testEdgeCases)
}

// Session affinity ClientIP: each client sticks to one backend over many
// connections, clients spread, stickiness ends with the timeout, and a
// client whose backend goes away moves to a live one at once.
func (l *behaviourLab) testSessionAffinity(t *testing.T) {
	const timeout = 2
	svc := gatewaytest.Service("default", "sticky", "ClusterIP", []string{"198.19.0.21"}, gatewaytest.Port{Name: "http", Port: 80})
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(timeout))}}
	all := []string{l.b4(0, 8080), l.b4(1, 8080), l.b4(2, 8080), l.b4(3, 8080)}
	slice := func(eps ...gatewaytest.Endpoint) *discoveryv1.EndpointSlice {
		return gatewaytest.Slice("default", "sticky-1", "sticky", "http", "", 8080, eps...)
	}
	l.g.Write("sticky.yaml", svc, slice(ep("198.18.2.10", ""), ep("198.18.2.11", ""), ep("198.18.2.12", ""), ep("198.18.2.13", "")))
	dst := ap("198.19.0.21:80")
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		_, err := l.topo.Client.Dial("tcp", dst, lab.DialOpts{Timeout: time.Second})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// stick dials n times from each client and checks that each got one
	// backend throughout; it returns them.
	stick := func(n int) map[netip.Addr]string {
		t.Helper()
		stuck := map[netip.Addr]string{}
		for _, c := range l.topo.ClientIPv4 {
			seen := l.backendsFrom(t, "tcp", dst, from(c), n)
			if len(seen) != 1 {
				t.Fatalf("client %s went to %v, want one backend", c, seen)
			}
			for b := range seen {
				stuck[c] = b
			}
		}
		return stuck
	}
	stuck := stick(10)
	used := map[string]bool{}
	for _, b := range stuck {
		used[b] = true
	}
	if len(used) < 2 {
		t.Errorf("%d clients all stuck to %v: affinity does not spread clients", len(stuck), stuck)
	}

	// The timeout itself is the behaviour under test: after it, each
	// client's next connection is a new choice.
	time.Sleep(timeout*time.Second + 500*time.Millisecond)
	moved := 0
	for _, c := range l.topo.ClientIPv4 {
		r, err := l.topo.Client.Dial("tcp", dst, from(c))
		if err != nil {
			t.Fatal(err)
		}
		if r.Backend != stuck[c] {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("after the %d s timeout no client of %d landed elsewhere: affinity did not expire", timeout, len(stuck))
	}
	stuck = stick(5) // and they stick again

	// The backend of the first client goes away: it moves to a live one
	// at once, and sticks there; clients on other backends keep theirs.
	c0 := l.topo.ClientIPv4[0]
	gone := stuck[c0]
	var live []gatewaytest.Endpoint
	for _, b := range all {
		if b != gone {
			live = append(live, ep(ap(b).Addr().String(), ""))
		}
	}
	l.g.Write("sticky.yaml", svc, slice(live...))
	var now string
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		r, err := l.topo.Client.Dial("tcp", dst, from(c0))
		if err != nil {
			return err
		}
		if r.Backend == gone {
			return fmt.Errorf("still on the removed backend %s", gone)
		}
		now = r.Backend
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if seen := l.backendsFrom(t, "tcp", dst, from(c0), 10); len(seen) != 1 || seen[now] == 0 {
		t.Errorf("client %s moved from %s to %s, then went to %v", c0, gone, now, seen)
	}
	for c, b := range stuck {
		if b == gone {
			continue
		}
		if seen := l.backendsFrom(t, "tcp", dst, from(c), 3); len(seen) != 1 || seen[b] == 0 {
			t.Errorf("client %s was on %s, which stayed; after the change it went to %v", c, b, seen)
		}
	}
	l.g.Remove("sticky.yaml")
}

// localService is a LoadBalancer Service with externalTrafficPolicy Local
// reachable every external way: node port 30000+n, ExternalIP 198.19.1.n,
// LoadBalancer IP 198.19.2.n, ClusterIP 198.19.0.n.
func localService(name string, n int, healthPort int32) *corev1.Service {
	s := gatewaytest.Service("default", name, "LoadBalancer", []string{fmt.Sprintf("198.19.0.%d", n)},
		gatewaytest.Port{Name: "http", Port: 80, NodePort: int32(30000 + n)})
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = healthPort
	s.Spec.ExternalIPs = []string{fmt.Sprintf("198.19.1.%d", n)}
	s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("198.19.2.%d", n)}}
	return s
}

func (l *behaviourLab) externalDsts(n int) []netip.AddrPort {
	return []netip.AddrPort{
		l.nodePort4(uint16(30000 + n)),
		ap(fmt.Sprintf("198.19.1.%d:80", n)),
		ap(fmt.Sprintf("198.19.2.%d:80", n)),
	}
}

// externalTrafficPolicy Local: external traffic only to this node's
// endpoints, with the client's own address; dropped without one.
func (l *behaviourLab) testExternalTrafficPolicyLocal(t *testing.T) {
	l.g.Write("local.yaml",
		localService("local", 31, 0),
		gatewaytest.Slice("default", "local-1", "local", "http", "", 8080, ep("198.18.2.14", "gateway"), ep("198.18.2.15", "other")),
		localService("remote", 32, 0),
		gatewaytest.Slice("default", "remote-1", "remote", "http", "", 8080, ep("198.18.2.16", "other"), ep("198.18.2.17", "other")))
	l.eventuallyBackends(t, "tcp", ap("198.19.0.31:80"), 20, l.b4(4, 8080), l.b4(5, 8080))

	for _, dst := range l.externalDsts(31) {
		for i, c := range l.topo.ClientIPv4[:3] {
			r, err := l.topo.Client.Dial("tcp", dst, from(c))
			if err != nil {
				t.Fatalf("%s from %s: %v", dst, c, err)
			}
			if r.Backend != l.b4(4, 8080) {
				t.Errorf("%s from %s (try %d): answered by %s, want only the local endpoint %s", dst, c, i, r.Backend, l.b4(4, 8080))
			}
			if r.ObservedSource.Addr() != c {
				t.Errorf("%s from %s: the backend saw %s, want the client's own address", dst, c, r.ObservedSource)
			}
		}
	}
	// The ClusterIP keeps policy Cluster: both endpoints, masqueraded.
	r, err := l.topo.Client.Dial("tcp", ap("198.19.0.31:80"), lab.DialOpts{})
	if err != nil || r.ObservedSource.Addr() != l.topo.GatewayBackendIPv4 {
		t.Errorf("ClusterIP of a Local Service: %v, backend saw %s, want the gateway's %s", err, r.ObservedSource, l.topo.GatewayBackendIPv4)
	}

	// No local endpoint: dropped, so that the load balancer's health
	// check, not a reset, steers clients away.
	for _, dst := range l.externalDsts(32) {
		l.wantDropped(t, "tcp", dst, lab.DialOpts{})
	}
	wantBackends(t, gatewaytest.Backends(t, l.topo.Client, "tcp", ap("198.19.0.32:80"), 20), l.b4(6, 8080), l.b4(7, 8080))

	// The local endpoint stops being ready but keeps serving while it
	// terminates: Local traffic still goes to it.
	term := gatewaytest.Endpoint{Addr: "198.18.2.14", NodeName: "gateway", Terminating: true}
	l.g.Write("local.yaml",
		localService("local", 31, 0),
		gatewaytest.Slice("default", "local-1", "local", "http", "", 8080, term, ep("198.18.2.15", "other")))
	l.eventuallyBackends(t, "tcp", ap("198.19.0.31:80"), 10, l.b4(5, 8080))
	l.eventuallyBackends(t, "tcp", l.nodePort4(30031), 5, l.b4(4, 8080))
	l.g.Remove("local.yaml")
}

// healthCheckNodePort: 200 with the local endpoint count while there are
// ready local endpoints, 503 otherwise, opened and closed with the Service;
// a port that cannot be bound is retried without holding up the sync.
func (l *behaviourLab) testHealthCheckNodePort(t *testing.T) {
	local := model.NewServiceKey("default", "hc-local")
	remote := model.NewServiceKey("default", "hc-remote")
	twoLocal := gatewaytest.Slice("default", "hc-local-1", "hc-local", "http", "", 8080,
		ep("198.18.2.14", "gateway"), ep("198.18.2.15", "gateway"), ep("198.18.2.16", "other"))
	l.g.Write("hc.yaml",
		localService("hc-local", 33, 31033), twoLocal,
		localService("hc-remote", 34, 31034),
		gatewaytest.Slice("default", "hc-remote-1", "hc-remote", "http", "", 8080, ep("198.18.2.16", "other")))
	l.eventuallyHealth(t, local, 31033, http.StatusOK, 2)
	l.eventuallyHealth(t, remote, 31034, http.StatusServiceUnavailable, 0)
	// Every address of the gateway serves it, IPv6 too; each family
	// reports its own endpoints, as kube-proxy's per-family proxiers do,
	// and this Service has no IPv6 ones.
	if code, body, _, err := l.healthCheck(l.topo.GatewayClientIPv6, 31033); err != nil ||
		code != http.StatusServiceUnavailable || body != healthcheck.Body(local, 0, true) {
		t.Errorf("health check on %s: %d %q %v", l.topo.GatewayClientIPv6, code, body, err)
	}

	// Local endpoints terminate: they still take Local traffic, but the
	// check fails so that the load balancer drains the node.
	l.g.Write("hc.yaml",
		localService("hc-local", 33, 31033),
		gatewaytest.Slice("default", "hc-local-1", "hc-local", "http", "", 8080,
			gatewaytest.Endpoint{Addr: "198.18.2.14", NodeName: "gateway", Terminating: true}, ep("198.18.2.16", "other")),
		localService("hc-remote", 34, 31034),
		gatewaytest.Slice("default", "hc-remote-1", "hc-remote", "http", "", 8080, ep("198.18.2.17", "gateway")))
	l.eventuallyHealth(t, local, 31033, http.StatusServiceUnavailable, 0)
	l.eventuallyHealth(t, remote, 31034, http.StatusOK, 1)

	// A Service that goes away closes its port; switching to policy
	// Cluster does too.
	cluster := localService("hc-local", 33, 0)
	cluster.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	l.g.Write("hc.yaml", cluster, twoLocal)
	for _, port := range []uint16{31033, 31034} {
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			_, _, _, err := l.healthCheck(l.topo.GatewayClientIPv4, port)
			if !lab.IsRefused(err) {
				return fmt.Errorf("port %d: got %v, want refused", port, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	// A port something else holds: logged, retried, and the Service's
	// traffic is programmed meanwhile.
	busy, err := l.topo.Gateway.Listen("tcp", ":31035")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	l.g.Write("hc-busy.yaml", localService("hc-busy", 35, 31035),
		gatewaytest.Slice("default", "hc-busy-1", "hc-busy", "http", "", 8080, ep("198.18.2.18", "gateway")))
	l.eventuallyBackends(t, "tcp", l.nodePort4(30035), 3, l.b4(8, 8080))
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if !strings.Contains(l.g.Logs(), "health check port cannot be opened") || !strings.Contains(l.g.Logs(), "31035") {
			return fmt.Errorf("no log line about port 31035")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	busy.Close()
	l.eventuallyHealth(t, model.NewServiceKey("default", "hc-busy"), 31035, http.StatusOK, 1)
	l.g.Remove("hc.yaml")
	l.g.Remove("hc-busy.yaml")
}

// internalTrafficPolicy Local: ClusterIP traffic only to this node's
// endpoints, dropped without one.
func (l *behaviourLab) testInternalTrafficPolicyLocal(t *testing.T) {
	itp := func(name, ip string) *corev1.Service {
		s := gatewaytest.Service("default", name, "ClusterIP", []string{ip}, gatewaytest.Port{Name: "http", Port: 80})
		s.Spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
		return s
	}
	l.g.Write("itp.yaml",
		itp("itp", "198.19.0.41"),
		gatewaytest.Slice("default", "itp-1", "itp", "http", "", 8080, ep("198.18.2.10", "gateway"), ep("198.18.2.11", "other"), ep("198.18.2.12", "gateway")),
		itp("itp-remote", "198.19.0.42"),
		gatewaytest.Slice("default", "itp-remote-1", "itp-remote", "http", "", 8080, ep("198.18.2.13", "other")))
	l.eventuallyBackends(t, "tcp", ap("198.19.0.41:80"), 30, l.b4(0, 8080), l.b4(2, 8080))
	l.wantDropped(t, "tcp", ap("198.19.0.42:80"), lab.DialOpts{})
	l.g.Remove("itp.yaml")
}

// Endpoint conditions: ready endpoints only; serving-and-terminating ones
// when none is ready; never not-serving ones.
func (l *behaviourLab) testTerminatingEndpoints(t *testing.T) {
	svc := gatewaytest.Service("default", "drain", "ClusterIP", []string{"198.19.0.51"}, gatewaytest.Port{Name: "http", Port: 80})
	terminatingNotServing := func(sl *discoveryv1.EndpointSlice, i int) *discoveryv1.EndpointSlice {
		sl.Endpoints[i].Conditions = discoveryv1.EndpointConditions{Ready: ptrTo(false), Serving: ptrTo(false), Terminating: ptrTo(true)}
		return sl
	}
	dst := ap("198.19.0.51:80")
	l.g.Write("drain.yaml", svc, gatewaytest.Slice("default", "drain-1", "drain", "http", "", 8080,
		ep("198.18.2.10", ""),
		gatewaytest.Endpoint{Addr: "198.18.2.11", Terminating: true},
		gatewaytest.Endpoint{Addr: "198.18.2.12", NotReady: true},
		gatewaytest.Endpoint{Addr: "198.18.2.13", Dead: true}))
	l.eventuallyBackends(t, "tcp", dst, 20, l.b4(0, 8080))

	l.g.Write("drain.yaml", svc, terminatingNotServing(gatewaytest.Slice("default", "drain-1", "drain", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.11", Terminating: true},
		gatewaytest.Endpoint{Addr: "198.18.2.14", Terminating: true},
		gatewaytest.Endpoint{Addr: "198.18.2.12", NotReady: true},
		gatewaytest.Endpoint{Addr: "198.18.2.13", Dead: true},
		gatewaytest.Endpoint{Addr: "198.18.2.15"}), 4))
	l.eventuallyBackends(t, "tcp", dst, 30, l.b4(1, 8080), l.b4(4, 8080))

	l.g.Write("drain.yaml", svc, terminatingNotServing(gatewaytest.Slice("default", "drain-1", "drain", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.12", NotReady: true},
		gatewaytest.Endpoint{Addr: "198.18.2.13", Dead: true},
		gatewaytest.Endpoint{Addr: "198.18.2.15"}), 2))
	l.eventuallyRefused(t, "tcp", dst)
	l.g.Remove("drain.yaml")
}

// Topology: with the gateway in zone-a (--zone), only endpoints hinted for
// zone-a, when every ready endpoint has hints and one matches; all of them
// otherwise. Node hints for this node win over zone hints.
func (l *behaviourLab) testTopology(t *testing.T) {
	svc := gatewaytest.Service("default", "zoned", "ClusterIP", []string{"198.19.0.61"}, gatewaytest.Port{Name: "http", Port: 80})
	svc.Spec.TrafficDistribution = ptrTo(corev1.ServiceTrafficDistributionPreferSameZone)
	three := func() *discoveryv1.EndpointSlice {
		return gatewaytest.Slice("default", "zoned-1", "zoned", "http", "", 8080, ep("198.18.2.10", ""), ep("198.18.2.11", ""), ep("198.18.2.12", ""))
	}
	dst := ap("198.19.0.61:80")
	all := []string{l.b4(0, 8080), l.b4(1, 8080), l.b4(2, 8080)}

	l.g.Write("zoned.yaml", svc, withHints(three(), [][]string{{"zone-a"}, {"zone-b"}, {"zone-a"}}, nil))
	l.eventuallyBackends(t, "tcp", dst, 30, l.b4(0, 8080), l.b4(2, 8080))

	l.g.Write("zoned.yaml", svc, withHints(three(), [][]string{{"zone-a"}, nil, {"zone-a"}}, nil))
	l.eventuallyBackends(t, "tcp", dst, 40, all...)

	l.g.Write("zoned.yaml", svc, withHints(three(), [][]string{{"zone-b"}, {"zone-c"}, {"zone-b"}}, nil))
	l.eventuallyBackends(t, "tcp", dst, 40, all...)

	// Hints of an endpoint that is not ready do not count.
	notReady := withHints(three(), [][]string{{"zone-a"}, nil, {"zone-a"}}, nil)
	notReady.Endpoints[1].Conditions.Ready = ptrTo(false)
	l.g.Write("zoned.yaml", svc, notReady)
	l.eventuallyBackends(t, "tcp", dst, 30, l.b4(0, 8080), l.b4(2, 8080))

	svc.Spec.TrafficDistribution = ptrTo(corev1.ServiceTrafficDistributionPreferSameNode)
	l.g.Write("zoned.yaml", svc, withHints(three(), [][]string{{"zone-a"}, {"zone-a"}, {"zone-a"}}, []string{"other", "gateway", "other"}))
	l.eventuallyBackends(t, "tcp", dst, 20, l.b4(1, 8080))
	l.g.Remove("zoned.yaml")
}

// loadBalancerSourceRanges: only sources inside reach the LoadBalancer IP;
// others are dropped there, and reach the node port, ExternalIP and
// ClusterIP as before.
func (l *behaviourLab) testLoadBalancerSourceRanges(t *testing.T) {
	svc := gatewaytest.Service("default", "ranged", "LoadBalancer", []string{"198.19.0.71"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30071})
	svc.Spec.ExternalIPs = []string{"198.19.1.71"}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.71"}}
	// ClientIPv4[0] alone, and ClientIPv4[2..3] as a /31.
	c := l.topo.ClientIPv4
	svc.Spec.LoadBalancerSourceRanges = []string{c[0].String() + "/32", c[2].String() + "/31"}
	l.g.Write("ranged.yaml", svc, gatewaytest.Slice("default", "ranged-1", "ranged", "http", "", 8080, ep("198.18.2.19", "")))
	lb := ap("198.19.2.71:80")
	l.eventuallyBackends(t, "tcp", ap("198.19.0.71:80"), 3, l.b4(9, 8080))
	for _, in := range []netip.Addr{c[0], c[2], c[3]} {
		if r, err := l.topo.Client.Dial("tcp", lb, from(in)); err != nil || r.Backend != l.b4(9, 8080) {
			t.Errorf("LB IP from %s, inside the ranges: %v %v", in, r.Backend, err)
		}
	}
	for _, out := range []netip.Addr{c[1], c[4]} {
		l.wantDropped(t, "tcp", lb, from(out))
		for _, dst := range []netip.AddrPort{l.nodePort4(30071), ap("198.19.1.71:80"), ap("198.19.0.71:80")} {
			if r, err := l.topo.Client.Dial("tcp", dst, from(out)); err != nil || r.Backend != l.b4(9, 8080) {
				t.Errorf("%s from %s, outside the LB ranges: %v %v", dst, out, r.Backend, err)
			}
		}
	}
	l.g.Remove("ranged.yaml")
}

// Dual-stack: an IPv6 Service every way (ClusterIP, ExternalIP, LB IP,
// node port, IPv6 endpoints), and a dual-stack Service on both families.
func (l *behaviourLab) testDualStack(t *testing.T) {
	v6 := gatewaytest.Service("default", "v6", "LoadBalancer", []string{"fd42:ff::81"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30081})
	v6.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	v6.Spec.ExternalIPs = []string{"fd42:ff::181"}
	v6.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd42:ff::281"}}
	dual := gatewaytest.Service("default", "dual", "NodePort", []string{"198.19.0.82", "fd42:ff::82"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30082})
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	dual.Spec.IPFamilyPolicy = ptrTo(corev1.IPFamilyPolicyRequireDualStack)
	l.g.Write("v6.yaml",
		v6, gatewaytest.Slice("default", "v6-1", "v6", "http", "", 8080, ep("fd42:2::10", ""), ep("fd42:2::11", "")),
		dual,
		gatewaytest.Slice("default", "dual-4", "dual", "http", "", 8080, ep("198.18.2.16", "")),
		gatewaytest.Slice("default", "dual-6", "dual", "http", "", 8080, ep("fd42:2::12", ""), ep("fd42:2::13", "")))
	v6eps := []string{l.b6(0, 8080), l.b6(1, 8080)}
	for _, dst := range []netip.AddrPort{ap("[fd42:ff::81]:80"), ap("[fd42:ff::181]:80"), ap("[fd42:ff::281]:80"), l.nodePort6(30081)} {
		l.eventuallyBackends(t, "tcp", dst, 30, v6eps...)
	}
	r, err := l.topo.Client.Dial("tcp", ap("[fd42:ff::81]:80"), lab.DialOpts{})
	if err != nil || r.ObservedSource.Addr() != l.topo.GatewayBackendIPv6 {
		t.Errorf("IPv6 ClusterIP from outside the cluster: %v, backend saw %s, want the gateway's %s", err, r.ObservedSource, l.topo.GatewayBackendIPv6)
	}
	// The IPv6-only Service has no IPv4 node port.
	l.wantRefused(t, "tcp", l.nodePort4(30081))

	l.eventuallyBackends(t, "tcp", ap("198.19.0.82:80"), 5, l.b4(6, 8080))
	l.eventuallyBackends(t, "tcp", l.nodePort4(30082), 5, l.b4(6, 8080))
	l.eventuallyBackends(t, "tcp", ap("[fd42:ff::82]:80"), 30, l.b6(2, 8080), l.b6(3, 8080))
	l.eventuallyBackends(t, "tcp", l.nodePort6(30082), 30, l.b6(2, 8080), l.b6(3, 8080))
	l.g.Remove("v6.yaml")
}

// Edge cases kube-proxy handles.
func (l *behaviourLab) testEdgeCases(t *testing.T) {
	t.Run("LoadBalancer without node ports", func(t *testing.T) {
		svc := gatewaytest.Service("default", "nonp", "LoadBalancer", []string{"198.19.0.91"}, gatewaytest.Port{Name: "http", Port: 80})
		svc.Spec.AllocateLoadBalancerNodePorts = ptrTo(false)
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.91"}}
		l.g.Write("nonp.yaml", svc, gatewaytest.Slice("default", "nonp-1", "nonp", "http", "", 8080, ep("198.18.2.17", "")))
		l.eventuallyBackends(t, "tcp", ap("198.19.2.91:80"), 3, l.b4(7, 8080))
		l.eventuallyBackends(t, "tcp", ap("198.19.0.91:80"), 3, l.b4(7, 8080))
		out := l.g.Nft("list", "map", "ip", serviceTable(t, l.g, "default", "nonp"), "service-nodeports")
		if strings.Contains(out, "default/nonp") {
			t.Errorf("a LoadBalancer without node ports has a node port element:\n%s", out)
		}
		l.g.Remove("nonp.yaml")
	})

	t.Run("same endpoint in two slices", func(t *testing.T) {
		svc := gatewaytest.Service("default", "dup", "ClusterIP", []string{"198.19.0.92"}, gatewaytest.Port{Name: "http", Port: 80})
		// .10 is listed twice, once not ready (a slice being replaced):
		// it is used once, as ready.
		l.g.Write("dup.yaml", svc,
			gatewaytest.Slice("default", "dup-a", "dup", "http", "", 8080, ep("198.18.2.10", ""), ep("198.18.2.11", "")),
			gatewaytest.Slice("default", "dup-b", "dup", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10", NotReady: true}, ep("198.18.2.12", "")))
		l.eventuallyBackends(t, "tcp", ap("198.19.0.92:80"), 40, l.b4(0, 8080), l.b4(1, 8080), l.b4(2, 8080))
		eps := endpointsOf(t, l.g, serviceTable(t, l.g, "default", "dup"), "198.19.0.92 . tcp . 80")
		if n := strings.Count(strings.Join(eps, " "), "198.18.2.10:8080"); n != 1 || len(eps) != 3 {
			t.Errorf("the endpoint listed in two slices is %d of the Service's endpoints %v, want one of three", n, eps)
		}
		l.g.Remove("dup.yaml")
	})

	t.Run("endpoint port missing from a slice", func(t *testing.T) {
		svc := gatewaytest.Service("default", "partial", "ClusterIP", []string{"198.19.0.93"},
			gatewaytest.Port{Name: "http", Port: 80}, gatewaytest.Port{Name: "admin", Port: 81})
		// The admin slice's port has no number: its endpoints do not
		// serve that port, which is then without endpoints.
		admin := gatewaytest.Slice("default", "partial-admin", "partial", "admin", "", 8080, ep("198.18.2.14", ""))
		admin.Ports[0].Port = nil
		l.g.Write("partial.yaml", svc, gatewaytest.Slice("default", "partial-http", "partial", "http", "", 8080, ep("198.18.2.13", "")), admin)
		l.eventuallyBackends(t, "tcp", ap("198.19.0.93:80"), 3, l.b4(3, 8080))
		l.wantRefused(t, "tcp", ap("198.19.0.93:81"))
		l.g.Remove("partial.yaml")
	})

	t.Run("port changes protocol", func(t *testing.T) {
		mk := func(proto corev1.Protocol, port int32) []any {
			return []any{
				gatewaytest.Service("default", "proto", "ClusterIP", []string{"198.19.0.94"}, gatewaytest.Port{Name: "dns", Protocol: proto, Port: 53}),
				gatewaytest.Slice("default", "proto-1", "proto", "dns", proto, port, ep("198.18.2.10", "")),
			}
		}
		dst := ap("198.19.0.94:53")
		l.g.Write("proto.yaml", mk(corev1.ProtocolTCP, 8080)...)
		l.eventuallyBackends(t, "tcp", dst, 3, l.b4(0, 8080))
		l.g.Write("proto.yaml", mk(corev1.ProtocolUDP, 5353)...)
		l.eventuallyBackends(t, "udp", dst, 3, l.b4(0, 5353))
		// TCP to that port is now a ClusterIP port no Service has.
		l.wantRefused(t, "tcp", dst)
		l.g.Remove("proto.yaml")
	})
}

// serviceTable is the shard table holding a Service's chains and dispatch
// elements, at the shard count the gateway runs with ("auto" chose it at
// the first full sync from the Services then): its IPv4 shard tables
// counted.
func serviceTable(t *testing.T, g *gatewaytest.Gateway, namespace, name string) string {
	t.Helper()
	cfg := ruleset.Config{Table: "nftgate"}
	for _, line := range strings.Split(g.Nft("list", "tables", "ip"), "\n") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(line), "table ip "); ok && cfg.IsShardTable(t) {
			cfg.Shards++
		}
	}
	if cfg.Shards == 0 {
		t.Fatal("the gateway has no shard table")
	}
	return cfg.TableOf(model.NewServiceKey(namespace, name))
}

// chainOf returns the chain a service-ips element (key as nft prints it)
// of a shard table points to.
func chainOf(t *testing.T, g *gatewaytest.Gateway, table, key string) string {
	t.Helper()
	out := g.Nft("list", "map", "ip", table, "service-ips")
	// An element with a counter prints it between the key and the verdict.
	elem := regexp.MustCompile(`(^|[\s{,])` + regexp.QuoteMeta(key) + `( counter packets \d+ bytes \d+)? : goto ([^\s,}]+)`)
	for _, line := range strings.Split(out, "\n") {
		if m := elem.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			return m[3]
		}
	}
	t.Fatalf("no element %q in service-ips:\n%s", key, out)
	return ""
}

// endpointsOf returns, in bucket order, the endpoints a destination (key
// as nft prints it) of a shard table has in the endpoint maps its
// service-ips element's pick chain looks up.
func endpointsOf(t *testing.T, g *gatewaytest.Gateway, table, key string) []string {
	t.Helper()
	chain := chainOf(t, g, table, key)
	n, err := strconv.Atoi(chain[strings.LastIndexByte(chain, '-')+1:])
	if !strings.HasPrefix(chain, "pick-") || err != nil {
		t.Fatalf("%s goes to chain %s, not to a pick chain", key, chain)
	}
	elem := regexp.MustCompile(`(^|[\s{,])` + regexp.QuoteMeta(key) + ` : ([0-9a-f.:]+) \. (\d+)`)
	var out []string
	for i := range n {
		m := elem.FindStringSubmatch(g.Nft("list", "map", "ip", table, ruleset.EndpointMap(false, i)))
		if m == nil {
			t.Fatalf("no element %q in %s", key, ruleset.EndpointMap(false, i))
		}
		out = append(out, m[2]+":"+m[3])
	}
	return out
}

// TestServiceBehaviourAPI covers what needs the API server's allocators:
// a Service changing type (node ports allocated and released), a ClusterIP
// reused right after its Service was deleted, and an allocated
// healthCheckNodePort.
func TestServiceBehaviourAPI(t *testing.T) {
	topo := labtest.Gateway(t)
	l := &behaviourLab{topo: topo}
	for i := 0; i < 4; i++ {
		gatewaytest.Serve(t, topo.Backend, "tcp", netip.AddrPortFrom(topo.BackendIPv4[i], 8080))
	}
	l.g = gatewaytest.NewWithAPI(t, topo)
	l.g.Start()
	ctx := context.Background()
	services := l.g.Client().CoreV1().Services("default")

	t.Run("Service changes type", func(t *testing.T) {
		svc := gatewaytest.Service("default", "morph", "ClusterIP", []string{"198.19.0.95"}, gatewaytest.Port{Name: "http", Port: 80})
		slice := gatewaytest.Slice("default", "morph-1", "morph", "http", "", 8080, ep("198.18.2.11", ""))
		cip, np, lb := ap("198.19.0.95:80"), l.nodePort4(30095), ap("198.19.2.95:80")
		leftovers := func(t *testing.T, absent ...string) {
			t.Helper()
			out := withoutTrafficSets(l.g.Nft("list", "ruleset", "ip"))
			for _, a := range absent {
				if strings.Contains(out, a) {
					t.Errorf("table still holds %q:\n%s", a, out)
				}
			}
		}
		l.g.Write("morph.yaml", svc, slice)
		l.eventuallyBackends(t, "tcp", cip, 3, l.b4(1, 8080))
		l.wantRefused(t, "tcp", np) // nothing listens there on the gateway

		svc.Spec.Type = corev1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = 30095
		l.g.Write("morph.yaml", svc, slice)
		l.eventuallyBackends(t, "tcp", np, 3, l.b4(1, 8080))
		l.eventuallyBackends(t, "tcp", cip, 3, l.b4(1, 8080))

		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.95"}}
		l.g.Write("morph.yaml", svc, slice)
		l.eventuallyBackends(t, "tcp", lb, 3, l.b4(1, 8080))
		l.eventuallyBackends(t, "tcp", np, 3, l.b4(1, 8080))

		// Back to ClusterIP: the API server releases the node port and
		// the gateway forgets it and the LB IP.
		back := gatewaytest.Service("default", "morph", "ClusterIP", []string{"198.19.0.95"}, gatewaytest.Port{Name: "http", Port: 80})
		l.g.Write("morph.yaml", back, slice)
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			_, err := l.topo.Client.Dial("tcp", np, lab.DialOpts{Timeout: time.Second})
			if !lab.IsRefused(err) {
				return fmt.Errorf("node port: %v", err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		l.wantDropped(t, "tcp", lb, lab.DialOpts{})
		l.eventuallyBackends(t, "tcp", cip, 3, l.b4(1, 8080))
		leftovers(t, "30095", "198.19.2.95")
		l.g.Remove("morph.yaml")
	})

	t.Run("ClusterIP reused right after deletion", func(t *testing.T) {
		dst := ap("198.19.0.96:80")
		l.g.Write("old.yaml", gatewaytest.Service("default", "old", "ClusterIP", []string{"198.19.0.96"}, gatewaytest.Port{Name: "http", Port: 80}),
			gatewaytest.Slice("default", "old-1", "old", "http", "", 8080, ep("198.18.2.12", "")))
		l.eventuallyBackends(t, "tcp", dst, 3, l.b4(2, 8080))

		l.g.Remove("old.yaml")
		// The allocator may take a moment to release the address.
		fresh := gatewaytest.Service("default", "new", "ClusterIP", []string{"198.19.0.96"}, gatewaytest.Port{Name: "http", Port: 80})
		fresh.CreationTimestamp = metav1.Time{}
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			_, err := services.Create(ctx, fresh, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}); err != nil {
			t.Fatalf("create a Service with the released ClusterIP: %v", err)
		}
		l.g.Write("new.yaml", fresh, gatewaytest.Slice("default", "new-1", "new", "http", "", 8080, ep("198.18.2.13", "")))
		l.eventuallyBackends(t, "tcp", dst, 20, l.b4(3, 8080))
		out := l.g.Nft("list", "ruleset", "ip")
		if strings.Contains(out, "default/old/") {
			t.Errorf("the deleted Service left chains behind:\n%s", out)
		}
		l.g.Remove("new.yaml")
	})

	t.Run("allocated healthCheckNodePort", func(t *testing.T) {
		l.g.Write("hc.yaml", localService("hc", 97, 0),
			gatewaytest.Slice("default", "hc-1", "hc", "http", "", 8080, ep("198.18.2.10", "gateway"), ep("198.18.2.11", "other")))
		got, err := services.Get(ctx, "hc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		port := got.Spec.HealthCheckNodePort
		if port == 0 {
			t.Fatal("the API server allocated no healthCheckNodePort")
		}
		l.eventuallyHealth(t, model.NewServiceKey("default", "hc"), uint16(port), http.StatusOK, 1)
		l.g.Remove("hc.yaml")
	})
}

// TestSCTP sends SCTP through the gateway. The kernel here has SCTP
// conntrack and NAT but no SCTP sockets (CONFIG_IP_SCTP is off, and Go has
// no SCTP API anyway), so client and backend speak SCTP through raw IP
// sockets: the client sends an INIT to the Service, the backend must see
// it translated to the endpoint and answers with an INIT-ACK, which must
// come back to the client from the Service's address and port. That is
// the gateway's whole part in an association: DNAT of the first packet,
// conntrack state, and the reverse translation of the reply.
func TestSCTP(t *testing.T) {
	topo := labtest.Gateway(t)
	l := &behaviourLab{topo: topo}
	l.g = gatewaytest.New(t, topo)
	svc := gatewaytest.Service("default", "diameter", "NodePort", []string{"198.19.0.99"},
		gatewaytest.Port{Name: "diameter", Protocol: corev1.ProtocolSCTP, Port: 3868, NodePort: 30099})
	l.g.Write("sctp.yaml", svc, gatewaytest.Slice("default", "diameter-1", "diameter", "diameter", corev1.ProtocolSCTP, 3869, ep("198.18.2.12", "")))
	l.g.Start()
	backend := netip.AddrPortFrom(topo.BackendIPv4[2], 3869)
	for i, dst := range []netip.AddrPort{ap("198.19.0.99:3868"), l.nodePort4(30099)} {
		seen, err := sctpExchange(topo.Client, topo.Backend, dst, backend, uint16(40000+i))
		if err != nil {
			t.Fatalf("SCTP to %s: %v", dst, err)
		}
		if seen != topo.GatewayBackendIPv4 {
			t.Errorf("SCTP to %s: the backend saw %s, want the gateway's %s (masqueraded)", dst, seen, topo.GatewayBackendIPv4)
		}
	}
}

// sctpExchange sends an INIT from client port sport to dst and expects it
// at backend; the backend answers with an INIT-ACK, which must reach the
// client from dst. It returns the source address the backend saw.
func sctpExchange(client, backendHost *lab.Host, dst, backend netip.AddrPort, sport uint16) (netip.Addr, error) {
	cs, err := client.RawSCTP(false)
	if err != nil {
		return netip.Addr{}, err
	}
	defer cs.Close()
	bs, err := backendHost.RawSCTP(false)
	if err != nil {
		return netip.Addr{}, err
	}
	defer bs.Close()
	// The reply must come from the endpoint's own address, which is not
	// the backend host's first one.
	if err := bs.Bind(backend.Addr()); err != nil {
		return netip.Addr{}, err
	}

	deadline := time.Now().Add(5 * time.Second)
	const clientTag, backendTag = 0x1234abcd, 0x5678ef01
	type result struct {
		seen netip.Addr
		err  error
	}
	got := make(chan result, 1)
	go func() {
		in, err := bs.Recv(deadline, func(in lab.SCTPIn) bool {
			return in.Dst == backend.Addr() && in.Dport == backend.Port() && in.Chunk == lab.SCTPInit
		})
		if err != nil {
			got <- result{err: fmt.Errorf("the backend got no INIT at %s: %w", backend, err)}
			return
		}
		if in.VTag != 0 || in.InitTag() != clientTag {
			got <- result{err: fmt.Errorf("the INIT arrived altered: vtag %#x, initiate tag %#x", in.VTag, in.InitTag())}
			return
		}
		cookie := []byte{0, 7, 0, 8, 'c', 'o', 'o', 'k'} // State Cookie parameter
		ack := lab.SCTPPacket(backend.Port(), in.Sport, in.InitTag(), lab.SCTPInitAck, lab.SCTPInitBody(backendTag, cookie...))
		got <- result{seen: in.Src, err: bs.Send(in.Src, ack)}
	}()

	init := lab.SCTPPacket(sport, dst.Port(), 0, lab.SCTPInit, lab.SCTPInitBody(clientTag))
	if err := cs.Send(dst.Addr(), init); err != nil {
		return netip.Addr{}, err
	}
	r := <-got
	if r.err != nil {
		return netip.Addr{}, r.err
	}
	in, err := cs.Recv(deadline, func(in lab.SCTPIn) bool { return in.Chunk == lab.SCTPInitAck && in.Dport == sport })
	if err != nil {
		return r.seen, fmt.Errorf("the client got no INIT-ACK: %w", err)
	}
	if in.Src != dst.Addr() || in.Sport != dst.Port() || in.VTag != clientTag || in.InitTag() != backendTag {
		return r.seen, fmt.Errorf("INIT-ACK from %s:%d vtag %#x tag %#x, want from %s with vtag %#x tag %#x",
			in.Src, in.Sport, in.VTag, in.InitTag(), dst, clientTag, backendTag)
	}
	return r.seen, nil
}
