package trace_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/internal/testing/trace"
	"github.com/nftgate/nftgate/internal/testing/world"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// flow is one new connection and what must happen to it.
type flow struct {
	name     string
	src, dst string // dst as addr:port
	proto    model.Protocol
	output   bool     // sent by the gateway itself
	affinity []string // affinity sets that hold the source
	want     string   // TraceResult.Summary
}

func replay(t *testing.T, cfg *ruleset.Config, svcs []*model.Service, fl flow) (trace.TraceResult, []ruleset.Table) {
	t.Helper()
	dst := netip.MustParseAddrPort(fl.dst)
	pkt := trace.Packet{
		Src: world.Addr(fl.src), Dst: dst.Addr(), Proto: fl.proto, SrcPort: 40123, DstPort: dst.Port(),
		Hook: "prerouting", SrcLocal: slices.Contains(world.GatewayAddrs, world.Addr(fl.src)), DstLocal: slices.Contains(world.GatewayAddrs, dst.Addr()),
	}
	if pkt.Proto == 0 {
		pkt.Proto = model.TCP
	}
	if fl.output {
		pkt.Hook = "output"
		if !pkt.SrcLocal {
			t.Fatalf("flow %q: the gateway's own traffic must come from one of its addresses, not %s", fl.name, pkt.Src)
		}
	}
	if len(fl.affinity) > 0 {
		pkt.AffinityHit = map[string]bool{}
		for _, s := range fl.affinity {
			pkt.AffinityHit[s] = true
		}
	}
	f := ruleset.Of(pkt.Dst)
	tables := ruleset.Layout(cfg, f, svcs)
	return trace.Trace(cfg, f, tables, pkt), tables
}

func runFlows(t *testing.T, cfg *ruleset.Config, svcs []*model.Service, flows []flow) {
	t.Helper()
	for _, fl := range flows {
		t.Run(fl.name, func(t *testing.T) {
			res, tables := replay(t, cfg, svcs, fl)
			if got := res.Summary(); got != fl.want {
				var text bytes.Buffer
				ruleset.WriteTables(&text, ruleset.Of(world.Addr(fl.src)), tables)
				t.Errorf("%s -> %s: got %q, want %q\n%s\nruleset:\n%s", fl.src, fl.dst, got, fl.want, res.Paths(), text.String())
			}
			for _, o := range res.Outcomes {
				// The masquerading chain must act on exactly the marked
				// packets and the hairpin ones (an endpoint reaching itself).
				hairpin := o.DNAT.IsValid() && o.DNAT.Addr() == world.Addr(fl.src)
				if (o.Marked || hairpin) != o.Masqueraded {
					t.Errorf("outcome %s: marked=%v but masqueraded=%v\n%s", o, o.Marked, o.Masqueraded, res.Paths())
				}
			}
		})
	}
}

func TestTraceClusterIPProtocols(t *testing.T) {
	eps := func(port uint16) []model.Endpoint {
		return []model.Endpoint{world.Ready("10.180.0.1", port), world.Ready("10.180.1.1", port), world.Ready("10.180.2.1", port)}
	}
	svc := &model.Service{
		Key: model.NewServiceKey("ns1", "multi"), Type: model.TypeClusterIP, ClusterIPs: world.Addrs("172.30.0.50"),
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps(8080)},
			{Name: "dns", Protocol: model.UDP, Port: 53, Endpoints: eps(5353)},
			{Name: "sig", Protocol: model.SCTP, Port: 3868, Endpoints: eps(3869)},
		},
	}
	runFlows(t, world.Config(), []*model.Service{svc}, []flow{
		{name: "tcp spreads over all endpoints", src: "10.1.2.3", dst: "172.30.0.50:80",
			want: "dnat 10.180.0.1:8080, dnat 10.180.1.1:8080, dnat 10.180.2.1:8080"},
		{name: "udp", src: "10.1.2.3", dst: "172.30.0.50:53", proto: model.UDP,
			want: "dnat 10.180.0.1:5353, dnat 10.180.1.1:5353, dnat 10.180.2.1:5353"},
		{name: "sctp", src: "10.1.2.3", dst: "172.30.0.50:3868", proto: model.SCTP,
			want: "dnat 10.180.0.1:3869, dnat 10.180.1.1:3869, dnat 10.180.2.1:3869"},
		{name: "udp to the tcp port is not the service", src: "10.1.2.3", dst: "172.30.0.50:80", proto: model.UDP,
			want: "reject"},
		{name: "from the gateway itself", src: "192.168.0.2", dst: "172.30.0.50:80", output: true,
			want: "dnat 10.180.0.1:8080 masq, dnat 10.180.1.1:8080 masq, dnat 10.180.2.1:8080 masq"},
		{name: "other address is untouched", src: "10.1.2.3", dst: "172.30.0.99:80", want: "accept"},
	})
}

// kube-proxy rejects new connections to a ClusterIP on a port that no
// Service port serves (its cluster-ips set, "Reject traffic to invalid
// ports of ClusterIPs"), in filter forward and output.
func TestTraceClusterIPUnknownPortRejected(t *testing.T) {
	svc := world.Web(world.Ready("10.180.0.1", 8080))
	runFlows(t, world.Config(), []*model.Service{svc}, []flow{
		{name: "forwarded", src: "10.1.2.3", dst: "172.30.0.41:81", want: "reject"},
		{name: "from the gateway", src: "192.168.0.2", dst: "172.30.0.41:81", output: true, want: "reject"},
	})
}

func TestTraceNodePorts(t *testing.T) {
	svcs := []*model.Service{world.Web(world.Ready("10.180.0.1", 8080), world.Ready("10.180.1.1", 8080))}
	both := "dnat 10.180.0.1:8080 masq, dnat 10.180.1.1:8080 masq"
	runFlows(t, world.Config(), svcs, []flow{
		{name: "on the node address", src: "203.0.113.5", dst: "192.168.0.2:30080", want: both},
		{name: "on another local address", src: "203.0.113.5", dst: "10.99.0.1:30080", want: both},
		{name: "from a pod", src: "10.1.2.3", dst: "192.168.0.2:30080", want: both},
		{name: "from the gateway itself", src: "192.168.0.2", dst: "192.168.0.2:30080", output: true, want: both},
		{name: "not on loopback", src: "127.0.0.1", dst: "127.0.0.1:30080", output: true, want: "accept"},
		{name: "not on a forwarded address", src: "203.0.113.5", dst: "203.0.113.99:30080", want: "accept"},
		{name: "wrong protocol", src: "203.0.113.5", dst: "192.168.0.2:30080", proto: model.UDP, want: "accept"},
	})

	cfg := world.Config()
	cfg.NodePortAddresses = []netip.Prefix{world.Prefix("192.168.0.0/24")}
	runFlows(t, cfg, svcs, []flow{
		{name: "limited: inside NodePortAddresses", src: "203.0.113.5", dst: "192.168.0.2:30080", want: both},
		{name: "limited: local address outside them", src: "203.0.113.5", dst: "10.99.0.1:30080", want: "accept"},
		{name: "limited: no IPv6 NodePorts without an IPv6 prefix", src: "2001:db8:9::5", dst: "[2001:db8:1::2]:30080", want: "accept"},
	})
}

func TestTraceExternalAndLoadBalancerIPs(t *testing.T) {
	svcs := []*model.Service{world.Web(world.Ready("10.180.0.1", 8080), world.Ready("10.180.1.1", 8080))}
	both := "dnat 10.180.0.1:8080 masq, dnat 10.180.1.1:8080 masq"
	runFlows(t, world.Config(), svcs, []flow{
		{name: "externalIP routed to the gateway", src: "203.0.113.5", dst: "192.168.99.11:80", want: both},
		{name: "externalIP that is a local address", src: "203.0.113.5", dst: "192.168.0.3:80", want: both},
		{name: "externalIP from a pod is masqueraded too", src: "10.1.2.3", dst: "192.168.99.11:80", want: both},
		// Not routed back to the router that routes the address here
		// (ruleset/unserved.go).
		{name: "externalIP other port", src: "203.0.113.5", dst: "192.168.99.11:81", want: "reject"},
		{name: "externalIP that is a local address, other port", src: "203.0.113.5", dst: "192.168.0.3:81", want: "accept"},
		{name: "LoadBalancer IP", src: "203.0.113.5", dst: "198.51.100.1:80", want: both},
		{name: "LoadBalancer IP from the gateway", src: "192.168.0.2", dst: "198.51.100.1:80", output: true, want: both},
		{name: "LoadBalancer IP other port", src: "203.0.113.5", dst: "198.51.100.1:443", want: "reject"},
		{name: "LoadBalancer IP other protocol", src: "203.0.113.5", dst: "198.51.100.1:80", proto: model.UDP, want: "reject"},
	})
	for unserved, want := range map[ruleset.Unserved]string{ruleset.UnservedDrop: "drop", ruleset.UnservedRoute: "accept"} {
		cfg := world.Config()
		cfg.Unserved = unserved
		runFlows(t, cfg, svcs, []flow{
			{name: "externalIP other port, " + want, src: "203.0.113.5", dst: "192.168.99.11:81", want: want},
			{name: "LoadBalancer IP other port, " + want, src: "203.0.113.5", dst: "198.51.100.1:443", want: want},
			{name: "echo request to the LoadBalancer IP, answered all the same", src: "203.0.113.5", dst: "198.51.100.1:0", proto: ruleset.ProtoICMP, want: "redirect"},
		})
	}
}

// The gateway answers an echo request to a Service address itself
// (ruleset/unserved.go); ServiceEchoOff leaves it to the unserved traffic's
// rules.
func TestTraceEchoRequestToServiceAddresses(t *testing.T) {
	svcs := []*model.Service{world.Web(world.Ready("10.180.0.1", 8080))}
	runFlows(t, world.Config(), svcs, []flow{
		{name: "LoadBalancer IP", src: "203.0.113.5", dst: "198.51.100.1:0", proto: ruleset.ProtoICMP, want: "redirect"},
		{name: "externalIP", src: "203.0.113.5", dst: "192.168.99.11:0", proto: ruleset.ProtoICMP, want: "redirect"},
		{name: "ClusterIP: rejected as before", src: "10.1.2.3", dst: "172.30.0.41:0", proto: ruleset.ProtoICMP, want: "reject"},
		{name: "another address: routed", src: "203.0.113.5", dst: "198.51.100.99:0", proto: ruleset.ProtoICMP, want: "accept"},
		{name: "the gateway's own echo request to the LoadBalancer IP", src: "192.168.0.2", dst: "198.51.100.1:0", proto: ruleset.ProtoICMP, output: true, want: "accept"},
	})
	for unserved, want := range map[ruleset.Unserved]string{ruleset.UnservedReject: "reject", ruleset.UnservedDrop: "drop", ruleset.UnservedRoute: "accept"} {
		cfg := world.Config()
		cfg.Unserved, cfg.ServiceEchoOff = unserved, true
		runFlows(t, cfg, svcs, []flow{
			{name: "echo off: LoadBalancer IP, " + want, src: "203.0.113.5", dst: "198.51.100.1:0", proto: ruleset.ProtoICMP, want: want},
		})
	}
}

func TestTraceLoadBalancerSourceRanges(t *testing.T) {
	svc := world.Web(world.Ready("10.180.0.1", 8080))
	svc.EditRare().SourceRanges = []netip.Prefix{world.Prefix("203.0.113.0/24"), world.Prefix("198.19.7.7/32")}
	one := "dnat 10.180.0.1:8080 masq"
	runFlows(t, world.Config(), []*model.Service{svc}, []flow{
		{name: "LB IP from inside a range", src: "203.0.113.5", dst: "198.51.100.1:80", want: one},
		{name: "LB IP from a single-address range", src: "198.19.7.7", dst: "198.51.100.1:80", want: one},
		{name: "LB IP from outside", src: "198.18.0.1", dst: "198.51.100.1:80", want: "drop"},
		{name: "LB IP from a pod outside", src: "10.1.2.3", dst: "198.51.100.1:80", want: "drop"},
		{name: "LB IP from the gateway outside", src: "192.168.0.2", dst: "198.51.100.1:80", output: true, want: "drop"},
		{name: "NodePort is not subject to ranges", src: "198.18.0.1", dst: "192.168.0.2:30080", want: one},
		{name: "externalIP is not subject to ranges", src: "198.18.0.1", dst: "192.168.99.11:80", want: one},
		{name: "ClusterIP is not subject to ranges", src: "198.18.0.1", dst: "172.30.0.41:80", want: one},
		{name: "other LB port is not subject to ranges", src: "198.18.0.1", dst: "198.51.100.1:81", want: "reject"},
	})
}

func TestTraceNoEndpointsRejects(t *testing.T) {
	notReady := model.Endpoint{Port: 8080}.WithAddr(world.Addr("10.180.0.1"))
	for name, eps := range map[string][]model.Endpoint{
		"none":                     nil,
		"only not ready":           {notReady},
		"only terminating, unused": {model.Endpoint{Port: 8080, Terminating: true}.WithAddr(world.Addr("10.180.0.1"))},
	} {
		t.Run(name, func(t *testing.T) {
			svc := world.Web(eps...)
			udp := &model.Service{Key: model.NewServiceKey("ns1", "dns"), Type: model.TypeNodePort,
				ClusterIPs: world.Addrs("172.30.0.53"), Ports: []model.ServicePort{{Protocol: model.UDP, Port: 53, NodePort: 30053, Endpoints: eps}}}
			runFlows(t, world.Config(), []*model.Service{svc, udp}, []flow{
				{name: "ClusterIP", src: "10.1.2.3", dst: "172.30.0.41:80", want: "reject"},
				{name: "ClusterIP from the gateway", src: "192.168.0.2", dst: "172.30.0.41:80", output: true, want: "reject"},
				{name: "NodePort", src: "203.0.113.5", dst: "192.168.0.2:30080", want: "reject"},
				{name: "NodePort from the gateway", src: "192.168.0.2", dst: "192.168.0.2:30080", output: true, want: "reject"},
				{name: "externalIP", src: "203.0.113.5", dst: "192.168.99.11:80", want: "reject"},
				{name: "local externalIP", src: "203.0.113.5", dst: "192.168.0.3:80", want: "reject"},
				{name: "LoadBalancer IP", src: "203.0.113.5", dst: "198.51.100.1:80", want: "reject"},
				{name: "UDP ClusterIP", src: "10.1.2.3", dst: "172.30.0.53:53", proto: model.UDP, want: "reject"},
				{name: "UDP NodePort", src: "203.0.113.5", dst: "192.168.0.2:30053", proto: model.UDP, want: "reject"},
			})
		})
	}
}

func TestTraceExternalTrafficPolicyLocal(t *testing.T) {
	local := func(name, cip, lb string, nodePort uint16, eps ...model.Endpoint) *model.Service {
		return &model.Service{
			Key: model.NewServiceKey("ns1", name), Type: model.TypeLoadBalancer, ExternalLocal: true,
			ClusterIPs: world.Addrs(cip), Rare: &model.Rare{LoadBalancerIPs: world.Addrs(lb)}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: nodePort, Endpoints: eps}},
		}
	}
	svcs := []*model.Service{
		local("both", "172.30.0.42", "198.51.100.2", 30081, world.On("gw", world.Ready("10.180.0.2", 8080)), world.On("other", world.Ready("10.180.1.2", 8080))),
		local("remote", "172.30.0.43", "198.51.100.3", 30082, world.On("other", world.Ready("10.180.1.3", 8080)), world.On("other", world.Ready("10.180.2.3", 8080))),
		local("none", "172.30.0.44", "198.51.100.4", 30083),
		local("draining", "172.30.0.45", "198.51.100.5", 30084, world.On("gw", world.Terminating("10.180.0.5", 8080)), world.On("other", world.Ready("10.180.1.5", 8080))),
		local("both-policies", "172.30.0.46", "198.51.100.6", 30085, world.On("other", world.Ready("10.180.1.6", 8080))),
	}
	svcs[4].InternalLocal = true
	runFlows(t, world.Config(), svcs, []flow{
		{name: "LB IP: local endpoint only, client kept", src: "203.0.113.5", dst: "198.51.100.2:80", want: "dnat 10.180.0.2:8080"},
		{name: "NodePort: local endpoint only, client kept", src: "203.0.113.5", dst: "192.168.0.2:30081", want: "dnat 10.180.0.2:8080"},
		{name: "ClusterIP keeps Cluster policy", src: "203.0.113.5", dst: "172.30.0.42:80",
			want: "dnat 10.180.0.2:8080 masq, dnat 10.180.1.2:8080 masq"},
		{name: "gateway's own traffic to LB IP uses all endpoints", src: "192.168.0.2", dst: "198.51.100.2:80", output: true,
			want: "dnat 10.180.0.2:8080 masq, dnat 10.180.1.2:8080 masq"},
		{name: "gateway's own traffic to its NodePort uses all endpoints", src: "192.168.0.2", dst: "192.168.0.2:30081", output: true,
			want: "dnat 10.180.0.2:8080 masq, dnat 10.180.1.2:8080 masq"},
		// kube-proxy short-circuits traffic from the cluster CIDR to the
		// Cluster endpoints ("short-circuit pod traffic"): a pod reaching
		// an LB IP is not subject to the Local policy.
		{name: "pod to LB IP is not subject to Local policy", src: "10.1.2.3", dst: "198.51.100.2:80",
			want: "dnat 10.180.0.2:8080, dnat 10.180.1.2:8080"},

		{name: "no local endpoint: LB IP drops", src: "203.0.113.5", dst: "198.51.100.3:80", want: "drop"},
		{name: "no local endpoint: NodePort drops", src: "203.0.113.5", dst: "192.168.0.2:30082", want: "drop"},
		{name: "no local endpoint: gateway still reaches the Service", src: "192.168.0.2", dst: "198.51.100.3:80", output: true,
			want: "dnat 10.180.1.3:8080 masq, dnat 10.180.2.3:8080 masq"},
		{name: "no local endpoint: ClusterIP works", src: "10.1.2.3", dst: "172.30.0.43:80",
			want: "dnat 10.180.1.3:8080, dnat 10.180.2.3:8080"},

		{name: "no endpoint at all: LB IP rejects", src: "203.0.113.5", dst: "198.51.100.4:80", want: "reject"},
		{name: "no endpoint at all: NodePort rejects", src: "203.0.113.5", dst: "192.168.0.2:30083", want: "reject"},

		{name: "local endpoint terminating: still used for Local", src: "203.0.113.5", dst: "198.51.100.5:80", want: "dnat 10.180.0.5:8080"},
		// Both policies Local: the gateway's own traffic to an external
		// address still short-circuits to the cluster endpoints (kube-proxy
		// keeps Cluster endpoints for any externally reachable Service).
		{name: "iTP and eTP Local: gateway's own traffic to LB IP", src: "192.168.0.2", dst: "198.51.100.6:80", output: true,
			want: "dnat 10.180.1.6:8080 masq"},
		{name: "iTP and eTP Local: external client dropped", src: "203.0.113.5", dst: "198.51.100.6:80", want: "drop"},
		{name: "iTP and eTP Local: ClusterIP dropped", src: "10.1.2.3", dst: "172.30.0.46:80", want: "drop"},

		{name: "local endpoint terminating: Cluster uses the ready one", src: "10.1.2.3", dst: "172.30.0.45:80", want: "dnat 10.180.1.5:8080"},
	})
}

func TestTraceInternalTrafficPolicyLocal(t *testing.T) {
	itp := func(name, cip string, nodePort uint16, eps ...model.Endpoint) *model.Service {
		return &model.Service{
			Key: model.NewServiceKey("ns1", name), Type: model.TypeNodePort, InternalLocal: true,
			ClusterIPs: world.Addrs(cip), Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80, NodePort: nodePort, Endpoints: eps}},
		}
	}
	svcs := []*model.Service{
		itp("both", "172.30.0.46", 30086, world.On("gw", world.Ready("10.180.0.6", 8080)), world.On("other", world.Ready("10.180.1.6", 8080))),
		itp("remote", "172.30.0.47", 30087, world.On("other", world.Ready("10.180.1.7", 8080))),
		itp("none", "172.30.0.48", 30088),
	}
	runFlows(t, world.Config(), svcs, []flow{
		{name: "ClusterIP goes to the local endpoint", src: "10.1.2.3", dst: "172.30.0.46:80", want: "dnat 10.180.0.6:8080"},
		{name: "NodePort keeps Cluster policy", src: "203.0.113.5", dst: "192.168.0.2:30086",
			want: "dnat 10.180.0.6:8080 masq, dnat 10.180.1.6:8080 masq"},
		// kube-proxy marks every ClusterIP connection from outside the
		// cluster CIDR in its services chain, whatever the policy.
		{name: "ClusterIP from outside the cluster is masqueraded", src: "203.0.113.5", dst: "172.30.0.46:80", want: "dnat 10.180.0.6:8080 masq"},
		{name: "no local endpoint: ClusterIP drops", src: "10.1.2.3", dst: "172.30.0.47:80", want: "drop"},
		{name: "no local endpoint: NodePort works", src: "203.0.113.5", dst: "192.168.0.2:30087", want: "dnat 10.180.1.7:8080 masq"},
		{name: "no endpoint at all: ClusterIP rejects", src: "10.1.2.3", dst: "172.30.0.48:80", want: "reject"},
	})
}

func TestTraceMasquerade(t *testing.T) {
	svcs := []*model.Service{world.Web(world.Ready("10.180.0.1", 8080))}
	runFlows(t, world.Config(), svcs, []flow{
		{name: "ClusterIP from inside the cluster CIDR", src: "10.1.2.3", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080"},
		{name: "ClusterIP from outside", src: "203.0.113.5", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080 masq"},
		{name: "ClusterIP from the gateway", src: "192.168.0.2", dst: "172.30.0.41:80", output: true, want: "dnat 10.180.0.1:8080 masq"},
		{name: "unrelated forwarded traffic", src: "203.0.113.5", dst: "198.18.0.1:80", want: "accept"},
	})
	cfg := world.Config()
	cfg.ClusterCIDRs = nil
	runFlows(t, cfg, svcs, []flow{
		{name: "no cluster CIDRs: everyone is masqueraded", src: "10.1.2.3", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080 masq"},
	})
	cfg = world.Config()
	cfg.MasqueradeAddresses = world.Addrs("198.51.100.200", "198.51.100.201", "198.51.100.202")
	runFlows(t, cfg, svcs, []flow{
		{name: "pool: from outside, to a masquerade address", src: "203.0.113.5", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080 masq"},
		{name: "pool: inside the cluster CIDR", src: "10.1.2.3", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080"},
	})
	// Masquerade ports by CPU group: every group's chain masquerades (the
	// trace forks over the groups; runFlows checks each outcome).
	for _, pool := range [][]netip.Addr{nil, world.Addrs("198.51.100.200", "198.51.100.201")} {
		cfg = world.Config()
		cfg.MasqueradePortGroups, cfg.MasqueradeAddresses = 4, pool
		runFlows(t, cfg, svcs, []flow{
			{name: fmt.Sprintf("cpu groups, pool of %d: from outside", len(pool)), src: "203.0.113.5", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080 masq"},
			{name: fmt.Sprintf("cpu groups, pool of %d: from the gateway", len(pool)), src: "192.168.0.2", dst: "172.30.0.41:80", output: true, want: "dnat 10.180.0.1:8080 masq"},
		})
	}
	cfg = world.Config()
	cfg.KeepClientAddress = true
	runFlows(t, cfg, svcs, []flow{
		{name: "keep: ClusterIP from outside keeps its address", src: "203.0.113.5", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:8080"},
		{name: "keep: external IP from outside keeps its address", src: "203.0.113.5", dst: "192.168.99.11:80", want: "dnat 10.180.0.1:8080"},
		{name: "keep: the gateway's own connection is masqueraded", src: "192.168.0.2", dst: "172.30.0.41:80", output: true, want: "dnat 10.180.0.1:8080 masq"},
	})
}

func TestTraceHairpin(t *testing.T) {
	single := world.Web(world.Ready("10.180.0.9", 8080))
	runFlows(t, world.Config(), []*model.Service{single}, []flow{
		{name: "endpoint to its own service", src: "10.180.0.9", dst: "172.30.0.41:80", want: "dnat 10.180.0.9:8080 masq"},
		{name: "another pod", src: "10.180.0.10", dst: "172.30.0.41:80", want: "dnat 10.180.0.9:8080"},
	})
	two := world.Web(world.Ready("10.180.0.1", 8080), world.Ready("10.180.1.1", 8080))
	t.Run("only the path back to itself", func(t *testing.T) {
		res, _ := replay(t, world.Config(), []*model.Service{two}, flow{src: "10.180.0.1", dst: "172.30.0.41:80"})
		if got, want := res.Summary(), "dnat 10.180.0.1:8080 masq, dnat 10.180.1.1:8080"; got != want {
			t.Errorf("got %q, want %q\n%s", got, want, res.Paths())
		}
	})
}

func TestTraceSessionAffinity(t *testing.T) {
	svc := world.Web(world.Ready("10.180.0.1", 8080), world.Ready("10.180.1.1", 8080), world.Ready("10.180.2.1", 8080))
	svc.EditRare().AffinityTimeout = 3 * time.Hour
	svcs := []*model.Service{svc}
	cfg := world.Config()

	// A first connection may go anywhere and records the client in the
	// chosen endpoint's own set.
	first, _ := replay(t, cfg, svcs, flow{src: "10.1.2.3", dst: "172.30.0.41:80"})
	if len(first.Targets()) != 3 {
		t.Fatalf("first connection: %s", first.Summary())
	}
	setOf := map[netip.AddrPort]string{}
	for _, o := range first.Outcomes {
		if len(o.Affinity) != 1 {
			t.Fatalf("outcome %s records affinity in %v, want one set\n%s", o, o.Affinity, first.Paths())
		}
		if prev, ok := setOf[o.DNAT]; ok && prev != o.Affinity[0] {
			t.Fatalf("endpoint %s records in two sets", o.DNAT)
		}
		setOf[o.DNAT] = o.Affinity[0]
	}
	seen := map[string]bool{}
	for _, s := range setOf {
		if seen[s] {
			t.Fatalf("endpoints share affinity set %s", s)
		}
		seen[s] = true
	}

	second := world.Addr("10.180.1.1")
	secondSet := setOf[netip.AddrPortFrom(second, 8080)]
	runFlows(t, cfg, svcs, []flow{
		{name: "known client sticks to its endpoint", src: "10.1.2.3", dst: "172.30.0.41:80", affinity: []string{secondSet},
			want: "dnat 10.180.1.1:8080"},
		{name: "sticks through the LB IP too", src: "203.0.113.5", dst: "198.51.100.1:80", affinity: []string{secondSet},
			want: "dnat 10.180.1.1:8080 masq"},
		{name: "sticks through the NodePort too", src: "203.0.113.5", dst: "192.168.0.2:30080", affinity: []string{secondSet},
			want: "dnat 10.180.1.1:8080 masq"},
		{name: "unknown client spreads", src: "10.1.2.4", dst: "172.30.0.41:80",
			want: "dnat 10.180.0.1:8080, dnat 10.180.1.1:8080, dnat 10.180.2.1:8080"},
	})

	// The sticky path refreshes the same set.
	res, _ := replay(t, cfg, svcs, flow{src: "10.1.2.3", dst: "172.30.0.41:80", affinity: []string{secondSet}})
	if len(res.Outcomes) != 1 || !slices.Equal(res.Outcomes[0].Affinity, []string{secondSet}) {
		t.Errorf("sticky connection updated %v, want [%s]\n%s", res.Outcomes, secondSet, res.Paths())
	}
}

func TestTraceTerminatingAndNotReady(t *testing.T) {
	notReady := func(a string) model.Endpoint { return model.Endpoint{Port: 8080}.WithAddr(world.Addr(a)) }
	servingNotReady := func(a string) model.Endpoint {
		return model.Endpoint{Port: 8080, Serving: true}.WithAddr(world.Addr(a))
	}
	terminatingNotServing := func(a string) model.Endpoint {
		return model.Endpoint{Port: 8080, Terminating: true}.WithAddr(world.Addr(a))
	}
	for _, tc := range []struct {
		name string
		eps  []model.Endpoint
		want string
	}{
		{"ready ones only while any is ready",
			[]model.Endpoint{world.Ready("10.180.0.1", 8080), world.Terminating("10.180.1.1", 8080), notReady("10.180.2.1")},
			"dnat 10.180.0.1:8080"},
		{"serving terminating ones when none is ready",
			[]model.Endpoint{world.Terminating("10.180.1.1", 8080), world.Terminating("10.180.1.2", 8080), terminatingNotServing("10.180.1.3"), notReady("10.180.2.1")},
			"dnat 10.180.1.1:8080, dnat 10.180.1.2:8080"},
		{"not ready never", []model.Endpoint{notReady("10.180.2.1"), notReady("10.180.2.2")}, "reject"},
		{"serving but not ready and not terminating never", []model.Endpoint{servingNotReady("10.180.2.1")}, "reject"},
		{"terminating and not serving never", []model.Endpoint{terminatingNotServing("10.180.1.3")}, "reject"},
	} {
		runFlows(t, world.Config(), []*model.Service{world.Web(tc.eps...)}, []flow{
			{name: tc.name, src: "10.1.2.3", dst: "172.30.0.41:80", want: tc.want},
		})
	}
}

func TestTraceTopology(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []model.Endpoint
		want string
	}{
		{"zone hints pick this zone",
			[]model.Endpoint{world.ZoneHints(world.Ready("10.180.0.1", 80), "zone-a"), world.ZoneHints(world.Ready("10.180.1.1", 80), "zone-b"), world.ZoneHints(world.Ready("10.180.2.1", 80), "zone-a")},
			"dnat 10.180.0.1:80, dnat 10.180.2.1:80"},
		{"an endpoint without hints disables them",
			[]model.Endpoint{world.ZoneHints(world.Ready("10.180.0.1", 80), "zone-a"), world.Ready("10.180.1.1", 80)},
			"dnat 10.180.0.1:80, dnat 10.180.1.1:80"},
		{"no hint for this zone falls back to all",
			[]model.Endpoint{world.ZoneHints(world.Ready("10.180.0.1", 80), "zone-b"), world.ZoneHints(world.Ready("10.180.1.1", 80), "zone-c")},
			"dnat 10.180.0.1:80, dnat 10.180.1.1:80"},
		{"hints of not-ready endpoints do not count",
			[]model.Endpoint{world.ZoneHints(model.Endpoint{Port: 80}.WithAddr(world.Addr("10.180.0.1")), "zone-a"), world.ZoneHints(world.Ready("10.180.1.1", 80), "zone-b")},
			"dnat 10.180.1.1:80"},
		{"node hints pick this node",
			[]model.Endpoint{world.NodeHints(world.ZoneHints(world.Ready("10.180.0.1", 80), "zone-a"), "gw"), world.NodeHints(world.ZoneHints(world.Ready("10.180.1.1", 80), "zone-a"), "other")},
			"dnat 10.180.0.1:80"},
		{"incomplete node hints fall back to zone hints",
			[]model.Endpoint{world.NodeHints(world.ZoneHints(world.Ready("10.180.0.1", 80), "zone-a"), "gw"), world.ZoneHints(world.Ready("10.180.1.1", 80), "zone-a"), world.ZoneHints(world.Ready("10.180.2.1", 80), "zone-b")},
			"dnat 10.180.0.1:80, dnat 10.180.1.1:80"},
	} {
		runFlows(t, world.Config(), []*model.Service{world.Web(tc.eps...)}, []flow{
			{name: tc.name, src: "10.1.2.3", dst: "172.30.0.41:80", want: tc.want},
		})
	}
	cfg := world.Config()
	cfg.Node.Zone = ""
	runFlows(t, cfg, []*model.Service{world.Web(world.ZoneHints(world.Ready("10.180.0.1", 80), "zone-a"), world.ZoneHints(world.Ready("10.180.1.1", 80), "zone-b"))}, []flow{
		{name: "gateway without a zone ignores zone hints", src: "10.1.2.3", dst: "172.30.0.41:80", want: "dnat 10.180.0.1:80, dnat 10.180.1.1:80"},
	})
}

func TestTraceDualStack(t *testing.T) {
	dual := func(eps ...model.Endpoint) *model.Service {
		return &model.Service{
			Key: model.NewServiceKey("ns1", "dual"), Type: model.TypeLoadBalancer,
			ClusterIPs: world.Addrs("172.30.0.60", "fd00:30::60"),
			Rare:       &model.Rare{LoadBalancerIPs: world.Addrs("198.51.100.6", "2001:db8:ff::6")},
			Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30060, Endpoints: eps}},
		}
	}
	svc := dual(world.Ready("10.180.0.6", 8080), world.Ready("10.180.1.6", 8080), world.Ready("fd00:10::6", 8080), world.Ready("fd00:10:1::6", 8080))
	v6both := "dnat [fd00:10:1::6]:8080 masq, dnat [fd00:10::6]:8080 masq"
	runFlows(t, world.Config(), []*model.Service{svc}, []flow{
		{name: "IPv4 ClusterIP goes to IPv4 endpoints", src: "10.1.2.3", dst: "172.30.0.60:80", want: "dnat 10.180.0.6:8080, dnat 10.180.1.6:8080"},
		{name: "IPv6 ClusterIP from a pod", src: "fd00:10::99", dst: "[fd00:30::60]:80", want: "dnat [fd00:10:1::6]:8080, dnat [fd00:10::6]:8080"},
		{name: "IPv6 ClusterIP from outside", src: "2001:db8:9::5", dst: "[fd00:30::60]:80", want: v6both},
		{name: "IPv6 NodePort", src: "2001:db8:9::5", dst: "[2001:db8:1::2]:30060", want: v6both},
		{name: "IPv6 NodePort not on loopback", src: "::1", dst: "[::1]:30060", output: true, want: "accept"},
		{name: "IPv6 LB IP", src: "2001:db8:9::5", dst: "[2001:db8:ff::6]:80", want: v6both},
		{name: "IPv6 hairpin", src: "fd00:10::6", dst: "[fd00:30::60]:80", want: "dnat [fd00:10:1::6]:8080, dnat [fd00:10::6]:8080 masq"},
	})

	noV6 := dual(world.Ready("10.180.0.6", 8080))
	runFlows(t, world.Config(), []*model.Service{noV6}, []flow{
		{name: "IPv6 without IPv6 endpoints rejects", src: "fd00:10::99", dst: "[fd00:30::60]:80", want: "reject"},
		{name: "IPv4 still works", src: "10.1.2.3", dst: "172.30.0.60:80", want: "dnat 10.180.0.6:8080"},
	})

	// kube-proxy runs one proxier per family: the fallback to terminating
	// endpoints is decided per family, so IPv6 clients reach the draining
	// IPv6 endpoint although IPv4 has a ready one.
	draining := dual(world.Ready("10.180.0.6", 8080), world.Terminating("fd00:10::7", 8080))
	runFlows(t, world.Config(), []*model.Service{draining}, []flow{
		{name: "terminating fallback is per family", src: "fd00:10::99", dst: "[fd00:30::60]:80", want: "dnat [fd00:10::7]:8080"},
		{name: "IPv4 uses its ready endpoint", src: "10.1.2.3", dst: "172.30.0.60:80", want: "dnat 10.180.0.6:8080"},
	})

	// kube-proxy's IPv6 proxier ignores a Service without an IPv6
	// ClusterIP: the NodePort of an IPv4-only Service on an IPv6 address
	// is not the Service's (nor rejected as one without endpoints).
	v4only := world.Web(world.Ready("10.180.0.1", 8080))
	v4only.IPv4 = true // spec.ipFamilies: [IPv4]
	cfg := world.Config()
	cfg.NodePortAddresses = []netip.Prefix{world.Prefix("192.168.0.0/24"), world.Prefix("2001:db8:1::/64")}
	runFlows(t, cfg, []*model.Service{v4only}, []flow{
		{name: "IPv4-only NodePort on IPv4", src: "203.0.113.5", dst: "192.168.0.2:30080", want: "dnat 10.180.0.1:8080 masq"},
		{name: "IPv4-only NodePort is not on IPv6", src: "2001:db8:9::5", dst: "[2001:db8:1::2]:30080", want: "accept"},
	})

	// kube-proxy filters loadBalancerSourceRanges by family: a family
	// without any range is not firewalled.
	ranged := dual(world.Ready("10.180.0.6", 8080), world.Ready("fd00:10::6", 8080))
	ranged.EditRare().SourceRanges = []netip.Prefix{world.Prefix("203.0.113.0/24")}
	runFlows(t, world.Config(), []*model.Service{ranged}, []flow{
		{name: "IPv4 ranges apply to IPv4", src: "198.18.0.1", dst: "198.51.100.6:80", want: "drop"},
		{name: "IPv4 ranges leave IPv6 open", src: "2001:db8:9::5", dst: "[2001:db8:ff::6]:80", want: "dnat [fd00:10::6]:8080 masq"},
	})
}

// TestTraceFromKubernetes runs API objects through model.FromKubernetes and
// the renderer: named target ports resolve per slice.
func TestTraceFromKubernetes(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "named"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "172.30.0.70", ClusterIPs: []string{"172.30.0.70"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30070}},
		},
	}
	slice := func(name string, port int32, ip string, ready bool) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns1", Name: name, Labels: map[string]string{model.LabelServiceName: "named"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(port)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)}}},
		}
	}
	m, err := model.FromKubernetes(svc, []*discoveryv1.EndpointSlice{
		slice("named-a", 8080, "10.180.0.1", true),
		slice("named-b", 9090, "10.180.1.1", true),
		slice("named-c", 7070, "10.180.2.1", false),
	}, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runFlows(t, world.Config(), []*model.Service{m}, []flow{
		{name: "ClusterIP", src: "10.1.2.3", dst: "172.30.0.70:80", want: "dnat 10.180.0.1:8080, dnat 10.180.1.1:9090"},
		{name: "NodePort", src: "203.0.113.5", dst: "192.168.0.2:30070", want: "dnat 10.180.0.1:8080 masq, dnat 10.180.1.1:9090 masq"},
	})
}

func ptr[T any](v T) *T { return &v }

// The tracer's own semantics, on small hand-written rulesets.
func TestTraceSemantics(t *testing.T) {
	cfg := &ruleset.Config{MasqueradeBit: 0x4000}
	jump := func(c string) ruleset.Verdict { return ruleset.Verdict{Kind: ruleset.Jump, Chain: c} }
	gotoV := func(c string) ruleset.Verdict { return ruleset.Verdict{Kind: ruleset.Goto, Chain: c} }
	ret := ruleset.Verdict{Kind: ruleset.Return}
	dnat := func(s string) ruleset.DNAT { return ruleset.DNAT{Proto: model.TCP, To: netip.MustParseAddrPort(s)} }
	base := func(name, typ, hook string, prio int32, rules ...ruleset.Rule) *ruleset.Chain {
		return &ruleset.Chain{Name: name, Hook: &ruleset.Hook{Type: typ, Hook: hook, Priority: prio}, Rules: rules}
	}
	chain := func(name string, rules ...ruleset.Rule) *ruleset.Chain {
		return &ruleset.Chain{Name: name, Rules: rules}
	}
	pkt := trace.Packet{Src: world.Addr("198.18.0.1"), Dst: world.Addr("198.18.1.1"), Proto: model.TCP, SrcPort: 1000, DstPort: 80, Hook: "prerouting"}
	src := func(p string) ruleset.MatchAddr { return ruleset.MatchAddr{Dir: ruleset.Src, Prefix: world.Prefix(p)} }

	for _, tc := range []struct {
		name   string
		chains []*ruleset.Chain
		pkt    trace.Packet
		want   string
	}{
		{"return goes back after the jump", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100, ruleset.Rule{jump("a")}, ruleset.Rule{dnat("10.0.0.2:80")}),
			chain("a", ruleset.Rule{ret}, ruleset.Rule{dnat("10.0.0.1:80")}),
		}, pkt, "dnat 10.0.0.2:80"},
		{"return after goto skips the goto's chain", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100, ruleset.Rule{jump("a")}, ruleset.Rule{dnat("10.0.0.2:80")}),
			chain("a", ruleset.Rule{gotoV("b")}, ruleset.Rule{dnat("10.0.0.1:80")}),
			chain("b", ruleset.Rule{ret}),
		}, pkt, "dnat 10.0.0.2:80"},
		{"end of a jumped chain returns", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100, ruleset.Rule{jump("a")}, ruleset.Rule{dnat("10.0.0.2:80")}),
			chain("a", ruleset.Rule{src("10.0.0.0/8"), dnat("10.0.0.1:80")}),
		}, pkt, "dnat 10.0.0.2:80"},
		{"failed match skips the rest of the rule", []*ruleset.Chain{
			base("pre", "filter", "prerouting", -110, ruleset.Rule{src("10.0.0.0/8"), ruleset.Verdict{Kind: ruleset.Drop}}),
		}, pkt, "accept"},
		{"negated match", []*ruleset.Chain{
			base("pre", "filter", "prerouting", -110, ruleset.Rule{ruleset.MatchAddr{Dir: ruleset.Src, Prefix: world.Prefix("10.0.0.0/8"), Not: true}, ruleset.Verdict{Kind: ruleset.Drop}}),
		}, pkt, "drop"},
		{"accept ends only its base chain", []*ruleset.Chain{
			base("f1", "filter", "forward", -10, ruleset.Rule{ruleset.Verdict{Kind: ruleset.Accept}}),
			base("f2", "filter", "forward", 0, ruleset.Rule{ruleset.Reject{}}),
		}, pkt, "reject"},
		{"priorities order the chains of a hook", []*ruleset.Chain{
			base("late", "filter", "prerouting", 10, ruleset.Rule{ruleset.Reject{}}),
			base("early", "filter", "prerouting", -10, ruleset.Rule{ruleset.Verdict{Kind: ruleset.Drop}}),
		}, pkt, "drop"},
		{"filter after dnat sees the new destination", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100, ruleset.Rule{dnat("10.0.0.1:80")}),
			base("fwd", "filter", "forward", 0, ruleset.Rule{ruleset.MatchAddr{Dir: ruleset.Dst, Prefix: world.Prefix("10.0.0.1/32")}, ruleset.Verdict{Kind: ruleset.Drop}}),
		}, pkt, "drop"},
		{"local destination is delivered, not forwarded", []*ruleset.Chain{
			base("fwd", "filter", "forward", 0, ruleset.Rule{ruleset.Verdict{Kind: ruleset.Drop}}),
			base("post", "nat", "postrouting", 100, ruleset.Rule{ruleset.Masquerade{}}),
		}, trace.Packet{Src: pkt.Src, Dst: pkt.Dst, Proto: model.TCP, DstPort: 80, Hook: "prerouting", DstLocal: true}, "accept"},
		{"dnat needs its protocol", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100, ruleset.Rule{dnat("10.0.0.1:80")}),
		}, trace.Packet{Src: pkt.Src, Dst: pkt.Dst, Proto: model.UDP, DstPort: 80, Hook: "prerouting"}, "accept"},
		{"mark set before postrouting masquerades", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100, ruleset.Rule{ruleset.SetMark{Bit: 0x4000}}),
			base("post", "nat", "postrouting", 100, ruleset.Rule{ruleset.MatchMarkUnset{Bit: 0x4000}, ret}, ruleset.Rule{ruleset.SetMark{Bit: 0x4000, Xor: true}, ruleset.Masquerade{}}),
		}, pkt, "accept masq"},
		{"own traffic passes output, not prerouting", []*ruleset.Chain{
			base("pre", "filter", "prerouting", 0, ruleset.Rule{ruleset.Verdict{Kind: ruleset.Drop}}),
			base("out", "nat", "output", -100, ruleset.Rule{dnat("10.0.0.1:80")}),
		}, trace.Packet{Src: world.Addr("192.168.0.2"), SrcLocal: true, Dst: pkt.Dst, Proto: model.TCP, DstPort: 80, Hook: "output"}, "dnat 10.0.0.1:80"},
		{"own traffic to itself loops back through prerouting filters", []*ruleset.Chain{
			base("pre", "filter", "prerouting", 0, ruleset.Rule{ruleset.Reject{}}),
		}, trace.Packet{Src: world.Addr("192.168.0.2"), SrcLocal: true, Dst: world.Addr("192.168.0.2"), DstLocal: true, Proto: model.TCP, DstPort: 80, Hook: "output"}, "reject"},
		{"hash buckets: every value is taken", []*ruleset.Chain{
			base("pre", "nat", "prerouting", -100,
				ruleset.Rule{ruleset.HashBucket{Seed: 1, Modulus: 3, Bucket: 0}, gotoV("a")},
				ruleset.Rule{ruleset.HashBucket{Seed: 1, Modulus: 3, Bucket: 1}, gotoV("b")}),
			chain("a", ruleset.Rule{dnat("10.0.0.1:80")}),
			chain("b", ruleset.Rule{ruleset.Verdict{Kind: ruleset.Drop}}),
		}, pkt, "accept, dnat 10.0.0.1:80, drop"},
		{"hash buckets: one value per path", []*ruleset.Chain{
			// The same seed and modulus hash the same flow alike: no path
			// matches bucket 0 in one rule and bucket 1 in another.
			base("pre", "nat", "prerouting", -100,
				ruleset.Rule{ruleset.HashBucket{Seed: 1, Modulus: 2, Bucket: 0}, ruleset.SetMark{Bit: 0x4000}},
				ruleset.Rule{ruleset.HashBucket{Seed: 1, Modulus: 2, Bucket: 0}, dnat("10.0.0.1:80")},
				ruleset.Rule{ruleset.HashBucket{Seed: 1, Modulus: 2, Bucket: 1}, dnat("10.0.0.2:80")},
				ruleset.Rule{ruleset.Verdict{Kind: ruleset.Drop}}),
			base("post", "nat", "postrouting", 100, ruleset.Rule{ruleset.MatchMarkUnset{Bit: 0x4000}, ret}, ruleset.Rule{ruleset.Masquerade{}}),
		}, pkt, "dnat 10.0.0.1:80 masq, dnat 10.0.0.2:80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := trace.Trace(cfg, ruleset.IPv4, []ruleset.Table{{Name: "t", Fragment: ruleset.Fragment{Chains: tc.chains}}}, tc.pkt)
			if got := res.Summary(); got != tc.want {
				t.Errorf("got %q, want %q\n%s", got, tc.want, res.Paths())
			}
		})
	}

	for _, tc := range []struct {
		name string
		fr   ruleset.Fragment
		pkt  trace.Packet
		want string
	}{
		{"missing chain", ruleset.Fragment{Chains: []*ruleset.Chain{base("pre", "nat", "prerouting", -100, ruleset.Rule{jump("nowhere")})}}, pkt, `missing chain "nowhere"`},
		{"missing map", ruleset.Fragment{Chains: []*ruleset.Chain{base("pre", "nat", "prerouting", -100, ruleset.Rule{ruleset.VmapDispatch{Map: "m", Shape: ruleset.KeyProtoPort}})}}, pkt, `missing map "m"`},
		{"loop", ruleset.Fragment{Chains: []*ruleset.Chain{base("pre", "nat", "prerouting", -100, ruleset.Rule{jump("a")}), chain("a", ruleset.Rule{jump("a")})}}, pkt, "loop"},
		{"element of a missing map", ruleset.Fragment{Elements: []ruleset.Element{{Map: "m", Key: ruleset.Key{Proto: model.TCP, Port: 1}}}}, pkt, `missing map "m"`},
		{"family mismatch", ruleset.Fragment{}, trace.Packet{Src: world.Addr("::1"), Dst: world.Addr("::1"), Hook: "prerouting"}, "not of family"},
		{"bad hook", ruleset.Fragment{}, trace.Packet{Src: pkt.Src, Dst: pkt.Dst, Hook: "input"}, "want prerouting or output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := trace.Trace(cfg, ruleset.IPv4, []ruleset.Table{{Name: "t", Fragment: tc.fr}}, tc.pkt)
			if res.Err == nil || !strings.Contains(res.Err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", res.Err, tc.want)
			}
		})
	}
}

// PROXY protocol: a TCP port of an annotated Service redirects new
// connections from outside the cluster to the proxy's port, for its
// LoadBalancer IP and its node port; clients inside the cluster, the
// gateway itself, the ClusterIP and UDP ports keep the kernel path.
func TestTraceProxyProtocol(t *testing.T) {
	cfg := world.Config()
	cfg.ProxyPort = 9190
	svc := &model.Service{
		Key: model.NewServiceKey("ns1", "pp"), Type: model.TypeLoadBalancer, ClusterIPs: world.Addrs("172.30.0.60"),
		Rare:          &model.Rare{LoadBalancerIPs: world.Addrs("203.0.113.60")},
		ProxyProtocol: 1,
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30060, Endpoints: []model.Endpoint{world.Ready("10.180.0.1", 8080)}},
			{Name: "dns", Protocol: model.UDP, Port: 53, Endpoints: []model.Endpoint{world.Ready("10.180.0.1", 5353)}},
		},
	}
	gw := world.GatewayAddrs[0].String()
	runFlows(t, cfg, []*model.Service{svc}, []flow{
		{name: "outside to the LB IP", src: "198.51.100.7", dst: "203.0.113.60:80", want: "redirect :9190"},
		{name: "outside to the node port", src: "198.51.100.7", dst: gw + ":30060", want: "redirect :9190"},
		{name: "inside the cluster", src: "10.1.2.3", dst: "203.0.113.60:80", want: "dnat 10.180.0.1:8080 masq"},
		{name: "the ClusterIP", src: "198.51.100.7", dst: "172.30.0.60:80", want: "dnat 10.180.0.1:8080 masq"},
		{name: "udp", src: "198.51.100.7", dst: "203.0.113.60:53", proto: model.UDP, want: "dnat 10.180.0.1:5353 masq"},
	})
	cfg.ProxyPort = 0
	runFlows(t, cfg, []*model.Service{svc}, []flow{
		{name: "proxy off", src: "198.51.100.7", dst: "203.0.113.60:80", want: "dnat 10.180.0.1:8080 masq"},
	})
}

// Maglev: a Service's flows spread over every endpoint through its slot
// map, by annotation or by the gateway's default; with ClientIP affinity,
// a known client still sticks to its endpoint, and a new one records
// itself in the set of the endpoint its slot chose.
func TestTraceMaglev(t *testing.T) {
	eps := []model.Endpoint{world.Ready("10.180.0.1", 8080), world.Ready("10.180.1.1", 8080), world.Ready("10.180.2.1", 8080)}
	all := "dnat 10.180.0.1:8080, dnat 10.180.1.1:8080, dnat 10.180.2.1:8080"
	for _, c := range []struct{ name, def, annotation string }{
		{"annotation", "", model.SelectionMaglev},
		{"default", model.SelectionMaglev, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := world.Config()
			cfg.EndpointSelection = c.def
			svc := world.Web(eps...)
			svc.EditRare().EndpointSelection = c.annotation
			res, tables := replay(t, cfg, []*model.Service{svc}, flow{src: "10.1.2.3", dst: "172.30.0.41:80"})
			if got := res.Summary(); got != all {
				t.Fatalf("got %q, want %q\n%s", got, all, res.Paths())
			}
			var text bytes.Buffer
			ruleset.WriteTables(&text, ruleset.IPv4, tables)
			if !strings.Contains(text.String(), "jhash ip saddr . th sport mod 509 seed 0x7 vmap @mgc-") {
				t.Errorf("no Maglev dispatch in the ruleset:\n%s", text.String())
			}
			runFlows(t, cfg, []*model.Service{svc}, []flow{
				{name: "LB IP from outside", src: "203.0.113.5", dst: "198.51.100.1:80",
					want: "dnat 10.180.0.1:8080 masq, dnat 10.180.1.1:8080 masq, dnat 10.180.2.1:8080 masq"},
			})

			svc.EditRare().AffinityTimeout = 3 * time.Hour
			first, _ := replay(t, cfg, []*model.Service{svc}, flow{src: "10.1.2.3", dst: "172.30.0.41:80"})
			if got := first.Summary(); got != all {
				t.Fatalf("first connection with affinity: got %q\n%s", got, first.Paths())
			}
			setOf := map[netip.AddrPort]string{}
			for _, o := range first.Outcomes {
				if len(o.Affinity) != 1 {
					t.Fatalf("outcome %s records affinity in %v, want one set\n%s", o, o.Affinity, first.Paths())
				}
				setOf[o.DNAT] = o.Affinity[0]
			}
			runFlows(t, cfg, []*model.Service{svc}, []flow{
				{name: "known client sticks", src: "10.1.2.3", dst: "172.30.0.41:80",
					affinity: []string{setOf[netip.MustParseAddrPort("10.180.2.1:8080")]}, want: "dnat 10.180.2.1:8080"},
			})
		})
	}
	// The annotation "hash" wins over a Maglev default.
	cfg := world.Config()
	cfg.EndpointSelection = model.SelectionMaglev
	svc := world.Web(eps...)
	svc.EditRare().EndpointSelection = model.SelectionHash
	_, tables := replay(t, cfg, []*model.Service{svc}, flow{src: "10.1.2.3", dst: "172.30.0.41:80"})
	var text bytes.Buffer
	ruleset.WriteTables(&text, ruleset.IPv4, tables)
	if strings.Contains(text.String(), "vmap @mgc-") {
		t.Errorf("a Service annotated hash got a Maglev table:\n%s", text.String())
	}
}

// TestTraceEndpointMaps: Services sharing a pick chain (same protocol and
// number of endpoints) each reach their own endpoints, by ClusterIP,
// external address and NodePort; a port with more endpoints than the maps
// take keeps a chain of its own and reaches all of them too.
func TestTraceEndpointMaps(t *testing.T) {
	eps := func(third byte, n int) []model.Endpoint {
		var out []model.Endpoint
		for i := range n {
			out = append(out, world.Ready(fmt.Sprintf("10.%d.%d.%d", 180+i/250, third, 1+i%250), 8080))
		}
		return out
	}
	a := &model.Service{Key: model.NewServiceKey("ns1", "a"), Type: model.TypeNodePort, ClusterIPs: world.Addrs("172.30.0.60"),
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30060, Endpoints: eps(1, 2)}}}
	b := &model.Service{Key: model.NewServiceKey("ns1", "b"), Type: model.TypeClusterIP, ClusterIPs: world.Addrs("172.30.0.61"),
		Rare:  &model.Rare{ExternalIPs: world.Addrs("192.168.0.61")},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps(2, 2)}}}
	wide := &model.Service{Key: model.NewServiceKey("ns1", "wide"), Type: model.TypeClusterIP, ClusterIPs: world.Addrs("172.30.0.62"),
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps(3, ruleset.MaxMapEndpoints+1)}}}
	full := &model.Service{Key: model.NewServiceKey("ns1", "full"), Type: model.TypeClusterIP, ClusterIPs: world.Addrs("172.30.0.63"),
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps(4, ruleset.MaxMapEndpoints)}}}
	cfg := world.Config()
	cfg.Shards = 1 // all four in one shard: the pick chain is shared
	svcs := []*model.Service{a, b, wide, full}
	all := func(svc *model.Service, masq string) string {
		var out []string
		for _, e := range svc.Ports[0].Endpoints {
			out = append(out, "dnat "+e.AddrPort().String()+masq)
		}
		slices.Sort(out)
		return strings.Join(out, ", ")
	}
	runFlows(t, cfg, svcs, []flow{
		{name: "a by ClusterIP", src: "10.1.2.3", dst: "172.30.0.60:80", want: all(a, "")},
		{name: "b by ClusterIP", src: "10.1.2.3", dst: "172.30.0.61:80", want: all(b, "")},
		{name: "b by external address", src: "10.1.2.3", dst: "192.168.0.61:80", want: all(b, " masq")},
		{name: "a by NodePort", src: "10.1.2.3", dst: "192.168.0.2:30060", want: all(a, " masq")},
		{name: "65 endpoints", src: "10.1.2.3", dst: "172.30.0.62:80", want: all(wide, "")},
		{name: "64 endpoints", src: "10.1.2.3", dst: "172.30.0.63:80", want: all(full, "")},
	})
	tables := ruleset.Layout(cfg, ruleset.IPv4, svcs)
	var chains []string
	for _, c := range tables[1].Chains {
		chains = append(chains, c.Name)
	}
	for _, want := range []string{"pick-tcp-2", "pick-ext-tcp-2", "pick-nodeport-tcp-2", "pick-tcp-64", "svc-ns1/wide/tcp/http"} {
		if !slices.Contains(chains, want) {
			t.Errorf("no chain %s in the shard: %v", want, chains)
		}
	}
	if n := len(chains); n != 5+5 { // and the shard's skeleton
		t.Errorf("%d chains in the shard, want 10: %v", n, chains)
	}
}
