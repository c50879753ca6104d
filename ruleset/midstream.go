package ruleset

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Waiting for a replica, with a bound (Config.DropMidstreamTCP with
// Config.MidstreamWait).
//
// A masqueraded TCP packet that reaches a NAT chain without being a SYN is
// one conntrack picked up in mid-stream: a connection that another
// gateway of the set opened and the router moved here before its replica
// came. Dropping it keeps the kernel from taking the connection as new and
// masquerading it afresh (to this gateway's address and port, which the
// endpoint does not know); the client sends it again and meets the replica.
// A connection whose replica never comes (its gateway failed within the
// sync's lag) would wait that way until its client gave up. So the first
// such packet of a connection puts its original tuple in SetMidstreamWaiting
// for MidstreamWait and in SetMidstreamWaited for MidstreamWait and
// MidstreamGiveUp more; its packets are dropped while the tuple is in the
// first, and the first one that comes after (it is in the second only) is
// picked up: masqueraded here. With one masquerade address that floats
// between the gateways (active/backup) and the client's port free, that is
// the endpoint's connection again, and it carries on; to another address
// the endpoint resets it, and the client learns at once rather than after
// minutes. A set that is full takes no tuple: that connection waits
// unbounded, as without the bound.
//
// With masquerade ports by CPU (cpuports.go), the connection's own gateway
// kept the client's port only where it fell in the range of the CPU that
// took the SYN there; picked up here in the range of this CPU, it would keep
// it only where both ranges hold it (measured: 1 connection of 6 carried
// on, 2 CPUs). A picked-up connection is masqueraded without a range
// (ChainMidstreamPickUp), keeping the client's port wherever it is free
// here, and carries on wherever its gateway kept the port. It is one
// connection among the new ones: the clash the ranges prevent costs it a
// dropped packet, sent again and picked up the same way.
//
// In an active-active set each gateway masquerades to addresses of its
// own, which the endpoint of a dead gateway's connection does not know.
// With the peers' pools (Config.PeerMasquerade) ChainMidstreamPickUp first
// masquerades to the address MapMidstreamHomes gives for the client's
// address hash: while exactly one peer is dead, that peer's address its
// client hashes to, where this gateway holds it (the replies come here)
// or, with state sync, wherever it is held (the sync carries the entry to
// the holder, whose ChainStrayReplies drops the endpoint's answers until
// it is there); so the connection carries on where its gateway kept the
// port. Without the wait (Config.DropMidstreamTCP off: no state sync, or
// "pickup") the masqueraded TCP packets that are not a SYN go to
// ChainMidstreamPickUp at once. See docs/design/gateways.md, "A
// connection given up in active/active".
//
// While a peer of the set is dead (Config.MidstreamWaitPeerDead, shorter
// than MidstreamWait), a connection waits that long instead: the dead
// peer's connections whose replicas never came are then the ones that
// wait, and the longer wait, which covers a live peer's replica whose
// events were lost until the peer's next refresh, only holds them up. The
// first packet of a connection puts its tuple in SetMidstreamWaitingShort
// too, and ChainMidstream tests which of the two waits is in force when
// each packet comes (the flag SetMidstreamPeerDead, which nftgate writes
// when the gateway set tells a peer dead), so a connection that began to
// wait before the death was known is given up by the shorter wait too.
//
// The rules count the connections that began to wait (ChainMidstreamWait)
// and those given up (ChainMidstream) with Config.Counters.

// The sets of the wait, keyed by the connection's original tuple (KeyConn).
const (
	SetMidstreamWaiting = "midstream-waiting"
	SetMidstreamWaited  = "midstream-waited"
	// SetMidstreamWaitingShort holds a connection's tuple for
	// Config.MidstreamWaitPeerDead (with MidstreamShortens).
	SetMidstreamWaitingShort = "midstream-waiting-short"
)

// SetMidstreamPeerDead is the flag of the shorter wait (KeyProto): it
// holds MidstreamPeerDeadElement while a peer of the set is dead, and
// nothing otherwise. nftgate writes it at run time.
const SetMidstreamPeerDead = "midstream-peer-dead"

// MidstreamPeerDeadElement is SetMidstreamPeerDead's one element: the
// protocol of every packet the wait sees.
var MidstreamPeerDeadElement = Element{Map: SetMidstreamPeerDead, Key: Key{Proto: model.TCP}}

// The chains of the wait: ChainMidstream, for every masqueraded TCP packet
// that is not a SYN, drops it while its connection waits and lets it be
// picked up after; ChainMidstreamWait starts the wait.
const (
	ChainMidstream     = "midstream"
	ChainMidstreamWait = "midstream-wait"
	// ChainMidstreamPickUp masquerades a connection picked up: to a
	// dead peer's address (MapMidstreamHomes), else to this gateway's,
	// without the CPU's range of ports.
	ChainMidstreamPickUp = "midstream-pick-up"
)

// MidstreamGiveUp is how long after its wait a connection's tuple stays in
// SetMidstreamWaited, so that its next packet is picked up rather than
// waiting again: TCP sends again at most two minutes after the last try
// (TCP_RTO_MAX), with some room.
const MidstreamGiveUp = 150 * time.Second

// MidstreamSize bounds each set of the wait: connections waiting, or given
// up within MidstreamGiveUp.
const MidstreamSize = 65536

// MidstreamBounded tells whether the ruleset waits for a replica with a
// bound: ChainMidstream and the sets of the wait exist.
func (c *Config) MidstreamBounded() bool { return c.DropMidstreamTCP && c.MidstreamWait > 0 }

// MidstreamShortens tells whether the bounded wait is shorter while a
// peer is dead: SetMidstreamPeerDead and SetMidstreamWaitingShort exist.
func (c *Config) MidstreamShortens() bool {
	return c.MidstreamBounded() && c.MidstreamWaitPeerDead > 0 && c.MidstreamWaitPeerDead < c.MidstreamWait
}

// midstreamRules drop, with Config.DropMidstreamTCP, the masqueraded TCP
// packets that are not a SYN. Only the first packet of a connection
// passes a NAT chain, so these are the packets conntrack picked up in
// mid-stream: dropped, the entry is not kept, and the state sync's
// replica takes the connection's next packet. With Config.MidstreamWait
// they go to ChainMidstream, which drops them for that long per
// connection. Without DropMidstreamTCP they are picked up at once; with
// the map of homes, through ChainMidstreamPickUp.
func midstreamRules(cfg *Config, f Family) []Rule {
	switch {
	case !cfg.DropMidstreamTCP && MidstreamHomesModulus(cfg, f) > 0:
		// Picked up at once, through the map of homes.
		return []Rule{{MatchTCPNotSYN{}, Verdict{Kind: Goto, Chain: ChainMidstreamPickUp}}}
	case !cfg.DropMidstreamTCP:
		return nil
	case !cfg.MidstreamBounded():
		return []Rule{{MatchTCPNotSYN{}, Verdict{Kind: Drop}}}
	}
	return []Rule{{MatchTCPNotSYN{}, Verdict{Kind: Jump, Chain: ChainMidstream}}}
}

// midstreamWait is the sets and chains of the bounded wait and of the
// pick-up (with the map of homes, also without the wait), or nothing
// without them.
func midstreamWait(cfg *Config, f Family) ([]*Set, []*Chain) {
	var sets []*Set
	var chains []*Chain
	homes := MidstreamHomesModulus(cfg, f)
	if homes > 0 {
		sets = append(sets, &Set{Name: MapMidstreamHomes, Map: true, Shape: KeySlot, Addresses: true})
	}
	pickUp := Verdict{Kind: Return}
	if homes > 0 || cfg.MidstreamBounded() && masqueradePortGroups(cfg) > 1 {
		pickUp = Verdict{Kind: Goto, Chain: ChainMidstreamPickUp}
		chains = append(chains, &Chain{Name: ChainMidstreamPickUp, Rules: append(leanEventsRules(cfg), pickUpRules(cfg, f, homes)...)})
	}
	if !cfg.MidstreamBounded() {
		return sets, chains
	}
	var count []Stmt
	if cfg.Counters {
		count = []Stmt{Counter{}}
	}
	sets = append(sets,
		&Set{Name: SetMidstreamWaiting, Shape: KeyConn, Timeout: cfg.MidstreamWait, Size: MidstreamSize},
		&Set{Name: SetMidstreamWaited, Shape: KeyConn, Timeout: cfg.MidstreamWait + MidstreamGiveUp, Size: MidstreamSize})
	// Every packet here is TCP; nft's text needs the protocol said to
	// know the ports' type.
	tcp := MatchL4Proto{Proto: model.TCP}
	giveUp := append(append(Rule{tcp, MatchCtConnInSet{Set: SetMidstreamWaited}}, count...), pickUp)
	add := Rule{tcp, AddConn{Set: SetMidstreamWaiting}}
	waiting := []Rule{{tcp, MatchCtConnInSet{Set: SetMidstreamWaiting}, Verdict{Kind: Drop}}}
	if cfg.MidstreamShortens() {
		sets = append(sets,
			&Set{Name: SetMidstreamPeerDead, Shape: KeyProto},
			&Set{Name: SetMidstreamWaitingShort, Shape: KeyConn, Timeout: cfg.MidstreamWaitPeerDead, Size: MidstreamSize})
		add = append(add, AddConn{Set: SetMidstreamWaitingShort})
		// Which wait is in force is tested at each packet.
		waiting = []Rule{
			{tcp, MatchProtoInSet{Set: SetMidstreamPeerDead}, MatchCtConnInSet{Set: SetMidstreamWaitingShort}, Verdict{Kind: Drop}},
			{tcp, MatchProtoInSet{Set: SetMidstreamPeerDead, Not: true}, MatchCtConnInSet{Set: SetMidstreamWaiting}, Verdict{Kind: Drop}},
		}
	}
	start := append(append(append(add, AddConn{Set: SetMidstreamWaited}), count...), Verdict{Kind: Drop})
	chains = append(chains, []*Chain{
		{Name: ChainMidstream, Rules: append(waiting,
			giveUp,
			Rule{Verdict{Kind: Goto, Chain: ChainMidstreamWait}},
		)},
		// The second rule drops what the first could not add to a
		// full set.
		{Name: ChainMidstreamWait, Rules: []Rule{start, {Verdict{Kind: Drop}}}},
	}...)
	return sets, chains
}

// MatchCtConnInSet matches a packet whose connection's original tuple
// (KeyConn) is in Set.
type MatchCtConnInSet struct{ Set string }

// AppendText writes "ct original ip saddr . meta l4proto . ct original
// proto-src . ct original ip daddr . ct original proto-dst @set".
func (m MatchCtConnInSet) AppendText(b []byte, f Family) []byte {
	return fmt.Appendf(b, "ct original %s saddr . meta l4proto . ct original proto-src . ct original %s daddr . ct original proto-dst @%s",
		f, f, m.Set)
}

// Encode loads the tuple's fields into consecutive registers and looks
// them up.
func (m MatchCtConnInSet) Encode(f Family, s bc.Sink) {
	loadCtConn(f, s)
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: m.Set})
}

// MatchProtoInSet matches a packet whose protocol is (with Not, is not)
// in Set (KeyProto).
type MatchProtoInSet struct {
	Set string
	Not bool
}

// AppendText writes "meta l4proto @set" or "meta l4proto != @set".
func (m MatchProtoInSet) AppendText(b []byte, _ Family) []byte {
	b = append(b, "meta l4proto "...)
	if m.Not {
		b = append(b, "!= "...)
	}
	return append(append(b, '@'), m.Set...)
}

// Encode loads the protocol and looks it up.
func (m MatchProtoInSet) Encode(_ Family, s bc.Sink) {
	s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: bc.Reg1})
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: m.Set, Invert: m.Not})
}

// pickUpRules translate a connection picked up in mid-stream (at once, or
// given up after the wait): with homes (the modulus of MapMidstreamHomes)
// first to the address its element gives, if any (the dead peer's address
// its client hashes to, where this gateway holds it), else to this
// gateway's addresses without the CPU's range of ports.
func pickUpRules(cfg *Config, f Family, homes uint32) []Rule {
	if homes == 0 {
		return anyPortRules(cfg, f)
	}
	toggle := SetMark{Bit: MasqueradeBitOf(cfg), Xor: true}
	home := Rule{SNATHome{Seed: cfg.hashSeed(), Modulus: homes, Map: MapMidstreamHomes}}
	return append([]Rule{{toggle}, home}, translateRules(cfg, f, Ports{})...)
}

// MapMidstreamHomes maps a bucket of the client's address hash (modulo
// MidstreamHomesModulus) to the address of a dead peer's pool that the
// peer masqueraded that client to, for the buckets whose address this
// gateway holds (with state sync, every bucket). nftgate writes its
// elements at run time (MidstreamHomeElements); a bucket without one is
// masqueraded to this gateway's own addresses.
const MapMidstreamHomes = "midstream-homes"

// maxHomesModulus bounds MidstreamHomesModulus: pools whose sizes have a
// larger least common multiple get no map (their pick-ups are
// masqueraded to this gateway's own addresses).
const maxHomesModulus = 4096

// HasMidstreamHomes tells whether either family has MapMidstreamHomes
// (and ChainStrayReplies).
func HasMidstreamHomes(cfg *Config) bool {
	return MidstreamHomesModulus(cfg, IPv4) > 0 || MidstreamHomesModulus(cfg, IPv6) > 0
}

// MidstreamHomesModulus is the modulus of MapMidstreamHomes in family f:
// the least common multiple of the sizes of the peers' pools of f, so
// that every pool's choice is a run of buckets (jhash scales the hash to
// the modulus rather than taking a remainder); 0 without the map (no
// pick-up: the wait without bound; no peer pool of f; or a multiple past
// maxHomesModulus).
func MidstreamHomesModulus(cfg *Config, f Family) uint32 {
	if cfg.DropMidstreamTCP && !cfg.MidstreamBounded() {
		return 0
	}
	m := uint32(0)
	for _, pool := range cfg.PeerMasquerade {
		n := uint32(0)
		for _, a := range pool {
			if Of(a) == f {
				n++
			}
		}
		if n == 0 {
			continue
		}
		if m == 0 {
			m = n
			continue
		}
		a, b := m, n
		for b != 0 {
			a, b = b, a%b
		}
		if m = m / a * n; m > maxHomesModulus {
			return 0
		}
	}
	return m
}

// MidstreamHomeElements are the elements of MapMidstreamHomes in family f
// for a dead peer's pool (its addresses of f, sorted, as its masquerading
// chain hashes over them: MasqueradePool), those of the buckets whose
// address held tells this gateway holds.
func MidstreamHomeElements(cfg *Config, f Family, pool []netip.Addr, held func(netip.Addr) bool) []Element {
	k := MidstreamHomesModulus(cfg, f)
	own := poolOf(pool, f)
	if k == 0 || len(own) == 0 || k%uint32(len(own)) != 0 {
		return nil
	}
	per := k / uint32(len(own))
	var out []Element
	for i := range k {
		a := own[i/per]
		if held(a) {
			out = append(out, Element{Map: MapMidstreamHomes, Key: Key{Slot: i}, To: netip.AddrPortFrom(a, 0)})
		}
	}
	return out
}

// SNATHome translates the source to the address the client's address
// hashes to in a map of buckets (MapMidstreamHomes), keeping the port
// where it is free; without an element the rule does not match.
type SNATHome struct {
	Seed    uint32
	Modulus uint32
	Map     string
}

// AppendText writes "snat ip to jhash ip saddr mod 2 seed 0x7 map @map".
func (n SNATHome) AppendText(b []byte, f Family) []byte {
	b = fmt.Appendf(b, "snat %s to jhash %s saddr mod %d seed 0x%x map @", f, f, n.Modulus, n.Seed)
	return append(b, n.Map...)
}

// Encode hashes the source address as HashBucket does, looks the bucket
// up into the address register and translates the source to it.
func (n SNATHome) Encode(f Family, s bc.Sink) {
	fam := uint32(IPv4)
	if f == IPv6 {
		fam = uint32(IPv6)
	}
	s.Payload(loadAddr(f, Src, bc.Reg2, f.AddrLen()))
	s.Hash(bc.Hash{Sreg: bc.Reg2, Dreg: bc.Reg1, Len: f.AddrLen(), Modulus: n.Modulus, Seed: n.Seed})
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: n.Map, Dreg: bc.Reg1, HasDreg: true})
	s.NAT(bc.NAT{Type: bc.NATSource, Family: fam, RegAddr: bc.Reg1})
}

// ChainStrayReplies drops, in the forward hook, a TCP packet that is not
// a SYN, has no entry here and goes to one of the set's masquerade
// addresses (this gateway's and its peers'): an endpoint's packet for a
// connection this gateway does not hold (yet). The case it is for: a
// connection of a dead peer picked up at a survivor and masqueraded to
// the dead peer's address another survivor holds (MapMidstreamHomes
// with state sync); the endpoint's first answer reaches the holder
// before the pick-up's replica (a batch, milliseconds). Routed, it would
// make an entry of its own there, whose tuple then refuses the replica,
// and the connection would hang; dropped, the endpoint sends it again
// and meets the replica. Any other such packet is a stray too: routed,
// it would go back to the router, which routes it here again.
const ChainStrayReplies = "stray-replies"

// strayReplies is ChainForwardNew's rule that sends TCP packets that are
// not a SYN to ChainStrayReplies, and that chain, whose rules drop those
// to each masquerade address of the set in family f (counted with
// Config.Counters); none without the map of homes. A connection's first
// packet is a SYN but for a pick-up, so the addresses cost a new
// connection one test.
func strayReplies(cfg *Config, f Family) (Rule, *Chain) {
	if MidstreamHomesModulus(cfg, f) == 0 {
		return nil, nil
	}
	addrs := poolOf(cfg.MasqueradeAddresses, f)
	for _, pool := range cfg.PeerMasquerade {
		addrs = append(addrs, poolOf(pool, f)...)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	c := &Chain{Name: ChainStrayReplies}
	for _, a := range addrs {
		r := Rule{MatchAddr{Dir: Dst, Prefix: netip.PrefixFrom(a, a.BitLen())}}
		if cfg.Counters {
			r = append(r, Counter{})
		}
		c.Rules = append(c.Rules, append(r, Verdict{Kind: Drop}))
	}
	return Rule{MatchTCPNotSYN{}, Verdict{Kind: Jump, Chain: ChainStrayReplies}}, c
}
