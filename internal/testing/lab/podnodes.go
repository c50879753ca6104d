package lab

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// The pod nodes' address plan: the links between a gateway and its nodes
// (198.18.1i.0/24, fd42:1i::/64 for node i, outside the gateway topology's
// networks), and the pods behind them (10.244.i.0/24, 2001:db8:244:i::/64).
var (
	PodClusterNet4 = netip.MustParsePrefix("10.244.0.0/16")
	PodClusterNet6 = netip.MustParsePrefix("2001:db8:244::/48")
)

// PodNode is a Kubernetes node as the gateway sees it: a host linked to
// the gateway that forwards to a pod host behind it. The pod is reachable
// from the gateway only through its node, and only with a route to it.
//
//	gw ─ 198.18.1i.0/24, fd42:1i::/64 ─ node i ─ 10.244.i.0/24, 2001:db8:244:i::/64 ─ pod i (.10, ::10)
type PodNode struct {
	Node, Pod *Host
	// Name is the node's name in Kubernetes objects: node-i.
	Name string
	// InternalIPs are the node's IPv4 and IPv6 addresses on the link to
	// the gateway; PodCIDRs its pod networks; Pods the pod's IPv4 and IPv6
	// addresses.
	InternalIPs []netip.Addr
	PodCIDRs    []netip.Prefix
	Pods        []netip.Addr
}

// AddPodNodes adds n nodes (at most 9) behind gw, each with one pod. The
// nodes forward, and route everything else back to the gateway (so that
// pods answer clients beyond it); the gateway gets no route to the pods.
func (l *Lab) AddPodNodes(gw *Host, n int) ([]PodNode, error) {
	if n < 1 || n > 9 {
		return nil, fmt.Errorf("lab %s: AddPodNodes: %d nodes, want 1 to 9", l.name, n)
	}
	var out []PodNode
	for i := 1; i <= n; i++ {
		p := func(f string) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf(f, i)) }
		pn := PodNode{Name: fmt.Sprintf("node-%d", i),
			InternalIPs: []netip.Addr{p("198.18.1%d.2/32").Addr(), p("fd42:1%d::2/128").Addr()},
			PodCIDRs:    []netip.Prefix{p("10.244.%d.0/24"), p("2001:db8:244:%d::/64")},
			Pods:        []netip.Addr{p("10.244.%d.10/32").Addr(), p("2001:db8:244:%d::10/128").Addr()},
		}
		var err error
		if pn.Node, err = l.AddHost(fmt.Sprintf("n%d", i)); err != nil {
			return nil, err
		}
		if pn.Pod, err = l.AddHost(fmt.Sprintf("p%d", i)); err != nil {
			return nil, err
		}
		for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
			if err := pn.Node.Sysctl(kv[0], kv[1]); err != nil {
				return nil, err
			}
		}
		gw4, gw6 := p("198.18.1%d.1/24"), p("fd42:1%d::1/64")
		if _, err := l.Link(gw, []netip.Prefix{gw4, gw6},
			pn.Node, []netip.Prefix{p("198.18.1%d.2/24"), p("fd42:1%d::2/64")}); err != nil {
			return nil, err
		}
		if _, err := l.Link(pn.Node, []netip.Prefix{p("10.244.%d.1/24"), p("2001:db8:244:%d::1/64")},
			pn.Pod, []netip.Prefix{p("10.244.%d.10/24"), p("2001:db8:244:%d::10/64")}); err != nil {
			return nil, err
		}
		for _, r := range []struct {
			h   *Host
			dst string
			via netip.Addr
		}{
			{pn.Pod, "0.0.0.0/0", p("10.244.%d.1/32").Addr()},
			{pn.Pod, "::/0", p("2001:db8:244:%d::1/128").Addr()},
			{pn.Node, "0.0.0.0/0", gw4.Addr()},
			{pn.Node, "::/0", gw6.Addr()},
		} {
			if err := r.h.AddRoute(netip.MustParsePrefix(r.dst), r.via); err != nil {
				return nil, err
			}
		}
		out = append(out, pn)
	}
	return out, nil
}

// Segment puts hosts on one Ethernet segment: a Linux bridge in a
// namespace of its own (named name), with a veth from each host, which
// gets addrs[i]. It returns the bridge's host and each host's interface
// on the segment.
func (l *Lab) Segment(name string, hosts []*Host, addrs [][]netip.Prefix) (*Host, []string, error) {
	if len(addrs) != len(hosts) {
		return nil, nil, fmt.Errorf("lab %s: Segment: %d hosts, %d address lists", l.name, len(hosts), len(addrs))
	}
	br, err := l.AddHost(name)
	if err != nil {
		return nil, nil, err
	}
	bridge := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := br.nl.LinkAdd(bridge); err != nil {
		return nil, nil, fmt.Errorf("lab: %s: bridge: %w", br.short, err)
	}
	var ifaces []string
	for i, h := range hosts {
		v, err := l.Link(h, addrs[i], br, nil)
		if err != nil {
			return nil, nil, err
		}
		port, err := br.nl.LinkByName(v.B)
		if err != nil {
			return nil, nil, fmt.Errorf("lab: %s: %s: %w", br.short, v.B, err)
		}
		if err := br.nl.LinkSetMaster(port, bridge); err != nil {
			return nil, nil, fmt.Errorf("lab: %s: %s into the bridge: %w", br.short, v.B, err)
		}
		ifaces = append(ifaces, v.A)
	}
	if err := br.nl.LinkSetUp(bridge); err != nil {
		return nil, nil, fmt.Errorf("lab: %s: bridge up: %w", br.short, err)
	}
	return br, ifaces, nil
}
