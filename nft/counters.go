package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Count is a number of packets and their bytes.
type Count struct{ Packets, Bytes uint64 }

func (c *Count) add(o Count) { c.Packets += o.Packets; c.Bytes += o.Bytes }

// PortRef names one port of a Service by its protocol and port.
type PortRef struct {
	Service model.ServiceKey
	Proto   model.Protocol
	Port    uint16
}

// PortCounters are the kernel's counters of one Service port, summed over
// its addresses, node port and families. They count new connections (the
// first packet of each): established packets pass no counter.
type PortCounters struct {
	// New are the connections dispatched to the port's rules (to an
	// endpoint, or dropped there by a Local policy without local ones).
	New Count
	// Rejected are the connections rejected for want of endpoints.
	Rejected Count
	// Dropped are the connections to a LoadBalancer IP dropped by the
	// port's loadBalancerSourceRanges.
	Dropped Count
}

// CountersMaxAge is how long a reading of the counters is served again
// before the kernel is read anew: a page or a scrape never costs more than
// one reading per interval, whatever the number of Services.
const CountersMaxAge = time.Second

// counterCache holds the last reading of the counters.
type counterCache struct {
	mu     sync.Mutex // held while reading: callers at once share one reading
	reader *reader
	last   *Reading
}

// Reading is one reading of the counters.
type Reading struct {
	At    time.Time
	Ports map[PortRef]PortCounters
	// dests are the Service port of each counted destination.
	dests map[ruleset.ElemID]PortRef
}

// PortOf returns the Service port a new flow to dst went to: the one
// whose address and port it is, or else whose node port.
func (r *Reading) PortOf(proto model.Protocol, dst netip.AddrPort) (PortRef, bool) {
	if r == nil {
		return PortRef{}, false
	}
	if p, ok := r.dests[ruleset.ElemID{Map: ruleset.MapServiceIPs, Key: ruleset.Key{Addr: dst.Addr(), Proto: proto, Port: dst.Port()}}]; ok {
		return p, true
	}
	p, ok := r.dests[ruleset.ElemID{Map: ruleset.MapServiceNodePorts, Key: ruleset.Key{Proto: proto, Port: dst.Port()}}]
	return p, ok
}

// Counters returns the counters of every programmed Service port, read
// from the kernel at most once per CountersMaxAge (an older reading is
// returned until then). Without ruleset.Config.Counters the reading has
// no counts, and still tells each destination's Service port.
func (p *Programmer) Counters() (*Reading, error) {
	c := &p.counters
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.last.At) < CountersMaxAge {
		return c.last, nil
	}
	if !p.cfg.Counters {
		c.last = p.attribute(nil, nil)
		c.last.At = time.Now()
		return c.last, nil
	}
	if c.reader == nil {
		r, err := newReader(p.netnsFD)
		if err != nil {
			return nil, err
		}
		c.reader = r
	}
	at := time.Now()
	elems, drops, err := c.reader.readCounters(&p.cfg, p.firewallChains())
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	c.last = p.attribute(elems, drops)
	c.last.At = at
	return c.last, nil
}

// counted is one map element's counter.
type counted struct {
	f  ruleset.Family
	id ruleset.ElemID
	n  Count
}

// countedMaps are the maps whose elements carry counters.
var countedMaps = []string{ruleset.MapServiceIPs, ruleset.MapServiceNodePorts, ruleset.MapNoEndpointServices, ruleset.MapNoEndpointNodePorts}

// readCounters reads the counters of the counted maps' elements in every
// table of nftgate's, and of the drop rules of the source-range chains fw
// (one dump per chain: a dump of the main table's rules would send every
// Service's).
func (r *reader) readCounters(cfg *ruleset.Config, fw map[string]PortRef) ([]counted, map[string]Count, error) {
	var out []counted
	drops := map[string]Count{}
	for _, f := range ruleset.Families {
		names := []string{cfg.Table}
		for i := range cfg.ShardCount() {
			names = append(names, cfg.ShardTable(i))
		}
		for _, name := range names {
			table := &nftables.Table{Name: name, Family: nftFamily(f)}
			sets, err := r.conn.GetSets(table)
			if err != nil {
				continue // not programmed (yet), or the family is unused
			}
			for _, s := range sets {
				if !isCounted(s.Name) {
					continue
				}
				shape := ruleset.SetShape(s.Name)
				elems, err := r.conn.GetSetElements(s)
				if err != nil {
					return nil, nil, fmt.Errorf("list elements of map %s: %w", s.Name, err)
				}
				for _, e := range elems {
					k, ok := keyFromBytes(f, shape, e.Key)
					if !ok || e.Counter == nil {
						continue
					}
					out = append(out, counted{f, ruleset.ElemID{Map: s.Name, Key: k}, Count{e.Counter.Packets, e.Counter.Bytes}})
				}
			}
			if name != cfg.Table {
				continue
			}
			for ch := range fw {
				rules, err := r.conn.GetRules(table, &nftables.Chain{Name: ch, Table: table})
				if err != nil {
					continue // not in this family, or gone since
				}
				for _, rl := range rules {
					for _, x := range rl.Exprs {
						if c, ok := x.(*expr.Counter); ok {
							n := drops[ch]
							n.add(Count{c.Packets, c.Bytes})
							drops[ch] = n
						}
					}
				}
			}
		}
	}
	return out, drops, nil
}

func isCounted(name string) bool { return slices.Contains(countedMaps, name) }

// attribute sums the counters per Service port: each element to the
// Service that holds it, each source-range chain to its port.
func (p *Programmer) attribute(elems []counted, drops map[string]Count) *Reading {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[PortRef]PortCounters, len(p.services))
	dests := make(map[ruleset.ElemID]PortRef, len(p.services))
	p.claims.EachHolder(func(_ ruleset.Family, id ruleset.ElemID, key model.ServiceKey) {
		if id.Map == ruleset.MapServiceIPs || id.Map == ruleset.MapServiceNodePorts {
			if ref, ok := p.portOf(key, id); ok {
				dests[id] = ref
			}
		}
	})
	for _, e := range elems {
		key, ok := p.claims.Holder(e.f, e.id)
		if !ok {
			continue
		}
		ref, ok := p.portOf(key, e.id)
		if !ok {
			continue
		}
		pc := out[ref]
		if e.id.Map == ruleset.MapServiceIPs || e.id.Map == ruleset.MapServiceNodePorts {
			pc.New.add(e.n)
		} else {
			pc.Rejected.add(e.n)
		}
		out[ref] = pc
	}
	fw := p.firewallChainsLocked()
	for ch, n := range drops {
		ref, ok := fw[ch]
		if !ok {
			continue
		}
		pc := out[ref]
		pc.Dropped.add(n)
		out[ref] = pc
	}
	return &Reading{Ports: out, dests: dests}
}

// portOf returns the port of Service key that map element id is of: by
// its protocol, and its port or node port.
func (p *Programmer) portOf(key model.ServiceKey, id ruleset.ElemID) (PortRef, bool) {
	svc := p.services[key]
	if svc == nil {
		return PortRef{}, false
	}
	nodePort := id.Map == ruleset.MapServiceNodePorts || id.Map == ruleset.MapNoEndpointNodePorts
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		if sp.Protocol == id.Key.Proto && (nodePort && sp.NodePort == id.Key.Port || !nodePort && sp.Port == id.Key.Port) {
			return PortRef{Service: key, Proto: sp.Protocol, Port: sp.Port}, true
		}
	}
	return PortRef{}, false
}

// firewallChains names the source-range chain of every programmed Service
// port that has one, with its port.
func (p *Programmer) firewallChains() map[string]PortRef {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firewallChainsLocked()
}

func (p *Programmer) firewallChainsLocked() map[string]PortRef {
	out := map[string]PortRef{}
	for key, svc := range p.services {
		if len(svc.SourceRanges) == 0 || len(svc.LoadBalancerIPs) == 0 {
			continue
		}
		for i := range svc.Ports {
			sp := &svc.Ports[i]
			out[ruleset.PortObject("fw", svc, sp)] = PortRef{Service: key, Proto: sp.Protocol, Port: sp.Port}
		}
	}
	return out
}
