package ruleset

import (
	"fmt"
	"net/netip"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Releasing the endpoints' TIME_WAIT (Config.ReleaseTimeWait).
//
// An endpoint that closes a connection first keeps (source address, port)
// in TIME_WAIT for 60 s and accepts a new SYN onto it only from the same
// client connection. Masqueraded to one address, clients share that
// address's 64,000 ports, so above ~1,000 new connections per second to one
// endpoint from many clients, new SYNs land on ports the endpoint still
// holds and about half are refused (docs/design/dataplane.md). The gateway
// sees both ends close, so it releases the endpoint's TIME_WAIT itself:
// conntrack marks record that the endpoint sent its FIN (CloseMarkReplyFIN)
// and that the client sent its own after it (CloseMarkClientFIN); the
// endpoint's bare ACK after both, the last packet of the connection, is
// forwarded as always and a copy of it, sent to the gateway itself, is
// answered with a TCP reset to the endpoint, from the masquerade address
// and port, with the ACK's acknowledgement number as its sequence number:
// exactly what a TIME_WAIT socket accepts as a reset (Linux's
// tcp_timewait_state_process, with net.ipv4.tcp_rfc1337 = 0, the default).
// The endpoint's socket is gone, and the next client given that port is
// accepted like a first one.
//
// A released connection's late segments from the client (an ACK or a FIN
// it sent again before the last ACK reached it) would then find no socket
// on the endpoint, which would answer them with a reset on the
// connection's tuple, and the client may already use that tuple again (its
// port is free once the last ACK arrives, and the masquerade keeps it). A
// reset that reaches the gateway after the new connection's SYN is the
// first answer conntrack sees for it, and conntrack deletes such an entry
// at once: the endpoint's SYN-ACK then finds none and is answered by the
// gateway's own stack with a reset that ends the endpoint's half-open
// connection, and the client sends its SYN again a second later. So the
// copy also marks the connection released (CloseMarkReleased), and the
// client's segments after that are dropped.

// The conntrack mark bits of a masqueraded connection's close.
const (
	// CloseMarkReplyFIN: the endpoint has sent its FIN.
	CloseMarkReplyFIN uint32 = 1 << 29
	// CloseMarkClientFIN: the client sent its FIN after the endpoint's.
	CloseMarkClientFIN uint32 = 1 << 30
	// CloseMarkReleased: the gateway has reset the endpoint's TIME_WAIT.
	CloseMarkReleased uint32 = 1 << 28
)

// The chains of the close: ChainCloseFIN marks the FINs,
// ChainReleaseTimeWait copies the last ACK.
const (
	ChainCloseFIN        = "close-fin"
	ChainReleaseTimeWait = "release-time-wait"
)

// releaseBaseRules are the close chain's: every packet of every
// masqueraded connection passes them, so each tests first what rules most
// packets out at once (a FIN flag, or with lean events a FIN or RST flag,
// in as many expressions; the close mark, which only the last packets of
// a closing connection carry).
func releaseBaseRules(lean bool) []Rule {
	fin := MatchTCPFlags{Mask: TCPFlagFIN, Flags: TCPFlagFIN}
	if lean {
		fin = MatchTCPFlags{Mask: TCPFlagFIN | TCPFlagRST, Any: true}
	}
	return []Rule{
		{fin, Verdict{Kind: Jump, Chain: ChainCloseFIN}},
		{MatchCtMark{Bit: CloseMarkClientFIN}, Verdict{Kind: Jump, Chain: ChainReleaseTimeWait}},
	}
}

// closeFINRules mark a masqueraded Service connection's FINs: the
// endpoint's, then the client's after it. With lean events a FIN or a RST
// enters, and they first set the close's label (events.go); a RST then
// leaves.
func closeFINRules(lean bool) []Rule {
	var label []Rule
	if lean {
		label = []Rule{{SetCtLabel{Bit: CloseLabel}}, {MatchTCPFlags{Mask: TCPFlagRST, Flags: TCPFlagRST}, Verdict{Kind: Return}}}
	}
	return append(label, []Rule{
		{MatchCtMasqueraded{}, MatchCtDirection{Reply: true}, SetCtMark{Bit: CloseMarkReplyFIN}},
		{MatchCtMasqueraded{}, MatchCtDirection{}, MatchCtMark{Bit: CloseMarkReplyFIN}, SetCtMark{Bit: CloseMarkClientFIN}},
	}...)
}

// releaseRules drop the client's segments of a connection already released,
// and copy the endpoint's last ACK of a connection whose two FINs were
// marked, marking it released. Only a bare ACK is copied (a TCP header of 20
// bytes, or 32 with timestamps, and nothing after it): an endpoint
// retransmitting data after the client's FIN (a client that half-closed and
// still reads) is never reset. With counter, the copying rules count the
// copies (the resets sent; nft.Reading.Resets sums the chain's counters, so
// the drop has none).
func releaseRules(bit uint32, counter bool) []Rule {
	drop := Rule{MatchCtDirection{}, MatchCtMark{Bit: CloseMarkReleased}, Verdict{Kind: Drop}}
	return append([]Rule{drop}, copyBareReplyACK(bit, counter, nil, SetCtMark{Bit: CloseMarkReleased})...)
}

// copyBareReplyACK are the two rules (a TCP header of 20 bytes, or 32 with
// timestamps) that copy an endpoint's bare ACK which also passes match to
// the gateway's output path (DupToSelf), counting the copies with counter,
// and then do after.
func copyBareReplyACK(bit uint32, counter bool, match []Stmt, after ...Stmt) []Rule {
	var rules []Rule
	for _, doff := range []uint8{5, 8} {
		r := Rule{MatchTCPFlags{Mask: TCPFlagFIN | TCPFlagSYN | TCPFlagRST | TCPFlagACK, Flags: TCPFlagACK},
			MatchCtDirection{Reply: true}}
		r = append(r, match...)
		r = append(r, MatchTCPNoPayload{Doff: doff}, MatchMarkUnset{Bit: bit})
		if counter {
			r = append(r, Counter{})
		}
		r = append(r, DupToSelf{Bit: bit})
		rules = append(rules, append(r, after...))
	}
	return rules
}

// releaseResetRule answers the copies DupToSelf sends, and only them (an
// untracked TCP packet carrying the masquerade bit), with the reset.
func releaseResetRule(bit uint32) Rule {
	return Rule{MatchCtUntracked{}, MatchMarkSet{Bit: bit},
		MatchTCPFlags{Mask: TCPFlagACK, Flags: TCPFlagACK}, Reject{TCPReset: true}}
}

// MatchCtMasqueraded matches the packets of a connection whose destination
// and source were both translated: a Service connection whose client was
// masqueraded.
type MatchCtMasqueraded struct{}

// AppendText writes "ct status & (snat | dnat) == snat | dnat".
func (MatchCtMasqueraded) AppendText(b []byte, _ Family) []byte {
	return append(b, "ct status & (snat | dnat) == snat | dnat"...)
}

// Encode tests both NAT bits of the connection's status.
func (MatchCtMasqueraded) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtStatus, Dreg: bc.Reg1})
	allBits(s, bc.CtStatusSrcNAT|bc.CtStatusDstNAT)
}

// MatchCtUntracked matches packets conntrack does not track (as a copy of
// DupToSelf).
type MatchCtUntracked struct{}

// AppendText writes "ct state untracked".
func (MatchCtUntracked) AppendText(b []byte, _ Family) []byte {
	return append(b, "ct state untracked"...)
}

// Encode tests the connection state's untracked bit.
func (MatchCtUntracked) Encode(_ Family, s bc.Sink) { ctStateBit(s, bc.CtStateUntracked) }

// MatchCtDirection matches the packets that go the connection's way
// (original) or come back (Reply).
type MatchCtDirection struct{ Reply bool }

// AppendText writes "ct direction original" or "ct direction reply".
func (m MatchCtDirection) AppendText(b []byte, _ Family) []byte {
	if m.Reply {
		return append(b, "ct direction reply"...)
	}
	return append(b, "ct direction original"...)
}

// Encode loads the direction (one byte) and compares it.
func (m MatchCtDirection) Encode(_ Family, s bc.Sink) {
	dir := byte(bc.CtDirOriginal)
	if m.Reply {
		dir = bc.CtDirReply
	}
	s.Ct(bc.Ct{Key: bc.CtDirection, Dreg: bc.Reg1})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(dir)})
}

// MatchCtMark matches connections whose mark has Bit.
type MatchCtMark struct{ Bit uint32 }

// AppendText writes "ct mark & 0x20000000 == 0x20000000".
func (m MatchCtMark) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "ct mark & %#08x == %#08x", m.Bit, m.Bit)
}

// Encode masks the connection's mark and compares it with the bit.
func (m MatchCtMark) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtMark, Dreg: bc.Reg1})
	allBits(s, m.Bit)
}

// SetCtMark sets Bit in the connection's mark, keeping its other bits.
type SetCtMark struct{ Bit uint32 }

// AppendText writes "ct mark set ct mark | 0x20000000".
func (m SetCtMark) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "ct mark set ct mark | %#08x", m.Bit)
}

// Encode loads the mark, sets the bit and stores it.
func (m SetCtMark) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtMark, Dreg: bc.Reg1})
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 4, Mask: bc.U32(^m.Bit), Xor: bc.U32(m.Bit)})
	s.Ct(bc.Ct{Key: bc.CtMark, Dreg: bc.Reg1, Set: true})
}

// MatchMarkSet matches packets with the mark bit.
type MatchMarkSet struct{ Bit uint32 }

// AppendText writes "meta mark & 0x004000 == 0x004000".
func (m MatchMarkSet) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "meta mark & %#08x == %#08x", m.Bit, m.Bit)
}

// Encode masks the mark and compares it with the bit.
func (m MatchMarkSet) Encode(_ Family, s bc.Sink) {
	s.Meta(bc.Meta{Key: bc.MetaMark, Reg: bc.Reg1})
	allBits(s, m.Bit)
}

// MatchTCPFlags matches TCP packets whose flags, masked with Mask, are
// Flags, or with Any, that have any flag of Mask (Flags unused).
type MatchTCPFlags struct {
	Mask, Flags uint8
	Any         bool
}

var tcpFlagNames = []struct {
	bit  uint8
	name string
}{{TCPFlagFIN, "fin"}, {TCPFlagSYN, "syn"}, {TCPFlagRST, "rst"}, {0x08, "psh"}, {TCPFlagACK, "ack"}, {0x20, "urg"}, {0x40, "ecn"}, {0x80, "cwr"}}

func appendTCPFlags(b []byte, flags uint8, parens bool) []byte {
	n := 0
	for _, f := range tcpFlagNames {
		if flags&f.bit != 0 {
			n++
		}
	}
	if n == 0 {
		return append(b, "0x0"...)
	}
	parens = parens && n > 1
	if parens {
		b = append(b, '(')
	}
	first := true
	for _, f := range tcpFlagNames {
		if flags&f.bit == 0 {
			continue
		}
		if !first {
			b = append(b, " | "...)
		}
		first = false
		b = append(b, f.name...)
	}
	if parens {
		b = append(b, ')')
	}
	return b
}

// AppendText writes "tcp flags & (fin | syn | rst | ack) == ack", or with
// Any "tcp flags & (fin | rst) != 0x0".
func (m MatchTCPFlags) AppendText(b []byte, _ Family) []byte {
	b = append(b, "tcp flags & "...)
	b = appendTCPFlags(b, m.Mask, true)
	if m.Any {
		return append(b, " != 0x0"...)
	}
	b = append(b, " == "...)
	return appendTCPFlags(b, m.Flags, false)
}

// Encode matches the protocol, loads the flags byte, masks it and compares
// it.
func (m MatchTCPFlags) Encode(_ Family, s bc.Sink) {
	matchL4Proto(s, model.TCP)
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 13, Len: 1, Dreg: bc.Reg1})
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 1, Mask: bc.Bytes(m.Mask), Xor: bc.Zero(1)})
	if m.Any {
		s.Cmp(bc.Cmp{Op: bc.CmpNeq, Sreg: bc.Reg1, Data: bc.Zero(1)})
		return
	}
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(m.Flags)})
}

// MatchTCPNoPayload matches a TCP segment of Doff 32-bit words of header
// and nothing after it, by the IP header's length field (IPv4 without
// options: 20 + 4×Doff bytes; IPv6 without extension headers: 4×Doff of
// payload). It follows a match of the protocol (MatchTCPFlags).
type MatchTCPNoPayload struct{ Doff uint8 }

func (m MatchTCPNoPayload) ipLength(f Family) (field string, offset uint32, length uint16) {
	if f == IPv6 {
		return "ip6 length", 4, 4 * uint16(m.Doff)
	}
	return "ip length", 2, 20 + 4*uint16(m.Doff)
}

// AppendText writes "tcp doff 8 ip length 52".
func (m MatchTCPNoPayload) AppendText(b []byte, f Family) []byte {
	field, _, length := m.ipLength(f)
	return fmt.Appendf(b, "tcp doff %d %s %d", m.Doff, field, length)
}

// Encode compares the data offset's four bits and the length field.
func (m MatchTCPNoPayload) Encode(f Family, s bc.Sink) {
	_, off, length := m.ipLength(f)
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 12, Len: 1, Dreg: bc.Reg1})
	s.Bitwise(bc.Bitwise{Sreg: bc.Reg1, Dreg: bc.Reg1, Len: 1, Mask: bc.Bytes(0xf0), Xor: bc.Zero(1)})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(m.Doff << 4)})
	s.Payload(bc.Payload{Base: bc.NetworkHeader, Offset: off, Len: 2, Dreg: bc.Reg1})
	s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: bc.Reg1, Data: bc.Bytes(byte(length>>8), byte(length))})
}

// loopback is each family's loopback address, where DupToSelf routes its
// copies.
var loopback = map[Family]netip.Addr{IPv4: netip.MustParseAddr("127.0.0.1"), IPv6: netip.IPv6Loopback()}

// DupToSelf sends an untracked copy of the packet, carrying mark Bit, to
// the gateway's own output path (routed by the loopback address; the copy
// keeps its addresses), and leaves the packet's own mark as it was. It
// follows MatchMarkUnset of the same bit.
type DupToSelf struct{ Bit uint32 }

// AppendText writes "meta mark set meta mark | 0x004000 dup to 127.0.0.1
// meta mark set meta mark ^ 0x004000".
func (d DupToSelf) AppendText(b []byte, f Family) []byte {
	b = SetMark{Bit: d.Bit}.AppendText(b, f)
	b = append(b, " dup to "...)
	b = loopback[f].AppendTo(b)
	b = append(b, ' ')
	return SetMark{Bit: d.Bit, Xor: true}.AppendText(b, f)
}

// Encode sets the bit, duplicates towards loopback and toggles the bit
// back.
func (d DupToSelf) Encode(f Family, s bc.Sink) {
	SetMark{Bit: d.Bit}.Encode(f, s)
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: addrData(loopback[f])})
	s.Dup(bc.Dup{RegAddr: bc.Reg1})
	SetMark{Bit: d.Bit, Xor: true}.Encode(f, s)
}
