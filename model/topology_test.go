package model_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nftgate/nftgate/model"
)

// ep is an endpoint for the Categorize cases: local ones run on node "gw".
type ep struct {
	addr                        string
	ready, serving, terminating bool
	local                       bool
	zones, nodes                []string
}

func (e ep) endpoint() model.Endpoint {
	ap := netip.MustParseAddrPort(e.addr)
	m := model.Endpoint{Port: ap.Port(), Ready: e.ready, Serving: e.serving || e.ready,
		Terminating: e.terminating, Place: model.On("other")}.WithAddr(ap.Addr())
	if e.zones != nil || e.nodes != nil {
		m.Place = m.Place.WithHints(e.zones, e.nodes)
	}
	if e.local {
		m.Place = model.NewPlace("gw", "", e.zones, e.nodes)
	}
	return m
}

func addrPorts(eps []model.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.AddrPort().String())
	}
	slices.Sort(out)
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestCategorize carries over the cases of kube-proxy's
// TestCategorizeEndpoints (pkg/proxy/topology_test.go) that apply to a
// gateway with the PreferSameTrafficDistribution gate locked on.
func TestCategorize(t *testing.T) {
	type policy struct{ internalLocal, externalLocal, nodePort bool }
	zone := func(z ...string) []string { return z }
	for _, tc := range []struct {
		name    string
		node    model.Node
		policy  policy
		eps     []ep
		cluster []string
		local   []string
		any     bool
	}{
		{name: "all endpoints hinted, one for this zone: topology used",
			node: model.Node{Name: "gw", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"}, any: true},
		{name: "externalTrafficPolicy Local: topology ignored for local endpoints",
			node: model.Node{Name: "gw", Zone: "zone-a"}, policy: policy{externalLocal: true, nodePort: true},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, local: true, zones: zone("zone-a")}, {addr: "10.1.2.4:80", ready: true, local: true, zones: zone("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"}, local: []string{"10.1.2.3:80", "10.1.2.4:80"}, any: true},
		{name: "internalTrafficPolicy Local: topology ignored for local endpoints",
			node: model.Node{Name: "gw", Zone: "zone-a"}, policy: policy{internalLocal: true, nodePort: true},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, local: true, zones: zone("zone-a")}, {addr: "10.1.2.4:80", ready: true, local: true, zones: zone("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"}, local: []string{"10.1.2.3:80", "10.1.2.4:80"}, any: true},
		{name: "node without a zone",
			node:    model.Node{Name: "gw"},
			eps:     []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80"}, any: true},
		{name: "node in a different zone: no filtering",
			node:    model.Node{Name: "gw", Zone: "zone-b"},
			eps:     []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80"}, any: true},
		{name: "unready endpoint",
			node: model.Node{Name: "gw", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c")}, {addr: "10.1.2.6:80", zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80"}, any: true},
		{name: "only unready endpoints in this zone: no filtering",
			node: model.Node{Name: "gw", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", zones: zone("zone-a")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c")}, {addr: "10.1.2.6:80", zones: zone("zone-a")}},
			cluster: []string{"10.1.2.4:80", "10.1.2.5:80"}, any: true},
		{name: "missing hints: no filtering",
			node: model.Node{Name: "gw", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b")},
				{addr: "10.1.2.5:80", ready: true}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"}, any: true},
		{name: "several hints per endpoint: any hint for this zone counts",
			node: model.Node{Name: "gw", Zone: "zone-c"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a", "zone-b", "zone-c")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b", "zone-c")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-b", "zone-d")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-c")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"}, any: true},
		{name: "PreferSameNode",
			node: model.Node{Name: "node-1", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a"), nodes: zone("node-1")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b"), nodes: zone("node-2")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c"), nodes: zone("node-3")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a"), nodes: zone("node-4")}},
			cluster: []string{"10.1.2.3:80"}, any: true},
		{name: "PreferSameNode ignored when some endpoints are unhinted",
			node: model.Node{Name: "node-1", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a"), nodes: zone("node-1")}, {addr: "10.1.2.4:80", ready: true},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c"), nodes: zone("node-3")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a"), nodes: zone("node-4")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"}, any: true},
		{name: "PreferSameNode falls back to the zone when no endpoint is for this node",
			node: model.Node{Name: "node-0", Zone: "zone-a"},
			eps: []ep{{addr: "10.1.2.3:80", ready: true, zones: zone("zone-a"), nodes: zone("node-1")}, {addr: "10.1.2.4:80", ready: true, zones: zone("zone-b"), nodes: zone("node-2")},
				{addr: "10.1.2.5:80", ready: true, zones: zone("zone-c"), nodes: zone("node-3")}, {addr: "10.1.2.6:80", ready: true, zones: zone("zone-a"), nodes: zone("node-4")}},
			cluster: []string{"10.1.2.3:80", "10.1.2.6:80"}, any: true},
		{name: "conflicting topology and localness",
			node: model.Node{Name: "gw", Zone: "zone-a"}, policy: policy{externalLocal: true, nodePort: true},
			eps: []ep{{addr: "10.0.0.0:80", ready: true, local: true, zones: zone("zone-a")}, {addr: "10.0.0.1:80", ready: true, local: true, zones: zone("zone-b")},
				{addr: "10.0.0.2:80", ready: true, zones: zone("zone-a")}, {addr: "10.0.0.3:80", ready: true, zones: zone("zone-b")}},
			cluster: []string{"10.0.0.0:80", "10.0.0.2:80"}, local: []string{"10.0.0.0:80", "10.0.0.1:80"}, any: true},
		{name: "internalTrafficPolicy Local, no endpoints",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true}, any: false},
		{name: "internalTrafficPolicy Local, all endpoints remote",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true},
			eps: []ep{{addr: "10.0.0.0:80", ready: true}, {addr: "10.0.0.1:80", ready: true}},
			any: true},
		{name: "internalTrafficPolicy Local, all endpoints local",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true},
			eps:   []ep{{addr: "10.0.0.0:80", ready: true, local: true}, {addr: "10.0.0.1:80", ready: true, local: true}},
			local: []string{"10.0.0.0:80", "10.0.0.1:80"}, any: true},
		{name: "internalTrafficPolicy Local, some endpoints local",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true},
			eps:   []ep{{addr: "10.0.0.0:80", ready: true, local: true}, {addr: "10.0.0.1:80", ready: true}},
			local: []string{"10.0.0.0:80"}, any: true},
		{name: "Cluster policy, no endpoint ready",
			node: model.Node{Name: "gw"},
			eps:  []ep{{addr: "10.0.0.0:80"}, {addr: "10.0.0.1:80"}},
			any:  false},
		{name: "Cluster policy, some endpoints ready",
			node:    model.Node{Name: "gw"},
			eps:     []ep{{addr: "10.0.0.0:80"}, {addr: "10.0.0.1:80", ready: true}},
			cluster: []string{"10.0.0.1:80"}, any: true},
		{name: "Cluster policy, all endpoints terminating",
			node:    model.Node{Name: "gw"},
			eps:     []ep{{addr: "10.0.0.0:80", serving: true, terminating: true, local: true}, {addr: "10.0.0.1:80", serving: true, terminating: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, any: true},
		{name: "iTP Local, eTP Cluster, some endpoints local",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true, nodePort: true},
			eps:     []ep{{addr: "10.0.0.0:80", ready: true, local: true}, {addr: "10.0.0.1:80", ready: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, local: []string{"10.0.0.0:80"}, any: true},
		{name: "iTP Cluster, eTP Local, some endpoints local",
			node: model.Node{Name: "gw"}, policy: policy{externalLocal: true, nodePort: true},
			eps:     []ep{{addr: "10.0.0.0:80", ready: true, local: true}, {addr: "10.0.0.1:80", ready: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, local: []string{"10.0.0.0:80"}, any: true},
		{name: "iTP Local, eTP Local, some endpoints local",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true, externalLocal: true, nodePort: true},
			eps:     []ep{{addr: "10.0.0.0:80", ready: true, local: true}, {addr: "10.0.0.1:80", ready: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, local: []string{"10.0.0.0:80"}, any: true},
		{name: "iTP Local, eTP Local, all endpoints remote",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true, externalLocal: true, nodePort: true},
			eps:     []ep{{addr: "10.0.0.0:80", ready: true}, {addr: "10.0.0.1:80", ready: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, any: true},
		{name: "iTP Local, eTP Local, all endpoints remote and terminating",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true, externalLocal: true, nodePort: true},
			eps:     []ep{{addr: "10.0.0.0:80", serving: true, terminating: true}, {addr: "10.0.0.1:80", serving: true, terminating: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, any: true},
		{name: "iTP Cluster, eTP Local, terminating endpoints",
			node: model.Node{Name: "gw"}, policy: policy{externalLocal: true, nodePort: true},
			eps: []ep{{addr: "10.0.0.0:80", ready: true}, {addr: "10.0.0.1:80", local: true},
				{addr: "10.0.0.2:80", serving: true, terminating: true, local: true}, {addr: "10.0.0.3:80", serving: true, terminating: true}},
			cluster: []string{"10.0.0.0:80"}, local: []string{"10.0.0.2:80"}, any: true},
		{name: "externalTrafficPolicy ignored when not externally accessible",
			node: model.Node{Name: "gw"}, policy: policy{externalLocal: true},
			eps:     []ep{{addr: "10.0.0.0:80", ready: true}, {addr: "10.0.0.1:80", ready: true, local: true}},
			cluster: []string{"10.0.0.0:80", "10.0.0.1:80"}, any: true},
		{name: "iTP Local internal-only: no cluster endpoints",
			node: model.Node{Name: "gw"}, policy: policy{internalLocal: true},
			eps:   []ep{{addr: "10.0.0.0:80", ready: true}, {addr: "10.0.0.1:80", ready: true, local: true}},
			local: []string{"10.0.0.1:80"}, any: true},
		{name: "no endpoints", node: model.Node{Name: "gw"}, any: false},
		{name: "one endpoint neither ready, serving nor terminating",
			node: model.Node{Name: "gw", Zone: "zone-a"},
			eps:  []ep{{addr: "10.0.0.0:80"}}, any: false},

		// kube-proxy: an endpoint is local only when the proxy has a
		// node name and the endpoint names the same node.
		{name: "gateway without a node name has no local endpoints",
			node: model.Node{}, policy: policy{externalLocal: true, nodePort: true},
			eps:     []ep{{addr: "10.0.0.0:80", ready: true}},
			cluster: []string{"10.0.0.0:80"}, any: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &model.Service{Key: model.NewServiceKey("ns", "svc"), Type: model.TypeClusterIP,
				InternalLocal: tc.policy.internalLocal, ExternalLocal: tc.policy.externalLocal,
				Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}}}
			if tc.policy.nodePort {
				svc.Type, svc.Ports[0].NodePort = model.TypeNodePort, 30080
			}
			for _, e := range tc.eps {
				m := e.endpoint()
				if tc.node.Name == "" {
					m.Place = model.Place{} // neither side knows its node
				}
				svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, m)
			}
			got := model.Categorize(svc, &svc.Ports[0], tc.node)
			if g := addrPorts(got.Cluster); !slices.Equal(g, sorted(tc.cluster)) {
				t.Errorf("Cluster = %v, want %v", g, sorted(tc.cluster))
			}
			if g := addrPorts(got.Local); !slices.Equal(g, sorted(tc.local)) {
				t.Errorf("Local = %v, want %v", g, sorted(tc.local))
			}
			if got.Any != tc.any {
				t.Errorf("Any = %v, want %v", got.Any, tc.any)
			}
		})
	}
}
