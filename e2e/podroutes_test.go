package e2e_test

// Routes to pods: the backends are pods behind "node" namespaces, which
// the gateway reaches only through the routes nftgate installs.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/podroutes"
)

const podPort = 8080

// podLab is the gateway topology with two nodes behind the gateway, each
// with one pod serving on podPort.
type podLab struct {
	topo  *lab.Topology
	nodes []lab.PodNode
}

func newPodLab(t *testing.T) *podLab {
	t.Helper()
	topo := labtest.Gateway(t)
	nodes, err := topo.AddPodNodes(topo.Gateway, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, a := range n.Pods {
			gatewaytest.Serve(t, n.Pod, "tcp", netip.AddrPortFrom(a, podPort))
		}
	}
	return &podLab{topo: topo, nodes: nodes}
}

// config writes nftgate's configuration: the mode, the pods' cluster CIDRs
// and extra lines.
func (l *podLab) config(t *testing.T, mode string, extra ...string) string {
	t.Helper()
	text := fmt.Sprintf("pod_routes = %q\npod_routes_repair_interval = \"1h\"\ncluster_cidrs = [%q, %q]\n%s",
		mode, lab.PodClusterNet4, lab.PodClusterNet6, strings.Join(extra, "\n"))
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// createNodes writes the nodes into the API as the kubelet and the node
// IPAM controller would: InternalIPs in the status, pod CIDRs in the spec.
func (l *podLab) createNodes(t *testing.T, g *gatewaytest.Gateway, nodes ...lab.PodNode) {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
		for _, c := range n.PodCIDRs {
			node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, c.String())
		}
		node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
		created, err := g.Client().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: n.Name}}
		for _, a := range n.InternalIPs {
			created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
		}
		if _, err := g.Client().CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// kernelRoutes lists the gateway's routes of nftgate's protocol as
// "dst via gw", sorted.
func (l *podLab) kernelRoutes(t *testing.T) []string {
	t.Helper()
	rs, err := l.topo.Gateway.Netlink().RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Protocol: podroutes.Protocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		gw, _ := netip.AddrFromSlice(r.Gw)
		out = append(out, podroutes.Route{Dst: netip.MustParsePrefix(r.Dst.String()), Via: gw.Unmap()}.String())
	}
	slices.Sort(out)
	return out
}

// awaitRoutes waits until the gateway's routes of nftgate's protocol are
// exactly want.
func (l *podLab) awaitRoutes(t *testing.T, within time.Duration, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	var got []string
	if err := lab.EventuallyWithin(within, func() error {
		if got = l.kernelRoutes(t); !slices.Equal(got, want) {
			return fmt.Errorf("routes %q", got)
		}
		return nil
	}); err != nil {
		t.Fatalf("routes of protocol 246 %q, want %q", got, want)
	}
}

// reachable tells whether the gateway itself reaches a pod.
func (l *podLab) reachable(a netip.Addr) bool {
	_, err := l.topo.Gateway.Dial("tcp", netip.AddrPortFrom(a, podPort), lab.DialOpts{Timeout: time.Second})
	return err == nil
}

func route(dst any, via netip.Addr) string { return fmt.Sprintf("%v via %s", dst, via) }

// web is a ClusterIP Service whose endpoints are the given nodes' IPv4
// pods, each with its nodeName.
func (l *podLab) web(nodes ...lab.PodNode) []any {
	svc := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	var eps []gatewaytest.Endpoint
	for _, n := range nodes {
		eps = append(eps, gatewaytest.Endpoint{Addr: n.Pods[0].String(), NodeName: n.Name})
	}
	return []any{svc, gatewaytest.Slice("default", "web-1", "web", "http", "", podPort, eps...)}
}

func (l *podLab) podBackends(nodes ...lab.PodNode) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, netip.AddrPortFrom(n.Pods[0], podPort).String())
	}
	return out
}

var webVIP = netip.MustParseAddrPort("198.19.0.10:80")

// podRoutesView is what the tests read of GET /api/v1/edge.
type podRoutesView struct {
	PodRoutes *struct {
		Mode      string   `json:"mode"`
		Installed int      `json:"installed"`
		Problems  []string `json:"problems"`
		Via       []struct {
			Node   string `json:"node"`
			Via    string `json:"via"`
			Routes int    `json:"routes"`
		} `json:"via"`
	} `json:"podRoutes"`
}

func edgePodRoutes(t *testing.T, g *gatewaytest.Gateway) podRoutesView {
	t.Helper()
	code, body, err := g.Get("/api/v1/edge")
	if err != nil || code != 200 {
		t.Fatalf("/api/v1/edge: %d %v %s", code, err, body)
	}
	var v podRoutesView
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.PodRoutes == nil {
		t.Fatalf("/api/v1/edge: %v %s", err, body)
	}
	return v
}

// deleteByHand removes a route as an operator would, and waits for it to
// come back.
func (l *podLab) deleteByHand(t *testing.T, dst string, want ...string) {
	t.Helper()
	if out, err := l.topo.Gateway.Command(context.Background(), "ip", "route", "del", dst).CombinedOutput(); err != nil {
		t.Fatalf("ip route del %s: %v: %s", dst, err, out)
	}
	start := time.Now()
	l.awaitRoutes(t, 5*time.Second, want...)
	t.Logf("%s deleted by hand: back after %s", dst, time.Since(start).Round(time.Microsecond))
}

// cleanup stops nftgate and runs `nftgate cleanup`: no route of nftgate's
// is left, and the pods are out of reach again.
func (l *podLab) cleanup(t *testing.T, g *gatewaytest.Gateway) {
	t.Helper()
	g.Stop()
	if len(l.kernelRoutes(t)) == 0 {
		t.Fatal("the routes went away with nftgate; they should stay until cleanup")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := l.topo.Gateway.Command(ctx, gatewaytest.Binary(t), "cleanup").CombinedOutput(); err != nil {
		t.Fatalf("nftgate cleanup: %v\n%s", err, out)
	}
	if got := l.kernelRoutes(t); len(got) != 0 {
		t.Errorf("after nftgate cleanup: %q", got)
	}
	if l.reachable(l.nodes[0].Pods[0]) {
		t.Errorf("%s reachable after nftgate cleanup", l.nodes[0].Pods[0])
	}
}

// TestPodRoutesNodeMode: pod_routes = "node" against a real
// kube-apiserver, with the rights of deploy/rbac.yaml only: a route per
// Node pod CIDR via its InternalIP carries the client's traffic to the
// pods; a deleted Node takes its routes with it; a route deleted by hand
// comes back; `nftgate cleanup` removes them.
func TestPodRoutesNodeMode(t *testing.T) {
	l := newPodLab(t)
	g := gatewaytest.NewWithAPI(t, l.topo, "--config", l.config(t, "node"))
	leastPrivilege(t, g)
	n1, n2 := l.nodes[0], l.nodes[1]
	for _, n := range l.nodes {
		if l.reachable(n.Pods[0]) {
			t.Fatalf("%s reachable before nftgate: the test proves nothing", n.Pods[0])
		}
	}
	l.createNodes(t, g, l.nodes...)
	g.Write("web.yaml", l.web(l.nodes...)...)
	g.Start()
	all := []string{
		route(n1.PodCIDRs[0], n1.InternalIPs[0]), route(n1.PodCIDRs[1], n1.InternalIPs[1]),
		route(n2.PodCIDRs[0], n2.InternalIPs[0]), route(n2.PodCIDRs[1], n2.InternalIPs[1]),
	}
	l.awaitRoutes(t, 10*time.Second, all...)
	wantBackends(t, gatewaytest.Backends(t, l.topo.Client, "tcp", webVIP, 20), l.podBackends(n1, n2)...)
	for _, n := range l.nodes {
		if !l.reachable(n.Pods[1]) {
			t.Errorf("IPv6 pod %s not reached through its node", n.Pods[1])
		}
	}
	v := edgePodRoutes(t, g)
	if pr := v.PodRoutes; pr.Mode != "node" || pr.Installed != 4 || len(pr.Via) != 4 || pr.Via[0].Node != n1.Name || pr.Via[0].Routes != 1 {
		t.Errorf("/api/v1/edge podRoutes %+v", *pr)
	}
	if got := metric(t, g, "nftgate_pod_routes_installed"); got != 4 {
		t.Errorf("nftgate_pod_routes_installed %v, want 4", got)
	}

	// The second Node goes: its routes with it.
	if err := g.Client().CoreV1().Nodes().Delete(context.Background(), n2.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	l.awaitRoutes(t, 10*time.Second, all[:2]...)
	if l.reachable(n2.Pods[0]) {
		t.Errorf("%s reachable after its Node was deleted", n2.Pods[0])
	}
	l.deleteByHand(t, n1.PodCIDRs[0].String(), all[:2]...)
	if !l.reachable(n1.Pods[0]) {
		t.Errorf("%s not reachable after its route came back", n1.Pods[0])
	}
	l.cleanup(t, g)
}

// testPodRoutesEndpointMode: pod_routes = "endpoint": a /32 per endpoint
// via the InternalIP of its nodeName carries the traffic; an endpoint
// that goes takes its route with it; a route deleted by hand comes back;
// `nftgate cleanup` removes them. nodes makes the Nodes known to nftgate.
func testPodRoutesEndpointMode(t *testing.T, l *podLab, g *gatewaytest.Gateway, nodes func()) {
	n1, n2 := l.nodes[0], l.nodes[1]
	nodes()
	g.Write("web.yaml", l.web(n1, n2)...)
	g.Start()
	all := []string{route(netip.PrefixFrom(n1.Pods[0], 32), n1.InternalIPs[0]), route(netip.PrefixFrom(n2.Pods[0], 32), n2.InternalIPs[0])}
	l.awaitRoutes(t, 10*time.Second, all...)
	wantBackends(t, gatewaytest.Backends(t, l.topo.Client, "tcp", webVIP, 20), l.podBackends(n1, n2)...)
	if pr := edgePodRoutes(t, g).PodRoutes; pr.Mode != "endpoint" || pr.Installed != 2 || len(pr.Via) != 2 || pr.Via[1].Node != n2.Name {
		t.Errorf("/api/v1/edge podRoutes %+v", *pr)
	}

	// The endpoint on the second node goes: its route with it.
	g.Write("web.yaml", l.web(n1)...)
	l.awaitRoutes(t, 10*time.Second, all[0])
	if l.reachable(n2.Pods[0]) {
		t.Errorf("%s reachable after its endpoint went away", n2.Pods[0])
	}
	wantBackends(t, gatewaytest.Backends(t, l.topo.Client, "tcp", webVIP, 10), l.podBackends(n1)...)
	l.deleteByHand(t, n1.Pods[0].String(), all[0])
	l.cleanup(t, g)
}

// TestPodRoutesEndpointMode runs testPodRoutesEndpointMode against a real
// kube-apiserver (its Nodes give the InternalIPs), and from manifests
// (pod_routes_nodes gives them).
func TestPodRoutesEndpointMode(t *testing.T) {
	t.Run("kubernetes", func(t *testing.T) {
		l := newPodLab(t)
		g := gatewaytest.NewWithAPI(t, l.topo, "--config", l.config(t, "endpoint"))
		testPodRoutesEndpointMode(t, l, g, func() { l.createNodes(t, g, l.nodes...) })
	})
	t.Run("manifests", func(t *testing.T) {
		l := newPodLab(t)
		var lines []string
		for _, n := range l.nodes {
			lines = append(lines, fmt.Sprintf("{name = %q, internal_ips = [%q, %q]},", n.Name, n.InternalIPs[0], n.InternalIPs[1]))
		}
		g := gatewaytest.New(t, l.topo, "--config", l.config(t, "endpoint", "pod_routes_nodes = [\n"+strings.Join(lines, "\n")+"\n]"))
		testPodRoutesEndpointMode(t, l, g, func() {})
	})
}
