package ruleset

import bc "github.com/nftgate/nftgate/ruleset/bytecode"

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
func UntranslatedEventsRule() Rule { return Rule{MatchCtNotDNAT{}, CtEventsOff{}} }

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

// CtEventsOff sets the connection's conntrack event mask to none: the
// kernel reports none of its events (new, updates, destroy) to any
// listener.
type CtEventsOff struct{}

// AppendText writes "ct event set 0x0", as nft lists it.
func (CtEventsOff) AppendText(b []byte, _ Family) []byte { return append(b, "ct event set 0x0"...) }

// Encode loads the empty mask and stores it, as nft writes it.
func (CtEventsOff) Encode(_ Family, s bc.Sink) {
	s.Immediate(bc.Immediate{Dreg: bc.Reg1, Data: bc.U32(0)})
	s.Ct(bc.Ct{Key: bc.CtEventMask, Dreg: bc.Reg1, Set: true})
}
