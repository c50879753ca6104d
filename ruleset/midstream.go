package ruleset

import (
	"fmt"
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
// The rules count the connections that began to wait (ChainMidstreamWait)
// and those given up (ChainMidstream) with Config.Counters.

// The sets of the wait, keyed by the connection's original tuple (KeyConn).
const (
	SetMidstreamWaiting = "midstream-waiting"
	SetMidstreamWaited  = "midstream-waited"
)

// The chains of the wait: ChainMidstream, for every masqueraded TCP packet
// that is not a SYN, drops it while its connection waits and lets it be
// picked up after; ChainMidstreamWait starts the wait.
const (
	ChainMidstream     = "midstream"
	ChainMidstreamWait = "midstream-wait"
	// ChainMidstreamPickUp masquerades a connection picked up without
	// the CPU's range of ports, with masquerade ports by CPU.
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

// midstreamRules drop, with Config.DropMidstreamTCP, the masqueraded TCP
// packets that are not a SYN. Only the first packet of a connection
// passes a NAT chain, so these are the packets conntrack picked up in
// mid-stream: dropped, the entry is not kept, and the state sync's
// replica takes the connection's next packet. With Config.MidstreamWait
// they go to ChainMidstream, which drops them for that long per
// connection.
func midstreamRules(cfg *Config) []Rule {
	switch {
	case !cfg.DropMidstreamTCP:
		return nil
	case !cfg.MidstreamBounded():
		return []Rule{{MatchTCPNotSYN{}, Verdict{Kind: Drop}}}
	}
	return []Rule{{MatchTCPNotSYN{}, Verdict{Kind: Jump, Chain: ChainMidstream}}}
}

// midstreamWait is the sets and chains of the bounded wait, or nothing
// without it.
func midstreamWait(cfg *Config, f Family) ([]*Set, []*Chain) {
	if !cfg.MidstreamBounded() {
		return nil, nil
	}
	var count []Stmt
	if cfg.Counters {
		count = []Stmt{Counter{}}
	}
	sets := []*Set{
		{Name: SetMidstreamWaiting, Shape: KeyConn, Timeout: cfg.MidstreamWait, Size: MidstreamSize},
		{Name: SetMidstreamWaited, Shape: KeyConn, Timeout: cfg.MidstreamWait + MidstreamGiveUp, Size: MidstreamSize},
	}
	// Every packet here is TCP; nft's text needs the protocol said to
	// know the ports' type.
	tcp := MatchL4Proto{Proto: model.TCP}
	pickUp := Verdict{Kind: Return}
	var chains []*Chain
	if masqueradePortGroups(cfg) > 1 {
		pickUp = Verdict{Kind: Goto, Chain: ChainMidstreamPickUp}
		chains = append(chains, &Chain{Name: ChainMidstreamPickUp, Rules: append(leanEventsRules(cfg), anyPortRules(cfg, f)...)})
	}
	giveUp := append(append(Rule{tcp, MatchCtConnInSet{Set: SetMidstreamWaited}}, count...), pickUp)
	start := append(append(Rule{tcp, AddConn{Set: SetMidstreamWaiting}, AddConn{Set: SetMidstreamWaited}}, count...), Verdict{Kind: Drop})
	chains = append(chains, []*Chain{
		{Name: ChainMidstream, Rules: []Rule{
			{tcp, MatchCtConnInSet{Set: SetMidstreamWaiting}, Verdict{Kind: Drop}},
			giveUp,
			{Verdict{Kind: Goto, Chain: ChainMidstreamWait}},
		}},
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
