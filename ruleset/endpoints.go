package ruleset

import (
	"encoding/binary"
	"iter"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Endpoint maps: how most Service ports choose an endpoint with no chain
// of their own.
//
// The kernel walks every chain of every table in the network namespace on
// each commit (to make the new rules visible: about 100 ns a chain), and
// takes a rule's expressions in one by one at a cold sync (looking each
// one's type up by name). A chain of hash-bucket rules per Service port
// made both grow with the cluster: at 100,000 Services, 100,000 chains
// walked by every commit (10–15 ms of kernel time for a one-endpoint
// change) and 32 expressions per Service at a cold sync (7 s of kernel
// time). Here a port's endpoints are elements instead, which the kernel
// stores without expressions and no commit walks:
//
//   - each shard has endpoint maps endpoints-0, endpoints-1, ... keyed by
//     destination (daddr . l4proto . dport, as the dispatch map), whose
//     data is an endpoint (address . port); endpoint i of a port is its
//     element in endpoints-i, for every destination of the port;
//     NodePorts have their own, nodeport-endpoints-i, keyed by l4proto .
//     dport;
//   - the dispatch map's element for the destination jumps to a chain the
//     shard shares among all ports with the same protocol and number of
//     endpoints N: pick-<protocol>-<N>, whose rule i sends the flows of
//     hash bucket i (modulo N, as the chains of a port did) to the
//     endpoint the packet's destination has in endpoints-i; its ext and
//     nodeport variants first ask for masquerade, as the port's ext chain
//     did.
//
// A flow goes to the same endpoint as it did through the port's own chain:
// the same hash, the same buckets. Ports with a traffic policy of Local,
// session affinity, a Maglev table or the PROXY protocol keep their chains
// (render.go); so do ports with more than MaxMapEndpoints endpoints, for
// which a shard would need as many maps. A port's elements, one per
// endpoint and destination, are kept in the tables' state as one Pick per
// destination: the number of endpoints and a fingerprint of them.

// MaxMapEndpoints bounds the endpoints of a port that chooses through the
// endpoint maps: a shard has a map per endpoint of its largest such port.
const MaxMapEndpoints = 64

// Prefixes of the shared objects' names. Service objects' names have a
// '/' and the skeleton's are fixed, so neither starts with these.
const (
	endpointMapPrefix         = "endpoints-"
	nodePortEndpointMapPrefix = "nodeport-endpoints-"
	pickChainPrefix           = "pick-"
)

// EndpointMap is the name of the endpoint map of bucket i, for NodePorts
// or for the other destinations.
func EndpointMap(nodePort bool, i int) string {
	if nodePort {
		return nodePortEndpointMapPrefix + strconv.Itoa(i)
	}
	return endpointMapPrefix + strconv.Itoa(i)
}

// endpointMapIndex parses an endpoint map's name: its bucket, and whether
// it is a NodePort one; ok is false for any other name.
func endpointMapIndex(name string) (i int, nodePort bool, ok bool) {
	rest, found := strings.CutPrefix(name, nodePortEndpointMapPrefix)
	if found {
		nodePort = true
	} else if rest, found = strings.CutPrefix(name, endpointMapPrefix); !found {
		return 0, false, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= MaxMapEndpoints || strconv.Itoa(n) != rest {
		return 0, false, false
	}
	return n, nodePort, true
}

// EndpointMapIndex is endpointMapIndex for the kernel package's readback.
func EndpointMapIndex(name string) (i int, nodePort bool, ok bool) { return endpointMapIndex(name) }

// Pick chain variants: for ClusterIPs, for external addresses (which ask
// for masquerade first), for NodePorts (likewise).
const (
	pickInternal = ""
	pickExternal = "ext-"
	pickNodePort = "nodeport-"
)

// pickChainName names the shared chain that chooses among n endpoints.
func pickChainName(variant string, p model.Protocol, n int) string {
	return pickChainPrefix + variant + p.String() + "-" + strconv.Itoa(n)
}

// Shared tells whether a chain or a set is one the Services of a shard
// share (a pick chain or an endpoint map): a Service's rendering lists
// those it uses, and a partial sync adds them when missing but never
// removes them; a full sync removes those no Service uses.
func Shared(name string) bool {
	if strings.HasPrefix(name, pickChainPrefix) {
		return true
	}
	_, _, ok := endpointMapIndex(name)
	return ok
}

// pickChainKey identifies a shared pick chain's rendering.
type pickChainKey struct {
	seed    uint32
	variant string
	proto   model.Protocol
	n       int
}

// pickChains holds the pick chains rendered so far: every Service of a
// cluster lists one or a few of them, and a chain, once rendered, is
// never changed, so all share one copy.
var pickChains sync.Map // pickChainKey → *Chain

// pickChain renders a shared pick chain.
func pickChain(cfg *Config, variant string, p model.Protocol, n int) *Chain {
	k := pickChainKey{cfg.hashSeed(), variant, p, n}
	if c, ok := pickChains.Load(k); ok {
		return c.(*Chain)
	}
	c, _ := pickChains.LoadOrStore(k, renderPickChain(cfg, variant, p, n))
	return c.(*Chain)
}

// renderPickChain renders a shared pick chain.
func renderPickChain(cfg *Config, variant string, p model.Protocol, n int) *Chain {
	c := &Chain{Name: pickChainName(variant, p, n)}
	if variant == pickExternal {
		c.Rules = []Rule{
			{Verdict{Kind: Jump, Chain: ChainMarkForMasquerade}},
			{Verdict{Kind: Goto, Chain: pickChainName(pickInternal, p, n)}},
		}
		return c
	}
	if variant == pickNodePort {
		c.Rules = append(c.Rules, Rule{Verdict{Kind: Jump, Chain: ChainMarkForMasquerade}})
	}
	nodePort := variant == pickNodePort
	for i := range n - 1 {
		c.Rules = append(c.Rules, Rule{
			HashBucket{Seed: cfg.hashSeed(), Modulus: uint32(n), Bucket: uint32(i)},
			DNATMap{Proto: p, NodePort: nodePort, Map: EndpointMap(nodePort, i)},
		})
	}
	// The last bucket is what the others left, as in a port's own chain.
	c.Rules = append(c.Rules, Rule{DNATMap{Proto: p, NodePort: nodePort, Map: EndpointMap(nodePort, n-1)}})
	return c
}

// endpointMapSets are the definitions of the endpoint maps, the
// NodePorts' second, made once.
var endpointMapSets = func() (out [2][MaxMapEndpoints]*Set) {
	for j, nodePort := range []bool{false, true} {
		shape := KeyAddrProtoPort
		if nodePort {
			shape = KeyProtoPort
		}
		for i := range MaxMapEndpoints {
			out[j][i] = &Set{Name: EndpointMap(nodePort, i), Map: true, Shape: shape, Endpoints: true}
		}
	}
	return out
}()

// endpointMapSet is the definition of an endpoint map.
func endpointMapSet(nodePort bool, i int) *Set {
	if nodePort {
		return endpointMapSets[1][i]
	}
	return endpointMapSets[0][i]
}

// Pick is a Service port's endpoints for one destination: element i of
// endpoint map i (of the NodePort maps when NodePort is set) under Key is
// To[i].
type Pick struct {
	NodePort bool
	Key      Key
	To       []netip.AddrPort
}

// pickBase is the name under which the tables' state keeps picks.
func pickBase(nodePort bool) string {
	if nodePort {
		return "nodeport-endpoints"
	}
	return "endpoints"
}

// ID identifies the pick: by the maps it is in and its key.
func (p *Pick) ID() ElemID { return NewElemID(pickBase(p.NodePort), p.Key) }

// Info is what the tables' state keeps of the pick.
func (p *Pick) Info() PickInfo { return PickInfoOf(p.To) }

// AppendElements appends the pick's elements, one per endpoint, to dst.
func (p *Pick) AppendElements(dst []Element) []Element {
	for i, to := range p.To {
		dst = append(dst, Element{Map: EndpointMap(p.NodePort, i), Key: p.Key, To: to})
	}
	return dst
}

// PickInfo is what the tables' state keeps of the elements of one
// destination in the endpoint maps: how many there are (in maps 0 to N-1)
// and a fingerprint of their endpoints in order.
type PickInfo struct {
	FP uint64
	N  uint32
}

// PickInfoOf is the info of the endpoints to, in order.
func PickInfoOf(to []netip.AddrPort) PickInfo {
	h := uint64(fnvOffset64)
	var b [18]byte
	for _, ap := range to {
		a := ap.Addr().As16()
		copy(b[:], a[:])
		binary.BigEndian.PutUint16(b[16:], ap.Port())
		h = fnv64a(h, b[:])
	}
	return PickInfo{FP: h, N: uint32(len(to))}
}

// PickID is the state's identity of the elements under key in the
// endpoint maps (the NodePort ones when nodePort is set).
func PickID(nodePort bool, k Key) ElemID { return NewElemID(pickBase(nodePort), k) }

// PickIsNodePort tells whether a pick's identity is of the NodePort maps.
func PickIsNodePort(id ElemID) bool { return id.Map() == pickBase(true) }

// Picks is what a table's state keeps of its picks. The zero Picks is
// empty and ready to use.
type Picks struct {
	m        elemMap[PickInfo]
	elements int // the picks' elements, their Ns summed
}

// Len is the number of picks.
func (p *Picks) Len() int { return p.m.len() }

// Elements is the number of the picks' elements in the endpoint maps.
func (p *Picks) Elements() int { return p.elements }

// Get returns the info of pick id, and whether the table holds it.
func (p *Picks) Get(id ElemID) (PickInfo, bool) { return p.m.get(elem(id)) }

// Put records pick id.
func (p *Picks) Put(id ElemID, info PickInfo) {
	if old, ok := p.m.get(elem(id)); ok {
		p.elements -= int(old.N)
	}
	p.elements += int(info.N)
	p.m.put(elem(id), info)
}

// Delete forgets pick id.
func (p *Picks) Delete(id ElemID) {
	if old, ok := p.m.get(elem(id)); ok {
		p.elements -= int(old.N)
		p.m.del(elem(id))
	}
}

// All yields every pick, in no particular order. The loop may delete the
// pick it is given.
func (p *Picks) All() iter.Seq2[ElemID, PickInfo] {
	return func(yield func(ElemID, PickInfo) bool) {
		for fe, v := range p.m.all() {
			if !yield(fe.id, v) {
				return
			}
		}
	}
}

// Clone returns a copy of p.
func (p *Picks) Clone() Picks { return Picks{p.m.clone(), p.elements} }

// PickState is a pick as a committed plan records it.
type PickState struct {
	ID   ElemID
	Info PickInfo
}

// DNATMap sends the packet to the endpoint its destination has in an
// endpoint map: looked up by destination address, protocol and port (or
// with NodePort, by protocol and port). It carries its protocol because a
// port rewrite needs a transport protocol match first.
type DNATMap struct {
	Proto    model.Protocol
	NodePort bool
	Map      string
}

// AppendText writes "meta l4proto tcp dnat ip to ip daddr . meta l4proto .
// th dport map @endpoints-0" (for NodePorts "... to meta l4proto . th dport
// map ...").
func (d DNATMap) AppendText(b []byte, f Family) []byte {
	b = append(b, "meta l4proto "...)
	b = append(b, d.Proto.String()...)
	b = append(b, " dnat "...)
	b = append(b, f.String()...)
	b = append(b, " to "...)
	if !d.NodePort {
		b = append(b, f.String()...)
		b = append(b, " daddr . "...)
	}
	b = append(b, "meta l4proto . th dport map @"...)
	return append(b, d.Map...)
}

// Encode matches the protocol, loads the key as VmapDispatch does, looks
// it up into the registers the translation reads (the address, then the
// port in the next 32-bit word for IPv4, the next register for IPv6) and
// translates to them.
func (d DNATMap) Encode(f Family, s bc.Sink) {
	fam, portReg := uint32(IPv4), uint32(bc.Reg32a)
	if f == IPv6 {
		fam, portReg = uint32(IPv6), bc.Reg2
	}
	matchL4Proto(s, d.Proto)
	shape := KeyAddrProtoPort
	if d.NodePort {
		shape = KeyProtoPort
	}
	loadDispatchKey(f, shape, s)
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: d.Map, Dreg: bc.Reg1, HasDreg: true})
	s.NAT(bc.NAT{Type: bc.NATDest, Family: fam, RegAddr: bc.Reg1, RegProto: portReg, Flags: bc.NATSpecified})
}

// mapped tells whether a port of svc chooses its endpoints through the
// endpoint maps: its endpoints are the same for every destination and
// every client, and chosen by hash (see the top of this file).
func mapped(cfg *Config, svc *model.Service, p *model.ServicePort, maglev bool, sets model.EndpointSets) bool {
	return !maglev && svc.AffinityTimeout() == 0 && !svc.InternalLocal && !svc.ExternalLocal &&
		!(cfg.ProxyPort != 0 && svc.Proxied(p)) && len(sets.Cluster) > 0 && len(sets.Cluster) <= MaxMapEndpoints
}

// renderMapped renders a port that chooses through the endpoint maps: the
// shared chains and maps it uses, its dispatch elements, jumping to them,
// and its picks.
func renderMapped(cfg *Config, svc *model.Service, p *model.ServicePort, fr *Fragment, hairpin *addrSet, f Family,
	eps []model.Endpoint, clusterIPs, external []netip.Addr, hasNodePort bool) {
	n := len(eps)
	to := make([]netip.AddrPort, n)
	for i, e := range eps {
		to[i] = e.AddrPort()
		hairpin.add(f, to[i].Addr())
	}
	seen := make(map[Key]bool, len(clusterIPs)+len(external))
	pick := func(nodePort bool, k Key) bool {
		if !nodePort {
			if seen[k] {
				return false // a Service listing a destination twice keeps its first
			}
			seen[k] = true
		}
		fr.Picks = append(fr.Picks, Pick{NodePort: nodePort, Key: k, To: to})
		return true
	}
	maps := func(nodePort bool) {
		for i := range n {
			fr.Sets = append(fr.Sets, endpointMapSet(nodePort, i))
		}
	}
	key := func(a netip.Addr) Key { return Key{Addr: a, Proto: p.Protocol, Port: p.Port} }
	// The verdicts name the shared chains by the chains' own names: one
	// string for all the Services' elements.
	internalChain := pickChain(cfg, pickInternal, p.Protocol, n)
	if len(clusterIPs) > 0 || len(external) > 0 {
		maps(false)
		fr.Chains = append(fr.Chains, internalChain)
	}
	internal := Verdict{Kind: Goto, Chain: internalChain.Name}
	for _, a := range clusterIPs {
		if pick(false, key(a)) {
			fr.Elements = append(fr.Elements, Element{Map: MapServiceIPs, Key: key(a), Verdict: internal})
		}
	}
	if len(external) > 0 {
		c := pickChain(cfg, pickExternal, p.Protocol, n)
		fr.Chains = append(fr.Chains, c)
		ext := Verdict{Kind: Goto, Chain: c.Name}
		for _, a := range external {
			if pick(false, key(a)) {
				fr.Elements = append(fr.Elements, Element{Map: MapServiceIPs, Key: key(a), Verdict: ext})
			}
		}
	}
	if hasNodePort {
		maps(true)
		c := pickChain(cfg, pickNodePort, p.Protocol, n)
		fr.Chains = append(fr.Chains, c)
		k := Key{Proto: p.Protocol, Port: p.NodePort}
		pick(true, k)
		fr.Elements = append(fr.Elements, Element{Map: MapServiceNodePorts, Key: k, Verdict: Verdict{Kind: Goto, Chain: c.Name}})
	}
}

// dispatchID is the dispatch map element whose winner owns a pick: the
// Service whose claim on the destination wins also fills its endpoints.
func dispatchID(p *Pick) ElemID { return dispatchOf(p.NodePort, p.Key) }

// dispatchOf is the dispatch map element of a destination.
func dispatchOf(nodePort bool, k Key) ElemID {
	if nodePort {
		return NewElemID(MapServiceNodePorts, k)
	}
	return NewElemID(MapServiceIPs, k)
}

// pickOfDispatch is the pick identity for a dispatch element's id; ok is
// false when the element is not of a dispatch map.
func pickOfDispatch(id ElemID) (ElemID, bool) {
	switch id.Map() {
	case MapServiceIPs:
		return PickID(false, id.Key()), true
	case MapServiceNodePorts:
		return PickID(true, id.Key()), true
	}
	return ElemID{}, false
}

// reserve makes room for the picks of a batch that fills an empty table.
func (p *Picks) reserve(add []PickState) {
	counts := map[setID]int{}
	for i := range add {
		counts[setID{set: add[i].ID.set}]++
	}
	for id, n := range counts {
		p.m.reserve(id, n)
	}
}

// PickOf is the pick that services, as programmed with the claims of
// book, put in family f's tables under pick id: the one of the Service
// whose claim on the destination wins, if it chooses through the endpoint
// maps; nil otherwise.
func (ts *Tables) PickOf(book *Claims, services map[model.ServiceKey]*model.Service, f Family, id ElemID) *Pick {
	nodePort, k := PickIsNodePort(id), id.Key()
	cs := book.verdicts.at(famElem{f, dispatchOf(nodePort, k)})
	if cs == nil {
		return nil
	}
	svc := services[cs.winner().svc]
	if svc == nil {
		return nil
	}
	r := ts.Render(svc)
	return r.Of(f).PickFor(nodePort, k)
}

// PickFor is fr's pick for a destination (a NodePort's when nodePort is
// set), or nil when the destination does not choose through the endpoint
// maps.
func (fr *Fragment) PickFor(nodePort bool, k Key) *Pick {
	for i := range fr.Picks {
		if p := &fr.Picks[i]; p.NodePort == nodePort && p.Key == k {
			return p
		}
	}
	return nil
}

// compareIDs orders element identities by set, then key.
func compareIDs(a, b ElemID) int {
	if c := strings.Compare(a.Map(), b.Map()); c != 0 {
		return c
	}
	return a.Key().compare(b.Key())
}

// pickFP is the fingerprint of the endpoints dispatch element e of fr
// sends to through the endpoint maps, and zero for an element that does
// not go to a pick chain.
func pickFP(fr *Fragment, e *Element) uint64 {
	if e.Verdict.Kind != Goto || !strings.HasPrefix(e.Verdict.Chain, pickChainPrefix) {
		return 0
	}
	if p := fr.PickFor(e.Map == MapServiceNodePorts, e.Key); p != nil {
		return p.Info().FP
	}
	return 0
}

// sharedSet tells whether shared map s is met for the first time in this
// plan, and marks it met.
func (d *differ) sharedSet(s *Set) bool {
	if !Shared(s.Name) {
		return true
	}
	return d.firstShared(s)
}

// sharedChain tells whether shared chain c is met for the first time in
// this plan, and marks it met.
func (d *differ) sharedChain(c *Chain) bool { return d.firstShared(c) }

func (d *differ) firstShared(o any) bool {
	if d.sharedSeen[o] {
		return false
	}
	if d.sharedSeen == nil {
		d.sharedSeen = map[any]bool{}
	}
	d.sharedSeen[o] = true
	return true
}

// sharedPlans are the shared chains' plans, per family: the rules'
// fingerprints, computed once.
var sharedPlans sync.Map // sharedPlanKey → *ChainPlan

type sharedPlanKey struct {
	f Family
	c *Chain
}

// sharedPlan is the plan of shared chain c in family f.
func sharedPlan(f Family, c *Chain) *ChainPlan {
	k := sharedPlanKey{f, c}
	if p, ok := sharedPlans.Load(k); ok {
		return p.(*ChainPlan)
	}
	p := PlanChain(f, c, nil)
	v, _ := sharedPlans.LoadOrStore(k, &p)
	return v.(*ChainPlan)
}
