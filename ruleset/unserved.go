package ruleset

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Traffic to a Service address that nftgate does not translate
// (Config.Unserved).
//
// A LoadBalancer IP or external IP is routed to the gateway (BGP, ARP),
// and the gateway's own route for it is usually its default route, back
// to the router. A packet to such an address that no Service port takes
// (a port no Service has, an ICMP echo when not answered) or that
// conntrack takes for invalid (a flag combination no connection makes, a
// bad checksum, a segment outside its connection's window, which is never
// translated) is then routed back to the router, which routes it to the
// gateway again, until its TTL runs out: each such packet crosses the link
// some thirty times, which a sender can use to multiply its traffic.
// kube-proxy rejects ClusterIPs on ports no Service has; Calico added its
// service loop prevention for external and LoadBalancer IPs.
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

// ChainForwardNew holds the forward hook's rules for a connection's first
// packet (the Services without endpoints, the ClusterIPs' other ports, the
// Service addresses' unserved traffic) and, unless UnservedRoute, for a
// packet conntrack could not track: the base chain tests the state once,
// and an established packet, the most of them, pays that one test (it paid
// one for each of the rules when they sat in the base chain).
const ChainForwardNew = "forward-new"

// forwardEntry is the base chain's rule that sends packets to
// ChainForwardNew.
func forwardEntry(cfg *Config) Rule {
	if cfg.Unserved == UnservedRoute {
		return Rule{MatchCtNew{}, Verdict{Kind: Jump, Chain: ChainForwardNew}}
	}
	return Rule{MatchCtNewOrInvalid{}, Verdict{Kind: Jump, Chain: ChainForwardNew}}
}

// forwardNewRules are ChainForwardNew's rules: an invalid packet to a
// Service address or a ClusterIP dropped (a ClusterIP's new connections
// on ports no Service has are rejected by the checks; routed to the
// gateway from outside, its invalid packets would loop the same way) and
// any other returned, then the checks of a new connection, then (unless
// UnservedRoute) its unserved traffic.
func forwardNewRules(cfg *Config, checks ...Rule) []Rule {
	dst := MatchAddrInSet{Dir: Dst, Set: SetServiceAddrs}
	var rules []Rule
	if cfg.Unserved != UnservedRoute {
		rules = append(rules,
			Rule{MatchCtInvalid{}, dst, Verdict{Kind: Drop}},
			Rule{MatchCtInvalid{}, MatchAddrInSet{Dir: Dst, Set: SetClusterIPs}, Verdict{Kind: Drop}},
			Rule{MatchCtInvalid{}, Verdict{Kind: Return}})
	}
	rules = append(rules, checks...)
	switch cfg.Unserved {
	case UnservedDrop:
		rules = append(rules, Rule{dst, Verdict{Kind: Drop}})
	case UnservedReject:
		rules = append(rules, Rule{dst, Verdict{Kind: Jump, Chain: ChainReject}})
	}
	return rules
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

// An ICMP echo request to a Service address is answered by the gateway, as
// a host answers one to its own address (and kube-proxy's IPVS mode, whose
// addresses sit on a local device, answers it): operators ping a
// LoadBalancer IP to see that it reaches a gateway, and a monitoring probe
// does. Redirected to the gateway in the NAT prerouting hook, the request
// is delivered to the gateway's own stack, which answers; conntrack
// translates the answer's source back to the Service address. NAT chains
// see a flow's first packet only, so the rule costs every other new
// connection one protocol test. Config.ServiceEchoOff leaves echo requests
// to the unserved traffic's rules.

// The protocols of an echo request.
const (
	ProtoICMP   model.Protocol = 1
	ProtoICMPv6 model.Protocol = 58
)

// echoRules are the NAT prerouting rules that answer echo requests to the
// Service addresses, and echoSets the set they need.
func echoRules(cfg *Config) []Rule {
	if cfg.ServiceEchoOff {
		return nil
	}
	return []Rule{EchoRule(cfg)}
}

func echoSets(cfg *Config) []*Set {
	if cfg.ServiceEchoOff {
		return nil
	}
	return []*Set{EchoSourcesSet()}
}

// EchoRule redirects an echo request to a Service address to the gateway,
// up to the configured new echo flows a second from one source and from
// all together (Config.EchoSourceRate and EchoRate: by default
// DefaultEchoSourceRate and DefaultEchoRate). The source's limit comes
// first, so that a source beyond its own rate takes nothing from the
// others'.
func EchoRule(cfg *Config) Rule {
	all, one := cfg.echoRates()
	return Rule{MatchEchoRequest{}, MatchAddrInSet{Dir: Dst, Set: SetServiceAddrs},
		LimitBySource{Set: SetEchoSources, Rate: uint64(one), Burst: one},
		LimitRate{Rate: uint64(all), Burst: all}, RedirectHere{}}
}

// echoRates are the echo flows a second answered from all sources and
// from one, the defaults where the configuration gives none.
func (c *Config) echoRates() (all, one uint32) {
	all, one = c.EchoRate, c.EchoSourceRate
	if all == 0 {
		all = DefaultEchoRate
	}
	if one == 0 {
		one = DefaultEchoSourceRate
	}
	return all, one
}

// EchoSourcesSet is the set of the sources' limits, filled by the packet
// path.
func EchoSourcesSet() *Set {
	return &Set{Name: SetEchoSources, Timeout: EchoSourceTimeout, Size: EchoSources}
}

// DefaultEchoRate bounds the echo flows to Service addresses that the
// gateway begins to answer, a second, all together (and as many more at
// once), unless Config.EchoRate says otherwise. An echo flow is a source
// and an identifier (one ping process), one
// conntrack entry that lives 30 s past its last request: NAT chains see
// its first request only, and the rest are answered as the gateway answers
// a ping to its own address. So a flood of requests with ever new
// identifiers or sources holds at most about 30 × the rate entries. A
// flow beyond the rate is unserved traffic (rejected by default, which the
// kernel's ICMP rate limit bounds in turn). Operators' pings and a
// monitoring system's are far below it; one source's are bounded lower
// (DefaultEchoSourceRate).
const DefaultEchoRate = 1000

// A source (an IPv4 address, an IPv6 /64: what one host or subscriber
// holds) begins at most DefaultEchoSourceRate echo flows a second (and as
// many more at once) unless Config.EchoSourceRate says otherwise, so that
// one source flooding with new identifiers cannot take the whole rate
// from the others' pings: with the global limit alone, another source's
// requests right after such a flood went unanswered (1 of 50 answered, e2e
// TestEdgePingServiceAddress). A monitoring system pinging a hundred
// Service addresses a second from one host stays within the default.
// SetEchoSources holds each recent source with its limit's credit; an
// element expires EchoSourceTimeout after its source's last new flow (by
// then its credit is whole again, whatever the rate: the credit is a
// second's worth, so nothing is forgotten that the limit needs). The set
// holds at most EchoSources sources: a flood from more sources than that
// in EchoSourceTimeout (spoofed, 8,000 a second)
// fills it, and a source not in it is then not answered until elements
// expire; under the global limit alone, such a flood takes nearly all of
// the rate anyway.
const (
	SetEchoSources        = "echo-sources"
	DefaultEchoSourceRate = 100
	EchoSourceTimeout     = 2 * time.Second
	EchoSources           = 16384
	EchoSourcePrefix6     = 64
)

// echoSourceMask6 is the mask of an IPv6 source's EchoSourcePrefix6.
func echoSourceMask6() [16]byte {
	var mask [16]byte
	for i := range EchoSourcePrefix6 {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return mask
}

// LimitBySource matches while the packet's source (its IPv6 /64) has sent
// the rule at most Rate packets a second, with Burst packets of credit:
// each source's credit is an element of the dynamic Set, made on its first
// packet (with the set full, the packet does not match).
type LimitBySource struct {
	Set   string
	Rate  uint64
	Burst uint32
}

// AppendText writes "update @set { ip saddr limit rate 100/second burst 100
// packets }" ("ip6 saddr & ffff:ffff:ffff:ffff::").
func (l LimitBySource) AppendText(b []byte, f Family) []byte {
	b = fmt.Appendf(b, "update @%s { %s saddr ", l.Set, f)
	if f == IPv6 {
		b = append(b, "& "...)
		b = netip.AddrFrom16(echoSourceMask6()).AppendTo(b)
		b = append(b, ' ')
	}
	b = LimitRate{Rate: l.Rate, Burst: l.Burst}.AppendText(b, f)
	return append(b, " }"...)
}

// Encode loads the source (masked to its /64), and updates the set with it
// and the limit as the element's expression.
func (l LimitBySource) Encode(f Family, s bc.Sink) {
	n := f.AddrLen()
	s.Payload(loadAddr(f, Src, bc.Reg1, n))
	if f == IPv6 {
		mask := echoSourceMask6()
		s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: n, Mask: bc.Bytes(mask[:]...), Xor: bc.Zero(int(n))})
	}
	s.Dynset(bc.Dynset{Sreg: bc.Reg1, Op: bc.DynsetUpdate, Set: l.Set, Limit: bc.Limit{Rate: l.Rate, Burst: l.Burst}})
}

// LimitRate matches while the rule's packets come at no more than Rate a
// second, with Burst packets of credit; a packet beyond does not match.
type LimitRate struct {
	Rate  uint64
	Burst uint32
}

// AppendText writes "limit rate 1000/second burst 1000 packets".
func (l LimitRate) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "limit rate %d/second burst %d packets", l.Rate, l.Burst)
}

// Encode writes the limit.
func (l LimitRate) Encode(_ Family, s bc.Sink) { s.Limit(bc.Limit{Rate: l.Rate, Burst: l.Burst}) }

// MatchEchoRequest matches an ICMP (ICMPv6) echo request.
type MatchEchoRequest struct{}

// AppendText writes "icmp type echo-request" ("icmpv6 type echo-request").
func (MatchEchoRequest) AppendText(b []byte, f Family) []byte {
	if f == IPv6 {
		return append(b, "icmpv6 type echo-request"...)
	}
	return append(b, "icmp type echo-request"...)
}

// Encode matches the protocol and the ICMP type, as nft writes it.
func (MatchEchoRequest) Encode(f Family, s bc.Sink) {
	proto, typ := ProtoICMP, byte(8)
	if f == IPv6 {
		proto, typ = ProtoICMPv6, 128
	}
	matchL4Proto(s, proto)
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 0, Len: 1, Dreg: bc.Reg1})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(typ)})
}

// RedirectHere delivers the packet to the gateway itself (the primary
// address of the interface it arrived on), its ports or ICMP id kept.
type RedirectHere struct{}

// AppendText writes "redirect".
func (RedirectHere) AppendText(b []byte, _ Family) []byte { return append(b, "redirect"...) }

// Encode writes a redirect without a port.
func (RedirectHere) Encode(_ Family, s bc.Sink) { s.Redir(bc.Redir{}) }
