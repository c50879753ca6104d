package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go4.org/netipx"
)

// Reasons of an allocation's problems; they are the Events' reasons.
const (
	ReasonPoolExhausted  = "PoolExhausted"
	ReasonAddressTaken   = "AddressTaken"
	ReasonNoPool         = "NoPoolForFamily"
	ReasonSharingRefused = "SharingRefused"
	ReasonNotInPool      = "AddressNotInPool"
	ReasonUnknownPool    = "UnknownPool"
	ReasonInvalid        = "InvalidRequest"
	// ReasonReleased: an address the Service held is given up (it left
	// every pool, its pool no longer serves the Service, or an older
	// Service has it); another is allocated when one is free.
	ReasonReleased = "AddressReleased"
)

// Problem is a failed allocation or a released address.
type Problem struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Assigned is an address given to a Service, and its pool.
type Assigned struct {
	Addr netip.Addr `json:"address"`
	Pool string     `json:"pool"`
}

// Allocation is what one Service gets.
type Allocation struct {
	Service *Service
	// Addresses in the order of the Service's families.
	Addresses []Assigned
	Problems  []Problem
}

// IPs are the allocated addresses, in the order status lists them.
func (a *Allocation) IPs() []netip.Addr {
	ips := make([]netip.Addr, len(a.Addresses))
	for i, as := range a.Addresses {
		ips[i] = as.Addr
	}
	return ips
}

// Usage is a pool's use.
type Usage struct {
	Pool string `json:"pool"`
	Used uint64 `json:"used"`
	Free uint64 `json:"free"`
}

// Result is an allocation of every Service the policy serves.
type Result struct {
	// Allocations of the Services the policy serves, sorted by key.
	Allocations []*Allocation
	// Usage of every pool, in the configuration's order.
	Usage []Usage
}

// Find returns the allocation of the Service k, or nil when the policy
// does not serve it.
func (r *Result) Find(k Key) *Allocation {
	i, ok := slices.BinarySearchFunc(r.Allocations, k, func(a *Allocation, k Key) int { return compareKeys(a.Service.Key, k) })
	if !ok {
		return nil
	}
	return r.Allocations[i]
}

func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// Allocate gives every Service the policy serves its addresses. It is a
// pure function of the policy and the set of Services (their order does
// not matter), and costs O(n log n) in their number:
//
//  1. In order of age (creation time, then namespace/name), each Service
//     keeps the addresses its status holds while they are still valid
//     (in a pool that serves it, the one it names, and among those it
//     requests if it requests any). An address held by an older Service
//     is taken from a younger one unless both may share it.
//  2. In the same order, each Service claims the addresses it requests:
//     an address another Service holds or claimed first is refused unless
//     both may share it. A request never takes an address from a Service
//     that holds it.
//  3. In the same order, each family still without an address gets the
//     first address that may be shared with it (same sharing key and
//     backend, no common port) or else the next free one, from the pool
//     it names or else the auto_assign pools that serve it, in the
//     configuration's order.
//
// So an address, once in a Service's status, stays there while it is
// valid: a restart recovers every allocation from status, and a pool
// change moves only the addresses it leaves outside.
func (pol *Policy) Allocate(services []*Service) *Result {
	a := &allocator{pol: pol, used: map[netip.Addr]*addrState{}, groups: map[groupKey]*group{}, cursors: map[cursorKey]*cursor{}}
	var served []*Allocation
	for _, s := range services {
		if pol.Serves(s) {
			served = append(served, &Allocation{Service: s, Addresses: make([]Assigned, len(s.Families))})
		}
	}
	slices.SortFunc(served, func(x, y *Allocation) int {
		return cmp.Or(x.Service.Created.Compare(y.Service.Created), compareKeys(x.Service.Key, y.Service.Key))
	})
	for _, al := range served {
		a.held(al)
	}
	for _, al := range served {
		a.requested(al)
	}
	for _, al := range served {
		a.automatic(al)
	}
	res := &Result{Allocations: served}
	for _, al := range served {
		al.Addresses = slices.DeleteFunc(al.Addresses, func(as Assigned) bool { return !as.Addr.IsValid() })
	}
	slices.SortFunc(res.Allocations, func(x, y *Allocation) int { return compareKeys(x.Service.Key, y.Service.Key) })
	used := map[*Pool]uint64{}
	for _, st := range a.used {
		used[st.pool]++
	}
	for _, p := range pol.Pools {
		res.Usage = append(res.Usage, Usage{Pool: p.Name, Used: used[p], Free: p.Size() - used[p]})
	}
	return res
}

type allocator struct {
	pol     *Policy
	used    map[netip.Addr]*addrState
	groups  map[groupKey]*group
	cursors map[cursorKey]*cursor
}

// addrState is an address in use.
type addrState struct {
	pool    *Pool
	key     string // sharing key; "" when not shared
	backend string
	holders []*Service
	ports   map[Port]*Service
}

// groupKey is a set of addresses Services may share.
type groupKey struct {
	pool         *Pool
	fam          int
	key, backend string
}

type group struct {
	addrs []netip.Addr
	// ports counts the addresses that have each port in use, so that a
	// Service whose port every address has needs no scan.
	ports map[Port]int
}

type cursorKey struct {
	pool *Pool
	fam  int
}

// cursor walks a pool's addresses of one family upwards. Within one
// allocation addresses are only taken, so it never needs to go back.
type cursor struct {
	i    int
	next netip.Addr
}

// held claims the valid addresses s holds in its status (only those it
// requests, when it requests some).
func (a *allocator) held(al *Allocation) {
	s := al.Service
	if s.Invalid != "" {
		al.Problems = append(al.Problems, Problem{ReasonInvalid, s.Invalid + "; the addresses it holds are kept, none is allocated"})
	}
	requests := len(s.Requested) > 0 && s.Invalid == ""
	for _, ip := range s.Held {
		slot := slices.Index(s.Families, 4+2*family(ip))
		if slot < 0 || al.Addresses[slot].Addr.IsValid() || requests && !slices.Contains(s.Requested, ip) {
			continue // a family it no longer asks for, a second one, or one it no longer requests
		}
		pool, why := a.fits(s, ip)
		if why == "" {
			why = a.claim(s, ip, pool)
		}
		if why != "" {
			al.Problems = append(al.Problems, Problem{ReasonReleased, fmt.Sprintf("address %s released: %s", ip, why)})
			continue
		}
		al.Addresses[slot] = Assigned{ip, pool.Name}
	}
}

// requested claims the addresses s requests and does not hold yet.
func (a *allocator) requested(al *Allocation) {
	s := al.Service
	if s.Invalid != "" {
		return
	}
	for _, ip := range s.Requested {
		slot := slices.Index(s.Families, 4+2*family(ip))
		if al.Addresses[slot].Addr == ip {
			continue
		}
		reason := ReasonNotInPool
		pool, why := a.fits(s, ip)
		if why == "" {
			if why = a.claim(s, ip, pool); why != "" {
				reason = ReasonAddressTaken
				if a.used[ip].key != "" && s.SharingKey != "" {
					reason = ReasonSharingRefused
				}
			}
		}
		if why != "" {
			al.Problems = append(al.Problems, Problem{reason, fmt.Sprintf("requested address %s (%s): %s", ip, s.RequestedFrom, why)})
			continue
		}
		al.Addresses[slot] = Assigned{ip, pool.Name}
	}
}

// fits tells why ip cannot be s's, or "" with its pool.
func (a *allocator) fits(s *Service, ip netip.Addr) (*Pool, string) {
	pool := a.pol.PoolOf(ip)
	switch {
	case pool == nil:
		return nil, "in no pool"
	case pool.skipped(ip):
		return nil, fmt.Sprintf("a network or broadcast address, which pool %q does not hand out (skip_network_and_broadcast)", pool.Name)
	case s.Pool != "" && s.Pool != pool.Name:
		return nil, fmt.Sprintf("in pool %q, but %s names pool %q", pool.Name, s.PoolFrom, s.Pool)
	case !pool.serves(s):
		return nil, fmt.Sprintf("pool %q does not serve this Service (its namespaces or service_selector)", pool.Name)
	}
	return pool, ""
}

// claim gives ip to s, or tells why it cannot.
func (a *allocator) claim(s *Service, ip netip.Addr, pool *Pool) string {
	st := a.used[ip]
	if st == nil {
		st = &addrState{pool: pool, key: s.SharingKey, backend: s.Backend, ports: map[Port]*Service{}}
		a.used[ip] = st
		if s.SharingKey != "" {
			gk := groupKey{pool, family(ip), s.SharingKey, s.Backend}
			g := a.groups[gk]
			if g == nil {
				g = &group{ports: map[Port]int{}}
				a.groups[gk] = g
			}
			g.addrs = append(g.addrs, ip)
		}
	} else if why := st.refuses(s); why != "" {
		return why
	}
	st.holders = append(st.holders, s)
	var g *group
	if st.key != "" {
		g = a.groups[groupKey{pool, family(ip), st.key, st.backend}]
	}
	for _, p := range s.Ports {
		if st.ports[p] == nil && g != nil {
			g.ports[p]++
		}
		st.ports[p] = s
	}
	return ""
}

// refuses tells why s may not share the address, or "".
func (st *addrState) refuses(s *Service) string {
	owner := st.holders[0].Key
	switch {
	case st.key == "" || s.SharingKey == "":
		return fmt.Sprintf("taken by %s (Services share an address only when both carry the same allow-shared-ip key)", owner)
	case st.key != s.SharingKey:
		return fmt.Sprintf("taken by %s, whose sharing key %q differs from %q", owner, st.key, s.SharingKey)
	case st.backend != s.Backend:
		return fmt.Sprintf("taken by %s; under externalTrafficPolicy Local, Services share an address only when they have the same selector and policy (%q, here %q)", owner, st.backend, s.Backend)
	}
	for _, p := range s.Ports {
		if o := st.ports[p]; o != nil {
			return fmt.Sprintf("port %s/%d is already used there by %s", p.Protocol, p.Port, o.Key)
		}
	}
	return ""
}

// unclaim gives back what s holds of ip.
func (a *allocator) unclaim(s *Service, ip netip.Addr) {
	st := a.used[ip]
	st.holders = slices.DeleteFunc(st.holders, func(h *Service) bool { return h == s })
	var g *group
	if st.key != "" {
		g = a.groups[groupKey{st.pool, family(ip), st.key, st.backend}]
	}
	for p, h := range st.ports {
		if h == s {
			delete(st.ports, p)
			if g != nil {
				g.ports[p]--
			}
		}
	}
	if len(st.holders) == 0 {
		delete(a.used, ip)
		if g != nil {
			g.addrs = slices.DeleteFunc(g.addrs, func(x netip.Addr) bool { return x == ip })
		}
		// The next Service gets it, as if it had never been taken.
		if c := a.cursors[cursorKey{st.pool, family(ip)}]; c != nil {
			i := slices.IndexFunc(st.pool.ranges, func(r netipx.IPRange) bool { return r.Contains(ip) })
			if i < c.i || i == c.i && c.next.IsValid() && ip.Less(c.next) {
				c.i, c.next = i, ip
			}
		}
	}
}

// automatic allocates the families s still lacks, and applies its
// ipFamilyPolicy.
func (a *allocator) automatic(al *Allocation) {
	s := al.Service
	var failed []int
	if s.Invalid == "" && len(s.Requested) == 0 {
		for slot, f := range s.Families {
			if al.Addresses[slot].Addr.IsValid() {
				continue
			}
			as, p := a.next(s, f)
			if p.Reason != "" {
				al.Problems = append(al.Problems, p)
				failed = append(failed, f)
				continue
			}
			al.Addresses[slot] = as
		}
	}
	got := 0
	for _, as := range al.Addresses {
		if as.Addr.IsValid() {
			got++
		}
	}
	switch {
	case s.RequireAll && got > 0 && got < len(s.Families):
		for i, as := range al.Addresses {
			if as.Addr.IsValid() {
				a.unclaim(s, as.Addr)
				al.Addresses[i] = Assigned{}
			}
		}
		al.Problems = append(al.Problems, Problem{ReasonNoPool, "ipFamilyPolicy RequireDualStack: no address is given unless every family has one"})
	case got > 0 && len(failed) > 0:
		// PreferDualStack: a family no pool serves is no failure.
		al.Problems = slices.DeleteFunc(al.Problems, func(p Problem) bool { return p.Reason == ReasonNoPool })
	}
}

// next finds an address of family f for s.
func (a *allocator) next(s *Service, f int) (Assigned, Problem) {
	fam := family4or6(f)
	var pools []*Pool
	if s.Pool != "" {
		p := a.pol.Pool(s.Pool)
		switch {
		case p == nil:
			return Assigned{}, Problem{ReasonUnknownPool, fmt.Sprintf("%s names pool %q, which is not configured", s.PoolFrom, s.Pool)}
		case !p.serves(s):
			return Assigned{}, Problem{ReasonNoPool, fmt.Sprintf("pool %q (%s) does not serve this Service (its namespaces or service_selector)", s.Pool, s.PoolFrom)}
		case p.size[fam] == 0:
			return Assigned{}, Problem{ReasonNoPool, fmt.Sprintf("pool %q (%s) has no IPv%d address", s.Pool, s.PoolFrom, f)}
		}
		pools = []*Pool{p}
	} else {
		for _, p := range a.pol.Pools {
			if p.AutoAssign && p.size[fam] > 0 && p.serves(s) {
				pools = append(pools, p)
			}
		}
		if len(pools) == 0 {
			return Assigned{}, Problem{ReasonNoPool, fmt.Sprintf("no auto_assign pool with IPv%d addresses serves this Service", f)}
		}
	}
	if s.SharingKey != "" {
		for _, p := range pools {
			if ip, ok := a.shared(s, p, fam); ok {
				a.claim(s, ip, p)
				return Assigned{ip, p.Name}, Problem{}
			}
		}
	}
	for _, p := range pools {
		if ip, ok := a.free(p, fam); ok {
			a.claim(s, ip, p)
			return Assigned{ip, p.Name}, Problem{}
		}
	}
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = fmt.Sprintf("%q", p.Name)
	}
	return Assigned{}, Problem{ReasonPoolExhausted, fmt.Sprintf("no free IPv%d address in pool %s", f, strings.Join(names, ", "))}
}

func family4or6(f int) int {
	if f == 6 {
		return 1
	}
	return 0
}

// shared finds the lowest address of p that s may share, if any.
func (a *allocator) shared(s *Service, p *Pool, fam int) (netip.Addr, bool) {
	g := a.groups[groupKey{p, fam, s.SharingKey, s.Backend}]
	if g == nil {
		return netip.Addr{}, false
	}
	for _, port := range s.Ports {
		if g.ports[port] == len(g.addrs) {
			return netip.Addr{}, false // every address has this port
		}
	}
	var best netip.Addr
	for _, ip := range g.addrs {
		if (!best.IsValid() || ip.Less(best)) && a.used[ip].refuses(s) == "" {
			best = ip
		}
	}
	return best, best.IsValid()
}

// free returns the next address of p nobody holds.
func (a *allocator) free(p *Pool, fam int) (netip.Addr, bool) {
	ck := cursorKey{p, fam}
	c := a.cursors[ck]
	if c == nil {
		c = &cursor{}
		a.cursors[ck] = c
	}
	for c.i < len(p.ranges) {
		r := p.ranges[c.i]
		if family(r.From()) != fam {
			c.i++
			continue
		}
		ip := c.next
		if !ip.IsValid() {
			ip = r.From()
		}
		if ip == r.To() {
			c.i++
			c.next = netip.Addr{}
		} else {
			c.next = ip.Next()
		}
		if !p.skipped(ip) && a.used[ip] == nil {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
