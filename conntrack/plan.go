package conntrack

import (
	"cmp"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/hostaddr"
)

// groupKey selects the flows of one address family and protocol; ctnetlink
// filters on one family per request.
type groupKey struct {
	family uint8 // unix.AF_INET or unix.AF_INET6
	proto  Protocol
}

type epKey struct {
	dst, endpoint netip.AddrPort
}

type nodeEpKey struct {
	port     uint16
	endpoint netip.AddrPort
}

// group holds what one Clean removes for one family and protocol: the exact
// user-space match, and the kernel filters whose union covers it.
type group struct {
	key           groupKey
	services      map[netip.AddrPort]struct{}
	nodeServices  map[uint16]struct{}
	endpoints     map[epKey]struct{}
	nodeEndpoints map[nodeEpKey]struct{}
	// nodeUntranslated holds node ports whose untranslated flows (reply
	// source equal to the original destination) are stale.
	nodeUntranslated map[uint16]struct{}
	filters          []kernelFilter
}

// matches is the authoritative decision; kernel filters only narrow what
// reaches it.
func (g *group) matches(e *entry, local localSet) bool {
	if e.family != g.key.family || e.proto != uint8(g.key.proto) {
		return false
	}
	dst := e.origDst
	if _, ok := g.services[dst]; ok {
		return true
	}
	if _, ok := g.endpoints[epKey{dst, e.replySrc}]; ok {
		return true
	}
	if len(g.nodeServices) == 0 && len(g.nodeEndpoints) == 0 && len(g.nodeUntranslated) == 0 || !local.has(dst.Addr()) {
		return false
	}
	if _, ok := g.nodeServices[dst.Port()]; ok {
		return true
	}
	if _, ok := g.nodeUntranslated[dst.Port()]; ok && e.replySrc == dst {
		return true
	}
	_, ok := g.nodeEndpoints[nodeEpKey{dst.Port(), e.replySrc}]
	return ok
}

type plan struct {
	groups []*group
	local  localSet
}

func (p *plan) empty() bool { return len(p.groups) == 0 }

func (p *plan) needsLocal() bool {
	for _, g := range p.groups {
		if len(g.nodeServices) > 0 || len(g.nodeEndpoints) > 0 || len(g.nodeUntranslated) > 0 {
			return true
		}
	}
	return false
}

func familyOf(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func checkProtocol(field string, p Protocol) error {
	switch p {
	case UDP, SCTP:
		return nil
	case 6:
		return fmt.Errorf("%s: tcp flows are never cleaned, got %s", field, p)
	}
	return fmt.Errorf("%s: want udp (17) or sctp (132), got %d", field, uint8(p))
}

func checkDest(field string, vip netip.Addr, port uint16, nodePort bool) error {
	if port == 0 {
		return fmt.Errorf("%s.Port: must not be 0", field)
	}
	if nodePort {
		if vip.IsValid() {
			return fmt.Errorf("%s.VIP: must be unset for a NodePort, got %s", field, vip)
		}
		return nil
	}
	if !vip.IsValid() || vip.IsUnspecified() {
		return fmt.Errorf("%s.VIP: need a service address, got %q", field, vip)
	}
	if vip.Zone() != "" {
		return fmt.Errorf("%s.VIP: zoned address not allowed, got %s", field, vip)
	}
	return nil
}

// buildPlan validates the input and turns it into per-family, per-protocol
// groups with deduplicated kernel filters.
func buildPlan(endpoints []StaleEndpoint, services []StaleService, maxNarrow int) (*plan, error) {
	groups := map[groupKey]*group{}
	get := func(k groupKey) *group {
		g := groups[k]
		if g == nil {
			g = &group{
				key:           k,
				services:      map[netip.AddrPort]struct{}{},
				nodeServices:  map[uint16]struct{}{},
				endpoints:     map[epKey]struct{}{},
				nodeEndpoints: map[nodeEpKey]struct{}{},

				nodeUntranslated: map[uint16]struct{}{},
			}
			groups[k] = g
		}
		return g
	}

	for i, s := range services {
		field := fmt.Sprintf("StaleService[%d]", i)
		if err := checkProtocol(field+".Protocol", s.Protocol); err != nil {
			return nil, err
		}
		if err := checkDest(field, s.VIP, s.Port, s.NodePort); err != nil {
			return nil, err
		}
		if s.NodePort {
			// A node port is open on every local address of both families.
			for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
				g := get(groupKey{fam, s.Protocol})
				if s.Untranslated {
					g.nodeUntranslated[s.Port] = struct{}{}
				} else {
					g.nodeServices[s.Port] = struct{}{}
				}
			}
			continue
		}
		vip := s.VIP.Unmap()
		dst := netip.AddrPortFrom(vip, s.Port)
		g := get(groupKey{familyOf(vip), s.Protocol})
		if s.Untranslated {
			// The reply of an untranslated flow comes from the destination.
			g.endpoints[epKey{dst, dst}] = struct{}{}
		} else {
			g.services[dst] = struct{}{}
		}
	}

	for i, e := range endpoints {
		field := fmt.Sprintf("StaleEndpoint[%d]", i)
		if err := checkProtocol(field+".Protocol", e.Protocol); err != nil {
			return nil, err
		}
		if err := checkDest(field, e.VIP, e.Port, e.NodePort); err != nil {
			return nil, err
		}
		ep := netip.AddrPortFrom(e.Endpoint.Addr().Unmap(), e.Endpoint.Port())
		if !ep.Addr().IsValid() || ep.Addr().IsUnspecified() || ep.Port() == 0 {
			return nil, fmt.Errorf("%s.Endpoint: need address and port, got %q", field, e.Endpoint)
		}
		fam := familyOf(ep.Addr())
		if e.NodePort {
			get(groupKey{fam, e.Protocol}).nodeEndpoints[nodeEpKey{e.Port, ep}] = struct{}{}
			continue
		}
		vip := e.VIP.Unmap()
		if familyOf(vip) != fam {
			return nil, fmt.Errorf("%s.Endpoint: address family differs from VIP %s, got %s", field, vip, ep)
		}
		get(groupKey{fam, e.Protocol}).endpoints[epKey{netip.AddrPortFrom(vip, e.Port), ep}] = struct{}{}
	}

	p := &plan{}
	keys := sortedKeys(groups, func(a, b groupKey) int {
		return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.proto, b.proto))
	})
	for _, k := range keys {
		g := groups[k]
		g.filters = narrowFilters(g)
		if len(g.filters) > maxNarrow {
			g.filters = []kernelFilter{{}}
		}
		p.groups = append(p.groups, g)
	}
	return p, nil
}

// narrowFilters returns one kernel filter per stale destination. A
// destination with a single stale endpoint also filters on the reply source,
// so that only that endpoint's flows come back; with several, one walk of the
// kernel table for the destination beats one walk per endpoint, and the
// endpoints are told apart in user space. Endpoint filters that a stale
// service of the same destination covers are left out.
func narrowFilters(g *group) []kernelFilter {
	var fs []kernelFilter
	for _, dst := range sortedKeys(g.services, netip.AddrPort.Compare) {
		fs = append(fs, kernelFilter{dst: dst.Addr(), dport: dst.Port()})
	}
	for _, port := range sortedKeys(g.nodeServices, cmp.Compare[uint16]) {
		fs = append(fs, kernelFilter{dport: port})
	}

	byDst := map[netip.AddrPort][]netip.AddrPort{}
	for k := range g.endpoints {
		if _, ok := g.services[k.dst]; !ok {
			byDst[k.dst] = append(byDst[k.dst], k.endpoint)
		}
	}
	for _, dst := range sortedKeys(byDst, netip.AddrPort.Compare) {
		f := kernelFilter{dst: dst.Addr(), dport: dst.Port()}
		if eps := byDst[dst]; len(eps) == 1 {
			f.replySrc = eps[0]
		}
		fs = append(fs, f)
	}

	byPort := map[uint16][]netip.AddrPort{}
	for k := range g.nodeEndpoints {
		if _, ok := g.nodeServices[k.port]; !ok {
			byPort[k.port] = append(byPort[k.port], k.endpoint)
		}
	}
	// Untranslated node port flows answer from whichever local address
	// they were sent to: no reply source to filter on (the invalid one).
	for port := range g.nodeUntranslated {
		if _, ok := g.nodeServices[port]; !ok {
			byPort[port] = append(byPort[port], netip.AddrPort{})
		}
	}
	for _, port := range sortedKeys(byPort, cmp.Compare[uint16]) {
		f := kernelFilter{dport: port}
		if eps := byPort[port]; len(eps) == 1 {
			f.replySrc = eps[0]
		}
		fs = append(fs, f)
	}
	return fs
}

// localSet holds the addresses of the namespace, the destinations a node
// port answers on.
type localSet map[netip.Addr]struct{}

func (l localSet) has(a netip.Addr) bool {
	_, ok := l[a]
	return ok
}

// localAddrs lists the addresses assigned to interfaces of the network
// namespace behind fd (0: the current one).
func localAddrs(fd int) (localSet, error) {
	addrs, err := hostaddr.List(fd)
	if err != nil {
		return nil, err
	}
	set := make(localSet, len(addrs))
	for _, p := range addrs {
		set[p.Addr()] = struct{}{}
	}
	return set, nil
}
