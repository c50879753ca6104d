// Package nft is nftgate's ruleset: a pure function from the service model to
// a small intermediate form of nftables objects (chains of rules, sets, verdict
// map elements), a differ between two such forms, and the one place that
// speaks netlink to nf_tables.
//
// The intermediate form is what makes the rest cheap: it prints as nft text
// for people, replays packets in unit tests (Trace), compares by value for
// the differ, and is encoded to netlink only for what actually changes: the
// objects a cold sync has by the ten thousand straight into the batch, byte
// for byte as github.com/google/nftables would write them, the rest through
// google/nftables itself (encode.go, wire.go).
//
// The shape of the ruleset is chosen for what the kernel does with it:
//   - no maps inside rules: the kernel finds an anonymous set by scanning
//     the whole transaction, so one per Service makes a cold sync
//     quadratic; an endpoint is chosen by one jhash bucket rule per
//     endpoint instead, which DNATs directly. A Maglev table (maglev.go)
//     is a named map of slots per Service port, which the kernel finds by
//     name: a cold sync stays linear, but every slot is an element;
//   - no chain and no rule per Service where none is needed: a port whose
//     endpoints are the same for every client and destination (policy
//     Cluster, chosen by hash, no affinity) chooses through chains its
//     shard's Services share, one per protocol and number of endpoints,
//     which look its endpoint up in per-bucket endpoint maps: its own
//     objects are map elements only (endpoints.go). Every commit walks
//     every chain in the network namespace, and a cold sync takes rules
//     in expression by expression; elements cost neither;
//   - few objects for the other ports: endpoint chains exist only for
//     session affinity and Maglev slots, hairpin traffic is found with one
//     set of endpoint address pairs, and the masquerade decision for
//     ClusterIPs is made once in the dispatch chain;
//   - every commit that adds a rule or a jump makes the kernel validate
//     every chain reachable from the base chains of that table, which is
//     what a partial sync costs at scale: so Services are spread over
//     shard tables and a change validates only its shard (layout.go);
//   - rules are read back one chain at a time, since a dump of a whole
//     table's rules is quadratic;
//   - most of a cold sync is the kernel taking in expressions: it looks
//     each one's type up by name in a list of every type it was built
//     with, so the cost follows the number of expressions (nine in an
//     endpoint's rule), hardly the number of messages, tables or elements.
package ruleset

import (
	"cmp"
	"fmt"
	"net/netip"
	"strconv"
	"time"
	"unique"

	"github.com/nftgate/nftgate/model"
)

// Family is an nftables table family. nftgate keeps its tables per family, as
// kube-proxy does, so every key and address has one width.
type Family uint8

// The families nftgate programs.
const (
	IPv4 Family = 2  // NFPROTO_IPV4
	IPv6 Family = 10 // NFPROTO_IPV6
)

// Families lists both, in programming order.
var Families = []Family{IPv4, IPv6}

func (f Family) String() string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// Of returns the family of an address.
func Of(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// AddrLen is the length of the family's addresses in bytes.
func (f Family) AddrLen() uint32 {
	if f == IPv6 {
		return 16
	}
	return 4
}

// VerdictKind is what a rule or a map element does with a packet.
type VerdictKind uint8

// Verdicts nftgate uses.
const (
	Goto VerdictKind = iota + 1
	Jump
	Return
	Drop
	Accept
)

// Verdict is a verdict with its target chain for Goto and Jump.
type Verdict struct {
	Kind  VerdictKind
	Chain string
}

func (v Verdict) String() string {
	switch v.Kind {
	case Goto:
		return "goto " + v.Chain
	case Jump:
		return "jump " + v.Chain
	case Return:
		return "return"
	case Drop:
		return "drop"
	case Accept:
		return "accept"
	}
	return "?"
}

// KeyShape is the layout of a verdict map's key.
type KeyShape uint8

// Key shapes of nftgate's maps.
const (
	KeyAddrProtoPort KeyShape = iota + 1 // daddr . l4proto . dport
	KeyProtoPort                         // l4proto . dport (NodePorts)
	KeyAddr                              // an address (plain address sets)
	KeyAddrPair                          // saddr . daddr, both the Key's Addr (hairpin set)
	KeySlot                              // a slot of a Maglev table, the Key's Slot
	// KeyTraffic is original daddr . l4proto . original dport . reply
	// saddr . reply sport: a Service destination and the endpoint it was
	// translated to (the traffic sets, which the packet path fills).
	KeyTraffic
	// KeyProto is a protocol alone, the Key's Proto (a flag set the
	// packet's protocol is looked up in: SetMidstreamPeerDead).
	KeyProto
)

// KeyConn is a connection's original tuple: client address . l4proto .
// client port . Service address . port (SetRefusedSYNs). It has
// KeyTraffic's layout, and is written, read and typed as it is.
const KeyConn = KeyTraffic

// Key is one verdict map key. Addr is unset for KeyProtoPort maps; only
// Slot is set for KeySlot maps.
type Key struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
	Slot  uint32
}

func (k Key) String() string {
	if !k.Addr.IsValid() && k.Proto == 0 && k.Port == 0 {
		return strconv.FormatUint(uint64(k.Slot), 10)
	}
	if k.Proto == 0 && k.Port == 0 {
		return k.Addr.String()
	}
	if !k.Addr.IsValid() {
		return fmt.Sprintf("%s . %d", k.Proto, k.Port)
	}
	return fmt.Sprintf("%s . %s . %d", k.Addr, k.Proto, k.Port)
}

// compare orders keys by address, protocol and port: cheaper than
// comparing their text, which sorting a cold sync's elements would format
// millions of times.
func (k Key) compare(o Key) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if k.Proto != o.Proto {
		return int(k.Proto) - int(o.Proto)
	}
	if k.Port != o.Port {
		return int(k.Port) - int(o.Port)
	}
	return cmp.Compare(k.Slot, o.Slot)
}

// Element is one element of a verdict map, or of an endpoint map (To;
// endpoints.go), or of an address set (neither).
type Element struct {
	Map     string
	Key     Key
	Verdict Verdict
	To      netip.AddrPort
}

// ElemID identifies an element: its map and key. The tables' state, the
// claims book and the counters' index each hold one for every element
// (hundreds of thousands of them): it is 32 bytes, the map's name a handle
// to one shared copy and the key's address its sixteen bytes, where the
// name and the Key themselves were 48.
type ElemID struct {
	set unique.Handle[string]
	elemKey
}

// elemKey is an element's key within its set: 24 bytes, no pointers.
type elemKey struct {
	addr  [16]byte
	slot  uint32
	port  uint16
	proto model.Protocol
	fam   uint8 // 4 or 6, or 0 for a key without an address
}

// NewElemID returns the identity of the element of map set with key k.
func NewElemID(set string, k Key) ElemID {
	id := ElemID{set: unique.Make(set), elemKey: elemKey{slot: k.Slot, port: k.Port, proto: k.Proto}}
	switch {
	case k.Addr.Is4():
		id.fam = 4
	case k.Addr.Is6():
		id.fam = 6
	}
	if id.fam != 0 {
		id.addr = k.Addr.As16()
	}
	return id
}

// Map is the name of the element's map.
func (id ElemID) Map() string {
	if id.set == (unique.Handle[string]{}) {
		return ""
	}
	return id.set.Value()
}

// Key is the element's key.
func (id ElemID) Key() Key {
	k := Key{Proto: id.proto, Port: id.port, Slot: id.slot}
	switch id.fam {
	case 4:
		k.Addr = netip.AddrFrom4([4]byte(id.addr[12:]))
	case 6:
		k.Addr = netip.AddrFrom16(id.addr)
	}
	return k
}

func (id ElemID) String() string { return id.Map() + " " + id.Key().String() }

// ID returns the element's identity.
func (e Element) ID() ElemID { return NewElemID(e.Map, e.Key) }

// Set is a named set or verdict map.
type Set struct {
	Name string
	// Map sets are verdict maps keyed by Shape; other sets hold addresses
	// (Shape KeyAddr when nftgate fills them, none when the packet path
	// does).
	Map   bool
	Shape KeyShape
	// Timeout, when set, makes the set dynamic with element timeouts (the
	// session-affinity sets, filled by the packet path with `update`).
	Timeout time.Duration
	// Counter gives every element a counter of the packets that matched
	// it (Config.Counters).
	Counter bool
	// Size bounds the elements of a set the packet path fills: past it,
	// no element is added (zero: the kernel's default).
	Size uint32
	// Endpoints makes a map an endpoint map: its data is an endpoint's
	// address and port, not a verdict (endpoints.go).
	Endpoints bool
	// Addresses makes a map's data an address (MapMidstreamHomes).
	Addresses bool
}

// Hook attaches a base chain to a netfilter hook.
type Hook struct {
	Type     string // "nat" or "filter"
	Hook     string // prerouting, input, forward, output, postrouting
	Priority int32
}

// Chain is a chain and its rules, in order.
type Chain struct {
	Name  string
	Hook  *Hook // nil for regular chains
	Rules []Rule
}

// Rule is a sequence of statements, evaluated left to right.
type Rule []Stmt

// Text renders the rule as nft syntax; it is also the rule's identity for the
// differ and the source of its kernel fingerprint.
func (r Rule) Text(f Family) string { return string(r.AppendText(nil, f)) }

// AppendText appends the rule's text: fingerprinting a cold sync's rules
// formats no strings.
func (r Rule) AppendText(b []byte, f Family) []byte {
	for i, s := range r {
		if i > 0 {
			b = append(b, ' ')
		}
		b = s.AppendText(b, f)
	}
	return b
}

// Flowtable is an nftables flowtable: established flows that a rule adds
// to it are forwarded from its devices' ingress hook, past the rest of the
// forward path.
type Flowtable struct {
	Name     string
	Priority int32
	// Devices are the interfaces whose ingress the flowtable hooks, in
	// the configured order.
	Devices []string
	// Counter: the flowtable adds the packets it forwards to their
	// connections' counters in conntrack (which exist while
	// nf_conntrack_acct is on); without it an offloaded connection's
	// counters stop at its offload.
	Counter bool
}

// Fragment is what one owner (the static skeleton, or one Service)
// contributes to one family's table. Fragments of different owners never
// share a chain or a set; they may claim the same map element, which the
// programmer resolves.
type Fragment struct {
	Chains   []*Chain
	Sets     []*Set
	Elements []Element
	// Flowtables are only in the main table's skeleton.
	Flowtables []*Flowtable
	// Picks are the Service's elements in its shard's endpoint maps, one
	// per destination that chooses through them (endpoints.go). The
	// chains and maps they need are among Chains and Sets, shared with
	// the shard's other Services (Shared).
	Picks []Pick
	// Proxied are the destinations whose new connections the rules
	// redirect to the PROXY protocol proxy, with the endpoints the proxy
	// sends them to. They are no kernel objects: the planners ignore them.
	Proxied []ProxyTarget
}

// ProxyTarget is one destination the PROXY protocol proxy serves: the
// Service it belongs to, and the endpoints new connections go to (the
// ones the kernel would DNAT them to, by the same traffic policy).
type ProxyTarget struct {
	Dest      Destination
	Service   *model.Service
	Endpoints []model.Endpoint
}

// Empty tells whether the fragment has nothing in it.
func (fr *Fragment) Empty() bool {
	return fr == nil || (len(fr.Chains) == 0 && len(fr.Sets) == 0 && len(fr.Elements) == 0 && len(fr.Flowtables) == 0 && len(fr.Picks) == 0)
}

// ByFamily holds one fragment per family.
type ByFamily [2]Fragment

// Of returns the fragment of family f.
func (b *ByFamily) Of(f Family) *Fragment {
	if f == IPv6 {
		return &b[1]
	}
	return &b[0]
}
