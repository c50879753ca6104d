package ruleset

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nftgate/nftgate/model"
)

// Config is what the ruleset depends on besides the Services.
type Config struct {
	// Table is the name of nftgate's table in each family.
	Table string
	// Node is this gateway's node name and zone, for traffic policy Local
	// and topology hints.
	Node model.Node
	// ClusterCIDRs are the sources that keep their address on Cluster
	// policy traffic; all other clients are masqueraded, so that replies
	// come back through the gateway. Empty: every client is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAddresses are the addresses clients are masqueraded to,
	// of either family: each client address is given one of its family's
	// by a hash, and keeps its port where the port is free. A family with
	// none is masqueraded to the outgoing interface's address.
	MasqueradeAddresses []netip.Addr
	// KeepClientAddress: replies from the endpoints to any client come
	// back through the gateway (it is the pods' way out), so no client
	// is masqueraded; only the gateway's own connections and hairpin
	// traffic are.
	KeepClientAddress bool
	// NodePortAddresses limit NodePorts to the gateway's addresses inside
	// these prefixes. Empty: every local address but loopback.
	NodePortAddresses []netip.Prefix
	// MasqueradeBit is the packet mark bit that asks for masquerade.
	MasqueradeBit uint32
	// HashSeed seeds the endpoint choice; gateways sharing a seed choose
	// the same endpoint for the same flow.
	HashSeed uint32
	// EndpointSelection is how the Services that do not ask for one
	// (model.Service.EndpointSelection) choose an endpoint: by hash
	// modulo the number of endpoints (model.SelectionHash, or empty), or
	// by a Maglev table (model.SelectionMaglev; maglev.go).
	EndpointSelection string
	// Shards is the number of service shard tables per family (see
	// layout.go); zero means DefaultShards.
	Shards int
	// ProxyPort is the gateway's port where the PROXY protocol proxy
	// listens: the TCP ports of Services that ask for PROXY protocol
	// redirect their new connections from outside the cluster to it.
	// Zero: no proxy, every Service takes the kernel path.
	ProxyPort uint16
	// FlowtableDevices, when not empty, turn the flowtable on: the main
	// table of each family gets a flowtable on these interfaces' ingress,
	// and the established connections nftgate DNATs are added to it.
	FlowtableDevices []string
	// FlowtablePackets: a connection is added to the flowtable once it
	// has passed more than this many packets (both directions); zero adds
	// it as soon as it is established. Short connections cost more
	// through the flowtable than without it (README "Established
	// flows"); counting turns conntrack's accounting on.
	FlowtablePackets uint64
	// Counters count, per element of the service maps (hence per Service
	// port and address), the new connections dispatched, the new
	// connections rejected for want of endpoints, and per source-range
	// chain the new connections dropped. Only new connections reach
	// these maps and chains: established packets pass no counter.
	Counters bool
	// DropMidstreamTCP drops, instead of translating, a masqueraded TCP
	// packet that is not a SYN and has no conntrack entry (the kernel's
	// loose pickup of a connection in mid-stream): with state sync, the
	// entry of a connection that another gateway of the set opened and the
	// router moved here is on its way, and the client's retransmission
	// meets it; picked up, the connection would be masqueraded afresh to
	// this gateway's address, which the endpoint does not know.
	DropMidstreamTCP bool
	// MidstreamWait bounds, with DropMidstreamTCP, how long the packets of
	// one connection are dropped; the first after is picked up (see
	// midstream.go). Zero drops them without bound.
	MidstreamWait time.Duration
	// MidstreamWaitPeerDead, when shorter than MidstreamWait, bounds the
	// wait instead while a peer of the set is dead (element
	// MidstreamPeerDeadElement in SetMidstreamPeerDead, written at run
	// time): the connections that wait then are mostly the dead peer's,
	// whose replicas never come.
	MidstreamWaitPeerDead time.Duration
	// PeerMasquerade are the home masquerade addresses of each other
	// gateway of an active-active set, one pool per peer. A connection
	// picked up in mid-stream (at once, or given up after the bounded
	// wait) may then be masqueraded to the address of a dead peer's pool
	// its client hashes to (map MapMidstreamHomes, whose elements are
	// written at run time: MidstreamHomeElements).
	PeerMasquerade [][]netip.Addr
	// Unserved is what becomes of a packet to a LoadBalancer or external
	// IP that no Service port translated (unserved.go): by default a new
	// connection is rejected and an invalid packet dropped, rather than
	// routed back where it came from.
	Unserved Unserved
	// ServiceEchoOff: an ICMP echo request to a LoadBalancer or external
	// IP is not answered by the gateway (unserved.go) but treated as the
	// other unserved traffic.
	ServiceEchoOff bool
	// EchoRate and EchoSourceRate bound the echo flows to Service
	// addresses the gateway answers a second, from all sources together
	// and from one (unserved.go); zero takes DefaultEchoRate and
	// DefaultEchoSourceRate.
	EchoRate, EchoSourceRate uint32
	// UntranslatedEventsOff: conntrack reports no event of a connection
	// whose destination nftgate did not translate (routed traffic, the
	// gateway's own connections): with state sync, whose listener wants
	// only the Services' flows and would drop the rest after the kernel
	// built them (events.go).
	UntranslatedEventsOff bool
	// LeanServiceEvents: conntrack reports of a masqueraded Service TCP
	// connection only the events a replica needs (its start, the
	// endpoint's answer, the handshake's end, the first FIN or RST, its
	// end: events.go), five messages instead of seven or more, for the
	// state sync.
	LeanServiceEvents bool
	// ReleaseTimeWait: the gateway resets an endpoint's TIME_WAIT of a
	// masqueraded TCP connection once both ends have closed it (see
	// release.go), so that the masquerade address's ports can be given
	// to other clients at once.
	ReleaseTimeWait bool
	// AnswerRefusedSYNs: the gateway answers an endpoint's refusal of a
	// masqueraded connection's SYN (a TIME_WAIT it still holds for that
	// address and port) with the reset that ends it, and keeps the
	// connection's port for the SYN sent again (refused.go). It needs no
	// conntrack marks, so it stays on where ReleaseTimeWait cannot be.
	AnswerRefusedSYNs bool
	// MasqueradePortGroups, a power of two from 2 to
	// MaxMasqueradePortGroups, gives each group of CPUs its own share of
	// the ports TCP is masqueraded to (cpuports.go), so that two CPUs never
	// give two new connections the same address and port at once. 0 or 1:
	// no groups.
	MasqueradePortGroups int
	// TrafficElements, with Counters, turns on the traffic sets: packets
	// and bytes of every translated connection, each way, per Service
	// destination and endpoint, counted in the forward path (CountTraffic)
	// into a set per direction of at most this many elements each. Zero:
	// no traffic sets.
	TrafficElements uint32
}

// TrafficTimeout is how long an element of a traffic set outlives its
// last packet. Longer than the readings of the counters are apart (the
// history reads them every minute by default), so that what an element
// counted is read before it expires.
const TrafficTimeout = 10 * time.Minute

// DefaultMasqueradeBit is kube-proxy's masquerade mark bit.
const DefaultMasqueradeBit = 0x4000

// DefaultHashSeed is the endpoint-choice seed when Config.HashSeed is zero.
// Zero itself cannot be used: the kernel takes a hash without a seed as a
// request for a random one, different in every rule, and the bucket rules
// of a Service would then not partition its flows.
const DefaultHashSeed = 0x6e667467

func (c *Config) hashSeed() uint32 {
	if c.HashSeed == 0 {
		return DefaultHashSeed
	}
	return c.HashSeed
}

// Names of the static objects in each table.
const (
	MapServiceIPs          = "service-ips"
	MapServiceNodePorts    = "service-nodeports"
	MapNoEndpointServices  = "no-endpoint-services"
	MapNoEndpointNodePorts = "no-endpoint-nodeports"
	MapFirewallIPs         = "firewall-ips"
	SetClusterIPs          = "cluster-ips"
	SetHairpin             = "hairpin-endpoints"
	SetTrafficIn           = "traffic-to-endpoints"
	SetTrafficOut          = "traffic-from-endpoints"
	FlowtableName          = "established"

	ChainServices          = "services"
	ChainNodePorts         = "nodeports"
	ChainFirewallCheck     = "firewall-check"
	ChainServiceEPCheck    = "service-endpoints-check"
	ChainNodePortEPCheck   = "nodeport-endpoints-check"
	ChainNodePortEPLookup  = "nodeport-endpoints-lookup"
	ChainMasquerading      = "masquerading"
	ChainMarkForMasquerade = "mark-for-masquerade"
	ChainMasqueradeOutside = "mark-for-masquerade-outside-cluster"
	ChainReject            = "reject-chain"
	ChainClusterIPsCheck   = "cluster-ips-check"
	ChainCountTraffic      = "count-traffic"
	ChainClose             = "close"
)

// Netfilter hook priorities (from the kernel's netfilter headers).
const (
	PrioDstNAT = -100
	PrioFilter = 0
	PrioSrcNAT = 100
)

// Static renders the skeleton of family f's main table: the filter hooks,
// masquerading, and the maps and sets shared by every Service.
func Static(cfg *Config, f Family) Fragment {
	bit := MasqueradeBitOf(cfg)
	jump := func(c string) Verdict { return Verdict{Kind: Jump, Chain: c} }
	vmap := func(m string, shape KeyShape) Rule { return Rule{VmapDispatch{Map: m, Shape: shape}} }

	fr := Fragment{
		Sets: []*Set{
			{Name: MapNoEndpointServices, Map: true, Shape: KeyAddrProtoPort, Counter: cfg.Counters},
			{Name: MapNoEndpointNodePorts, Map: true, Shape: KeyProtoPort, Counter: cfg.Counters},
			{Name: MapFirewallIPs, Map: true, Shape: KeyAddrProtoPort},
			{Name: SetClusterIPs, Shape: KeyAddr},
			{Name: SetHairpin, Shape: KeyAddrPair},
			{Name: SetServiceAddrs, Shape: KeyAddr},
		},
	}
	fr.Sets = append(fr.Sets, echoSets(cfg)...)
	base := func(name, typ, hook string, prio int32, rules ...Rule) {
		fr.Chains = append(fr.Chains, &Chain{Name: name, Hook: &Hook{Type: typ, Hook: hook, Priority: prio}, Rules: rules})
	}
	regular := func(name string, rules ...Rule) {
		fr.Chains = append(fr.Chains, &Chain{Name: name, Rules: rules})
	}
	// NAT: every new ClusterIP connection from outside the cluster is
	// masqueraded, whatever its Service's traffic policy. The mark is set
	// here, just before the shards' NAT chains dispatch the connection.
	// The same base chain redirects the echo requests to Service addresses
	// that the gateway answers (unserved.go).
	markOutside := Rule{MatchAddrInSet{Dir: Dst, Set: SetClusterIPs}, jump(ChainMasqueradeOutside)}
	base("nat-prerouting-mark", "nat", "prerouting", PrioDstNAT-1, append([]Rule{markOutside}, echoRules(cfg)...)...)
	base("nat-output-mark", "nat", "output", PrioDstNAT-1, markOutside)
	postrouting := []Rule{{jump(ChainMasquerading)}}
	if cfg.UntranslatedEventsOff {
		postrouting = append(postrouting, UntranslatedEventsRule())
	}
	base("nat-postrouting", "nat", "postrouting", PrioSrcNAT, postrouting...)
	// Source ranges are checked before DNAT rewrites the destination
	// (the prerouting base chain is made below: the close shares it).
	firewallCheck := Rule{MatchCtNew{}, jump(ChainFirewallCheck)}
	preDNAT := []Rule{firewallCheck}
	base("filter-output-pre-dnat", "filter", "output", PrioDstNAT-10, firewallCheck)
	// Services without endpoints were not DNATed: reject them where they
	// would otherwise be delivered or forwarded.
	base("filter-input", "filter", "input", PrioFilter-1,
		Rule{MatchCtNew{}, jump(ChainNodePortEPCheck)},
		Rule{MatchCtNew{}, jump(ChainServiceEPCheck)})
	// So are ClusterIPs on ports no Service has, as kube-proxy does.
	// So are the other addresses of the Services, rather than routed
	// back to the router that routes them here (unserved.go).
	forward := []Rule{forwardEntry(cfg)}
	checks := []Rule{{jump(ChainServiceEPCheck)}, {jump(ChainClusterIPsCheck)}}
	if stray, c := strayReplies(cfg, f); c != nil {
		checks = append([]Rule{stray}, checks...)
		fr.Chains = append(fr.Chains, c)
	}
	regular(ChainForwardNew, forwardNewRules(cfg, checks...)...)
	if cfg.Counters && cfg.TrafficElements > 0 {
		// Every packet of a translated connection, both ways, before a
		// flowtable takes the connection past this hook.
		for _, name := range []string{SetTrafficIn, SetTrafficOut} {
			fr.Sets = append(fr.Sets, &Set{Name: name, Shape: KeyTraffic, Timeout: TrafficTimeout, Size: cfg.TrafficElements})
		}
		// One test of the status for every forwarded packet, in the base
		// chain; a translated packet then passes only the rules before
		// its own protocol and direction's, which returns. With the six
		// rules in the base chain, each testing the status, a routed
		// connection paid 5,700 instructions for them, now about 800, and
		// one via a Service 17,000, now 11,000 (docs/design/dataplane.md,
		// "Counted in instructions").
		var count []Rule
		for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
			count = append(count,
				Rule{CountTraffic{Set: SetTrafficIn, Proto: p}, Verdict{Kind: Return}},
				Rule{CountTraffic{Set: SetTrafficOut, Reply: true, Proto: p}, Verdict{Kind: Return}})
		}
		last := &count[len(count)-1]
		*last = (*last)[:len(*last)-1] // the chain's end returns anyway
		regular(ChainCountTraffic, count...)
		forward = append([]Rule{{MatchCtDNAT{}, jump(ChainCountTraffic)}}, forward...)
	}
	if len(cfg.FlowtableDevices) > 0 {
		// Only the connections nftgate translated: a flow in the
		// flowtable skips every forward hook, other programs' too, and
		// traffic that is not a Service's is none of nftgate's business.
		// The kernel adds only TCP connections past the handshake (and
		// not closing) and UDP flows, and marks them [OFFLOAD] in
		// conntrack, where they stay.
		fr.Flowtables = []*Flowtable{{Name: FlowtableName, Priority: PrioFilter, Devices: cfg.FlowtableDevices, Counter: true}}
		forward = append(forward, OffloadRule(cfg.FlowtablePackets))
	}
	base("filter-forward", "filter", "forward", PrioFilter-1, forward...)
	output := []Rule{
		{MatchCtNew{}, jump(ChainNodePortEPCheck)},
		{MatchCtNew{}, jump(ChainServiceEPCheck)},
		{MatchCtNew{}, jump(ChainClusterIPsCheck)},
	}
	if release, answer, lean := cfg.ReleaseTimeWait, cfg.AnswerRefusedSYNs, cfg.LeanServiceEvents; release || answer || lean {
		var closeRules []Rule
		switch {
		case release:
			closeRules = releaseBaseRules(lean)
		case lean:
			closeRules = []Rule{CloseLabelRule()}
		}
		if answer {
			closeRules = append(closeRules, refusedBaseRule())
			fr.Sets = append(fr.Sets, &Set{Name: SetRefusedSYNs, Shape: KeyConn, Timeout: RefusedTimeout, Size: RefusedSize})
			base(ChainRefusedRaw, "filter", "prerouting", PrioRaw, refusedRawRule())
		}
		// Every rule of the close is for masqueraded Service
		// connections: any other packet (a routed one, one of a Service
		// connection whose client is kept) leaves after one test. The
		// close needs the connection's status and marks (after
		// conntrack, -200) and the packet's addresses before NAT (-100),
		// where the source ranges' check is: it shares that base chain,
		// one call of a base chain less for every forwarded packet. A
		// connection is not masqueraded before its first packet passed
		// NAT, so the two rules never both apply.
		preDNAT = append([]Rule{{MatchCtMasqueraded{}, jump(ChainClose)}}, preDNAT...)
		regular(ChainClose, closeRules...)
		if release {
			regular(ChainCloseFIN, closeFINRules(lean)...)
			regular(ChainReleaseTimeWait, releaseRules(bit, cfg.Counters)...)
		}
		if answer {
			regular(ChainReleaseRefused, refusedRules(bit, cfg.Counters)...)
		}
		if release || answer {
			output = append([]Rule{releaseResetRule(bit)}, output...)
		}
	}
	base("filter-output", "filter", "output", PrioFilter-1, output...)
	base("filter-prerouting-pre-dnat", "filter", "prerouting", PrioDstNAT-10, preDNAT...)

	regular(ChainFirewallCheck, vmap(MapFirewallIPs, KeyAddrProtoPort))
	regular(ChainServiceEPCheck, vmap(MapNoEndpointServices, KeyAddrProtoPort))
	regular(ChainNodePortEPCheck, Rule{MatchLocal{Dir: Dst}, jump(ChainNodePortEPLookup)})
	regular(ChainNodePortEPLookup, nodePortRules(cfg, f, MapNoEndpointNodePorts)...)
	masq, masqCPU := masqueradeRules(cfg, f)
	regular(ChainMasquerading, append([]Rule{
		// Hairpin: an endpoint that reached itself through a Service
		// must be masqueraded, or it would answer itself directly.
		{MatchAddrPairInSet{Set: SetHairpin}, SetMark{Bit: bit}},
		{MatchMarkUnset{Bit: bit}, Verdict{Kind: Return}},
	}, append(midstreamRules(cfg, f), append(leanEventsRules(cfg), masq...)...)...)...)
	fr.Chains = append(fr.Chains, masqCPU...)
	waitSets, waitChains := midstreamWait(cfg, f)
	fr.Sets = append(fr.Sets, waitSets...)
	fr.Chains = append(fr.Chains, waitChains...)
	var outside []Rule
	for _, p := range cfg.ClusterCIDRs {
		if Of(p.Addr()) == f {
			outside = append(outside, Rule{MatchAddr{Dir: Src, Prefix: p}, Verdict{Kind: Return}})
		}
	}
	regular(ChainMasqueradeOutside, append(outside, markRule(cfg))...)
	regular(ChainReject, Rule{Reject{}})
	regular(ChainClusterIPsCheck, Rule{MatchAddrInSet{Dir: Dst, Set: SetClusterIPs}, Reject{}})
	return fr
}

// StaticShard renders the skeleton of each of family f's service shard
// tables: NAT base chains that dispatch new connections through the shard's
// maps to the chains of its Services.
func StaticShard(cfg *Config, f Family) Fragment {
	jump := func(c string) Verdict { return Verdict{Kind: Jump, Chain: c} }
	fr := Fragment{
		Sets: []*Set{
			{Name: MapServiceIPs, Map: true, Shape: KeyAddrProtoPort, Counter: cfg.Counters},
			{Name: MapServiceNodePorts, Map: true, Shape: KeyProtoPort, Counter: cfg.Counters},
		},
	}
	base := func(name, hook string, rules ...Rule) {
		fr.Chains = append(fr.Chains, &Chain{Name: name, Hook: &Hook{Type: "nat", Hook: hook, Priority: PrioDstNAT}, Rules: rules})
	}
	regular := func(name string, rules ...Rule) {
		fr.Chains = append(fr.Chains, &Chain{Name: name, Rules: rules})
	}
	// Every new connection, forwarded or from the gateway itself, goes
	// through the service dispatch.
	base("nat-prerouting", "prerouting", Rule{jump(ChainServices)})
	base("nat-output", "output", Rule{jump(ChainServices)})
	regular(ChainServices,
		Rule{VmapDispatch{Map: MapServiceIPs, Shape: KeyAddrProtoPort}},
		Rule{MatchLocal{Dir: Dst}, jump(ChainNodePorts)})
	regular(ChainNodePorts, nodePortRules(cfg, f, MapServiceNodePorts)...)
	regular(ChainMarkForMasquerade, markRule(cfg))
	return fr
}

// OffloadRule adds an established connection nftgate DNATed to the
// flowtable, once it has passed more than packets packets (0: at once).
func OffloadRule(packets uint64) Rule {
	r := Rule{MatchCtEstablished{}, MatchCtDNAT{}}
	if packets > 0 {
		r = append(r, MatchCtPacketsOver{N: packets})
	}
	return append(r, FlowOffload{Flowtable: FlowtableName})
}

// markRule asks for masquerade of a connection to a Service under policy
// Cluster: of every one, or with KeepClientAddress, only of the gateway's
// own (its address may not be routed back to it from the endpoints).
func markRule(cfg *Config) Rule {
	mark := SetMark{Bit: MasqueradeBitOf(cfg)}
	if cfg.KeepClientAddress {
		return Rule{MatchLocal{Dir: Src}, mark}
	}
	return Rule{mark}
}

// MasqueradePool is family f's masquerade addresses, sorted (the order
// decides which clients each is given).
func MasqueradePool(cfg *Config, f Family) []netip.Addr {
	return poolOf(cfg.MasqueradeAddresses, f)
}

// poolOf are the addresses of family f in addrs, sorted: the pool's order
// is the hash's choice, so another gateway of the set knows it
// (MidstreamHomeElements) whatever order each configuration lists them in.
func poolOf(addrs []netip.Addr, f Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if Of(a) == f {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// MasqueradeBitOf is the mark bit that asks for masquerade under cfg.
func MasqueradeBitOf(cfg *Config) uint32 {
	if cfg.MasqueradeBit == 0 {
		return DefaultMasqueradeBit
	}
	return cfg.MasqueradeBit
}

// nodePortRules dispatch on l4proto . dport for traffic to the gateway's own
// addresses, limited to NodePortAddresses when they are configured. Loopback
// never carries NodePorts.
func nodePortRules(cfg *Config, f Family, m string) []Rule {
	loop := netip.MustParsePrefix("127.0.0.0/8")
	if f == IPv6 {
		loop = netip.MustParsePrefix("::1/128")
	}
	dispatch := VmapDispatch{Map: m, Shape: KeyProtoPort}
	if len(cfg.NodePortAddresses) == 0 {
		return []Rule{{MatchAddr{Dir: Dst, Prefix: loop, Not: true}, dispatch}}
	}
	var rules []Rule
	for _, p := range cfg.NodePortAddresses {
		if Of(p.Addr()) == f {
			rules = append(rules, Rule{MatchAddr{Dir: Dst, Prefix: p}, dispatch})
		}
	}
	return rules
}

// Object names. Every chain and set of a Service port is named by its
// kind (svc, local, ext, fw, ep, aff) and the port's identity, written so
// that the mapping is injective whatever the names hold, and every name is
// a plain nft identifier:
//
//	svc-<namespace>/<name>/<protocol>/<port name>
//	ep-<namespace>/<name>/<protocol>/<port name>/<address>/<port>
//	aff-<namespace>/<name>/<protocol>/<port name>/<address>/<port>/<timeout>
//
// Each name is escaped: the characters of a DNS label (a-z, 0-9, '-') stay
// as they are, every other byte becomes '_' and two upper-case hex digits,
// so a component never holds a '/' or a '.', and the number of components
// is fixed by the kind. An unnamed port is written as '.' and its number.
// An address is written with '.' for ':' (nft's grammar takes no colon in
// a name); an IPv4 address never has two dots in a row, an IPv6 one with
// fewer than seven colons always has. The static objects' names have no
// '/'. The names the model accepts are DNS labels of at most 63 bytes, so
// they are written as they are, and the longest name (an affinity set of
// an SCTP port with an IPv6 endpoint) is 253 bytes, within the kernel's
// 255 (TestLongestNamesFitTheKernel).
const maxNameLen = 255

// PortObject names an object of one Service port.
func PortObject(kind string, svc *model.Service, p *model.ServicePort) string {
	b := make([]byte, 0, 64)
	b = append(b, kind...)
	b = append(b, '-')
	return string(appendPortID(b, svc, p))
}

// EndpointObject names an object of one endpoint of a Service port; extra,
// when not empty, is one more component (the affinity timeout).
func EndpointObject(kind string, svc *model.Service, p *model.ServicePort, ep netip.AddrPort, extra string) string {
	b := make([]byte, 0, 96)
	b = append(b, kind...)
	b = append(b, '-')
	b = appendPortID(b, svc, p)
	b = append(b, '/')
	b = append(b, nameAddr(ep.Addr())...)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(ep.Port()), 10)
	if extra != "" {
		b = append(b, '/')
		b = append(b, extra...)
	}
	return string(b)
}

func appendPortID(b []byte, svc *model.Service, p *model.ServicePort) []byte {
	b = appendEscaped(b, svc.Key.Namespace())
	b = append(b, '/')
	b = appendEscaped(b, svc.Key.Name())
	b = append(b, '/')
	b = append(b, p.Protocol.String()...)
	b = append(b, '/')
	if p.Name == "" {
		b = append(b, '.')
		return strconv.AppendUint(b, uint64(p.Port), 10)
	}
	return appendEscaped(b, p.Name)
}

// appendEscaped writes a name component: a-z, 0-9 and '-' as they are,
// every other byte as '_' and two upper-case hex digits.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b = append(b, c)
		} else {
			b = append(b, '_', hex[c>>4], hex[c&0xf])
		}
	}
	return b
}

// nameAddr writes an address for an object name. nft's grammar takes no
// colon in a name, so IPv6 addresses are written with dots instead; the
// names stay readable and `nft -f` can read a listing back.
func nameAddr(a netip.Addr) string {
	return strings.ReplaceAll(a.String(), ":", ".")
}

// RenderService renders everything one Service contributes to both tables.
// It is a pure function of the Service and the config, so rendering the
// Service's previous state again yields exactly what was programmed for it.
func RenderService(cfg *Config, svc *model.Service) ByFamily {
	var out ByFamily
	// Room for the elements at once: a cold sync renders every Service,
	// and growing the slices element by element was much of its garbage.
	// Each port puts one element for each of its destinations (a
	// LoadBalancer IP two, with its firewall's), each endpoint one for
	// hairpin masquerade, each ClusterIP one more.
	perPort := len(svc.ClusterIPs) + len(svc.ExternalIPs()) + 2*len(svc.LoadBalancerIPs())
	n, eps := len(svc.ClusterIPs), 0
	for pi := range svc.Ports {
		n += perPort
		if svc.Ports[pi].NodePort != 0 {
			n++
		}
		eps += len(svc.Ports[pi].Endpoints)
	}
	var hairpin addrSet
	for i, f := range Families {
		if svc.HasFamily(f == IPv6) {
			out[i].Elements = make([]Element, 0, n+eps)
			hairpin[i] = make([]netip.Addr, 0, eps)
		}
	}
	for pi := range svc.Ports {
		renderPort(cfg, svc, &svc.Ports[pi], &out, &hairpin)
	}
	// Its endpoints' addresses, for hairpin masquerade, in address order
	// so that the rendering is stable.
	for i, f := range Families {
		addrs := hairpin[i]
		slices.SortFunc(addrs, netip.Addr.Compare)
		addrs = slices.Compact(addrs)
		fr := out.Of(f)
		for _, a := range addrs {
			fr.Elements = append(fr.Elements, Element{Map: SetHairpin, Key: Key{Addr: a}})
		}
	}
	// Its ClusterIPs, for the masquerade decision and for rejecting ports
	// no Service has.
	for _, a := range svc.ClusterIPs {
		fr := out.Of(Of(a))
		fr.Elements = append(fr.Elements, Element{Map: SetClusterIPs, Key: Key{Addr: a}})
	}
	// Its LoadBalancer and external IPs, for what is sent to them
	// untranslated (unserved.go), each once.
	addrs := append(slices.Clone(svc.ExternalIPs()), svc.LoadBalancerIPs()...)
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range slices.Compact(addrs) {
		fr := out.Of(Of(a))
		fr.Elements = append(fr.Elements, Element{Map: SetServiceAddrs, Key: Key{Addr: a}})
	}
	return out
}

// addrSet collects the addresses of one Service per family; RenderService
// sorts them and drops the repeated ones.
type addrSet [2][]netip.Addr

func (s *addrSet) add(f Family, a netip.Addr) {
	i := familyIndex(f)
	s[i] = append(s[i], a)
}

func renderPort(cfg *Config, svc *model.Service, p *model.ServicePort, out *ByFamily, hairpin *addrSet) {
	for _, f := range Families {
		if !svc.HasFamily(f == IPv6) {
			continue // not even NodePorts: kube-proxy ignores the family too
		}
		fr := out.Of(f)
		// Endpoints are chosen per family, as kube-proxy does: a
		// dual-stack Service whose IPv6 endpoints are all terminating
		// falls back to them for IPv6 while IPv4 uses its ready ones.
		famPort := p.OfFamily(f == IPv6)
		sets := model.Categorize(svc, &famPort, cfg.Node)

		var clusterIPs, externalAddrs, lbIPs []netip.Addr
		for _, a := range svc.ClusterIPs {
			if Of(a) == f {
				clusterIPs = append(clusterIPs, a)
			}
		}
		for _, a := range svc.ExternalIPs() {
			if Of(a) == f {
				externalAddrs = append(externalAddrs, a)
			}
		}
		for _, a := range svc.LoadBalancerIPs() {
			if Of(a) == f {
				lbIPs = append(lbIPs, a)
			}
		}
		hasNodePort := p.NodePort != 0 && familyHasNodePorts(cfg, f)
		if len(clusterIPs) == 0 && len(externalAddrs) == 0 && len(lbIPs) == 0 && !hasNodePort {
			continue
		}

		key := func(a netip.Addr, port uint16) Key { return Key{Addr: a, Proto: p.Protocol, Port: port} }
		maglev := svc.Maglev(cfg.EndpointSelection)
		if mapped(cfg, svc, p, maglev, sets) {
			renderMapped(cfg, svc, p, fr, hairpin, f, sets.Cluster, clusterIPs, append(externalAddrs, lbIPs...), hasNodePort)
		} else {
			renderChained(cfg, svc, p, fr, hairpin, f, sets, maglev, clusterIPs, externalAddrs, lbIPs, hasNodePort)
		}

		// loadBalancerSourceRanges guard the LoadBalancer IPs only, and
		// only in the families they name; a range of all addresses is no
		// restriction.
		var rules []Rule
		open := false
		for _, r := range svc.SourceRanges() {
			if Of(r.Addr()) == f {
				open = open || r.Bits() == 0
				rules = append(rules, Rule{MatchAddr{Dir: Src, Prefix: r}, Verdict{Kind: Return}})
			}
		}
		if len(rules) > 0 && !open && len(lbIPs) > 0 {
			if cfg.Counters {
				rules = append(rules, Rule{Counter{}, Verdict{Kind: Drop}})
			} else {
				rules = append(rules, Rule{Verdict{Kind: Drop}})
			}
			fwChain := PortObject("fw", svc, p)
			fr.Chains = append(fr.Chains, &Chain{Name: fwChain, Rules: rules})
			for _, a := range lbIPs {
				fr.Elements = append(fr.Elements, Element{Map: MapFirewallIPs, Key: key(a, p.Port), Verdict: Verdict{Kind: Goto, Chain: fwChain}})
			}
		}
	}
}

// renderChained renders a port with chains of its own (every port that
// does not choose through the endpoint maps: see mapped): its endpoints'
// chains where it needs them, its cluster and local chains, its external
// chain, and its dispatch elements.
func renderChained(cfg *Config, svc *model.Service, p *model.ServicePort, fr *Fragment, hairpin *addrSet, f Family,
	sets model.EndpointSets, maglev bool, clusterIPs, externalAddrs, lbIPs []netip.Addr, hasNodePort bool) {
	cluster, local, anyEps := sets.Cluster, sets.Local, sets.Any
	key := func(a netip.Addr, port uint16) Key { return Key{Addr: a, Proto: p.Protocol, Port: port} }
	// Names are hashed only for the chains the port has.
	clusterChain := PortObject("svc", svc, p)
	var localChain, externalChain string

	// An endpoint is DNATed right in the rule that chooses it. Only
	// with session affinity does it get a chain of its own, which
	// also records the client in the endpoint's affinity set: fewer
	// objects is what keeps a cold sync of many Services fast.
	// A Maglev table's slots jump to the endpoints' chains too.
	epChain := map[netip.AddrPort]string{}
	affinitySet := map[netip.AddrPort]string{}
	addEndpoint := func(e model.Endpoint) {
		ap := e.AddrPort()
		hairpin.add(f, ap.Addr())
		if _, ok := epChain[ap]; ok || svc.AffinityTimeout() == 0 && !maglev {
			return
		}
		name := EndpointObject("ep", svc, p, ap, "")
		epChain[ap] = name
		if svc.AffinityTimeout() == 0 {
			fr.Chains = append(fr.Chains, &Chain{Name: name, Rules: []Rule{{DNAT{Proto: p.Protocol, To: ap}}}})
			return
		}
		// The timeout is part of the set's name: a changed timeout is
		// a new set, never an in-place edit the kernel refuses.
		set := EndpointObject("aff", svc, p, ap, DurationText(svc.AffinityTimeout()))
		affinitySet[ap] = set
		fr.Sets = append(fr.Sets, &Set{Name: set, Timeout: svc.AffinityTimeout()})
		fr.Chains = append(fr.Chains, &Chain{Name: name, Rules: []Rule{
			{UpdateAffinity{Set: set}},
			{DNAT{Proto: p.Protocol, To: ap}},
		}})
	}
	// send is the action that sends a flow to endpoint e.
	send := func(e model.Endpoint) Stmt {
		if c, ok := epChain[e.AddrPort()]; ok {
			return Verdict{Kind: Goto, Chain: c}
		}
		return DNAT{Proto: p.Protocol, To: e.AddrPort()}
	}
	if len(local) > 0 {
		localChain = PortObject("local", svc, p)
	}
	if len(externalAddrs) > 0 || len(lbIPs) > 0 || hasNodePort {
		externalChain = PortObject("ext", svc, p)
	}
	for _, e := range cluster {
		addEndpoint(e)
	}
	for _, e := range local {
		addEndpoint(e)
	}
	dispatch := func(eps []model.Endpoint, table string) []Rule {
		var rules []Rule
		for _, e := range eps {
			if set, ok := affinitySet[e.AddrPort()]; ok {
				rules = append(rules, Rule{MatchAddrInSet{Dir: Src, Set: set}, Verdict{Kind: Goto, Chain: epChain[e.AddrPort()]}})
			}
		}
		if len(eps) == 1 {
			return append(rules, Rule{send(eps[0])})
		}
		if maglev {
			return append(rules, maglevDispatch(cfg, fr, table, eps, epChain))
		}
		// The last bucket needs no hash: a flow that reaches its rule
		// fell in none of the others (a DNAT ends the chain). That is
		// four expressions fewer per Service, which the kernel checks
		// and stores one by one, and a hash fewer per connection to
		// the last endpoint.
		for i, e := range eps[:len(eps)-1] {
			rules = append(rules, Rule{HashBucket{Seed: cfg.hashSeed(), Modulus: uint32(len(eps)), Bucket: uint32(i)}, send(e)})
		}
		return append(rules, Rule{send(eps[len(eps)-1])})
	}
	if len(cluster) > 0 {
		fr.Chains = append(fr.Chains, &Chain{Name: clusterChain, Rules: dispatch(cluster, PortObject(MaglevClusterKind, svc, p))})
	}
	if len(local) > 0 {
		fr.Chains = append(fr.Chains, &Chain{Name: localChain, Rules: dispatch(local, PortObject(MaglevLocalKind, svc, p))})
	}

	// internalVerdict is where ClusterIP traffic goes; ok is false
	// when it must be rejected for lack of endpoints.
	internalVerdict, internalOK := Verdict{Kind: Goto, Chain: clusterChain}, len(cluster) > 0
	if svc.InternalLocal {
		switch {
		case len(local) > 0:
			internalVerdict, internalOK = Verdict{Kind: Goto, Chain: localChain}, true
		case anyEps:
			internalVerdict, internalOK = Verdict{Kind: Drop}, true
		default:
			internalOK = false
		}
	}
	externalOK := len(cluster) > 0
	if svc.ExternalLocal {
		externalOK = anyEps
	}
	externalVerdict := Verdict{Kind: Goto, Chain: externalChain}
	// proxied: new connections from outside the cluster go to the
	// PROXY protocol proxy on the gateway, which sends them to one of
	// these endpoints; clients inside the cluster and the gateway's
	// own connections keep the kernel path.
	var proxied []model.Endpoint
	if cfg.ProxyPort != 0 && svc.Proxied(p) {
		if svc.ExternalLocal {
			proxied = local
		} else {
			proxied = cluster
		}
	}
	if externalOK && (len(externalAddrs) > 0 || len(lbIPs) > 0 || hasNodePort) {
		var rules []Rule
		if svc.ExternalLocal {
			if len(cluster) > 0 {
				// Clients inside the cluster are not subject to the
				// Local policy: they reach every endpoint, unmasqueraded.
				for _, c := range cfg.ClusterCIDRs {
					if Of(c.Addr()) == f {
						rules = append(rules, Rule{MatchAddr{Dir: Src, Prefix: c}, Verdict{Kind: Goto, Chain: clusterChain}})
					}
				}
				// The gateway's own traffic has no "local" client to
				// preserve: it uses the cluster-wide endpoints.
				rules = append(rules,
					Rule{MatchLocal{Dir: Src}, Verdict{Kind: Jump, Chain: ChainMarkForMasquerade}},
					Rule{MatchLocal{Dir: Src}, Verdict{Kind: Goto, Chain: clusterChain}})
			}
			switch {
			case len(proxied) > 0:
				rules = append(rules, Rule{Redirect{Proto: p.Protocol, Port: cfg.ProxyPort}})
			case len(local) > 0:
				rules = append(rules, Rule{Verdict{Kind: Goto, Chain: localChain}})
			default:
				rules = append(rules, Rule{Verdict{Kind: Drop}})
			}
		} else {
			if len(proxied) > 0 {
				// Clients inside the cluster and the gateway itself
				// keep the kernel path.
				var inside []Stmt
				for _, c := range cfg.ClusterCIDRs {
					if Of(c.Addr()) == f {
						inside = append(inside, MatchAddr{Dir: Src, Prefix: c})
					}
				}
				inside = append(inside, MatchLocal{Dir: Src})
				for _, m := range inside {
					rules = append(rules,
						Rule{m, Verdict{Kind: Jump, Chain: ChainMarkForMasquerade}},
						Rule{m, Verdict{Kind: Goto, Chain: clusterChain}})
				}
				rules = append(rules, Rule{Redirect{Proto: p.Protocol, Port: cfg.ProxyPort}})
			} else {
				rules = append(rules,
					Rule{Verdict{Kind: Jump, Chain: ChainMarkForMasquerade}},
					Rule{Verdict{Kind: Goto, Chain: clusterChain}})
			}
		}
		fr.Chains = append(fr.Chains, &Chain{Name: externalChain, Rules: rules})
		if len(proxied) > 0 {
			for _, a := range append(externalAddrs, lbIPs...) {
				fr.Proxied = append(fr.Proxied, ProxyTarget{Dest: Destination{Family: f, Proto: p.Protocol, Addr: a, Port: p.Port}, Service: svc, Endpoints: proxied})
			}
			if hasNodePort {
				fr.Proxied = append(fr.Proxied, ProxyTarget{Dest: Destination{Family: f, Proto: p.Protocol, Port: p.NodePort, NodePort: true}, Service: svc, Endpoints: proxied})
			}
		}
	}

	rejectV := Verdict{Kind: Goto, Chain: ChainReject}
	for _, a := range clusterIPs {
		if internalOK {
			fr.Elements = append(fr.Elements, Element{Map: MapServiceIPs, Key: key(a, p.Port), Verdict: internalVerdict})
		} else {
			fr.Elements = append(fr.Elements, Element{Map: MapNoEndpointServices, Key: key(a, p.Port), Verdict: rejectV})
		}
	}
	for _, a := range append(externalAddrs, lbIPs...) {
		if externalOK {
			fr.Elements = append(fr.Elements, Element{Map: MapServiceIPs, Key: key(a, p.Port), Verdict: externalVerdict})
		} else {
			fr.Elements = append(fr.Elements, Element{Map: MapNoEndpointServices, Key: key(a, p.Port), Verdict: rejectV})
		}
	}
	if hasNodePort {
		k := Key{Proto: p.Protocol, Port: p.NodePort}
		if externalOK {
			fr.Elements = append(fr.Elements, Element{Map: MapServiceNodePorts, Key: k, Verdict: externalVerdict})
		} else {
			fr.Elements = append(fr.Elements, Element{Map: MapNoEndpointNodePorts, Key: k, Verdict: rejectV})
		}
	}
}

// Kinds of the Maglev tables' names: of a port's cluster-wide endpoints,
// and of its local ones.
const (
	MaglevClusterKind = "mgc"
	MaglevLocalKind   = "mgl"
)

// maglevDispatch adds the verdict map of a Maglev table of the endpoints
// to fr, each slot jumping to its endpoint's chain, and returns the rule
// that looks a flow's slot up in it.
func maglevDispatch(cfg *Config, fr *Fragment, name string, eps []model.Endpoint, epChain map[netip.AddrPort]string) Rule {
	aps := make([]netip.AddrPort, len(eps))
	for i, e := range eps {
		aps[i] = e.AddrPort()
	}
	m := MaglevSize(len(aps))
	table := MaglevTable(aps, m, cfg.hashSeed())
	fr.Sets = append(fr.Sets, &Set{Name: name, Map: true, Shape: KeySlot})
	fr.Elements = slices.Grow(fr.Elements, len(table))
	for slot, ap := range table {
		fr.Elements = append(fr.Elements, Element{Map: name, Key: Key{Slot: uint32(slot)}, Verdict: Verdict{Kind: Goto, Chain: epChain[ap]}})
	}
	return Rule{MaglevDispatch{Seed: cfg.hashSeed(), Modulus: uint32(m), Map: name}}
}

// familyHasNodePorts tells whether family f carries NodePorts at all: with
// NodePortAddresses configured, only the families they name do.
func familyHasNodePorts(cfg *Config, f Family) bool {
	if len(cfg.NodePortAddresses) == 0 {
		return true
	}
	for _, p := range cfg.NodePortAddresses {
		if Of(p.Addr()) == f {
			return true
		}
	}
	return false
}
