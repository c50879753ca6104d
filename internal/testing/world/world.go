// Package world is the test world the ruleset's tests share: pods,
// Services, endpoints and a gateway configuration, built in one line each.
package world

import (
	"net/netip"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// The test world: pods in 10.0.0.0/8 and fd00:10::/48 (the cluster CIDRs),
// Service IPs in 172.30/16 and fd00:30::/64, the gateway on 192.168.0.2 and
// 2001:db8:1::2, external clients in 203.0.113/24, 198.18/15 and 2001:db8:9::/48.

// GatewayAddrs are the gateway's own addresses.
var GatewayAddrs = []netip.Addr{
	Addr("192.168.0.2"), Addr("192.168.0.3"), Addr("10.99.0.1"), Addr("127.0.0.1"),
	Addr("2001:db8:1::2"), Addr("::1"),
}

// Addr is a test world fixture.
func Addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// Prefix is a test world fixture.
func Prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Addrs is a test world fixture.
func Addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, Addr(s))
	}
	return out
}

// Config is a test world fixture.
func Config() *ruleset.Config {
	return &ruleset.Config{
		Table:         "nftgate",
		Node:          model.Node{Name: "gw", Zone: "zone-a"},
		ClusterCIDRs:  []netip.Prefix{Prefix("10.0.0.0/8"), Prefix("fd00:10::/48")},
		MasqueradeBit: ruleset.DefaultMasqueradeBit,
		HashSeed:      7,
	}
}

// Ready is a test world fixture.
func Ready(a string, port uint16) model.Endpoint {
	return model.Endpoint{Port: port, Ready: true, Serving: true}.WithAddr(Addr(a))
}

// Terminating is a test world fixture.
func Terminating(a string, port uint16) model.Endpoint {
	return model.Endpoint{Port: port, Serving: true, Terminating: true}.WithAddr(Addr(a))
}

// On is a test world fixture.
func On(node string, e model.Endpoint) model.Endpoint {
	v := e.Place
	e.Place = model.NewPlace(node, v.Zone(), v.ForZones(), v.ForNodes())
	return e
}

// ZoneHints is a test world fixture.
func ZoneHints(e model.Endpoint, zones ...string) model.Endpoint {
	e.Place = e.Place.WithHints(zones, e.NodeHints())
	return e
}

// NodeHints is a test world fixture.
func NodeHints(e model.Endpoint, nodes ...string) model.Endpoint {
	e.Place = e.Place.WithHints(e.ZoneHints(), nodes)
	return e
}

// web is a LoadBalancer Service reachable every way: ClusterIP, NodePort,
// a non-local and a local ExternalIP, a LoadBalancer IP.
// Web is a test world fixture.
func Web(eps ...model.Endpoint) *model.Service {
	return &model.Service{
		Key:        model.NewServiceKey("ns1", "web"),
		Type:       model.TypeLoadBalancer,
		ClusterIPs: Addrs("172.30.0.41"),
		Rare:       &model.Rare{ExternalIPs: Addrs("192.168.99.11", "192.168.0.3"), LoadBalancerIPs: Addrs("198.51.100.1")},
		Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080, Endpoints: eps}},
	}
}
