package podroutes

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func policy(t *testing.T, mode Mode, cidrs ...string) *Policy {
	t.Helper()
	var cc []netip.Prefix
	for _, c := range cidrs {
		cc = append(cc, pfx(c))
	}
	p, err := Config{Mode: mode}.Compile(cc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func routeStrings(rs []Route) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.String())
	}
	return out
}

func wantPlan(t *testing.T, got Plan, routes []string, problems ...string) {
	t.Helper()
	if g := routeStrings(got.Routes); !slices.Equal(g, routes) {
		t.Errorf("routes\n got %q\nwant %q", g, routes)
	}
	if len(got.Problems) != len(problems) {
		t.Errorf("problems %q, want %d matching %q", got.Problems, len(problems), problems)
		return
	}
	for i, p := range problems {
		if !strings.Contains(got.Problems[i], p) {
			t.Errorf("problem %d %q does not contain %q", i, got.Problems[i], p)
		}
	}
}

func TestNodeFromObject(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "2001:db8:244:1::/64", "nope"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
			{Type: corev1.NodeInternalIP, Address: "198.18.1.2"},
			{Type: corev1.NodeInternalIP, Address: "2001:db8:1::2"},
			{Type: corev1.NodeInternalIP, Address: "bad"},
		}},
	}
	got, problems := NodeFromObject(n)
	want := NodeInfo{Name: "n1", InternalIPs: []netip.Addr{addr("198.18.1.2"), addr("2001:db8:1::2")},
		PodCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("2001:db8:244:1::/64")}}
	if got.Name != want.Name || !slices.Equal(got.InternalIPs, want.InternalIPs) || !slices.Equal(got.PodCIDRs, want.PodCIDRs) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if len(problems) != 2 || !strings.Contains(problems[0], `status.addresses[4].address "bad"`) || !strings.Contains(problems[1], `spec.podCIDRs[2] "nope"`) {
		t.Errorf("problems %q", problems)
	}
	// An old Node with only spec.podCIDR.
	n.Spec.PodCIDRs = nil
	got, _ = NodeFromObject(n)
	if !slices.Equal(got.PodCIDRs, []netip.Prefix{pfx("10.244.1.0/24")}) {
		t.Errorf("podCIDR fallback: %v", got.PodCIDRs)
	}
}

var nodes = []NodeInfo{
	{Name: "n1", InternalIPs: []netip.Addr{addr("198.18.1.2"), addr("2001:db8:1::2")}, PodCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("2001:db8:244:1::/64")}},
	{Name: "v4only", InternalIPs: []netip.Addr{addr("198.18.2.2")}, PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("2001:db8:244:2::/64")}},
	{Name: "noip", PodCIDRs: []netip.Prefix{pfx("10.244.3.0/24")}},
	{Name: "nocidr", InternalIPs: []netip.Addr{addr("198.18.4.2")}},
	{Name: "outside", InternalIPs: []netip.Addr{addr("198.18.5.2")}, PodCIDRs: []netip.Prefix{pfx("192.168.0.0/24")}},
}

func TestPlanNode(t *testing.T) {
	got := policy(t, Node, "10.244.0.0/16", "2001:db8:244::/48").Plan(Input{Nodes: nodes})
	wantPlan(t, got,
		[]string{"10.244.1.0/24 via 198.18.1.2", "10.244.2.0/24 via 198.18.2.2", "2001:db8:244:1::/64 via 2001:db8:1::2"},
		"node nocidr: no spec.podCIDRs",
		"node noip: pod CIDR 10.244.3.0/24: the node has no IPv4 InternalIP",
		"node outside: 192.168.0.0/24 is outside cluster_cidrs",
		"node v4only: pod CIDR 2001:db8:244:2::/64: the node has no IPv6 InternalIP",
	)
	// Without cluster CIDRs, no bound.
	got = policy(t, Node).Plan(Input{Nodes: nodes})
	if !slices.Contains(routeStrings(got.Routes), "192.168.0.0/24 via 198.18.5.2") {
		t.Errorf("unbounded: %q", routeStrings(got.Routes))
	}
	// Other modes read no Nodes' CIDRs.
	if got := policy(t, None).Plan(Input{Nodes: nodes}); len(got.Routes)+len(got.Problems) != 0 {
		t.Errorf("none: %+v", got)
	}
}

func svc(name string, eps ...model.Endpoint) *model.Service {
	return &model.Service{Key: model.NewServiceKey("ns", name),
		Ports: []model.ServicePort{{Port: 80, Protocol: model.TCP, Endpoints: eps}, {Port: 81, Protocol: model.TCP, Endpoints: eps}}}
}

func ep(a, node string) model.Endpoint {
	return model.Endpoint{Port: 8080, Place: model.On(node)}.WithAddr(addr(a))
}

func TestPlanEndpoint(t *testing.T) {
	in := Input{Nodes: nodes, Services: []*model.Service{
		svc("web", ep("10.244.1.10", "n1"), ep("2001:db8:244:1::10", "n1"), ep("10.244.9.7", "v4only"),
			ep("2001:db8:244:2::10", "v4only"), ep("10.244.3.5", "noip"), ep("10.244.4.4", "gone"), ep("10.244.5.5", "")),
		svc("hostnet", ep("198.18.1.2", "n1")),
		// The same pod behind two Services: one route, no problem.
		svc("web2", ep("10.244.1.10", "n1")),
		// One address claimed on two nodes: the lower next hop, and a problem.
		svc("moved", ep("10.244.7.7", "v4only"), ep("10.244.7.7", "n1")),
		svc("far", ep("172.16.0.1", "n1")),
	}}
	got := policy(t, Endpoint, "10.244.0.0/16", "2001:db8:244::/48").Plan(in)
	wantPlan(t, got,
		[]string{"10.244.1.10/32 via 198.18.1.2", "10.244.7.7/32 via 198.18.1.2", "10.244.9.7/32 via 198.18.2.2", "2001:db8:244:1::10/128 via 2001:db8:1::2"},
		"10.244.7.7/32: claimed by endpoint 10.244.7.7 of ns/moved on node n1 (via 198.18.1.2) and by endpoint 10.244.7.7 of ns/moved on node v4only (via 198.18.2.2); routed via 198.18.1.2",
		"endpoint 10.244.3.5 of ns/web: node noip has no IPv4 InternalIP",
		"endpoint 10.244.4.4 of ns/web: node gone is unknown",
		"endpoint 10.244.5.5 of ns/web: no nodeName",
		"endpoint 172.16.0.1 of ns/far on node n1: 172.16.0.1/32 is outside cluster_cidrs",
		"endpoint 2001:db8:244:2::10 of ns/web: node v4only has no IPv6 InternalIP",
	)
	// The result does not depend on the order of the input.
	slices.Reverse(in.Services)
	again := policy(t, Endpoint, "10.244.0.0/16", "2001:db8:244::/48").Plan(in)
	if !slices.Equal(again.Routes, got.Routes) || !slices.Equal(again.Problems, got.Problems) {
		t.Errorf("order changes the plan:\n%+v\n%+v", got, again)
	}
}

func TestPlanBGP(t *testing.T) {
	peer := addr("198.18.0.1")
	in := Input{Learned: []Learned{
		{Peer: peer, Prefix: pfx("10.244.1.0/26"), NextHop: addr("198.18.1.2")},
		// A second peer (route reflector) with another next hop: the lower.
		{Peer: addr("198.18.0.3"), Prefix: pfx("10.244.1.0/26"), NextHop: addr("198.18.1.9")},
		// Stale, while a fresh path exists: the fresh one.
		{Peer: peer, Prefix: pfx("10.244.2.0/26"), NextHop: addr("198.18.2.1"), Stale: true},
		{Peer: addr("198.18.0.3"), Prefix: pfx("10.244.2.0/26"), NextHop: addr("198.18.2.2")},
		// Stale alone: kept.
		{Peer: peer, Prefix: pfx("10.244.3.0/26"), NextHop: addr("198.18.3.2"), Stale: true},
		{Peer: peer, Prefix: pfx("2001:db8:244:1::/64"), NextHop: addr("2001:db8:1::2")},
		{Peer: peer, Prefix: pfx("0.0.0.0/0"), NextHop: addr("198.18.1.2")},
		{Peer: peer, Prefix: pfx("203.0.113.0/24"), NextHop: addr("198.18.1.2")},
		{Peer: peer, Prefix: pfx("10.244.4.0/26"), NextHop: addr("2001:db8:1::2")},
		{Peer: peer, Prefix: pfx("10.244.5.0/26"), NextHop: addr("0.0.0.0")},
	}}
	got := policy(t, BGP, "10.244.0.0/16", "2001:db8:244::/48").Plan(in)
	wantPlan(t, got,
		[]string{"10.244.1.0/26 via 198.18.1.2", "10.244.2.0/26 via 198.18.2.2", "10.244.3.0/26 via 198.18.3.2", "2001:db8:244:1::/64 via 2001:db8:1::2"},
		"BGP peer 198.18.0.1: 0.0.0.0/0: a default route is never installed",
		"BGP peer 198.18.0.1: 10.244.4.0/26: next hop 2001:db8:1::2 is of the other family",
		"BGP peer 198.18.0.1: 10.244.5.0/26: next hop 0.0.0.0 is not usable",
		"BGP peer 198.18.0.1: 203.0.113.0/24 is outside cluster_cidrs",
	)
}

func TestConfigErrorsNameKeyAndValue(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		cidrs []netip.Prefix
		want  []string
	}{
		{Config{Mode: "nodes"}, nil, []string{`pod_routes = "nodes"`, `"none", "node", "endpoint" or "bgp"`}},
		{Config{Mode: BGP}, nil, []string{`pod_routes = "bgp" needs cluster_cidrs`}},
		{Config{Table: 255}, nil, []string{"pod_routes_table = 255", "local"}},
		{Config{Table: 253}, nil, []string{"pod_routes_table = 253", "default"}},
		{Config{Table: -1}, nil, []string{"pod_routes_table = -1"}},
		{Config{Table: 1 << 32}, nil, []string{"pod_routes_table = 4294967296"}},
		{Config{RepairInterval: 1}, nil, []string{`pod_routes_repair_interval = "1ns"`, "1s to 1h0m0s"}},
		{Config{Mode: Node}, []netip.Prefix{netip.MustParsePrefix("10.244.1.1/16")}, []string{`cluster_cidrs[0] = "10.244.1.1/16"`}},
		{Config{Nodes: []NodeConfig{{Name: "a"}, {Name: "a"}}}, nil, []string{`pod_routes_nodes[1].name = "a": given twice`}},
		{Config{Nodes: []NodeConfig{{Name: "a", InternalIPs: []string{"fe80::1%eth0"}}}}, nil, []string{`pod_routes_nodes[0].internal_ips[0] = "fe80::1%eth0"`}},
		{Config{Nodes: []NodeConfig{{Name: "a", PodCIDRs: []string{"10.244.1.0"}}}}, nil, []string{`pod_routes_nodes[0].pod_cidrs[0] = "10.244.1.0"`}},
	} {
		_, err := tc.cfg.Compile(tc.cidrs)
		if err == nil {
			t.Errorf("%+v accepted", tc.cfg)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
	}
	p, err := Config{Nodes: []NodeConfig{{Name: "a", InternalIPs: []string{"::ffff:198.18.1.2"}, PodCIDRs: []string{"10.244.1.1/24"}}}}.Compile(nil)
	if err != nil || len(p.Nodes) != 1 || p.Nodes[0].InternalIPs[0] != netip.MustParseAddr("198.18.1.2") || p.Nodes[0].PodCIDRs[0] != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("nodes: %+v %v", p, err)
	}
	p, err = Config{}.Compile(nil)
	if err != nil || p.Mode != None || p.Table != 254 || p.RepairInterval != DefaultRepairInterval {
		t.Errorf("defaults: %+v %v", p, err)
	}
}
