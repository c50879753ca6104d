package ruleset

import (
	"net/netip"

	"github.com/nftgate/nftgate/model"
)

// Destination is where new flows of a Service arrive: an address, protocol
// and port of the service maps, or a node port of one family (any local
// address; Addr unset).
type Destination struct {
	Family   Family
	Proto    model.Protocol
	Addr     netip.Addr
	Port     uint16
	NodePort bool
}

// Translations reads a rendered Service (RenderService's result) and calls
// visit once for each destination it dispatches, with the endpoints its
// rules may translate a new flow to it to: every DNAT reachable from the
// destination's verdict. A destination that rejects or drops new flows (no
// usable endpoint) has none. This is how the rules behave, read from the
// rules themselves, for what follows a ruleset's changes (stale conntrack
// flows) without knowing how Services become rules.
func Translations(out *ByFamily, visit func(Destination, []netip.AddrPort)) {
	for _, f := range Families {
		fr := out.Of(f)
		if fr.Empty() {
			continue
		}
		var chains map[string]*Chain // made when a verdict needs one
		var eps []netip.AddrPort
		for _, e := range fr.Elements {
			d := Destination{Family: f, Proto: e.Key.Proto, Addr: e.Key.Addr, Port: e.Key.Port}
			switch e.Map {
			case MapServiceIPs, MapNoEndpointServices:
			case MapServiceNodePorts, MapNoEndpointNodePorts:
				d.NodePort = true
			default:
				continue // not a destination: sets, source-range guards
			}
			if chains == nil && (e.Verdict.Kind == Goto || e.Verdict.Kind == Jump) {
				chains = make(map[string]*Chain, len(fr.Chains))
				for _, c := range fr.Chains {
					chains[c.Name] = c
				}
			}
			// The endpoints the destination has in the endpoint maps,
			// if it chooses through them.
			var pick []netip.AddrPort
			if p := fr.PickFor(d.NodePort, e.Key); p != nil {
				pick = p.To
			}
			eps = appendReached(eps[:0], chains, e.Verdict, pick, map[string]bool{})
			visit(d, eps)
		}
	}
}

// appendReached appends the DNAT targets reachable through verdict v within
// the chains of one Service (the skeleton's chains, such as the reject or
// masquerade marking chains, translate nothing).
// pick is the destination's endpoints in the endpoint maps, which a DNAT
// through map i translates to the i-th of.
func appendReached(out []netip.AddrPort, chains map[string]*Chain, v Verdict, pick []netip.AddrPort, seen map[string]bool) []netip.AddrPort {
	if v.Kind != Goto && v.Kind != Jump {
		return out
	}
	c, ok := chains[v.Chain]
	if !ok || seen[v.Chain] {
		return out
	}
	seen[v.Chain] = true
	for _, r := range c.Rules {
		for _, s := range r {
			switch s := s.(type) {
			case DNAT:
				out = append(out, s.To)
			case DNATMap:
				if i, _, ok := endpointMapIndex(s.Map); ok && i < len(pick) {
					out = append(out, pick[i])
				}
			case Verdict:
				out = appendReached(out, chains, s, pick, seen)
			}
		}
	}
	return out
}
