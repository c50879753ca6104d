package ruleset

import (
	"fmt"

	"github.com/nftgate/nftgate/model"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// Conntrack events of the connections nftgate does not translate
// (Config.UntranslatedEventsOff). The state sync listens to conntrack's
// events and replicates only the flows to Services, which nftgate DNATs;
// its socket filter drops every other event, but only at delivery: the
// kernel has built each message already (a new connection, every TCP state
// change, its end), and a routed connection through a gateway with state
// sync cost it about 90 % more than one without (docs/design/dataplane.md,
// "Conntrack events of routed connections"). The rule below sets such a
// connection's event mask to none before conntrack confirms it, so the
// kernel builds none of its events, for any listener.

// UntranslatedEventsRule silences the events of a connection whose
// destination was not translated, in the NAT postrouting base chain: NAT
// chains see only a connection's first packet (one rule per connection,
// nothing per packet), that chain sees every connection leaving the
// gateway, forwarded or its own, after destination NAT and before
// conntrack confirms it (the event of a new connection goes out at the
// confirmation), and a connection nftgate masquerades (always a DNATed
// one) ends the chain before it.
func UntranslatedEventsRule() Rule { return Rule{MatchCtNotDNAT{}, SetCtEvents{}} }

// MatchCtNotDNAT matches the packets of a connection whose destination
// was not translated: none of a Service's.
type MatchCtNotDNAT struct{}

// AppendText writes "ct status ! dnat", as nft lists it.
func (MatchCtNotDNAT) AppendText(b []byte, _ Family) []byte { return append(b, "ct status ! dnat"...) }

// Encode masks the status with the destination NAT bit and compares with
// zero.
func (MatchCtNotDNAT) Encode(_ Family, s bc.Sink) {
	s.Ct(bc.Ct{Key: bc.CtStatus, Dreg: bc.Reg1})
	maskedEq(s, bc.CtStatusDstNAT, 0)
}

// The conntrack events a connection's event mask names (the kernel's
// IPCT_* bits, include/uapi/linux/netfilter/nf_conntrack_common.h).
const (
	CtEventNew     uint32 = 1 << 0  // IPCT_NEW: the entry is confirmed
	CtEventDestroy uint32 = 1 << 2  // IPCT_DESTROY: the entry ends
	CtEventReply   uint32 = 1 << 3  // IPCT_REPLY: the first packet back
	CtEventAssured uint32 = 1 << 4  // IPCT_ASSURED: TCP's handshake completed
	CtEventLabel   uint32 = 1 << 10 // IPCT_LABEL: a label bit was set
)

var ctEventNames = []struct {
	bit  uint32
	name string
}{{CtEventNew, "new"}, {CtEventDestroy, "destroy"}, {CtEventReply, "reply"}, {CtEventAssured, "assured"}, {CtEventLabel, "label"}}

// SetCtEvents sets the connection's conntrack event mask to Events (the
// CtEvent* bits): the kernel sends a listener a message about the
// connection only for a packet that caused one of them. Zero: none ever,
// for any listener.
type SetCtEvents struct{ Events uint32 }

// AppendText writes "ct event set 0x0" or "ct event set new,destroy,...",
// as nft lists them.
func (c SetCtEvents) AppendText(b []byte, _ Family) []byte {
	b = append(b, "ct event set "...)
	if c.Events == 0 {
		return append(b, "0x0"...)
	}
	first := true
	for _, e := range ctEventNames {
		if c.Events&e.bit == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, e.name...)
	}
	return b
}

// Encode loads the mask and stores it, as nft writes it.
func (c SetCtEvents) Encode(_ Family, s bc.Sink) {
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: bc.U32(c.Events)})
	s.Ct(bc.Ct{Key: bc.CtEventMask, Dreg: bc.Reg1, Set: true})
}

// A Service's TCP connections make fewer events with
// Config.LeanServiceEvents (docs/design/dataplane.md, "Fewer events a
// Service connection"). Each step of a TCP connection is an event of its
// own (its start, every state of the handshake and of the close, its end:
// seven or more messages), each one built by the kernel, read by the state
// sync and decoded, for a replica that needs four of them: the start
// (SYN_SENT, which the replica is written as SYN_RECV: the client's ACK
// that completes the handshake is invalid to a replica in SYN_SENT), the
// handshake's end (ESTABLISHED, assured), the close's beginning (a replica
// that knows the connection is closing expires in minutes, not days, if
// the end is lost with its gateway; conntrack follows the rest of the close
// from there) and the end. The endpoint's answer (SYN_RECV, the reply
// event) told the replica no more than the start does since replicas of
// SYN_SENT are written SYN_RECV (statesync's encoder). The kernel sends a
// message when the packet caused one of the events in the connection's
// mask, and the message carries everything the packet changed (the TCP
// state among it). So the masquerade sets the mask to new, assured,
// destroy and label, and the close sets a label bit on the first FIN or
// RST either way: the bit's first setting is the label event (setting it
// again changes nothing and sends nothing).

// LeanEvents is the event mask of a masqueraded Service TCP connection
// with Config.LeanServiceEvents.
const LeanEvents = CtEventNew | CtEventAssured | CtEventDestroy | CtEventLabel

// CloseLabel is the conntrack label bit the close sets on a masqueraded
// Service TCP connection's first FIN or RST (of 128; nftgate uses no other).
const CloseLabel = 127

// LeanEventsRule sets a masqueraded TCP connection's event mask, in the
// masquerade chain (a NAT chain: once a connection, before conntrack
// confirms it).
func LeanEventsRule() Rule {
	return Rule{MatchL4Proto{Proto: model.TCP}, SetCtEvents{Events: LeanEvents}}
}

// leanEventsRules is the masquerade chain's rule with
// Config.LeanServiceEvents.
func leanEventsRules(cfg *Config) []Rule {
	if !cfg.LeanServiceEvents {
		return nil
	}
	return []Rule{LeanEventsRule()}
}

// CloseLabelRule marks the close's first FIN or RST. It follows what
// entered the close: a masqueraded connection's packet.
func CloseLabelRule() Rule {
	return Rule{MatchTCPFlags{Mask: TCPFlagFIN | TCPFlagRST, Any: true}, SetCtLabel{Bit: CloseLabel}}
}

// MatchL4Proto matches the packets of one transport protocol.
type MatchL4Proto struct{ Proto model.Protocol }

// AppendText writes "meta l4proto tcp".
func (m MatchL4Proto) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "meta l4proto %s", m.Proto)
}

// Encode loads the protocol and compares it.
func (m MatchL4Proto) Encode(_ Family, s bc.Sink) { matchL4Proto(s, m.Proto) }

// SetCtLabel sets Bit of the connection's conntrack labels, keeping the
// others (the kernel sets only the bits the value has). The connection
// must have begun after a rule that sets labels was loaded: the kernel
// gives the labels' room only to those.
type SetCtLabel struct{ Bit uint }

// AppendText writes "ct label set 127".
func (l SetCtLabel) AppendText(b []byte, _ Family) []byte {
	return fmt.Appendf(b, "ct label set %d", l.Bit)
}

// Encode loads the 128 bits with Bit set, in the host's order as nft
// writes them (amd64: little-endian), and stores them.
func (l SetCtLabel) Encode(_ Family, s bc.Sink) {
	var bits [16]byte
	bits[l.Bit/8] |= 1 << (l.Bit % 8)
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: bc.Bytes(bits[:]...)})
	s.Ct(bc.Ct{Key: bc.CtLabels, Dreg: bc.Reg1, Set: true})
}
