package ruleset

import bc "github.com/nftgate/nftgate/ruleset/bytecode"

// Traffic to a Service address that nftgate does not translate
// (Config.Unserved).
//
// A LoadBalancer IP or external IP is routed to the gateway (BGP, ARP),
// and the gateway's own route for it is usually its default route, back
// to the router. A packet to such an address that no Service port takes
// (a port no Service has, an ICMP echo) or that conntrack takes for
// invalid (a flag combination no connection makes, a bad checksum, a
// segment outside its connection's window, which is never translated) is
// then routed back to the router, which routes it to the gateway again,
// until its TTL runs out: each such packet crosses the link some thirty
// times, which a sender can use to multiply its traffic. kube-proxy rejects
// ClusterIPs on ports no Service has for the same reason, and Calico added
// its service loop prevention for external and LoadBalancer IPs.
//
// SetServiceAddrs holds the LoadBalancer and external IPs nftgate serves;
// in the forward hook, after the translations, a packet to one of them
// was not translated: a new one is rejected as a closed port would be (or
// dropped), an invalid one is dropped (answering it could reset a live
// connection of its client).

// SetServiceAddrs holds every LoadBalancer IP and external IP of the
// Services programmed.
const SetServiceAddrs = "service-addresses"

// Unserved is what becomes of a packet to a Service address that no
// Service port translated.
type Unserved uint8

// What becomes of untranslated traffic to a Service address.
const (
	// UnservedReject: a new connection is rejected (ICMP port
	// unreachable), an invalid packet dropped.
	UnservedReject Unserved = iota
	// UnservedDrop: both are dropped.
	UnservedDrop
	// UnservedRoute: both are routed like any packet, as before.
	UnservedRoute
)

// ChainUnserved answers, with UnservedReject, what the forward hook found
// sent to a Service address untranslated.
const ChainUnserved = "unserved"

// unservedRules are the forward hook's rule for untranslated traffic to a
// Service address (the state is tested first: an established packet, the
// most of them, pays one test), and the chain it jumps to.
func unservedRules(cfg *Config) ([]Rule, []*Chain) {
	match := Rule{MatchCtNewOrInvalid{}, MatchAddrInSet{Dir: Dst, Set: SetServiceAddrs}}
	switch cfg.Unserved {
	case UnservedRoute:
		return nil, nil
	case UnservedDrop:
		return []Rule{append(match, Verdict{Kind: Drop})}, nil
	}
	return []Rule{append(match, Verdict{Kind: Jump, Chain: ChainUnserved})}, []*Chain{{Name: ChainUnserved, Rules: []Rule{
		{MatchCtInvalid{}, Verdict{Kind: Drop}},
		{Verdict{Kind: Jump, Chain: ChainReject}},
	}}}
}

// MatchCtNewOrInvalid matches the packet that opens a connection and one
// conntrack could not track.
type MatchCtNewOrInvalid struct{}

// AppendText writes "ct state invalid,new".
func (MatchCtNewOrInvalid) AppendText(b []byte, _ Family) []byte {
	return append(b, "ct state invalid,new"...)
}

// Encode tests the connection state's new and invalid bits.
func (MatchCtNewOrInvalid) Encode(_ Family, s bc.Sink) {
	ctStateBit(s, bc.CtStateNew|bc.CtStateInvalid)
}

// MatchCtInvalid matches a packet conntrack could not track: it is never
// translated.
type MatchCtInvalid struct{}

// AppendText writes "ct state invalid".
func (MatchCtInvalid) AppendText(b []byte, _ Family) []byte { return append(b, "ct state invalid"...) }

// Encode tests the connection state's invalid bit.
func (MatchCtInvalid) Encode(_ Family, s bc.Sink) { ctStateBit(s, bc.CtStateInvalid) }
