package ruleset

import (
	"fmt"
	"time"

	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Answering an endpoint's refusal of a SYN (Config.AnswerRefusedSYNs).
//
// A SYN that lands on a (masquerade address, port) the endpoint still holds
// in TIME_WAIT for another client connection is refused: the endpoint
// answers with a bare ACK of the old connection (tcp_timewait_state_process).
// The client, in SYN_SENT, answers that with a reset carrying the ACK's
// acknowledgement number, and sends its SYN again a few milliseconds later
// (Linux's TCP_TIMEOUT_MIN, for the first retransmission only). The
// client's reset ends the endpoint's TIME_WAIT, but it also closes the
// connection's conntrack entry, so the SYN sent again opens a new one, and
// the NAT gives it a new port: one the endpoint may hold in TIME_WAIT too.
// A second refusal costs the client its one-second retransmission timeout.
//
// The gateway answers the refusal itself, the way it releases a closed
// connection's TIME_WAIT: the endpoint's bare ACK in the reply direction of
// a masqueraded connection that is not yet assured (conntrack saw no
// handshake complete) is forwarded as always, and a copy of it is answered
// with the reset, from the masquerade address and port; the connection's
// original tuple goes into SetRefusedSYNs for RefusedTimeout. Before
// conntrack (ChainRefusedRaw), the client's reset that follows (RST without
// ACK, from that tuple) is dropped, so the connection's entry stays as it
// was, and the SYN sent again keeps the port, on which the endpoint holds
// nothing any more. A refusal then costs one quick retransmission, never
// the one-second one. Only the first refusal of a connection can be
// retried quickly (the client's kernel rearms its timer for the first
// only), so keeping the port for it is what matters.

// SetRefusedSYNs holds, for RefusedTimeout, the original tuples (client
// address . protocol . client port . Service address . port, KeyConn) of
// connections whose SYN an endpoint refused.
const SetRefusedSYNs = "refused-syns"

// RefusedTimeout is how long a refused connection's tuple stays in
// SetRefusedSYNs: the client's reset follows the refusal within
// milliseconds.
const RefusedTimeout = time.Second

// RefusedSize bounds SetRefusedSYNs: refusals within RefusedTimeout. A
// refusal that finds it full is still answered; its client's reset passes.
const RefusedSize = 65536

// ChainReleaseRefused copies the endpoint's refusal; ChainRefusedRaw is the
// prerouting chain before conntrack that drops the client's reset.
const (
	ChainReleaseRefused = "release-refused"
	ChainRefusedRaw     = "filter-prerouting-raw"
)

// PrioRaw is the priority of ChainRefusedRaw: before conntrack (-200).
const PrioRaw = -300

// refusedBaseRule sends the packets of connections conntrack has not
// assured (their first packets, until the handshake completes) to
// ChainReleaseRefused, from the prerouting chain of the close.
func refusedBaseRule() Rule {
	return Rule{MatchCtNotAssured{}, Verdict{Kind: Jump, Chain: ChainReleaseRefused}}
}

// refusedRules copy an endpoint's bare ACK to a masqueraded connection
// whose handshake is not complete, and remember the connection. The copy
// is answered by releaseResetRule, as the release's are. With counter, the
// rules count the refusals answered.
func refusedRules(bit uint32, counter bool) []Rule {
	return copyBareReplyACK(bit, counter, []Stmt{MatchCtMasqueraded{}}, AddConn{Set: SetRefusedSYNs})
}

// refusedRawRule drops a client's reset without ACK (what answers an ACK
// in SYN_SENT) from a connection in SetRefusedSYNs, before conntrack sees
// it.
func refusedRawRule() Rule {
	return Rule{MatchTCPFlags{Mask: TCPFlagRST | TCPFlagACK, Flags: TCPFlagRST},
		MatchConnInSet{Set: SetRefusedSYNs}, Verdict{Kind: Drop}}
}

// MatchCtNotAssured matches the packets of a connection conntrack has not
// assured: for TCP, until the handshake's last ACK.
type MatchCtNotAssured struct{}

// AppendText writes "ct status & assured == 0".
func (MatchCtNotAssured) AppendText(b []byte, _ Family) []byte {
	return append(b, "ct status & assured == 0"...)
}

// Encode masks the status with the assured bit and compares with zero.
func (MatchCtNotAssured) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtStatus, Dreg: bc.Reg1})
	maskedEq(s, bc.CtStatusAssured, 0)
}

// AddConn adds the connection's original tuple to Set (KeyConn).
type AddConn struct{ Set string }

// AppendText writes "add @set { ct original ip saddr . meta l4proto . ct
// original proto-src . ct original ip daddr . ct original proto-dst }".
func (a AddConn) AppendText(b []byte, f Family) []byte {
	return fmt.Appendf(b, "add @%s { ct original %s saddr . meta l4proto . ct original proto-src . ct original %s daddr . ct original proto-dst }",
		a.Set, f, f)
}

// Encode loads the tuple's fields and adds them to the set.
func (a AddConn) Encode(f Family, s bc.Sink) {
	loadCtConn(f, s)
	s.Dynset(bc.Dynset{Sreg: bc.Reg1, Op: bc.DynsetAdd, Set: a.Set})
}

// loadCtConn loads the connection's original tuple (KeyConn) into
// consecutive registers from Reg1, each field taking whole 32-bit words.
func loadCtConn(f Family, s bc.Sink) {
	src, dst := uint32(bc.CtSrcIP), uint32(bc.CtDstIP)
	if f == IPv6 {
		src, dst = bc.CtSrcIP6, bc.CtDstIP6
	}
	r := keyTrafficRegs(f)
	s.Ct(bc.Ct{Key: src, Dreg: r[0]})
	s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: r[1]})
	s.Ct(bc.Ct{Key: bc.CtProtoSrc, Dreg: r[2]})
	s.Ct(bc.Ct{Key: dst, Dreg: r[3]})
	s.Ct(bc.Ct{Key: bc.CtProtoDst, Dreg: r[4]})
}

// MatchConnInSet matches a packet whose tuple (source address . protocol .
// source port . destination address . destination port) is in Set
// (KeyConn). It follows a match of the protocol.
type MatchConnInSet struct{ Set string }

// AppendText writes "ip saddr . meta l4proto . th sport . ip daddr . th
// dport @set".
func (m MatchConnInSet) AppendText(b []byte, f Family) []byte {
	return fmt.Appendf(b, "%s saddr . meta l4proto . th sport . %s daddr . th dport @%s", f, f, m.Set)
}

// Encode loads the packet's fields into consecutive registers and looks
// them up.
func (m MatchConnInSet) Encode(f Family, s bc.Sink) {
	r := keyTrafficRegs(f)
	s.Payload(loadAddr(f, Src, r[0], f.AddrLen()))
	s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: r[1]})
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 0, Len: 2, Dreg: r[2]})
	s.Payload(loadAddr(f, Dst, r[3], f.AddrLen()))
	s.Payload(bc.Payload{Base: bc.TransportHeader, Offset: 2, Len: 2, Dreg: r[4]})
	s.Lookup(bc.Lookup{Sreg: bc.Reg1, Set: m.Set})
}
