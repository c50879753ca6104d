package ipam

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"go4.org/netipx"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// PoolConfig is one address pool as the configuration file gives it
// ([[pools]] in config.toml).
type PoolConfig struct {
	// Name names the pool in annotations, events, the status page and the
	// metrics: a DNS-1123 label, unique among the pools.
	Name string `toml:"name"`
	// Addresses are CIDRs ("192.0.2.0/28", "2001:db8::/120"), single
	// addresses, or ranges "first-last" of one family, IPv4 and IPv6 in
	// any mix. No address may be in two entries, of this pool or another.
	Addresses []string `toml:"addresses"`
	// AutoAssign: Services that neither name a pool nor request an
	// address get theirs from this pool. Nil means true. A pool without
	// it serves only Services that name it or request one of its
	// addresses.
	AutoAssign *bool `toml:"auto_assign,omitempty"`
	// Namespaces limits the pool to Services of these namespaces. Empty:
	// every namespace.
	Namespaces []string `toml:"namespaces,omitempty"`
	// ServiceSelector limits the pool to Services whose labels match this
	// Kubernetes label selector ("app=web,tier in (front)"). Empty: every
	// Service.
	ServiceSelector string `toml:"service_selector,omitempty"`
	// SkipNetworkAndBroadcast: IPv4 addresses that clients may take for a
	// network or broadcast address are never handed out: the first and
	// last address of each CIDR, and every address ending in .0 or .255.
	SkipNetworkAndBroadcast bool `toml:"skip_network_and_broadcast,omitempty"`
}

// Config is what the configuration file says about address allocation.
type Config struct {
	// Pools are the address pools, in the order automatic assignment
	// tries them.
	Pools []PoolConfig `toml:"pools"`
	// LoadBalancerClass: empty, nftgate allocates for LoadBalancer
	// Services without spec.loadBalancerClass; set, only for Services of
	// that class (so that another load-balancer implementation keeps the
	// rest).
	LoadBalancerClass string `toml:"load_balancer_class"`
}

// Keys of the configuration file, named in errors.
const (
	PoolsKey             = "pools"
	LoadBalancerClassKey = "load_balancer_class"
)

// Pool is a validated pool.
type Pool struct {
	Name       string
	AutoAssign bool
	// ranges are the pool's addresses, sorted, not overlapping.
	ranges []netipx.IPRange
	// edges are the first and last address of each IPv4 CIDR entry, when
	// skip is set.
	edges      map[netip.Addr]bool
	skip       bool
	namespaces map[string]bool
	selector   labels.Selector
	// size is the number of addresses the pool hands out, per family
	// (index 0: IPv4, 1: IPv6), saturated at math.MaxUint64.
	size [2]uint64
}

// Policy is a validated Config: the pools and the class nftgate serves.
// It is immutable and safe for concurrent use.
type Policy struct {
	Pools []*Pool
	Class string
	// index is every pool's ranges, sorted, for the pool of an address.
	index []poolRange
}

type poolRange struct {
	r    netipx.IPRange
	pool *Pool
}

// Compile validates c. Its errors name the pool, the field and the value,
// and all of them are reported at once.
func (c Config) Compile() (*Policy, error) {
	var errs []error
	p := &Policy{Class: c.LoadBalancerClass}
	if c.LoadBalancerClass != "" {
		if msgs := validation.IsQualifiedName(c.LoadBalancerClass); len(msgs) > 0 || !strings.Contains(c.LoadBalancerClass, "/") {
			if len(msgs) == 0 {
				msgs = []string{"must have a prefix, as Kubernetes asks of a loadBalancerClass (example.com/name)"}
			}
			errs = append(errs, fmt.Errorf("%s = %q: %s", LoadBalancerClassKey, c.LoadBalancerClass, strings.Join(msgs, "; ")))
		}
	}
	names := map[string]int{}
	for i, pc := range c.Pools {
		where := fmt.Sprintf("%s[%d]", PoolsKey, i)
		if pc.Name != "" {
			where += fmt.Sprintf(" (name %q)", pc.Name)
		}
		pool, perrs := compilePool(pc, where)
		errs = append(errs, perrs...)
		if j, ok := names[pc.Name]; ok && pc.Name != "" {
			errs = append(errs, fmt.Errorf("%s: name %q: already the name of %s[%d]", where, pc.Name, PoolsKey, j))
		}
		names[pc.Name] = i
		if pool != nil {
			p.Pools = append(p.Pools, pool)
			for _, r := range pool.ranges {
				p.index = append(p.index, poolRange{r, pool})
			}
		}
	}
	slices.SortFunc(p.index, func(a, b poolRange) int { return a.r.From().Compare(b.r.From()) })
	for i := 1; i < len(p.index); i++ {
		a, b := p.index[i-1], p.index[i]
		if a.r.To().Compare(b.r.From()) >= 0 {
			if a.pool == b.pool {
				errs = append(errs, fmt.Errorf("%s: pool %q: addresses %s and %s overlap", PoolsKey, a.pool.Name, a.r, b.r))
			} else {
				errs = append(errs, fmt.Errorf("%s: pool %q (%s) and pool %q (%s) overlap", PoolsKey, a.pool.Name, a.r, b.pool.Name, b.r))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func compilePool(pc PoolConfig, where string) (*Pool, []error) {
	var errs []error
	if msgs := validation.IsDNS1123Label(pc.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("%s: name %q: %s", where, pc.Name, strings.Join(msgs, "; ")))
	}
	pool := &Pool{Name: pc.Name, AutoAssign: pc.AutoAssign == nil || *pc.AutoAssign, skip: pc.SkipNetworkAndBroadcast}
	if len(pc.Addresses) == 0 {
		errs = append(errs, fmt.Errorf("%s: addresses: empty; give at least one CIDR, address or range", where))
	}
	for _, s := range pc.Addresses {
		r, cidr, err := parseEntry(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: addresses: %q: %w", where, s, err))
			continue
		}
		pool.ranges = append(pool.ranges, r)
		if pool.skip && cidr && r.From().Is4() && r.From() != r.To() {
			if pool.edges == nil {
				pool.edges = map[netip.Addr]bool{}
			}
			pool.edges[r.From()], pool.edges[r.To()] = true, true
		}
	}
	slices.SortFunc(pool.ranges, func(a, b netipx.IPRange) int { return a.From().Compare(b.From()) })
	if len(pc.Namespaces) > 0 {
		pool.namespaces = map[string]bool{}
		for _, ns := range pc.Namespaces {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("%s: namespaces: %q: %s", where, ns, strings.Join(msgs, "; ")))
			}
			pool.namespaces[ns] = true
		}
	}
	if pc.ServiceSelector != "" {
		sel, err := labels.Parse(pc.ServiceSelector)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: service_selector: %q: %w", where, pc.ServiceSelector, err))
		}
		pool.selector = sel
	}
	if len(errs) > 0 {
		return nil, errs
	}
	for _, r := range pool.ranges {
		f := family(r.From())
		pool.size[f] = addSat(pool.size[f], pool.rangeSize(r))
	}
	return pool, nil
}

// parseEntry parses one entry of a pool's addresses: a CIDR, an address,
// or a range "first-last". cidr tells whether it was a CIDR.
func parseEntry(s string) (r netipx.IPRange, cidr bool, err error) {
	s = strings.TrimSpace(s)
	if from, to, ok := strings.Cut(s, "-"); ok {
		a, err := netip.ParseAddr(strings.TrimSpace(from))
		if err != nil {
			return r, false, fmt.Errorf("range start: %w", err)
		}
		b, err := netip.ParseAddr(strings.TrimSpace(to))
		if err != nil {
			return r, false, fmt.Errorf("range end: %w", err)
		}
		switch {
		case a.Zone() != "" || b.Zone() != "" || a.Is4In6() || b.Is4In6():
			return r, false, errors.New("not a Service address (zone or IPv4-mapped)")
		case a.Is4() != b.Is4():
			return r, false, fmt.Errorf("the range crosses address families (%s is IPv%d, %s is IPv%d)", a, 4+2*family(a), b, 4+2*family(b))
		case a.Compare(b) > 0:
			return r, false, fmt.Errorf("the range is empty: %s comes after %s", a, b)
		}
		return netipx.IPRangeFrom(a, b), false, nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return r, false, err
		}
		if p.Addr().Is4In6() {
			return r, false, errors.New("an IPv4-mapped IPv6 prefix; write the IPv4 CIDR")
		}
		if p.Masked() != p {
			return r, false, fmt.Errorf("host bits set; the CIDR is %s", p.Masked())
		}
		return netipx.RangeOfPrefix(p), true, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return r, false, errors.New("not a CIDR, an address or a range first-last")
	}
	if a.Zone() != "" || a.Is4In6() {
		return r, false, errors.New("not a Service address (zone or IPv4-mapped)")
	}
	return netipx.IPRangeFrom(a, a), false, nil
}

// family is 0 for IPv4, 1 for IPv6.
func family(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// skipped tells whether the pool never hands out a.
func (p *Pool) skipped(a netip.Addr) bool {
	if !p.skip || !a.Is4() {
		return false
	}
	last := a.As4()[3]
	return last == 0 || last == 255 || p.edges[a]
}

// rangeSize is the number of addresses of r the pool hands out,
// saturated.
func (p *Pool) rangeSize(r netipx.IPRange) uint64 {
	from, to := new(big.Int).SetBytes(r.From().AsSlice()), new(big.Int).SetBytes(r.To().AsSlice())
	n := new(big.Int).Sub(to, from)
	n.Add(n, big.NewInt(1))
	if !n.IsUint64() {
		return math.MaxUint64
	}
	size := n.Uint64()
	if p.skip && r.From().Is4() {
		a, b := int64(from.Uint64()), int64(to.Uint64())
		// addresses x in [a, b] with x mod 256 == m
		count := func(m int64) int64 { return floorDiv(b-m, 256) - floorDiv(a-1-m, 256) }
		size -= uint64(count(0) + count(255))
		for e := range p.edges {
			if r.Contains(e) && !(e.As4()[3] == 0 || e.As4()[3] == 255) {
				size--
			}
		}
	}
	return size
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func addSat(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// Contains tells whether the pool holds a (whether or not it hands it
// out).
func (p *Pool) Contains(a netip.Addr) bool {
	i, _ := slices.BinarySearchFunc(p.ranges, a, func(r netipx.IPRange, a netip.Addr) int { return r.From().Compare(a) })
	if i < len(p.ranges) && p.ranges[i].From() == a {
		return true
	}
	return i > 0 && p.ranges[i-1].Contains(a)
}

// Size is the number of addresses the pool hands out (IPv4 and IPv6
// together, saturated at math.MaxUint64).
func (p *Pool) Size() uint64 { return addSat(p.size[0], p.size[1]) }

// serves tells whether the pool may give s an address (namespace and
// selector; not auto_assign).
func (p *Pool) serves(s *Service) bool {
	if p.namespaces != nil && !p.namespaces[s.Namespace] {
		return false
	}
	return p.selector == nil || p.selector.Matches(labels.Set(s.Labels))
}

// PoolOf returns the pool that holds a, or nil.
func (pol *Policy) PoolOf(a netip.Addr) *Pool {
	a = a.Unmap()
	i, found := slices.BinarySearchFunc(pol.index, a, func(r poolRange, a netip.Addr) int { return r.r.From().Compare(a) })
	if found {
		return pol.index[i].pool
	}
	if i > 0 && pol.index[i-1].r.Contains(a) {
		return pol.index[i-1].pool
	}
	return nil
}

// Pool returns the pool of that name, or nil.
func (pol *Policy) Pool(name string) *Pool {
	for _, p := range pol.Pools {
		if p.Name == name {
			return p
		}
	}
	return nil
}
