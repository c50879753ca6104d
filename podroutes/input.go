package podroutes

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/model"
)

// Route is one route to pods: Dst through the next hop Via.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

func (r Route) String() string { return r.Dst.String() + " via " + r.Via.String() }

func compareRoutes(a, b Route) int {
	if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
		return c
	}
	if c := a.Dst.Bits() - b.Dst.Bits(); c != 0 {
		return c
	}
	return a.Via.Compare(b.Via)
}

// NodeInfo is what the routes need of a Node.
type NodeInfo struct {
	Name string
	// InternalIPs are its status.addresses of type InternalIP.
	InternalIPs []netip.Addr
	// PodCIDRs are its spec.podCIDRs (spec.podCIDR when that is empty).
	PodCIDRs []netip.Prefix
}

// NodeFromObject reads a Node. Values that do not parse are left out and
// named in the problems.
func NodeFromObject(n *corev1.Node) (NodeInfo, []string) {
	info := NodeInfo{Name: n.Name}
	var problems []string
	for i, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil || ip.Zone() != "" {
			problems = append(problems, fmt.Sprintf("node %s: status.addresses[%d].address %q: not an IP address", n.Name, i, a.Address))
			continue
		}
		info.InternalIPs = append(info.InternalIPs, ip.Unmap())
	}
	cidrs, field := n.Spec.PodCIDRs, "spec.podCIDRs"
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs, field = []string{n.Spec.PodCIDR}, "spec.podCIDR"
	}
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			problems = append(problems, fmt.Sprintf("node %s: %s[%d] %q: not a CIDR", n.Name, field, i, c))
			continue
		}
		info.PodCIDRs = append(info.PodCIDRs, p.Masked())
	}
	return info, problems
}

// Learned is a route a BGP peer announced. It has the fields of
// announce/bgp's ReceivedRoute, so a Speaker's Received() converts
// element by element: podroutes.Learned(r).
type Learned struct {
	Peer    netip.Addr
	Prefix  netip.Prefix
	NextHop netip.Addr
	// Stale: the peer is restarting and has not refreshed it yet. A stale
	// route is kept (the peer's forwarding goes on meanwhile), but a
	// fresh one for the same prefix is preferred.
	Stale bool
}

// Input is what the routes are computed from. Only what the mode needs is
// read: Nodes in node and endpoint modes, Services in endpoint mode,
// Learned in bgp mode.
type Input struct {
	Nodes    []NodeInfo
	Services []*model.Service
	Learned  []Learned
}

// Plan is the desired state: the routes, sorted, one per destination, and
// why some expected routes are missing.
type Plan struct {
	Mode     Mode
	Routes   []Route
	Problems []string
}

// Plan computes the routes of the policy's mode from in. It is pure.
func (p *Policy) Plan(in Input) Plan {
	pl := planner{policy: p, routes: map[netip.Prefix]candidate{}}
	switch p.Mode {
	case Node:
		pl.nodes(in.Nodes)
	case Endpoint:
		pl.endpoints(in.Nodes, in.Services)
	case BGP:
		pl.learned(in.Learned)
	}
	out := Plan{Mode: p.Mode}
	for dst, c := range pl.routes {
		out.Routes = append(out.Routes, Route{Dst: dst, Via: c.via})
	}
	slices.SortFunc(out.Routes, compareRoutes)
	slices.Sort(pl.problems)
	out.Problems = slices.Compact(pl.problems)
	return out
}

type candidate struct {
	via   netip.Addr
	from  string // what asked for it, in problems
	stale bool
}

type planner struct {
	policy   *Policy
	routes   map[netip.Prefix]candidate
	problems []string
}

func (pl *planner) problem(format string, args ...any) {
	pl.problems = append(pl.problems, fmt.Sprintf(format, args...))
}

// inCluster tells whether dst lies inside the cluster CIDRs (when any).
func (pl *planner) inCluster(dst netip.Prefix) bool {
	if len(pl.policy.ClusterCIDRs) == 0 {
		return true
	}
	for _, c := range pl.policy.ClusterCIDRs {
		if c.Addr().Is4() == dst.Addr().Is4() && c.Bits() <= dst.Bits() && c.Contains(dst.Addr()) {
			return true
		}
	}
	return false
}

// add offers a route; of two for one destination the one with the lower
// next hop wins, so that the result does not depend on the input order.
func (pl *planner) add(dst netip.Prefix, c candidate) {
	if !pl.inCluster(dst) {
		pl.problem("%s: %s is outside %s; no route", c.from, dst, ClusterCIDRsKey)
		return
	}
	old, ok := pl.routes[dst]
	if !ok {
		pl.routes[dst] = c
		return
	}
	if old.via == c.via {
		if old.stale && !c.stale {
			pl.routes[dst] = c
		}
		return
	}
	if pl.policy.Mode == BGP {
		// Several peers may announce a prefix with different next hops
		// (route reflectors, several nodes); prefer a fresh one, then
		// the lowest, silently.
		if old.stale != c.stale {
			if old.stale {
				pl.routes[dst] = c
			}
			return
		}
	}
	win := old
	if c.via.Less(old.via) {
		win = c
		pl.routes[dst] = c
	}
	if pl.policy.Mode != BGP {
		a, b := old, c
		if b.from < a.from {
			a, b = b, a
		}
		pl.problem("%s: claimed by %s (via %s) and by %s (via %s); routed via %s", dst, a.from, a.via, b.from, b.via, win.via)
	}
}

// via is the node's InternalIP of a's family.
func via(n NodeInfo, ipv6 bool) (netip.Addr, bool) {
	for _, a := range n.InternalIPs {
		if a.Is6() == ipv6 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func family(ipv6 bool) string {
	if ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

func (pl *planner) nodes(nodes []NodeInfo) {
	for _, n := range nodes {
		if len(n.PodCIDRs) == 0 {
			pl.problem("node %s: no spec.podCIDRs; no route", n.Name)
		}
		for _, c := range n.PodCIDRs {
			gw, ok := via(n, c.Addr().Is6())
			if !ok {
				pl.problem("node %s: pod CIDR %s: the node has no %s InternalIP; no route", n.Name, c, family(c.Addr().Is6()))
				continue
			}
			pl.add(c, candidate{via: gw, from: "node " + n.Name})
		}
	}
}

func (pl *planner) endpoints(nodes []NodeInfo, services []*model.Service) {
	byName := make(map[string]*NodeInfo, len(nodes))
	nodeAddr := map[netip.Addr]bool{}
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
		for _, a := range nodes[i].InternalIPs {
			nodeAddr[a] = true
		}
	}
	seen := map[string]bool{} // address and node name, once each
	for _, s := range services {
		for _, port := range s.Ports {
			for _, e := range port.Endpoints {
				a := e.Addr().Unmap()
				if nodeAddr[a] {
					continue // a host-network endpoint: the node's own address
				}
				node := e.Place.Node()
				k := a.String() + " " + node
				if seen[k] {
					continue
				}
				seen[k] = true
				from := fmt.Sprintf("endpoint %s of %s", a, s.Key)
				if node == "" {
					pl.problem("%s: no nodeName; no route", from)
					continue
				}
				n := byName[node]
				if n == nil {
					pl.problem("%s: node %s is unknown; no route", from, node)
					continue
				}
				gw, ok := via(*n, a.Is6())
				if !ok {
					pl.problem("%s: node %s has no %s InternalIP; no route", from, node, family(a.Is6()))
					continue
				}
				pl.add(netip.PrefixFrom(a, a.BitLen()), candidate{via: gw, from: from + " on node " + node})
			}
		}
	}
}

func (pl *planner) learned(routes []Learned) {
	for _, r := range routes {
		from := "BGP peer " + r.Peer.String()
		nh := r.NextHop.Unmap()
		switch {
		case !r.Prefix.IsValid():
			pl.problem("%s: invalid prefix; no route", from)
		case !nh.IsValid() || nh.IsUnspecified() || nh.IsMulticast() || nh.IsLoopback():
			pl.problem("%s: %s: next hop %s is not usable; no route", from, r.Prefix, r.NextHop)
		case nh.Is6() != r.Prefix.Addr().Is6():
			pl.problem("%s: %s: next hop %s is of the other family; no route", from, r.Prefix, nh)
		case r.Prefix.Bits() == 0:
			pl.problem("%s: %s: a default route is never installed", from, r.Prefix)
		default:
			pl.add(r.Prefix.Masked(), candidate{via: nh, from: from, stale: r.Stale})
		}
	}
}
