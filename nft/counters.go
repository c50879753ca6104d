package nft

import (
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Count is a number of packets and their bytes.
type Count struct{ Packets, Bytes uint64 }

func (c *Count) add(o Count) { c.Packets += o.Packets; c.Bytes += o.Bytes }

// sub returns c less o, each at least 0.
func (c Count) sub(o Count) Count {
	return Count{c.Packets - min(c.Packets, o.Packets), c.Bytes - min(c.Bytes, o.Bytes)}
}

// PortRef names one port of a Service by its protocol and port.
type PortRef struct {
	Service model.ServiceKey
	Proto   model.Protocol
	Port    uint16
}

// PortCounters are the kernel's counters of one Service port, summed over
// its addresses, node port and families. They count new connections (the
// first packet of each): established packets pass no counter. The kernel
// counts the first packets' bytes too, which say nothing of a connection:
// they are not kept (a reading holds one PortCounters per Service port).
type PortCounters struct {
	// New are the connections dispatched to the port's rules (to an
	// endpoint, or dropped there by a Local policy without local ones).
	New uint64
	// Rejected are the connections rejected for want of endpoints.
	Rejected uint64
	// Dropped are the connections to a LoadBalancer IP dropped by the
	// port's loadBalancerSourceRanges.
	Dropped uint64
	// Traffic is every packet of the port's translated connections, both
	// ways, counted in the forward path (ruleset.Config.TrafficElements).
	Traffic Traffic
}

// Traffic is what the traffic sets counted: In the packets from clients
// to endpoints, Out the endpoints' replies.
type Traffic struct{ In, Out Count }

func (t *Traffic) add(o Traffic) { t.In.add(o.In); t.Out.add(o.Out) }

// EndpointRef names one endpoint of a Service port.
type EndpointRef struct {
	Port     PortRef
	Endpoint netip.AddrPort
}

// trafficKey is one element of a traffic set: a Service destination and
// the endpoint it was translated to, one way.
type trafficKey struct {
	reply    bool
	proto    model.Protocol
	dest, ep netip.AddrPort
}

// CountersMaxAge is how long a reading of the counters is served before a
// new one is started: a page or a scrape never costs more than one reading
// per interval, whatever the number of Services.
const CountersMaxAge = time.Second

// countersPace bounds the time spent reading the counters to a share of
// one core: a reading that took d is followed by the next one no sooner
// than countersPace × d after it (full traffic sets take seconds to dump).
const countersPace = 10

// counterCache holds the last reading of the counters.
type counterCache struct {
	mu sync.Mutex // guards last, next, refreshing, closed
	// last is served to every caller; a caller that finds it older than
	// next starts the next reading in the background (wg), and gets last.
	last       *Reading
	next       time.Time
	refreshing bool
	closed     bool
	wg         sync.WaitGroup
	// shardNew are the new connections each shard's Service ports
	// counted, per shard, at the last reading (nil before there is one);
	// shardRecent what each counted between the last two readings that
	// told something of it, and shardSeen the last reading (by number,
	// readings) that found it counting (nextRecent): a repair after a
	// flush serves first the shards that counted last, and the most
	// (shardOrder).
	shardNew, shardRecent, shardSeen []uint64
	readings                         uint64

	read   sync.Mutex // held while reading, taken before mu; guards what follows
	reader *reader
	// counted is the number of counted elements the last reading found.
	counted int
	// seen are the traffic sets' elements of the last reading; retired
	// what the elements that expired since (or were made anew) had
	// counted, so that a port's or endpoint's totals never go down while
	// it is programmed; gone what the endpoints a port no longer has
	// counted, kept in the port's totals. before is what the kernel's
	// element under a key had counted at the last reading where no
	// programmed port owned it (a deleted Service's, until it expires): a
	// port that owns the key later (its address reused) counts only what
	// came after.
	seen    map[trafficKey]Count
	retired map[trafficKey]Count
	gone    map[PortRef]Traffic
	before  map[trafficKey]Count
	// ports is the index of Service ports and destinations of the last
	// reading, made when the programmer's changes count was portsOf:
	// readings share it until a sync changes what it is made from (at
	// 100,000 Services it is several MB, made again every second while
	// the counters are asked).
	ports   *portIndex
	portsOf uint64
	// prev is the last reading of the traffic sets; seenBefore its
	// elements, from traffic to attributeTraffic of the next reading.
	prev       *Reading
	seenBefore map[trafficKey]Count
}

// Reading is one reading of the counters.
type Reading struct {
	At time.Time
	// Endpoints are the traffic of each endpoint of a port that the
	// traffic sets counted.
	Endpoints map[EndpointRef]Traffic
	ports     *portIndex
	// counts are the counters of each port of ports, in its order; nil
	// without counters. A map of them took three times the room, made
	// for every reading.
	counts []PortCounters
	// shardNew sums New per shard of the layout it was read in.
	shardNew []uint64
	// Resets are the TCP resets the gateway sent endpoints to end a
	// TIME_WAIT of a masqueraded connection.
	Resets Resets
	// Midstream counts the connections that waited for their replica
	// (ruleset.Config.MidstreamWait).
	Midstream Midstream
}

// Midstream counts the masqueraded TCP connections whose packets came
// here without a conntrack entry (moved from another gateway before their
// replica).
type Midstream struct {
	// Waited: their packets were dropped, waiting for the replica.
	Waited uint64
	// GivenUp: no replica came within the wait; picked up here.
	GivenUp uint64
	// StrayReplies: the packets to a masquerade address of the set that
	// had no entry here, dropped (ruleset.ChainStrayReplies): an
	// endpoint's answers to a peer's pick-up before its replica came.
	StrayReplies uint64
}

// Resets counts the gateway's resets of endpoints' TIME_WAIT, by why they
// were sent.
type Resets struct {
	// Released: both ends had closed the connection
	// (ruleset.Config.ReleaseTimeWait).
	Released uint64
	// Refused: the endpoint had refused the connection's SYN on a
	// TIME_WAIT it still held (ruleset.Config.AnswerRefusedSYNs).
	Refused uint64
}

// portIndex is every programmed Service port that a counted map element
// leads to, and the elements: readings share it until a sync changes the
// Services or their claims.
type portIndex struct {
	refs []PortRef
	// dests is the port of each counted element (of the Service
	// addresses and node ports, with endpoints or without).
	dests *ruleset.ElemIndex
	// byRef finds a port by its name; made when first asked (few
	// readings need it: the drops of source ranges, the traffic of
	// endpoints gone).
	byRefOnce sync.Once
	byRef     map[PortRef]int32
}

// at returns the index of port ref.
func (x *portIndex) at(ref PortRef) (int32, bool) {
	x.byRefOnce.Do(func() {
		x.byRef = make(map[PortRef]int32, len(x.refs))
		for i, r := range x.refs {
			x.byRef[r] = int32(i)
		}
	})
	i, ok := x.byRef[ref]
	return i, ok
}

// Ports yields the counters of every Service port counted; none without
// counters.
func (r *Reading) Ports() iter.Seq2[PortRef, PortCounters] {
	return func(yield func(PortRef, PortCounters) bool) {
		for i := range r.counts {
			if !yield(r.ports.refs[i], r.counts[i]) {
				return
			}
		}
	}
}

// NumPorts is the number of ports Ports yields.
func (r *Reading) NumPorts() int { return len(r.counts) }

// Port returns the counters of port ref; ok is false when the reading
// has none of it.
func (r *Reading) Port(ref PortRef) (c PortCounters, ok bool) {
	if r == nil || r.counts == nil {
		return PortCounters{}, false
	}
	i, ok := r.ports.at(ref)
	if !ok {
		return PortCounters{}, false
	}
	return r.counts[i], true
}

// PortOf returns the Service port a new flow to dst went to: the one
// whose address and port it is, or else whose node port.
func (r *Reading) PortOf(proto model.Protocol, dst netip.AddrPort) (PortRef, bool) {
	i, ok := r.portAt(proto, dst)
	if !ok {
		return PortRef{}, false
	}
	return r.ports.refs[i], true
}

// portAt is PortOf's index of the port.
func (r *Reading) portAt(proto model.Protocol, dst netip.AddrPort) (int32, bool) {
	if r == nil || r.ports == nil {
		return 0, false
	}
	if i, ok := r.ports.dests.Get(ruleset.NewElemID(ruleset.MapServiceIPs, ruleset.Key{Addr: dst.Addr(), Proto: proto, Port: dst.Port()})); ok {
		return i, true
	}
	i, ok := r.ports.dests.Get(ruleset.NewElemID(ruleset.MapServiceNodePorts, ruleset.Key{Proto: proto, Port: dst.Port()}))
	return i, ok
}

// Counters returns the last reading of the counters of every programmed
// Service port. Only the first call waits for the kernel: a later one gets
// the last reading at once and, when it is older than CountersMaxAge (or
// countersPace times what it took), starts the next one in the background,
// so that a scrape or a page is never held up by a dump of large sets. A
// reading that fails is not served: the next call reads again, and gets
// the error. Without ruleset.Config.Counters the reading has no counts,
// and still tells each destination's Service port.
func (p *Programmer) Counters() (*Reading, error) {
	c := &p.counters
	c.mu.Lock()
	last := c.last
	if last != nil && !c.refreshing && !c.closed && !time.Now().Before(c.next) {
		c.refreshing = true
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			p.readCounters(true)
		}()
	}
	c.mu.Unlock()
	if last != nil {
		return last, nil
	}
	return p.readCounters(false)
}

// readCounters reads the counters into p.counters.last. In the
// background it replaces the last reading whatever its age; otherwise it
// returns one that another caller made meanwhile.
func (p *Programmer) readCounters(background bool) (*Reading, error) {
	c := &p.counters
	c.read.Lock()
	defer c.read.Unlock()
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	if last != nil && !background {
		return last, nil
	}
	start := time.Now()
	rd, err := p.readKernelCounters()
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshing = false
	if err != nil {
		c.last = nil
		return nil, err
	}
	rd.At = start
	c.last = rd
	c.readings++
	c.shardRecent, c.shardSeen = nextRecent(c.shardRecent, c.shardSeen, c.shardNew, rd.shardNew, c.readings)
	c.shardNew = rd.shardNew
	c.next = start.Add(max(CountersMaxAge, countersPace*took))
	return rd, nil
}

// nextRecent is what each shard counted recently, and the number of the
// last reading that found it counting, after reading number n found now
// where the one before found last: now − last; for a shard whose count went
// down (its table programmed anew, as after a flush), what it counted
// since; but when that is nothing, what was known before stays. A reading
// taken while the tables were gone, or being repaired, finds zeros that
// say nothing of the traffic: it left the next repair nothing to order by,
// and at 100,000 Services the traffic came back after 1.3-3.4 s instead of
// 0.1-0.5 s in 10 flushes of 150 (the bench scrapes /metrics, which starts
// a reading, just before each flush). And a shard found counting since a
// repair is the traffic of now, ahead of larger counts read before it.
func nextRecent(recent, seen, last, now []uint64, n uint64) (outRecent, outSeen []uint64) {
	outRecent, outSeen = make([]uint64, len(now)), make([]uint64, len(now))
	known := len(last) == len(now) && len(recent) == len(now) && len(seen) == len(now)
	for i := range now {
		switch {
		case !known: // the first reading, or another layout: all is new
			outRecent[i] = now[i]
		case now[i] >= last[i]:
			outRecent[i], outSeen[i] = now[i]-last[i], seen[i]
		case now[i] > 0:
			outRecent[i] = now[i]
		default:
			outRecent[i], outSeen[i] = recent[i], seen[i]
			continue // nothing learnt
		}
		if now[i] > 0 && (!known || now[i] != last[i]) {
			outSeen[i] = n // found counting
		}
	}
	return outRecent, outSeen
}

// readKernelCounters reads the kernel's counters; called with
// p.counters.read held.
func (p *Programmer) readKernelCounters() (*Reading, error) {
	c := &p.counters
	if !p.cfg.Counters {
		return p.attribute(nil, nil, false), nil
	}
	if c.reader == nil {
		r, err := newReader(p.netnsFD)
		if err != nil {
			return nil, err
		}
		c.reader = r
	}
	cfg, fw := p.countedConfig()
	elems, byChain, flows, err := c.reader.readCounters(&cfg, fw, len(c.seen), c.counted+c.counted/16)
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	c.traffic(flows)
	c.counted = len(elems)
	return p.attribute(elems, byChain, true), nil
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
// table of nftgate's, and of the rules of the source-range chains fw and
// of the resets' chains, summed by chain (chainsCounted; one dump per
// chain: a dump of the main table's rules would send every Service's).
// flows is the number of traffic elements expected (the last reading's),
// to size their map once, and elems the counted elements expected (the
// last reading's) for their slice.
func (r *reader) readCounters(cfg *ruleset.Config, fw map[string]PortRef, flows, elems int) ([]counted, map[string]Count, map[trafficKey]Count, error) {
	out := make([]counted, 0, elems)
	byChain := map[string]Count{}
	traffic := make(map[trafficKey]Count, flows)
	for _, f := range ruleset.Families {
		names := []string{cfg.Table}
		for i := range cfg.ShardCount() {
			names = append(names, cfg.ShardTable(i))
		}
		for _, name := range names {
			// The sets are asked for by name: a listing of the table's
			// sets describes each of them, and with session affinity
			// there is one for every endpoint.
			for _, set := range countedMaps {
				shape := ruleset.SetShape(set)
				err := r.eachElem(f, name, set, func(e *setElem) error {
					if k, ok := keyFromBytes(f, shape, e.Key); ok && e.HasCounter {
						out = append(out, counted{f, ruleset.NewElemID(set, k), e.Counter})
					}
					return nil
				})
				if err != nil && !errors.Is(err, unix.ENOENT) { // ENOENT: not in this table, or no table
					return nil, nil, nil, err
				}
			}
			for _, set := range []string{ruleset.SetTrafficIn, ruleset.SetTrafficOut} {
				if err := r.readTraffic(f, name, set, traffic); err != nil && !errors.Is(err, unix.ENOENT) {
					return nil, nil, nil, err
				}
			}
			if name != cfg.Table {
				continue
			}
			for ch := range chainsCounted(cfg, fw) {
				err := r.eachRuleCounter(f, name, ch, func(c Count) {
					n := byChain[ch]
					n.add(c)
					byChain[ch] = n
				})
				if err != nil && !errors.Is(err, unix.ENOENT) { // ENOENT: not in this family, or gone since
					return nil, nil, nil, err
				}
			}
		}
	}
	return out, byChain, traffic, nil
}

// chainsCounted are the chains of the main table whose rules' counters a
// reading sums: the source-range chains fw (their drops), the chains
// that copy what the gateway answers with a reset (Reading.Resets), and
// those of the wait for a replica and of the stray replies
// (Reading.Midstream).
func chainsCounted(cfg *ruleset.Config, fw map[string]PortRef) iter.Seq[string] {
	return func(yield func(string) bool) {
		for ch := range fw {
			if !yield(ch) {
				return
			}
		}
		if cfg.ReleaseTimeWait && !yield(ruleset.ChainReleaseTimeWait) {
			return
		}
		if cfg.AnswerRefusedSYNs && !yield(ruleset.ChainReleaseRefused) {
			return
		}
		if cfg.MidstreamBounded() && (!yield(ruleset.ChainMidstreamWait) || !yield(ruleset.ChainMidstream)) {
			return
		}
		if ruleset.HasMidstreamHomes(cfg) {
			yield(ruleset.ChainStrayReplies)
		}
	}
}

// readTraffic reads the elements of traffic set set of table into flows.
func (r *reader) readTraffic(f ruleset.Family, table, set string, flows map[trafficKey]Count) error {
	n := int(f.AddrLen())
	reply := set == ruleset.SetTrafficOut
	return r.eachElem(f, table, set, func(e *setElem) error {
		// The destination's fields as in the service maps, then the
		// endpoint's address and port (padded to four bytes).
		if !e.HasCounter || len(e.Key) != 2*n+12 {
			return nil
		}
		dest, ok := keyFromBytes(f, ruleset.KeyAddrProtoPort, e.Key[:n+8])
		ep, _ := netip.AddrFromSlice(e.Key[n+8 : 2*n+8])
		if !ok {
			return nil
		}
		k := trafficKey{reply: reply, proto: dest.Proto, dest: netip.AddrPortFrom(dest.Addr, dest.Port),
			ep: netip.AddrPortFrom(ep, uint16(e.Key[2*n+8])<<8|uint16(e.Key[2*n+9]))}
		c := flows[k]
		c.add(e.Counter)
		flows[k] = c
		return nil
	})
}

// traffic takes the traffic sets' elements read now: what the elements
// seen last time had counted moves to retired where they expired (or were
// made anew). What each key counted since it was first seen is then its
// count now plus its retired count (attributeTraffic adds them up, key by
// key, rather than in a map of its own: with full sets that map was a
// quarter of a reading's allocations).
func (c *counterCache) traffic(now map[trafficKey]Count) {
	if c.retired == nil {
		c.retired = map[trafficKey]Count{}
	}
	for k, old := range c.seen {
		if cur, ok := now[k]; !ok || cur.Packets < old.Packets {
			n := c.retired[k]
			n.add(old)
			c.retired[k] = n
		}
	}
	c.seen, c.seenBefore = now, c.seen
}

// fresh tells whether traffic key k, owned by port ref now, belonged to
// something else at the last reading: its port's Service was deleted
// since, or its destination was another port's.
func (c *counterCache) fresh(k trafficKey, ref PortRef, fg forgotten) bool {
	if fg.deleted[ref.Service] {
		return true
	}
	was, ok := c.prev.PortOf(k.proto, k.dest)
	return ok && was != ref
}

func isCounted(name string) bool { return slices.Contains(countedMaps, name) }

// attribute sums the counters per Service port: each element to the
// Service that holds it, each source-range chain to its port, each traffic
// element to the port of its destination and, while the port has it, its
// endpoint; the resets' chains to Resets. Called with p.counters.read
// held.
func (p *Programmer) attribute(elems []counted, byChain map[string]Count, traffic bool) *Reading {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &p.counters
	if c.ports == nil || c.portsOf != p.changes {
		c.ports, c.portsOf = p.portIndex(), p.changes
	}
	rd := &Reading{ports: c.ports}
	if !traffic {
		return rd
	}
	rd.Resets = Resets{Released: byChain[ruleset.ChainReleaseTimeWait].Packets, Refused: byChain[ruleset.ChainReleaseRefused].Packets}
	rd.Midstream = Midstream{Waited: byChain[ruleset.ChainMidstreamWait].Packets, GivenUp: byChain[ruleset.ChainMidstream].Packets,
		StrayReplies: byChain[ruleset.ChainStrayReplies].Packets}
	rd.counts = make([]PortCounters, len(rd.ports.refs))
	rd.Endpoints = p.attributeTraffic(rd, p.forgotten.take())
	for _, e := range elems {
		i, ok := rd.ports.dests.Get(e.id)
		if !ok {
			continue
		}
		if m := e.id.Map(); m == ruleset.MapServiceIPs || m == ruleset.MapServiceNodePorts {
			rd.counts[i].New += e.n.Packets
		} else {
			rd.counts[i].Rejected += e.n.Packets
		}
	}
	if len(byChain) > 0 {
		fw := p.firewallChainsLocked()
		for ch, n := range byChain {
			if ref, ok := fw[ch]; ok {
				if i, ok := rd.ports.at(ref); ok {
					rd.counts[i].Dropped += n.Packets
				}
			}
		}
	}
	rd.shardNew = p.shardSums(rd)
	return rd
}

// portIndex indexes the ports of the Services that hold counted map
// elements; called with p.mu held.
func (p *Programmer) portIndex() *portIndex {
	// Most Services have one port, with one element.
	x := &portIndex{refs: make([]PortRef, 0, len(p.services)), dests: ruleset.NewElemIndex(len(p.services))}
	seen := make(map[PortRef]int32, len(p.services))
	p.claims.EachHolder(func(_ ruleset.Family, id ruleset.ElemID, key model.ServiceKey) {
		if !isCounted(id.Map()) {
			return
		}
		ref, ok := p.portOf(key, id)
		if !ok {
			return
		}
		i, ok := seen[ref]
		if !ok {
			i = int32(len(x.refs))
			x.refs = append(x.refs, ref)
			seen[ref] = i
		}
		x.dests.Put(id, i)
	})
	return x
}

// attributeTraffic adds each traffic element's count to its port in rd,
// and returns the endpoints' counts. What an endpoint the port no longer
// has counted stays in the port's totals (p.counters.gone), and what
// belongs to no programmed port is forgotten, also by a port that owns its
// key later (p.counters.before). A port whose Service was deleted since the
// last reading, or whose destination another port owned then, starts
// afresh (fg).
func (p *Programmer) attributeTraffic(rd *Reading, fg forgotten) map[EndpointRef]Traffic {
	c := &p.counters
	for ref := range c.gone {
		if fg.deleted[ref.Service] {
			delete(c.gone, ref)
		}
	}
	if c.gone == nil {
		c.gone = map[PortRef]Traffic{}
	}
	if c.before == nil {
		c.before = map[trafficKey]Count{}
	}
	for k := range c.before {
		_, live := c.seen[k]
		if _, expired := c.retired[k]; !live && !expired {
			delete(c.before, k)
		}
	}
	eps := map[EndpointRef]Traffic{}
	one := func(k trafficKey, n Count) {
		pi, ok := rd.portAt(k.proto, k.dest)
		if !ok {
			delete(c.retired, k)
			// Before the first sync no port is programmed yet: what
			// lives then is the Services' that are still to come.
			if live, ok := c.seen[k]; ok && p.synced {
				c.before[k] = live
			} else {
				delete(c.before, k)
			}
			return
		}
		ref := rd.ports.refs[pi]
		if c.fresh(k, ref, fg) {
			// What the element counted for what owned it before is gone
			// with it where the sync destroyed it, and was at most one
			// reading's worth where it is new since the last reading;
			// otherwise it is all the element counted until now.
			delete(c.retired, k)
			n = c.seen[k]
			if _, old := c.seenBefore[k]; fg.destroyed[k] || !old {
				delete(c.before, k)
			} else {
				c.before[k] = n
			}
		}
		b := c.before[k]
		n = n.sub(b)
		var t Traffic
		if k.reply {
			t.Out = n
		} else {
			t.In = n
		}
		if !p.hasEndpoint(ref, k.ep) {
			// What expired moves to the port's; what still lives is
			// added below, and moves when it expires. What was counted
			// before the port owned the key is in either, expired first.
			if old, ok := c.retired[k]; ok {
				g, live := old.sub(b), n.sub(old.sub(b))
				if rest := b.sub(old); rest == (Count{}) {
					delete(c.before, k)
				} else {
					c.before[k] = rest
				}
				var gt Traffic
				if k.reply {
					gt.Out, t.Out = g, live
				} else {
					gt.In, t.In = g, live
				}
				gone := c.gone[ref]
				gone.add(gt)
				c.gone[ref] = gone
				delete(c.retired, k)
			}
			rd.counts[pi].Traffic.add(t)
			return
		}
		er := EndpointRef{Port: ref, Endpoint: k.ep}
		et := eps[er]
		et.add(t)
		eps[er] = et
		rd.counts[pi].Traffic.add(t)
	}
	for k, n := range c.seen {
		if r, ok := c.retired[k]; ok {
			n.add(r)
		}
		one(k, n)
	}
	for k, r := range c.retired {
		if _, ok := c.seen[k]; !ok {
			one(k, r)
		}
	}
	c.seenBefore, c.prev = nil, rd
	for ref, g := range c.gone {
		if p.services[ref.Service] == nil {
			delete(c.gone, ref)
			continue
		}
		if i, ok := rd.ports.at(ref); ok {
			rd.counts[i].Traffic.add(g)
		}
	}
	return eps
}

// hasEndpoint tells whether port ref has endpoint ep now.
func (p *Programmer) hasEndpoint(ref PortRef, ep netip.AddrPort) bool {
	svc := p.services[ref.Service]
	if svc == nil {
		return false
	}
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		if sp.Protocol != ref.Proto || sp.Port != ref.Port {
			continue
		}
		for _, e := range sp.Endpoints {
			if e.Addr() == ep.Addr() && e.Port == ep.Port() {
				return true
			}
		}
	}
	return false
}

// portOf returns the port of Service key that map element id is of: by
// its protocol, and its port or node port.
func (p *Programmer) portOf(key model.ServiceKey, id ruleset.ElemID) (PortRef, bool) {
	svc := p.services[key]
	if svc == nil {
		return PortRef{}, false
	}
	m, ek := id.Map(), id.Key()
	nodePort := m == ruleset.MapServiceNodePorts || m == ruleset.MapNoEndpointNodePorts
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		if sp.Protocol == ek.Proto && (nodePort && sp.NodePort == ek.Port || !nodePort && sp.Port == ek.Port) {
			return PortRef{Service: key, Proto: sp.Protocol, Port: sp.Port}, true
		}
	}
	return PortRef{}, false
}

// countedConfig returns the configuration (the layout chosen) and the
// firewall chains, for a reading of the counters.
func (p *Programmer) countedConfig() (ruleset.Config, map[string]PortRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg, p.firewallChainsLocked()
}

// firewallChainsLocked names the source-range chain of every programmed
// Service port that has one, with its port.
func (p *Programmer) firewallChainsLocked() map[string]PortRef {
	out := map[string]PortRef{}
	for key, svc := range p.services {
		if len(svc.SourceRanges()) == 0 || len(svc.LoadBalancerIPs()) == 0 {
			continue
		}
		for i := range svc.Ports {
			sp := &svc.Ports[i]
			out[ruleset.PortObject("fw", svc, sp)] = PortRef{Service: key, Proto: sp.Protocol, Port: sp.Port}
		}
	}
	return out
}
