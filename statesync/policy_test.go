package statesync

import (
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

var (
	webKey = model.NewServiceKey("ns", "web")
	vip    = netip.MustParseAddr("192.0.2.10")
	masq   = netip.MustParseAddr("198.51.100.1")
	ep1    = netip.MustParseAddrPort("10.1.0.5:8080")
	client = netip.MustParseAddrPort("203.0.113.7:40000")
)

// webService is a LoadBalancer on vip:80 (TCP, node port 30080), vip:53
// (UDP) and vip:3868 (SCTP) with the endpoint ep1 (port 8080 for all).
func webService() *model.Service {
	e := model.Endpoint{Port: ep1.Port(), Place: model.On("other"), Ready: true, Serving: true}.WithAddr(ep1.Addr())
	return &model.Service{Key: webKey, Type: model.TypeLoadBalancer, IPv4: true,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Rare:       &model.Rare{LoadBalancerIPs: []netip.Addr{vip}},
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080, Endpoints: []model.Endpoint{e}},
			{Name: "dns", Protocol: model.UDP, Port: 53, Endpoints: []model.Endpoint{e}},
			{Name: "diameter", Protocol: model.SCTP, Port: 3868, Endpoints: []model.Endpoint{e}},
		}}
}

func testPolicy() *Policy {
	p := NewPolicy(ruleset.Config{Node: model.Node{Name: "gw"}}, []netip.Addr{masq})
	p.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{webKey: webService()}})
	return p
}

// flow is a masqueraded TCP flow client → vip:80, DNATed to ep1.
func flow(clientPort uint16) Entry {
	return Entry{Proto: 6,
		Orig:    Tuple{Src: netip.AddrPortFrom(client.Addr(), clientPort), Dst: netip.AddrPortFrom(vip, 80)},
		Reply:   Tuple{Src: ep1, Dst: netip.AddrPortFrom(masq, clientPort)},
		Status:  1<<4 | 1<<5 | 1<<3,
		Timeout: 120, TCP: TCPInfo{State: 3}}
}

// nodePortFlow is a masqueraded TCP flow client → the gateway's own
// address at the node port of webService's http port.
func nodePortFlow(clientPort uint16) *Entry {
	e := flow(clientPort)
	e.Orig.Dst = netip.MustParseAddrPort("198.51.100.9:30080")
	return &e
}

// CheckOwn: which of this gateway's own flows go to the peers. Flows to a
// Service address do; flows to a node port, or to no Service address, do
// not, each by its own reason; before the first sync everything goes.
func TestPolicyCheckOwn(t *testing.T) {
	p := NewPolicy(ruleset.Config{Node: model.Node{Name: "gw"}}, []netip.Addr{masq})
	if got := p.CheckOwn(nodePortFlow(1000)); got != "" {
		t.Errorf("before the first sync: %q, want \"\" (sent)", got)
	}
	p.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{webKey: webService()}})
	other := flow(1000)
	other.Orig.Dst = netip.MustParseAddrPort("192.0.2.11:80")
	udpNodePort := *nodePortFlow(1000)
	udpNodePort.Proto = protoUDP
	for _, c := range []struct {
		name string
		e    *Entry
		want string
	}{
		{"service address", func() *Entry { e := flow(1000); return &e }(), ""},
		{"node port", nodePortFlow(1000), NotReplicatedNodePort},
		{"node port number, other protocol", &udpNodePort, NotReplicatedNotService},
		{"no service", &other, NotReplicatedNotService},
	} {
		if got := p.CheckOwn(c.e); got != c.want {
			t.Errorf("%s: CheckOwn = %q, want %q", c.name, got, c.want)
		}
	}
	// The Service loses its node port: the port is nobody's any more.
	svc := webService()
	svc.Ports[0].NodePort = 0
	p.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{webKey: svc}})
	if got := p.CheckOwn(nodePortFlow(1000)); got != NotReplicatedNotService {
		t.Errorf("node port gone: %q, want %q", got, NotReplicatedNotService)
	}
}

func TestPolicy(t *testing.T) {
	p := testPolicy()
	mod := func(f func(*Entry)) *Entry { e := flow(1000); f(&e); return &e }
	for _, c := range []struct {
		name string
		e    *Entry
		want string
	}{
		{"masqueraded", mod(func(*Entry) {}), ""},
		{"not masqueraded: the reply goes to the client", mod(func(e *Entry) { e.Reply.Dst = e.Orig.Src }), ""},
		{"udp port", mod(func(e *Entry) {
			e.Proto = 17
			e.Orig.Dst = netip.AddrPortFrom(vip, 53)
			e.TCP = TCPInfo{}
			e.Timeout = 30
		}), ""},
		{"icmp", mod(func(e *Entry) { e.Proto = 1 }), RefusedProtocol},
		{"address not served", mod(func(e *Entry) { e.Orig.Dst = netip.MustParseAddrPort("192.0.2.11:80") }), RefusedDestination},
		{"port not served", mod(func(e *Entry) { e.Orig.Dst = netip.AddrPortFrom(vip, 81) }), RefusedDestination},
		{"protocol of the port differs", mod(func(e *Entry) { e.Proto = 17 }), RefusedDestination},
		{"not an endpoint", mod(func(e *Entry) { e.Reply.Src = netip.MustParseAddrPort("10.1.0.6:8080") }), RefusedEndpoint},
		{"endpoint's other port", mod(func(e *Entry) { e.Reply.Src = netip.MustParseAddrPort("10.1.0.5:22") }), RefusedEndpoint},
		{"reply to a stranger", mod(func(e *Entry) { e.Reply.Dst = netip.MustParseAddrPort("198.51.100.99:1000") }), RefusedReplyDst},
		{"client's other port", mod(func(e *Entry) { e.Reply.Dst = netip.AddrPortFrom(client.Addr(), 1) }), RefusedReplyDst},
		{"tcp timeout too long", mod(func(e *Entry) { e.Timeout = 6 * 24 * 3600 }), RefusedTimeout},
		{"udp timeout too long", mod(func(e *Entry) {
			e.Proto = 17
			e.Orig.Dst = netip.AddrPortFrom(vip, 53)
			e.Timeout = 3600
		}), RefusedTimeout},
	} {
		if got := p.Check(c.e); got != c.want {
			t.Errorf("%s: Check = %q, want %q", c.name, got, c.want)
		}
	}
	// A flow to the node port, on the gateway's own address: a peer
	// holds no such address.
	if got := p.Check(nodePortFlow(1000)); got != RefusedDestination {
		t.Errorf("node port: Check = %q, want %q", got, RefusedDestination)
	}
	// The Service goes: nothing of it is accepted any more.
	p.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{webKey: nil}})
	if got := p.Check(mod(func(*Entry) {})); got != RefusedDestination {
		t.Errorf("after the Service is gone: %q, want %q", got, RefusedDestination)
	}
	if got := p.CheckDelete(mod(func(*Entry) {})); got != RefusedDestination {
		t.Errorf("delete after the Service is gone: %q, want %q", got, RefusedDestination)
	}
	// A failed sync changes nothing.
	p.Observe(loop.Event{Err: errTest, After: map[model.ServiceKey]*model.Service{webKey: webService()}})
	if got := p.Check(mod(func(*Entry) {})); got != RefusedDestination {
		t.Errorf("after a failed sync: %q, want %q", got, RefusedDestination)
	}
}
