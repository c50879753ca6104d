// Package announce decides which addresses this gateway announces, and
// hands the one list to every announcer (the BGP speaker of announce/bgp,
// the ARP/NDP responder of announce/l2). It is fed by the sync loop's
// events, so the announcements follow the ruleset: one source of truth for
// "this gateway serves this address".
//
// An address is announced when the sync loop programmed it for a Service
// (model.Exposure let the gateway serve it: the models in the events are
// the programmed ones) and the Service can answer on it right now: at least
// one port has a usable endpoint, and under externalTrafficPolicy Local a
// usable endpoint on this gateway's node (model.Categorize decides, as for
// the ruleset). An address shared by several Services is announced while
// any of them can answer.
package announce

import (
	"cmp"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftgate/nftgate/announce/bgp"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
)

// Addresses are the LoadBalancer and external IPs of a programmed Service,
// and whether the Service can answer on them now (Usable).
func Addresses(m *model.Service, node model.Node) (addrs []netip.Addr, usable bool) {
	if m == nil || len(m.LoadBalancerIPs())+len(m.ExternalIPs()) == 0 {
		return nil, false
	}
	addrs = make([]netip.Addr, 0, len(m.LoadBalancerIPs())+len(m.ExternalIPs()))
	addrs = append(append(addrs, m.LoadBalancerIPs()...), m.ExternalIPs()...)
	for i := range m.Ports {
		sets := model.Categorize(m, &m.Ports[i], node)
		if m.ExternalLocal && len(sets.Local) > 0 || !m.ExternalLocal && len(sets.Cluster) > 0 {
			return addrs, true
		}
	}
	return addrs, false
}

// Served is the set of addresses to announce for these programmed
// Services: sorted, each once.
func Served(svcs map[model.ServiceKey]*model.Service, node model.Node) []netip.Addr {
	var out []netip.Addr
	for _, m := range svcs {
		if addrs, ok := Addresses(m, node); ok {
			out = append(out, addrs...)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// RouteSetter is the BGP speaker (bgp.Speaker).
type RouteSetter interface{ Set([]bgp.Route) error }

// AddrSetter is the L2 announcer (l2.Announcer).
type AddrSetter interface{ Set([]netip.Addr) }

// Coordinator keeps the programmed Services' addresses from the sync
// events, and sets the announcers to the served set after every sync that
// changes it.
type Coordinator struct {
	Node model.Node
	// PoolOf names the address pool of an address ("" when none): BGP
	// announces each address with its pool's attributes.
	PoolOf func(netip.Addr) string
	BGP    RouteSetter // nil: no BGP
	L2     AddrSetter  // nil: no L2 announcement
	Log    *slog.Logger
	// Always are announced whatever the Services: the masquerade
	// addresses, to which the endpoints' replies must be routed.
	Always []netip.Addr

	mu sync.Mutex
	// services are the programmed Services that have addresses;
	// usable are the addresses each contributes to the served set, and
	// count how many Services contribute each: a sync costs what it
	// changed, not a pass over every Service.
	services map[model.ServiceKey]*model.Service
	usable   map[model.ServiceKey][]netip.Addr
	count    map[netip.Addr]int
	served   []netip.Addr
	applied  bool
	since    map[netip.Addr]time.Time
	bgpErr   string
	// withdrawn: the gateway drains; only Always stays announced.
	withdrawn bool
}

// Withdraw stops announcing the Services' addresses for good (a drain):
// the BGP routes are withdrawn and ARP/NDP answers stop at once, and later
// syncs announce nothing but Always, the masquerade addresses that the
// replies of the flows still passing through this gateway need. It returns
// the addresses it withdrew.
func (c *Coordinator) Withdraw() []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.withdrawn {
		return nil
	}
	c.withdrawn = true
	var gone []netip.Addr
	for _, a := range c.served {
		if !slices.Contains(c.Always, a) {
			gone = append(gone, a)
		}
	}
	c.apply()
	return gone
}

// Observe is a loop.Syncer observer.
func (c *Coordinator) Observe(ev loop.Event) {
	if len(ev.After) == 0 && len(c.Always) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(ev.After) == 0 && c.applied {
		return
	}
	if c.services == nil {
		c.services = map[model.ServiceKey]*model.Service{}
		c.usable = map[model.ServiceKey][]netip.Addr{}
		c.count = map[netip.Addr]int{}
		c.since = map[netip.Addr]time.Time{}
	}
	changed := false
	for k, m := range ev.After {
		for _, a := range c.usable[k] {
			if c.count[a]--; c.count[a] == 0 {
				delete(c.count, a)
				changed = true
			}
		}
		delete(c.usable, k)
		delete(c.services, k)
		addrs, ok := Addresses(m, c.Node)
		if len(addrs) == 0 {
			continue
		}
		c.services[k] = m
		if !ok {
			continue
		}
		addrs = slices.Compact(slices.SortedFunc(slices.Values(addrs), netip.Addr.Compare))
		c.usable[k] = addrs
		for _, a := range addrs {
			if c.count[a]++; c.count[a] == 1 {
				changed = true
			}
		}
	}
	if c.applied && !changed {
		return
	}
	served := make([]netip.Addr, 0, len(c.count)+len(c.Always))
	for a := range c.count {
		served = append(served, a)
	}
	served = append(served, c.Always...)
	slices.SortFunc(served, netip.Addr.Compare)
	served = slices.Compact(served)
	c.served, c.applied = served, true
	now := time.Now()
	keep := make(map[netip.Addr]time.Time, len(served))
	for _, a := range served {
		t, ok := c.since[a]
		if !ok {
			t = now
		}
		keep[a] = t
	}
	c.since = keep
	c.apply()
}

// announced is what the announcers carry: c.served, or while withdrawn
// only the Always addresses among them; c.mu is held.
func (c *Coordinator) announced() []netip.Addr {
	if !c.withdrawn {
		return slices.Clone(c.served)
	}
	var out []netip.Addr
	for _, a := range c.served {
		if slices.Contains(c.Always, a) {
			out = append(out, a)
		}
	}
	return out
}

// apply sets the announcers to what is announced; c.mu is held.
func (c *Coordinator) apply() {
	served := c.announced()
	if c.L2 != nil {
		c.L2.Set(slices.Clone(served))
	}
	if c.BGP != nil {
		routes := make([]bgp.Route, len(served))
		for i, a := range served {
			pool := ""
			if c.PoolOf != nil {
				pool = c.PoolOf(a)
			}
			routes[i] = bgp.HostRoute(a, pool)
		}
		c.bgpErr = ""
		if err := c.BGP.Set(routes); err != nil {
			c.bgpErr = err.Error()
			if c.Log != nil {
				c.Log.Error("BGP announcement failed", "err", err)
			}
		}
	}
}

// Served returns the addresses announced now.
func (c *Coordinator) Served() []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.announced()
}

// ServiceAddress is one address of a Service as the status page shows it.
type ServiceAddress struct {
	Address netip.Addr `json:"address"`
	Pool    string     `json:"pool,omitempty"`
	// Announced: the gateway announces it (BGP, L2, as configured);
	// else Why says why not.
	Announced bool      `json:"announced"`
	Since     time.Time `json:"since,omitzero"`
	Why       string    `json:"why,omitempty"`
}

// ServiceAddresses are a Service's addresses.
type ServiceAddresses struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Addresses []ServiceAddress `json:"addresses"`
}

// Snapshot is the announcement as the status page shows it.
type Snapshot struct {
	Announced []netip.Addr       `json:"announced"`
	BGPError  string             `json:"bgp_error,omitempty"`
	Services  []ServiceAddresses `json:"services"`
}

// Snapshot lists every programmed Service with addresses, sorted.
func (c *Coordinator) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	sn := Snapshot{Announced: c.announced(), BGPError: c.bgpErr}
	for k, m := range c.services {
		addrs, usable := Addresses(m, c.Node)
		if len(addrs) == 0 {
			continue
		}
		sa := ServiceAddresses{Namespace: k.Namespace(), Name: k.Name()}
		for _, a := range addrs {
			e := ServiceAddress{Address: a, Announced: usable, Since: c.since[a]}
			if c.PoolOf != nil {
				e.Pool = c.PoolOf(a)
			}
			if usable && c.withdrawn {
				e.Announced, e.Since, e.Why = false, time.Time{}, "the gateway drains"
			}
			if !usable {
				e.Why = "no usable endpoint"
				if m.ExternalLocal {
					e.Why = "no usable endpoint on this node (externalTrafficPolicy Local)"
				}
			}
			sa.Addresses = append(sa.Addresses, e)
		}
		sn.Services = append(sn.Services, sa)
	}
	slices.SortFunc(sn.Services, func(a, b ServiceAddresses) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return sn
}
