package ruleset

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Stmt is one statement of a rule: a match, an action or a verdict. The set
// of statements is closed. Each writes its nft text, and writes its
// expressions once, into a bytecode.Sink: the kernel package's batch, or a
// test's oracle. What each does to a packet is replayed by the test
// support's tracer (internal/testing/trace).
type Stmt interface {
	// AppendText appends the statement's nft text.
	AppendText(b []byte, f Family) []byte
	// Encode writes the statement's expressions into s.
	Encode(f Family, s bc.Sink)
}

func saddrOffset(f Family) uint32 {
	if f == IPv6 {
		return 8
	}
	return 12
}

func daddrOffset(f Family) uint32 {
	if f == IPv6 {
		return 24
	}
	return 16
}

// Dir selects the source or destination address of a packet.
type Dir uint8

// Address directions.
const (
	Src Dir = iota
	Dst
)

func (d Dir) word() string {
	if d == Src {
		return "saddr"
	}
	return "daddr"
}

func loadAddr(f Family, d Dir, reg, length uint32) bc.Payload {
	off := saddrOffset(f)
	if d == Dst {
		off = daddrOffset(f)
	}
	return bc.Payload{Base: bc.NetworkHeader, Offset: off, Len: length, Dreg: reg}
}

// addrData is an address as a constant.
func addrData(a netip.Addr) bc.Data {
	if a.Is4() {
		a4 := a.As4()
		return bc.Bytes(a4[:]...)
	}
	a16 := a.As16()
	return bc.Bytes(a16[:]...)
}

// MatchAddr matches the source or destination address against a prefix (a
// single address is a full-length prefix).
type MatchAddr struct {
	Dir    Dir
	Prefix netip.Prefix
	Not    bool
}

// AppendText writes "ip saddr != 10.0.0.0/8".
func (m MatchAddr) AppendText(b []byte, f Family) []byte {
	b = append(b, f.String()...)
	b = append(b, ' ')
	b = append(b, m.Dir.word()...)
	b = append(b, ' ')
	if m.Not {
		b = append(b, "!= "...)
	}
	if m.Prefix.IsSingleIP() {
		return m.Prefix.Addr().AppendTo(b)
	}
	return m.Prefix.AppendTo(b)
}

// Encode loads the address, masked when the prefix ends inside a byte,
// and compares it.
func (m MatchAddr) Encode(f Family, s bc.Sink) {
	op := uint32(bc.CmpEq)
	if m.Not {
		op = bc.CmpNeq
	}
	bits := m.Prefix.Bits()
	addr := addrData(m.Prefix.Addr())
	if bits%8 == 0 {
		// Whole bytes: load just those, as nft does.
		n := bits / 8
		s.Payload(loadAddr(f, m.Dir, bc.Reg1, uint32(n)))
		s.Cmp(bc.Cmp{Op: op, Sreg: bc.Reg1, Data: bc.Bytes(addr.Slice()[:n]...)})
		return
	}
	var mask [16]byte
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	n := f.AddrLen()
	s.Payload(loadAddr(f, m.Dir, bc.Reg1, n))
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: n, Mask: bc.Bytes(mask[:n]...), Xor: bc.Zero(int(n))})
	s.Cmp(bc.Cmp{Op: op, Sreg: bc.Reg1, Data: addr})
}

// MatchAddrInSet matches the source address against a named address set.
type MatchAddrInSet struct {
	Dir Dir
	Set string
}

// AppendText writes "ip saddr @set".
func (m MatchAddrInSet) AppendText(b []byte, f Family) []byte {
	b = append(b, f.String()...)
	b = append(b, ' ')
	b = append(b, m.Dir.word()...)
	b = append(b, " @"...)
	return append(b, m.Set...)
}

// Encode loads the address and looks it up.
func (m MatchAddrInSet) Encode(f Family, s bc.Sink) {
	s.Payload(loadAddr(f, m.Dir, bc.Reg1, f.AddrLen()))
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: m.Set})
}

// MatchAddrPairInSet matches a packet whose source and destination address
// pair is in a set: the hairpin set holds "A . A" for every endpoint A, so
// after DNAT it finds the endpoints that are talking to themselves.
type MatchAddrPairInSet struct {
	Set string
}

// AppendText writes "ip saddr . ip daddr @set".
func (m MatchAddrPairInSet) AppendText(b []byte, f Family) []byte {
	return fmt.Appendf(b, "%s saddr . %s daddr @%s", f, f, m.Set)
}

// Encode loads both addresses, one after the other, and looks them up.
func (m MatchAddrPairInSet) Encode(f Family, s bc.Sink) {
	daddrReg := uint32(bc.Reg32a)
	if f == IPv6 {
		daddrReg = bc.Reg2
	}
	s.Payload(loadAddr(f, Src, bc.Reg1, f.AddrLen()))
	s.Payload(loadAddr(f, Dst, daddrReg, f.AddrLen()))
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: m.Set})
}

// MatchLocal matches when the source or destination address is one of the
// gateway's own (fib ... type local). Excluding loopback keeps NodePorts off
// 127.0.0.1, as kube-proxy's nftables mode does.
type MatchLocal struct {
	Dir Dir
}

// AppendText writes "fib daddr type local".
func (m MatchLocal) AppendText(b []byte, _ Family) []byte {
	b = append(b, "fib "...)
	b = append(b, m.Dir.word()...)
	return append(b, " type local"...)
}

// Encode asks the fib for the address's type.
func (m MatchLocal) Encode(_ Family, s bc.Sink) {
	flags := uint32(bc.FibDaddr)
	if m.Dir == Src {
		flags = bc.FibSaddr
	}
	s.Fib(bc.Fib{Dreg: bc.Reg1, Flags: flags, Result: bc.FibAddrType})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.U32(bc.RouteTypeLocal)})
}

// MatchCtNew matches the first packet of a connection.
type MatchCtNew struct{}

// AppendText writes "ct state new".
func (MatchCtNew) AppendText(b []byte, _ Family) []byte { return append(b, "ct state new"...) }

// Encode tests the connection state's new bit.
func (MatchCtNew) Encode(_ Family, s bc.Sink) { ctStateBit(s, bc.CtStateNew) }

// ctStateBit tests a bit of the connection's state.
func ctStateBit(s bc.Sink, bit uint32) {
	s.Ct(bc.Ct{Key: bc.CtState, Dreg: bc.Reg1})
	anyBit(s, bit)
}

// anyBit masks register 1, just loaded, with bits and matches when any is
// set.
func anyBit(s bc.Sink, bits uint32) {
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 4, Mask: bc.U32(bits), Xor: bc.Zero(4)})
	s.Cmp(bc.Cmp{Op: bc.CmpNeq, Sreg: bc.Reg1, Data: bc.Zero(4)})
}

// allBits masks register 1, just loaded, with bits and matches when all
// are set.
func allBits(s bc.Sink, bits uint32) { maskedEq(s, bits, bits) }

// maskedEq masks register 1, just loaded, with mask and matches when the
// rest is value.
func maskedEq(s bc.Sink, mask, value uint32) {
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 4, Mask: bc.U32(mask), Xor: bc.Zero(4)})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.U32(value)})
}

// matchL4Proto loads the packet's transport protocol and matches p.
func matchL4Proto(s bc.Sink, p model.Protocol) {
	s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: bc.Reg1})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(byte(p))})
}

// MatchCtEstablished matches the packets of a connection that has seen
// traffic both ways.
type MatchCtEstablished struct{}

// AppendText writes "ct state established".
func (MatchCtEstablished) AppendText(b []byte, _ Family) []byte {
	return append(b, "ct state established"...)
}

// Encode tests the connection state's established bit.
func (MatchCtEstablished) Encode(_ Family, s bc.Sink) { ctStateBit(s, bc.CtStateEstablished) }

// MatchCtDNAT matches the packets of a connection whose destination was
// translated: the connections to a Service.
type MatchCtDNAT struct{}

// AppendText writes "ct status dnat".
func (MatchCtDNAT) AppendText(b []byte, _ Family) []byte { return append(b, "ct status dnat"...) }

// Encode tests the connection status's destination NAT bit.
func (MatchCtDNAT) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtStatus, Dreg: bc.Reg1})
	anyBit(s, bc.CtStatusDstNAT)
}

// MatchCtPacketsOver matches the packets of a connection that has passed
// more than N packets, both directions counted (N is never 0: the rule
// leaves the match out instead).
type MatchCtPacketsOver struct{ N uint64 }

// AppendText writes "ct packets > N".
func (m MatchCtPacketsOver) AppendText(b []byte, _ Family) []byte {
	return strconv.AppendUint(append(b, "ct packets > "...), m.N, 10)
}

// Encode loads the counter, turns it to network order and compares, as
// nft writes "ct packets > N".
func (m MatchCtPacketsOver) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtPackets, Dreg: bc.Reg1})
	s.Byteorder(bc.Byteorder{Sreg: bc.Reg1, Dreg: bc.Reg1, Op: bc.ByteorderHton, Len: 8, Size: 8})
	s.Cmp(bc.Cmp{Op: bc.CmpGt, Sreg: bc.Reg1, Data: bc.U64BE(m.N)})
}

// FlowOffload adds the packet's connection to a flowtable, which forwards
// its later packets from the ingress hook.
type FlowOffload struct{ Flowtable string }

// AppendText writes "flow add @ft".
func (o FlowOffload) AppendText(b []byte, _ Family) []byte {
	return append(append(b, "flow add @"...), o.Flowtable...)
}

// Encode writes the flow offload.
func (o FlowOffload) Encode(_ Family, s bc.Sink) {
	s.FlowOffload(bc.FlowOffload{Flowtable: o.Flowtable})
}

// MatchTCPNotSYN matches TCP packets that do not open a connection: any
// of FIN, RST or ACK set, or SYN unset (iptables' "! --syn").
type MatchTCPNotSYN struct{}

// The TCP header's flag bits the statements look at.
const (
	TCPFlagFIN uint8 = 0x01
	TCPFlagSYN uint8 = 0x02
	TCPFlagRST uint8 = 0x04
	TCPFlagACK uint8 = 0x10
)

const (
	tcpFIN = TCPFlagFIN
	tcpSYN = TCPFlagSYN
	tcpRST = TCPFlagRST
	tcpACK = TCPFlagACK
)

// AppendText writes "tcp flags & (fin | syn | rst | ack) != syn".
func (MatchTCPNotSYN) AppendText(b []byte, _ Family) []byte {
	return append(b, "tcp flags & (fin | syn | rst | ack) != syn"...)
}

// Encode matches the protocol, loads the flags byte, masks it and compares
// it with SYN alone.
func (MatchTCPNotSYN) Encode(_ Family, s bc.Sink) {
	matchL4Proto(s, model.TCP)
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 13, Len: 1, Dreg: bc.Reg1})
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 1, Mask: bc.Bytes(tcpFIN | tcpSYN | tcpRST | tcpACK), Xor: bc.Zero(1)})
	s.Cmp(bc.Cmp{Op: bc.CmpNeq, Sreg: bc.Reg1, Data: bc.Bytes(tcpSYN)})
}

// MatchMarkUnset matches packets without the masquerade mark bit.
type MatchMarkUnset struct{ Bit uint32 }

// AppendText writes "meta mark & 0x004000 == 0".
func (m MatchMarkUnset) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "meta mark & %#08x == 0", m.Bit)
}

// Encode masks the mark and compares it with zero.
func (m MatchMarkUnset) Encode(_ Family, s bc.Sink) {
	s.Meta(bc.Meta{Key: bc.MetaMark, Reg: bc.Reg1})
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 4, Mask: bc.U32(m.Bit), Xor: bc.Zero(4)})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Zero(4)})
}

// SetMark sets (Or) or toggles (Xor) a mark bit.
type SetMark struct {
	Bit uint32
	Xor bool
}

// AppendText writes "meta mark set meta mark | 0x004000" (or ^).
func (m SetMark) AppendText(b []byte, _ Family) []byte {
	if m.Xor {
		return fmt.Appendf(b, "meta mark set meta mark ^ %#08x", m.Bit)
	}
	return fmt.Appendf(b, "meta mark set meta mark | %#08x", m.Bit)
}

// Encode loads the mark, changes the bit and stores it.
func (m SetMark) Encode(_ Family, s bc.Sink) {
	mask := ^m.Bit
	if m.Xor {
		mask = 0xffffffff
	}
	s.Meta(bc.Meta{Key: bc.MetaMark, Reg: bc.Reg1})
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 4, Mask: bc.U32(mask), Xor: bc.U32(m.Bit)})
	s.Meta(bc.Meta{Key: bc.MetaMark, Reg: bc.Reg1, Set: true})
}

// Masquerade rewrites the source to the outgoing interface's address,
// keeping the port where it is free (see translateRules), or to a port of
// Ports when it names a range.
type Masquerade struct{ Ports Ports }

// AppendText writes "masquerade" (or "meta l4proto tcp masquerade to
// :1024-33279").
func (m Masquerade) AppendText(b []byte, _ Family) []byte {
	b = m.Ports.appendProto(b)
	b = append(b, "masquerade"...)
	if m.Ports.set() {
		b = append(b, " to "...)
	}
	return m.Ports.appendRange(b)
}

// Encode writes the masquerade (after the protocol match and the range's
// registers).
func (m Masquerade) Encode(_ Family, s bc.Sink) {
	m.Ports.match(s)
	lo, hi, flags := m.Ports.load(s, bc.Reg1)
	s.Masq(bc.Masq{Flags: flags, RegProtoMin: lo, RegProtoMax: hi})
}

// SNAT rewrites the source to an address, keeping the port where it is
// free, or to a port of Ports when it names a range.
type SNAT struct {
	To    netip.Addr
	Ports Ports
}

// AppendText writes "snat ip to 198.18.3.1" (or "meta l4proto tcp snat ip
// to 198.18.3.1:1024-33279", "snat ip6 to [2001:db8::1]:1024-33279").
func (n SNAT) AppendText(b []byte, f Family) []byte {
	b = n.Ports.appendProto(b)
	b = append(b, "snat "...)
	b = append(b, f.String()...)
	b = append(b, " to "...)
	if n.Ports.set() && n.To.Is6() {
		b = append(b, '[')
		b = n.To.AppendTo(b)
		b = append(b, ']')
		return n.Ports.appendRange(b)
	}
	return n.Ports.appendRange(n.To.AppendTo(b))
}

// Encode loads the address (and the range) and translates the source to
// them.
func (n SNAT) Encode(f Family, s bc.Sink) {
	fam := uint32(IPv4)
	if f == IPv6 {
		fam = uint32(IPv6)
	}
	n.Ports.match(s)
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: addrData(n.To)})
	lo, hi, flags := n.Ports.load(s, bc.Reg2)
	s.NAT(bc.NAT{Type: bc.NATSource, Family: fam, RegAddr: bc.Reg1, RegProto: lo, RegProtoMax: hi, Flags: flags})
}

// Counter counts the packets and bytes that reach it; nft reads it back
// from the rule (nft.Programmer.Counters).
type Counter struct{}

// AppendText writes "counter".
func (Counter) AppendText(b []byte, _ Family) []byte { return append(b, "counter"...) }

// Encode writes a counter starting at zero.
func (Counter) Encode(_ Family, s bc.Sink) { s.Counter() }

// Reject answers with ICMP port unreachable, so a client of a Service with no
// endpoint fails at once instead of waiting for a timeout; with TCPReset,
// a TCP packet is answered with a reset (whose sequence number is the
// packet's acknowledgement number).
type Reject struct{ TCPReset bool }

// AppendText writes "reject" (or "reject with tcp reset").
func (r Reject) AppendText(b []byte, _ Family) []byte {
	if r.TCPReset {
		return append(b, "reject with tcp reset"...)
	}
	return append(b, "reject"...)
}

// Encode writes the reject with the family's port unreachable code.
func (r Reject) Encode(f Family, s bc.Sink) {
	if r.TCPReset {
		s.Reject(bc.Reject{Type: bc.RejectTCPReset})
		return
	}
	code := uint8(3) // ICMP port unreachable
	if f == IPv6 {
		code = 4 // ICMPv6 port unreachable
	}
	s.Reject(bc.Reject{Type: bc.RejectICMPUnrch, Code: code})
}

// AppendText writes the verdict as a statement.
func (v Verdict) AppendText(b []byte, _ Family) []byte {
	switch v.Kind {
	case Goto:
		return append(append(b, "goto "...), v.Chain...)
	case Jump:
		return append(append(b, "jump "...), v.Chain...)
	}
	return append(b, v.String()...)
}

// Encode writes the verdict.
func (v Verdict) Encode(_ Family, s bc.Sink) { s.Verdict(v.Bytecode()) }

// Bytecode is the verdict as the kernel reads it, in a rule or a map
// element.
func (v Verdict) Bytecode() bc.Verdict {
	var code int32
	switch v.Kind {
	case Goto:
		code = bc.VerdictGoto
	case Jump:
		code = bc.VerdictJump
	case Return:
		code = bc.VerdictReturn
	case Drop:
		code = bc.VerdictDrop
	case Accept:
		code = bc.VerdictAccept
	}
	return bc.Verdict{Code: code, Chain: v.Chain}
}

// VerdictOf is the verdict of kernel verdict code and chain, as read back;
// the zero Verdict for a code nftgate does not use.
func VerdictOf(code int32, chain string) Verdict {
	switch code {
	case bc.VerdictGoto:
		return Verdict{Kind: Goto, Chain: chain}
	case bc.VerdictJump:
		return Verdict{Kind: Jump, Chain: chain}
	case bc.VerdictReturn:
		return Verdict{Kind: Return}
	case bc.VerdictDrop:
		return Verdict{Kind: Drop}
	case bc.VerdictAccept:
		return Verdict{Kind: Accept}
	}
	return Verdict{}
}

// VmapDispatch looks the packet up in a verdict map: by destination address,
// protocol and port, or by protocol and port alone (NodePorts).
type VmapDispatch struct {
	Map   string
	Shape KeyShape
}

// AppendText writes "ip daddr . meta l4proto . th dport vmap @map".
func (d VmapDispatch) AppendText(b []byte, f Family) []byte {
	if d.Shape == KeyProtoPort {
		return append(append(b, "meta l4proto . th dport vmap @"...), d.Map...)
	}
	return fmt.Appendf(b, "%s daddr . meta l4proto . th dport vmap @%s", f, d.Map)
}

// Encode loads the key's fields into consecutive registers and looks the
// key up.
func (d VmapDispatch) Encode(f Family, s bc.Sink) {
	loadDispatchKey(f, d.Shape, s)
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: d.Map, Dreg: bc.RegVerdict, HasDreg: true})
}

// loadDispatchKey loads a dispatch key's fields (of shape KeyAddrProtoPort
// or KeyProtoPort) into consecutive registers from register 1.
func loadDispatchKey(f Family, shape KeyShape, s bc.Sink) {
	dport := bc.Payload{Base: bc.TransportHeader, Offset: 2, Len: 2}
	if shape == KeyProtoPort {
		dport.Dreg = bc.Reg32a
		s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: bc.Reg1})
		s.Payload(dport)
		return
	}
	protoReg := uint32(bc.Reg32a)
	dport.Dreg = bc.Reg32b
	if f == IPv6 {
		protoReg, dport.Dreg = bc.Reg2, bc.Reg32c
	}
	s.Payload(loadAddr(f, Dst, bc.Reg1, f.AddrLen()))
	s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: protoReg})
	s.Payload(dport)
}

// HashBucket matches the flows whose Jenkins hash of the client's address
// and port (with AddrOnly, of its address alone), modulo Modulus, is
// Bucket. A Service with N endpoints has one rule per endpoint, bucket i
// sending to endpoint i; a pool of N masquerade addresses has one rule per
// address, so that each client address is given one of them. It replaces
// kube-proxy's `numgen random`, which the appliance kernel lacks, and makes
// every gateway that sees a flow choose the same endpoint.
//
// One rule per bucket rather than a map from bucket to endpoint: a map in a
// rule is an anonymous set, and the kernel looks those up by scanning the
// whole transaction, which makes a cold sync of 4,000 Services take 50 s
// instead of 1 s.
type HashBucket struct {
	Seed     uint32
	Modulus  uint32
	Bucket   uint32
	AddrOnly bool
}

// AppendText writes "jhash ip saddr . th sport mod 4 seed 0x7 0" (or
// "jhash ip saddr mod 4 ...").
func (h HashBucket) AppendText(b []byte, f Family) []byte {
	b = append(b, "jhash "...)
	b = append(b, f.String()...)
	if h.AddrOnly {
		b = append(b, " saddr mod "...)
	} else {
		b = append(b, " saddr . th sport mod "...)
	}
	b = strconv.AppendUint(b, uint64(h.Modulus), 10)
	b = append(b, " seed 0x"...)
	b = strconv.AppendUint(b, uint64(h.Seed), 16)
	b = append(b, ' ')
	return strconv.AppendUint(b, uint64(h.Bucket), 10)
}

// Encode loads the source address (and port), hashes them and compares
// the bucket.
func (h HashBucket) Encode(f Family, s bc.Sink) {
	sportReg, length := uint32(bc.Reg32c), uint32(8)
	if f == IPv6 {
		sportReg, length = bc.Reg3, 20
	}
	s.Payload(loadAddr(f, Src, bc.Reg2, f.AddrLen()))
	if h.AddrOnly {
		length = f.AddrLen()
	} else {
		s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 0, Len: 2, Dreg: sportReg})
	}
	s.Hash(bc.Hash{Sreg: bc.Reg2, Dreg: bc.Reg1, Len: length, Modulus: h.Modulus, Seed: h.Seed})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.U32(h.Bucket)})
}

// MaglevDispatch sends a flow by its slot in a Service port's Maglev
// table: the Jenkins hash of the client's address and port modulo the
// table's size, looked up in the port's verdict map of slots, which jumps
// to the endpoint's chain (maglev.go). The map is named, not anonymous, so
// a cold sync stays linear.
type MaglevDispatch struct {
	Seed    uint32
	Modulus uint32
	Map     string
}

// AppendText writes "jhash ip saddr . th sport mod 401 seed 0x7 vmap @map".
func (d MaglevDispatch) AppendText(b []byte, f Family) []byte {
	b = append(b, "jhash "...)
	b = append(b, f.String()...)
	b = append(b, " saddr . th sport mod "...)
	b = strconv.AppendUint(b, uint64(d.Modulus), 10)
	b = append(b, " seed 0x"...)
	b = strconv.AppendUint(b, uint64(d.Seed), 16)
	b = append(b, " vmap @"...)
	return append(b, d.Map...)
}

// Encode hashes the source address and port as HashBucket does and looks
// the slot up.
func (d MaglevDispatch) Encode(f Family, s bc.Sink) {
	sportReg, length := uint32(bc.Reg32c), uint32(8)
	if f == IPv6 {
		sportReg, length = bc.Reg3, 20
	}
	s.Payload(loadAddr(f, Src, bc.Reg2, f.AddrLen()))
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 0, Len: 2, Dreg: sportReg})
	s.Hash(bc.Hash{Sreg: bc.Reg2, Dreg: bc.Reg1, Len: length, Modulus: d.Modulus, Seed: d.Seed})
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: d.Map, Dreg: bc.RegVerdict, HasDreg: true})
}

// UpdateAffinity records the client's address in an endpoint's affinity set,
// refreshing its timeout.
type UpdateAffinity struct{ Set string }

// AppendText writes "update @set { ip saddr }".
func (u UpdateAffinity) AppendText(b []byte, f Family) []byte {
	b = append(b, "update @"...)
	b = append(b, u.Set...)
	b = append(b, " { "...)
	b = append(b, f.String()...)
	return append(b, " saddr }"...)
}

// Encode loads the source address and updates the set with it.
func (u UpdateAffinity) Encode(f Family, s bc.Sink) {
	s.Payload(loadAddr(f, Src, bc.Reg1, f.AddrLen()))
	s.Dynset(bc.Dynset{Sreg: bc.Reg1, Op: bc.DynsetUpdate, Set: u.Set})
}

// CountTraffic counts a translated connection's packet of one direction
// (the client's, or with Reply the endpoint's) in that direction's traffic
// set, under its Service destination (the original destination address
// and port, and the protocol) and its endpoint (where the client's packets
// go after the translation, and the endpoint's replies come from): the
// element is made on the first packet, with a counter that every later
// packet adds to, and expires when no packet came for the set's timeout.
// One hash lookup per packet, and nothing per Service in the rules. It
// matches one protocol, which gives nft the type of the original
// destination port when it reads the rule's text.
type CountTraffic struct {
	Set   string
	Reply bool
	Proto model.Protocol
}

// AppendText writes "meta l4proto tcp ct direction original update @set {
// ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr .
// th dport counter }" (for replies: "ct direction reply", "ip saddr . th
// sport").
func (c CountTraffic) AppendText(b []byte, f Family) []byte {
	dir, ep, port := "original", Dst, "dport"
	if c.Reply {
		dir, ep, port = "reply", Src, "sport"
	}
	return fmt.Appendf(b, "meta l4proto %s ct direction %s update @%s { ct original %s daddr . meta l4proto . ct original proto-dst . %s %s . th %s counter }",
		c.Proto, dir, c.Set, f, f, ep.word(), port)
}

// reg32 is the register nft names the i-th 32-bit word of the registers
// by: a 128-bit register where the word starts one.
func reg32(i uint32) uint32 {
	if i%4 == 0 {
		return bc.Reg1 + i/4
	}
	return bc.Reg32First + i
}

// keyTrafficRegs are the registers of the five fields of a KeyTraffic (or
// KeyConn) key, address . protocol . port . address . port, consecutive,
// each field taking whole 32-bit words.
func keyTrafficRegs(f Family) [5]uint32 {
	w := f.AddrLen() / 4
	return [5]uint32{reg32(0), reg32(w), reg32(w + 1), reg32(w + 2), reg32(2*w + 2)}
}

// Encode matches the protocol and the direction, loads the key's fields into consecutive
// registers, each field taking whole 32-bit words, and updates the set
// with them.
func (c CountTraffic) Encode(f Family, s bc.Sink) {
	dir, ep, port := uint32(bc.CtDirOriginal), Dst, uint32(2)
	if c.Reply {
		dir, ep, port = bc.CtDirReply, Src, 0
	}
	matchL4Proto(s, c.Proto)
	s.Ct(bc.Ct{Key: bc.CtDirection, Dreg: bc.Reg1})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(byte(dir))})
	dst := uint32(bc.CtDstIP)
	if f == IPv6 {
		dst = bc.CtDstIP6
	}
	r := keyTrafficRegs(f)
	s.Ct(bc.Ct{Key: dst, Dreg: r[0]})
	s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: r[1]})
	s.Ct(bc.Ct{Key: bc.CtProtoDst, Dreg: r[2]})
	s.Payload(loadAddr(f, ep, r[3], f.AddrLen()))
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: port, Len: 2, Dreg: r[4]})
	s.Dynset(bc.Dynset{Sreg: bc.Reg1, Op: bc.DynsetUpdate, Set: c.Set, Counter: true})
}

// DNAT sends the packet to an endpoint. It carries its protocol because a
// port rewrite needs a transport protocol match first.
type DNAT struct {
	Proto model.Protocol
	To    netip.AddrPort
}

// AppendText writes "meta l4proto tcp dnat to 10.0.0.1:80" (or
// "[fd00::1]:80").
func (d DNAT) AppendText(b []byte, _ Family) []byte {
	b = append(b, "meta l4proto "...)
	b = append(b, d.Proto.String()...)
	b = append(b, " dnat to "...)
	return d.To.AppendTo(b)
}

// Encode matches the protocol, loads the endpoint's address and port and
// translates to them.
func (d DNAT) Encode(f Family, s bc.Sink) {
	fam := uint32(IPv4)
	if f == IPv6 {
		fam = uint32(IPv6)
	}
	port := d.To.Port()
	matchL4Proto(s, d.Proto)
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: addrData(d.To.Addr())})
	s.Immediate(bc.Immediate{Dreg: bc.Reg2, Data: bc.Bytes(byte(port>>8), byte(port))})
	s.NAT(bc.NAT{Type: bc.NATDest, Family: fam, RegAddr: bc.Reg1, RegProto: bc.Reg2, Flags: bc.NATSpecified})
}

// Redirect sends a new connection to a port of the gateway itself (the
// address it arrived at, or loopback for the gateway's own traffic), where
// the PROXY protocol proxy listens; it keeps the original destination in
// conntrack, which the proxy reads back (SO_ORIGINAL_DST). It carries its
// protocol because a port rewrite needs a transport protocol match first.
type Redirect struct {
	Proto model.Protocol
	Port  uint16
}

// AppendText writes "meta l4proto tcp redirect to :9190".
func (r Redirect) AppendText(b []byte, _ Family) []byte {
	b = append(b, "meta l4proto "...)
	b = append(b, r.Proto.String()...)
	b = append(b, " redirect to :"...)
	return strconv.AppendUint(b, uint64(r.Port), 10)
}

// Encode matches the protocol, loads the port and redirects to it.
func (r Redirect) Encode(_ Family, s bc.Sink) {
	matchL4Proto(s, r.Proto)
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: bc.Bytes(byte(r.Port>>8), byte(r.Port))})
	s.Redir(bc.Redir{RegProto: bc.Reg1, Flags: bc.NATSpecified})
}
