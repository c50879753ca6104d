package ruleset

import (
	"fmt"
	"strconv"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Masquerade ports by CPU (Config.MasqueradePortGroups).
//
// The kernel's NAT picks a new connection's source port among those that no
// confirmed conntrack entry holds; a connection is confirmed only when its
// first packet leaves postrouting. Two SYNs translated at once on two CPUs
// can therefore be given the same address and port towards the same
// endpoint: the second to be confirmed clashes with the first
// (conntrack -S: insert_failed) and is dropped, and its client sends the SYN
// again a second later. At thousands of new connections a second from many
// clients that is a stall or two a minute (docs/design/dataplane.md). A
// CPU translates one packet at a time, so a range of ports of its own, which
// no other CPU picks from, leaves nothing to clash with: the CPUs are put in
// MasqueradePortGroups groups by the low bits of their number (meta cpu), and
// each group masquerades TCP to its share of the ports 1024-65535.
//
// Only TCP: a dropped SYN costs its client a second, while the kernel
// resolves most UDP clashes itself and a UDP client retries as it would
// after any loss. The cost: one group's share bounds the connections one
// masquerade address holds at once to one endpoint from that group's CPUs,
// which spread evenly only when the interfaces spread their packets over
// the CPUs (RSS or RPS).

// ChainMasqueradeCPU, followed by a group's number, names the masquerade
// chain of that group's CPUs.
const ChainMasqueradeCPU = "masquerading-cpu-"

// MaxMasqueradePortGroups bounds the groups: each keeps 64,512 / 16 = 4,032
// ports per address and endpoint.
const MaxMasqueradePortGroups = 16

// masqueradePortsLow and masqueradePortsHigh bound the ports the groups
// share: those the kernel gives a client whose own port is 1024 or higher.
const (
	masqueradePortsLow  = 1024
	masqueradePortsHigh = 65535
)

// MasqueradePortGroupsFor is the number of port groups for a gateway of
// cpus CPUs: the largest power of two not above cpus, at most
// MaxMasqueradePortGroups; 1 (no groups) for one CPU.
func MasqueradePortGroupsFor(cpus int) int {
	g := 1
	for g*2 <= min(cpus, MaxMasqueradePortGroups) {
		g *= 2
	}
	return g
}

// masqueradePortGroups is cfg's number of groups, 1 when it asks for none;
// a number that is not a power of two up to MaxMasqueradePortGroups is
// taken down to one (the groups are told apart by a mask).
func masqueradePortGroups(cfg *Config) int {
	return MasqueradePortGroupsFor(cfg.MasqueradePortGroups)
}

// GroupPorts is the range of ports of group g of groups.
func GroupPorts(g, groups int) Ports {
	size := (masqueradePortsHigh - masqueradePortsLow + 1) / groups
	lo := masqueradePortsLow + g*size
	return Ports{Proto: model.TCP, Min: uint16(lo), Max: uint16(lo + size - 1)}
}

// Ports is a range of ports a masquerade or SNAT translates the source
// port to, for one transport protocol (nft takes a port only after a match
// of the protocol). The zero Ports leaves the port to the kernel.
type Ports struct {
	Proto    model.Protocol
	Min, Max uint16
}

// set reports whether p names a range.
func (p Ports) set() bool { return p.Min != 0 }

// appendProto writes "meta l4proto tcp " for a range, nothing without.
func (p Ports) appendProto(b []byte) []byte {
	if !p.set() {
		return b
	}
	b = append(b, "meta l4proto "...)
	b = append(b, p.Proto.String()...)
	return append(b, ' ')
}

// appendRange writes ":1024-33279" for a range, nothing without.
func (p Ports) appendRange(b []byte) []byte {
	if !p.set() {
		return b
	}
	b = append(b, ':')
	b = strconv.AppendUint(b, uint64(p.Min), 10)
	b = append(b, '-')
	return strconv.AppendUint(b, uint64(p.Max), 10)
}

// match matches the protocol of a range.
func (p Ports) match(s bc.Sink) {
	if p.set() {
		matchL4Proto(s, p.Proto)
	}
}

// load loads a range into registers from and from+1 and returns them, with
// the NAT flags that make the kernel use them; zeros without a range.
func (p Ports) load(s bc.Sink, from uint32) (lo, hi, flags uint32) {
	if !p.set() {
		return 0, 0, 0
	}
	s.Immediate(bc.Immediate{Dreg: from, Data: bc.Bytes(byte(p.Min>>8), byte(p.Min))})
	s.Immediate(bc.Immediate{Dreg: from + 1, Data: bc.Bytes(byte(p.Max>>8), byte(p.Max))})
	return from, from + 1, bc.NATSpecified
}

// MatchCPU matches a packet of one protocol handled by a CPU whose number,
// masked with Mask, is Value.
type MatchCPU struct {
	Proto       model.Protocol
	Mask, Value uint32
}

// AppendText writes "meta l4proto tcp meta cpu & 1 == 0".
func (m MatchCPU) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "meta l4proto %s meta cpu & %d == %d", m.Proto, m.Mask, m.Value)
}

// Encode matches the protocol, loads the CPU's number, masks it and
// compares it.
func (m MatchCPU) Encode(_ Family, s bc.Sink) {
	matchL4Proto(s, m.Proto)
	s.Meta(bc.Meta{Key: bc.MetaCPU, Reg: bc.Reg1})
	maskedEq(s, m.Mask, m.Value)
}

// masqueradeRules translate a marked connection's source (after the
// masquerade bit is cleared): with port groups, TCP goes to its CPU
// group's chain, which translates to the group's ports, and the other
// protocols to any port; chains are the groups' chains.
func masqueradeRules(cfg *Config, f Family) (rules []Rule, chains []*Chain) {
	groups := masqueradePortGroups(cfg)
	if groups == 1 {
		return anyPortRules(cfg, f), nil
	}
	rules = []Rule{{SetMark{Bit: MasqueradeBitOf(cfg), Xor: true}}}
	for g := range groups {
		name := ChainMasqueradeCPU + strconv.Itoa(g)
		rules = append(rules, Rule{
			MatchCPU{Proto: model.TCP, Mask: uint32(groups - 1), Value: uint32(g)},
			Verdict{Kind: Goto, Chain: name}})
		chains = append(chains, &Chain{Name: name, Rules: translateRules(cfg, f, GroupPorts(g, groups))})
	}
	return append(rules, translateRules(cfg, f, Ports{})...), chains
}

// anyPortRules clear the masquerade mark bit and translate the source
// without a range of ports, keeping the client's port where it is free.
func anyPortRules(cfg *Config, f Family) []Rule {
	toggle := SetMark{Bit: MasqueradeBitOf(cfg), Xor: true}
	any := translateRules(cfg, f, Ports{})
	if len(any) == 1 {
		// One translation: the bit is cleared in its rule.
		return []Rule{append(Rule{toggle}, any[0]...)}
	}
	return append([]Rule{{toggle}}, any...)
}

// translateRules translate the source to one of the family's
// MasqueradeAddresses, chosen by a hash of the client's address, or without
// any, to the outgoing interface's address; to a port of ports, or without
// a range, keeping the client's port where it is free. That matters: the
// endpoint that closes first keeps (source, port) in TIME_WAIT for a minute
// and accepts a new SYN onto it only with a newer timestamp or a later
// sequence number, which only the same client connection (same address and
// port, hence the same timestamp offset and sequence clock) is sure to have.
// Random ports map unrelated client connections onto tuples the endpoint
// still holds, and about half of those SYNs are answered with an ACK, reset
// by the client and sent again (see docs/design/dataplane.md); the release
// of the endpoints' TIME_WAIT (release.go) leaves few such tuples, and a
// group's range keeps the client's port where it falls in the range.
func translateRules(cfg *Config, f Family, ports Ports) []Rule {
	pool := MasqueradePool(cfg, f)
	if len(pool) == 0 {
		return []Rule{{Masquerade{Ports: ports}}}
	}
	if len(pool) == 1 {
		return []Rule{{SNAT{To: pool[0], Ports: ports}}}
	}
	var rules []Rule
	for i, a := range pool[:len(pool)-1] {
		rules = append(rules, Rule{
			HashBucket{Seed: cfg.hashSeed(), Modulus: uint32(len(pool)), Bucket: uint32(i), AddrOnly: true},
			SNAT{To: a, Ports: ports}})
	}
	// The last address's bucket is what the others left (an SNAT ends
	// the chain), as for endpoints.
	return append(rules, Rule{SNAT{To: pool[len(pool)-1], Ports: ports}})
}
