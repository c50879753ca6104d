package statesync

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// IP protocol numbers.
const (
	protoTCP  Proto = 6
	protoUDP  Proto = 17
	protoSCTP Proto = 132
)

// Bounds of a replica's timeout, in seconds, by protocol: the kernel's
// longest default timeout of each (TCP and SCTP established: 5 days; UDP
// stream: 2 minutes, with room for a raised sysctl).
var maxTimeout = map[Proto]uint32{
	protoTCP:  5 * 24 * 3600,
	protoSCTP: 5 * 24 * 3600,
	protoUDP:  600,
}

// Reasons an entry from a peer is refused (the reason label of
// nftgate_statesync_entries_refused_total).
const (
	RefusedDecode      = "decode"      // the batch does not decode
	RefusedProtocol    = "protocol"    // not TCP, UDP or SCTP
	RefusedDestination = "destination" // not a Service address, protocol and port this gateway serves
	RefusedEndpoint    = "endpoint"    // the reply source is not an endpoint of that Service port
	RefusedReplyDst    = "reply_destination"
	RefusedTimeout     = "timeout" // beyond the protocol's bound
	RefusedWrite       = "write"   // the kernel refused it
	// RefusedOwn: this gateway is the flow's origin itself (the two saw
	// its first packets each, e.g. while an address moved): its own entry
	// is neither overwritten nor deleted by a peer's.
	RefusedOwn = "own_flow"
)

// Reasons one of this gateway's own entries is not sent to its peers (the
// reason label of nftgate_statesync_flows_not_replicated_total). Such a
// flow does not survive this gateway's failure.
const (
	// NotReplicatedNodePort: a flow to a node port on one of this
	// gateway's own addresses. The address does not move to a peer when
	// the gateway fails (only Service and masquerade addresses float), so
	// no packet of the flow could reach a replica; the peers would refuse
	// it anyway (RefusedDestination).
	NotReplicatedNodePort = "node_port"
	// NotReplicatedNotService: a translated flow to no Service address
	// this gateway serves (another rule's NAT, or a Service gone since).
	NotReplicatedNotService = "not_a_service"
)

// Policy decides which entries a peer may write into this gateway's
// kernel: only flows this gateway would have translated the same way
// itself. It follows the sync loop (Observe), as the conntrack cleaner
// does, reading the rules of each changed Service (ruleset.Translations).
// Its methods are safe for concurrent use.
type Policy struct {
	rcfg ruleset.Config

	mu   sync.RWMutex
	masq map[netip.Addr]bool
	// primed is closed by the first sync observed: before it the Policy
	// knows no Service, and would refuse every entry.
	primed     chan struct{}
	primedOnce sync.Once
	bySvc      map[model.ServiceKey]map[ruleset.Destination][]netip.AddrPort
	dests      map[ruleset.Destination]map[model.ServiceKey][]netip.AddrPort
	// nodePorts counts the Services of each node port (address left out:
	// a node port is on every address of the gateway).
	svcNodePorts map[model.ServiceKey][]ruleset.Destination
	nodePorts    map[ruleset.Destination]int
}

// NewPolicy returns a Policy for the ruleset rendered with rcfg (its Node
// decides the Local-policy endpoints), with the gateway set's masquerade
// addresses.
func NewPolicy(rcfg ruleset.Config, masquerade []netip.Addr) *Policy {
	p := &Policy{rcfg: rcfg, bySvc: map[model.ServiceKey]map[ruleset.Destination][]netip.AddrPort{},
		dests:        map[ruleset.Destination]map[model.ServiceKey][]netip.AddrPort{},
		svcNodePorts: map[model.ServiceKey][]ruleset.Destination{}, nodePorts: map[ruleset.Destination]int{},
		primed: make(chan struct{})}
	p.SetMasquerade(masquerade)
	return p
}

// SetMasquerade replaces the gateway set's masquerade addresses.
func (p *Policy) SetMasquerade(addrs []netip.Addr) {
	m := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		m[a.Unmap()] = true
	}
	p.mu.Lock()
	p.masq = m
	p.mu.Unlock()
}

// Observe follows a sync: the destinations of the changed Services are
// read again from their rules. It is a loop.Syncer observer.
func (p *Policy) Observe(ev loop.Event) {
	if ev.Err != nil {
		return // nothing changed in the kernel
	}
	for k, svc := range ev.After {
		p.update(k, svc)
	}
	p.primedOnce.Do(func() { close(p.primed) })
}

// Primed is closed once the Policy has followed a sync (Observe without
// an error): from then on it knows the Services this gateway serves.
func (p *Policy) Primed() <-chan struct{} { return p.primed }

// update replaces Service k's destinations with those svc (nil: none)
// translates to.
func (p *Policy) update(k model.ServiceKey, svc *model.Service) {
	var mine map[ruleset.Destination][]netip.AddrPort
	var nodePorts []ruleset.Destination
	if svc != nil {
		rendered := ruleset.RenderService(&p.rcfg, svc)
		ruleset.Translations(&rendered, func(d ruleset.Destination, eps []netip.AddrPort) {
			// A node port is any of the gateway's addresses: a flow to
			// a peer's own address cannot move here, so only Service
			// addresses are synced.
			if d.NodePort {
				nodePorts = append(nodePorts, nodePortOf(d.Family, d.Proto, d.Port))
				return
			}
			if len(eps) == 0 {
				return
			}
			if mine == nil {
				mine = map[ruleset.Destination][]netip.AddrPort{}
			}
			mine[d] = append(mine[d], eps...)
		})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for d := range p.bySvc[k] {
		delete(p.dests[d], k)
		if len(p.dests[d]) == 0 {
			delete(p.dests, d)
		}
	}
	delete(p.bySvc, k)
	for _, d := range p.svcNodePorts[k] {
		if p.nodePorts[d]--; p.nodePorts[d] == 0 {
			delete(p.nodePorts, d)
		}
	}
	delete(p.svcNodePorts, k)
	if len(nodePorts) > 0 {
		p.svcNodePorts[k] = nodePorts
		for _, d := range nodePorts {
			p.nodePorts[d]++
		}
	}
	if mine == nil {
		return
	}
	p.bySvc[k] = mine
	for d, eps := range mine {
		if p.dests[d] == nil {
			p.dests[d] = map[model.ServiceKey][]netip.AddrPort{}
		}
		p.dests[d][k] = eps
	}
}

// Check tells why e may not be written here ("" when it may).
func (p *Policy) Check(e *Entry) string {
	bound, ok := maxTimeout[e.Proto]
	if !ok {
		return RefusedProtocol
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	svcs := p.dests[destinationOf(e)]
	if len(svcs) == 0 {
		return RefusedDestination
	}
	found := false
	for _, eps := range svcs {
		if slices.Contains(eps, e.Reply.Src) {
			found = true
			break
		}
	}
	if !found {
		return RefusedEndpoint
	}
	rd := e.Reply.Dst
	if !p.masq[rd.Addr().Unmap()] && rd != e.Orig.Src {
		return RefusedReplyDst
	}
	if e.Timeout > bound {
		return RefusedTimeout
	}
	return ""
}

// CheckOwn tells why this gateway's own entry e is not sent to the peers
// ("" when it is): a flow to a node port (NotReplicatedNodePort) or to no
// Service address served here (NotReplicatedNotService). Until the Policy
// has followed a sync it knows no Service and sends everything.
func (p *Policy) CheckOwn(e *Entry) string {
	select {
	case <-p.primed:
	default:
		return ""
	}
	d := destinationOf(e)
	p.mu.RLock()
	defer p.mu.RUnlock()
	if len(p.dests[d]) > 0 {
		return ""
	}
	if p.nodePorts[nodePortOf(d.Family, d.Proto, d.Port)] > 0 {
		return NotReplicatedNodePort
	}
	return NotReplicatedNotService
}

func nodePortOf(f ruleset.Family, proto model.Protocol, port uint16) ruleset.Destination {
	return ruleset.Destination{Family: f, Proto: proto, Port: port, NodePort: true}
}

// CheckDelete tells why a peer may not delete the replica of e here: only
// entries of a destination this gateway serves are touched.
func (p *Policy) CheckDelete(e *Entry) string {
	if _, ok := maxTimeout[e.Proto]; !ok {
		return RefusedProtocol
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if len(p.dests[destinationOf(e)]) == 0 {
		return RefusedDestination
	}
	return ""
}

func destinationOf(e *Entry) ruleset.Destination {
	a := e.Orig.Dst.Addr().Unmap()
	return ruleset.Destination{Family: ruleset.Of(a), Proto: model.Protocol(e.Proto), Addr: a, Port: e.Orig.Dst.Port()}
}
