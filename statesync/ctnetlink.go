package statesync

// The ctnetlink messages of the sync (net/netfilter/nf_conntrack_netlink.c):
// the replica writer's, encoded here and nowhere else, and the events and
// dumped entries it reads, decoded here (parseMessage).
//
// Why here: github.com/ti-mo/conntrack decodes events and dumps completely,
// into a flow with an allocation per attribute, several times what the
// rest of the sync costs per entry (BenchmarkDecodeEvent, BenchmarkDump*).
// Its Create cannot carry translations (no CTA_NAT_SRC / CTA_NAT_DST), and the
// kernel ignores the NAT bits of CTA_STATUS (IPS_UNCHANGEABLE_MASK). The
// conntrack package's encoder is the stale-flow cleaner's: tuples, id and
// zone of a delete and a dump filter, nothing of NAT, status or timeouts.
// A replica is a create with both translations, which only this writer
// needs, so its encoder lives beside it.
//
// What the kernel does with a create (checked against Linux 6.12/6.18):
//   - IPCTNL_MSG_CT_NEW with NLM_F_CREATE and no existing entry of the
//     original tuple: ctnetlink_create_conntrack allocates the entry with
//     both tuples, then ctnetlink_setup_nat runs nf_nat_setup_info for
//     CTA_NAT_DST and CTA_NAT_SRC: each rewrites the reply tuple from the
//     range (min = max = one address and port here) and sets IPS_DST_NAT /
//     IPS_SRC_NAT. So the reply tuple sent is the untranslated inverse of
//     the original (as conntrackd does, NFCT_SOPT_SETUP_REPLY), and the
//     kernel derives the translated one: the DNAT range is the origin's
//     reply source (the endpoint), the SNAT range its reply destination
//     (the masquerade address). CTA_TIMEOUT is required.
//   - CTA_STATUS goes through nf_ct_change_status_common: IPS_CONFIRMED is
//     already set on a new entry and must be in the value (a difference in
//     EXPECTED, CONFIRMED or DYING is EBUSY); SEEN_REPLY and ASSURED can
//     only be set, never cleared (EBUSY); NAT bits are ignored.
//   - An existing entry (EEXIST with NLM_F_EXCL): without NLM_F_EXCL the
//     same message updates it (ctnetlink_change_conntrack), which may
//     change timeout, status (as above), TCP state and flags, mark and
//     helper, but refuses CTA_NAT_* (EOPNOTSUPP): an update carries no NAT.
//   - The TCP flags are a {flags, mask} pair per direction;
//     IP_CT_TCP_FLAG_BE_LIBERAL set in both makes the entry skip window
//     checks (a flow whose directions pass different gateways after a
//     failover is not marked invalid) without the namespace-wide sysctl
//     nf_conntrack_tcp_be_liberal. Window scales are taken only when both
//     directions have IP_CT_TCP_FLAG_WINDOW_SCALE, which the same message
//     sets first.
//   - SCTP protocol info (nlattr_to_sctp) needs the state and both
//     verification tags, or the message is refused (EINVAL); a replica
//     without it is in state NONE with tags 0, and conntrack takes every
//     packet of the association, whose tags are not 0, for invalid.
//   - A message that needs an acknowledgement gets exactly one, in order,
//     each in its own datagram (netlink_rcv_skb).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/nlattr"
)

const (
	nlaFNested  = 1 << 15
	nlmsgHdrLen = ctnetlink.NlmsgHdrLen
	nlmsgerrLen = 4 + nlmsgHdrLen
)

// IPS_* status bits (include/uapi/linux/netfilter/nf_conntrack_common.h).
const (
	StatusSeenReply uint32 = 1 << 1
	StatusAssured   uint32 = 1 << 2
	StatusConfirmed uint32 = 1 << 3
	StatusSrcNAT    uint32 = 1 << 4
	StatusDstNAT           = ctnetlink.StatusDstNAT
)

// IP_CT_TCP_FLAG_* (include/uapi/linux/netfilter/nf_conntrack_tcp.h).
const (
	tcpFlagWindowScale = 0x01
	tcpFlagSACKPerm    = 0x02
	tcpFlagCloseInit   = 0x04
	tcpFlagBeLiberal   = 0x08
	// tcpFlagsCarried are the origin's flags a replica takes over; the
	// others describe sequence numbers a replica does not have.
	tcpFlagsCarried = tcpFlagWindowScale | tcpFlagSACKPerm | tcpFlagCloseInit | tcpFlagBeLiberal
)

// msgKind is what one message asks of the kernel.
type msgKind uint8

const (
	kindCreate        msgKind = iota // new replica with NAT; EEXIST if present
	kindUpdate                       // existing replica: timeout, status, TCP, mark
	kindUpdateNoState                // the same without CTA_STATUS
	kindDelete                       // by original tuple
	kindAdopt                        // clear ReplicaMark
	kindCreateOrigin                 // new entry with NAT, without ReplicaMark
	kindGet                          // read by original tuple: the entry, or an error
)

// encoder appends netlink messages to one buffer for one sendmsg.
type encoder struct {
	b   []byte
	seq uint32
}

func (e *encoder) reset() { e.b = e.b[:0] }

// begin starts a message and returns its offset; end fills in its length.
func (e *encoder) begin(msgType, flags uint16, family uint8) int {
	off := len(e.b)
	e.seq++
	e.b = binary.NativeEndian.AppendUint32(e.b, 0)
	e.b = binary.NativeEndian.AppendUint16(e.b, msgType)
	e.b = binary.NativeEndian.AppendUint16(e.b, flags)
	e.b = binary.NativeEndian.AppendUint32(e.b, e.seq)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0)
	e.b = append(e.b, family, ctnetlink.NFNetlinkV0, 0, 0)
	return off
}

func (e *encoder) end(off int) {
	binary.NativeEndian.PutUint32(e.b[off:], uint32(len(e.b)-off))
}

func (e *encoder) attr(typ uint16, v []byte) {
	l := 4 + len(v)
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(l))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = append(e.b, v...)
	for l&3 != 0 {
		e.b = append(e.b, 0)
		l++
	}
}

func (e *encoder) u8(typ uint16, v uint8) { e.attr(typ, []byte{v}) }

func (e *encoder) be16(typ uint16, v uint16) {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	e.attr(typ, b[:])
}

func (e *encoder) be32(typ uint16, v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	e.attr(typ, b[:])
}

func (e *encoder) addr(typ uint16, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		e.attr(typ, b[:])
		return
	}
	b := a.As16()
	e.attr(typ, b[:])
}

func (e *encoder) nest(typ uint16) int {
	off := len(e.b)
	e.b = binary.NativeEndian.AppendUint16(e.b, 0)
	e.b = binary.NativeEndian.AppendUint16(e.b, typ|nlaFNested)
	return off
}

func (e *encoder) endNest(off int) {
	binary.NativeEndian.PutUint16(e.b[off:], uint16(len(e.b)-off))
}

func (e *encoder) tuple(typ uint16, proto Proto, t Tuple) {
	n := e.nest(typ)
	ip := e.nest(ctnetlink.TupleIP)
	if t.Src.Addr().Is4() {
		e.addr(ctnetlink.IPv4Src, t.Src.Addr())
		e.addr(ctnetlink.IPv4Dst, t.Dst.Addr())
	} else {
		e.addr(ctnetlink.IPv6Src, t.Src.Addr())
		e.addr(ctnetlink.IPv6Dst, t.Dst.Addr())
	}
	e.endNest(ip)
	p := e.nest(ctnetlink.TupleProto)
	e.u8(ctnetlink.ProtoNum, proto)
	e.be16(ctnetlink.ProtoSrcPort, t.Src.Port())
	e.be16(ctnetlink.ProtoDstPort, t.Dst.Port())
	e.endNest(p)
	e.endNest(n)
}

// nat encodes a translation to exactly one address and port.
func (e *encoder) nat(typ uint16, to netip.AddrPort) {
	n := e.nest(typ)
	if to.Addr().Is4() {
		e.addr(ctnetlink.NATV4MinIP, to.Addr())
		e.addr(ctnetlink.NATV4MaxIP, to.Addr())
	} else {
		e.addr(ctnetlink.NATV6MinIP, to.Addr())
		e.addr(ctnetlink.NATV6MaxIP, to.Addr())
	}
	p := e.nest(ctnetlink.NATProto)
	e.be16(ctnetlink.ProtoNATPortMin, to.Port())
	e.be16(ctnetlink.ProtoNATPortMax, to.Port())
	e.endNest(p)
	e.endNest(n)
}

func (e *encoder) tcp(t TCPInfo) {
	pi := e.nest(ctnetlink.Protoinfo)
	n := e.nest(ctnetlink.ProtoinfoTCP)
	e.u8(ctnetlink.ProtoinfoTCPState, replicaTCPState(t.State))
	// Flags first: the kernel applies the window scales only when both
	// directions have IP_CT_TCP_FLAG_WINDOW_SCALE.
	e.attr(ctnetlink.ProtoinfoTCPFlagsO, []byte{t.FlagsOrig&tcpFlagsCarried | tcpFlagBeLiberal, tcpFlagsCarried})
	e.attr(ctnetlink.ProtoinfoTCPFlagsR, []byte{t.FlagsReply&tcpFlagsCarried | tcpFlagBeLiberal, tcpFlagsCarried})
	e.u8(ctnetlink.ProtoinfoTCPWScaleO, t.WScaleOrig)
	e.u8(ctnetlink.ProtoinfoTCPWScaleR, t.WScaleReply)
	e.endNest(n)
	e.endNest(pi)
}

// The kernel's enum tcp_conntrack values the replicas' states are chosen
// by.
const (
	tcpStateSynSent = 1 // TCP_CONNTRACK_SYN_SENT
	tcpStateSynRecv = 2 // TCP_CONNTRACK_SYN_RECV
)

// replicaTCPState is the state a replica is written in for an origin in
// state st: SYN_RECV for SYN_SENT, st otherwise. A replica left in SYN_SENT
// (the origin failed after the endpoint's SYN-ACK passed it and before the
// sync sent more than the start) takes the client's next segment, an ACK
// in the original direction, for invalid: it would pass untranslated and
// the connection would hang, the endpoint being established already. In
// SYN_RECV that segment makes it ESTABLISHED, and the endpoint's SYN-ACK
// sent again, if it never reached the client, passes translated (the table
// ignores it and keeps the entry).
func replicaTCPState(st uint8) uint8 {
	if st == tcpStateSynSent {
		return tcpStateSynRecv
	}
	return st
}

// sctp appends the association's state and both verification tags; the
// kernel refuses SCTP protocol info without all three.
func (e *encoder) sctp(s SCTPInfo) {
	pi := e.nest(ctnetlink.Protoinfo)
	n := e.nest(ctnetlink.ProtoinfoSCTP)
	e.u8(ctnetlink.ProtoinfoSCTPState, s.State)
	e.be32(ctnetlink.ProtoinfoSCTPVTagOrig, s.VTagOrig)
	e.be32(ctnetlink.ProtoinfoSCTPVTagReply, s.VTagReply)
	e.endNest(n)
	e.endNest(pi)
}

func family(en *Entry) uint8 {
	if en.Orig.Src.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// replicaStatus is what a replica's CTA_STATUS carries: the origin's
// SEEN_REPLY and ASSURED, and CONFIRMED, which every live entry has.
func replicaStatus(s uint32) uint32 {
	return s&(StatusSeenReply|StatusAssured) | StatusConfirmed
}

// replicaTimeout is at least one second: a create needs a timeout.
func replicaTimeout(t uint32) uint32 { return max(t, 1) }

// message appends the message of kind k for en, with an acknowledgement.
func (e *encoder) message(k msgKind, en *Entry) {
	const ctNew = ctnetlink.Subsys<<8 | ctnetlink.MsgNew
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	switch k {
	case kindCreate, kindCreateOrigin:
		off := e.begin(ctNew, flags|unix.NLM_F_CREATE|unix.NLM_F_EXCL, family(en))
		e.tuple(ctnetlink.TupleOrig, en.Proto, en.Orig)
		e.tuple(ctnetlink.TupleReply, en.Proto, Tuple{Src: en.Orig.Dst, Dst: en.Orig.Src})
		if en.Reply.Src != en.Orig.Dst {
			e.nat(ctnetlink.NATDst, en.Reply.Src)
		}
		if en.Reply.Dst != en.Orig.Src {
			e.nat(ctnetlink.NATSrc, en.Reply.Dst)
		}
		e.state(en, true, k == kindCreate)
		e.end(off)
	case kindUpdate, kindUpdateNoState:
		off := e.begin(ctNew, flags, family(en))
		e.tuple(ctnetlink.TupleOrig, en.Proto, en.Orig)
		e.state(en, k == kindUpdate, true)
		e.end(off)
	case kindDelete:
		off := e.begin(ctnetlink.Subsys<<8|ctnetlink.MsgDelete, flags, family(en))
		e.tuple(ctnetlink.TupleOrig, en.Proto, en.Orig)
		e.end(off)
	case kindGet:
		// No acknowledgement: the answer is the entry, or an error.
		off := e.begin(ctnetlink.Subsys<<8|ctnetlink.MsgGet, unix.NLM_F_REQUEST, family(en))
		e.tuple(ctnetlink.TupleOrig, en.Proto, en.Orig)
		e.end(off)
	case kindAdopt:
		off := e.begin(ctNew, flags, family(en))
		e.tuple(ctnetlink.TupleOrig, en.Proto, en.Orig)
		e.be32(ctnetlink.Mark, 0)
		e.be32(ctnetlink.MarkMask, ReplicaMark)
		e.end(off)
	}
}

// state appends what a create and an update share; a replica's mark has
// ReplicaMark.
func (e *encoder) state(en *Entry, status, replica bool) {
	e.be32(ctnetlink.Timeout, replicaTimeout(en.Timeout))
	if status {
		e.be32(ctnetlink.Status, replicaStatus(en.Status))
	}
	mark := en.Mark
	if replica {
		mark |= ReplicaMark
	}
	e.be32(ctnetlink.Mark, mark)
	switch en.Proto {
	case unix.IPPROTO_TCP:
		e.tcp(en.TCP)
	case unix.IPPROTO_SCTP:
		e.sctp(en.SCTP)
	}
}

// parseReplies reads the answers in one datagram and calls fn with the
// sequence number each answers: an acknowledgement (NLMSG_ERROR) with its
// error (nil for success) and no message, or the message a request is
// answered with (a GET's entry).
func parseReplies(b []byte, fn func(seq uint32, msg []byte, err error)) error {
	return ctnetlink.Messages(b, func(typ uint16, msg []byte) bool {
		switch {
		case typ == unix.NLMSG_ERROR && len(msg) >= nlmsgHdrLen+nlmsgerrLen:
			code := int32(binary.NativeEndian.Uint32(msg[nlmsgHdrLen:]))
			seq := binary.NativeEndian.Uint32(msg[nlmsgHdrLen+4+8:])
			var err error
			if code != 0 {
				err = unix.Errno(-code)
			}
			fn(seq, nil, err)
		case typ != unix.NLMSG_ERROR && typ != unix.NLMSG_DONE && typ != unix.NLMSG_NOOP:
			fn(binary.NativeEndian.Uint32(msg[8:12]), msg, nil)
		}
		return true
	})
}

var errNotNAT = errors.New("entry has neither a destination nor a source translation")

// checkEntry refuses what cannot be written as a replica; the sync's
// policy decides what may be, this only keeps the messages well formed.
func checkEntry(en *Entry) error { return check(en, true) }

// checkOrig checks what a delete or an adoption needs: the protocol and
// the original tuple.
func checkOrig(en *Entry) error { return check(en, false) }

// checkProto refuses a protocol no Service has.
func checkProto(p Proto) error {
	switch p {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		return nil
	}
	return fmt.Errorf("protocol %d: want TCP (6), UDP (17) or SCTP (132)", p)
}

func check(en *Entry, reply bool) error {
	if err := checkProto(en.Proto); err != nil {
		return err
	}
	is4 := en.Orig.Src.Addr().Is4()
	addrs := []netip.AddrPort{en.Orig.Src, en.Orig.Dst, en.Reply.Src, en.Reply.Dst}
	if !reply {
		addrs = addrs[:2]
	}
	for _, a := range addrs {
		if !a.IsValid() || a.Addr().Is4() != is4 || a.Addr().Is4In6() {
			if !reply {
				return fmt.Errorf("tuple %s -> %s: want two valid addresses of one family", en.Orig.Src, en.Orig.Dst)
			}
			return fmt.Errorf("tuples %s -> %s, reply %s -> %s: want four valid addresses of one family",
				en.Orig.Src, en.Orig.Dst, en.Reply.Src, en.Reply.Dst)
		}
	}
	return nil
}

// parseMessage decodes one ctnetlink message, an event or an entry of a
// dump, in place (nothing is allocated): what happened (0 for a dump's
// entry) and the entry's tuples, status, timeout, mark, id and protocol
// state.
// ok is false for a message that is not a conntrack entry with both
// tuples. ti-mo/conntrack decodes the same completely, into a flow of
// every attribute with an allocation each: several times the CPU of the
// whole sync path per event, at 10,000 new flows a second.
func parseMessage(b []byte) (t EventType, en Entry, ok bool) {
	if len(b) < nlmsgHdrLen+ctnetlink.NFGenMsgLen {
		return 0, en, false
	}
	typ := binary.NativeEndian.Uint16(b[4:6])
	flags := binary.NativeEndian.Uint16(b[6:8])
	if typ>>8 != ctnetlink.Subsys {
		return 0, en, false
	}
	switch typ & 0xff {
	case ctnetlink.MsgNew:
		// Events and dumps share the type; an event's flags tell a new
		// entry from an update, a dump's are NLM_F_MULTI.
		switch {
		case flags&(unix.NLM_F_CREATE|unix.NLM_F_EXCL) != 0:
			t = EventNew
		case flags&unix.NLM_F_MULTI == 0:
			t = EventUpdate
		}
	case ctnetlink.MsgDelete:
		t = EventDestroy
	default:
		return 0, en, false
	}
	var orig, reply bool
	err := nlattr.Walk(b[nlmsgHdrLen+ctnetlink.NFGenMsgLen:], func(a uint16, v []byte) error {
		switch a {
		case ctnetlink.TupleOrig, ctnetlink.TupleReply:
			tu, err := ctnetlink.ParseTuple(v)
			if err != nil {
				return err
			}
			if a == ctnetlink.TupleOrig {
				en.Proto, en.Orig, orig = tu.Proto, Tuple{Src: ctnetlink.Unmapped(tu.Src), Dst: ctnetlink.Unmapped(tu.Dst)}, true
			} else {
				en.Reply, reply = Tuple{Src: ctnetlink.Unmapped(tu.Src), Dst: ctnetlink.Unmapped(tu.Dst)}, true
			}
		case ctnetlink.Status:
			en.Status = be32(v)
		case ctnetlink.Timeout:
			en.Timeout = be32(v)
		case ctnetlink.Mark:
			en.Mark = be32(v)
		case ctnetlink.ID:
			en.ID = be32(v)
		case ctnetlink.Protoinfo:
			return nlattr.Walk(v, func(a uint16, v []byte) error {
				switch a {
				case ctnetlink.ProtoinfoTCP:
					return nlattr.Walk(v, func(a uint16, v []byte) error {
						switch {
						case len(v) == 0:
						case a == ctnetlink.ProtoinfoTCPState:
							en.TCP.State = v[0]
						case a == ctnetlink.ProtoinfoTCPWScaleO:
							en.TCP.WScaleOrig = v[0]
						case a == ctnetlink.ProtoinfoTCPWScaleR:
							en.TCP.WScaleReply = v[0]
						case a == ctnetlink.ProtoinfoTCPFlagsO:
							en.TCP.FlagsOrig = v[0] // {flags, mask}
						case a == ctnetlink.ProtoinfoTCPFlagsR:
							en.TCP.FlagsReply = v[0]
						}
						return nil
					})
				case ctnetlink.ProtoinfoSCTP:
					return nlattr.Walk(v, func(a uint16, v []byte) error {
						switch {
						case a == ctnetlink.ProtoinfoSCTPState && len(v) > 0:
							en.SCTP.State = v[0]
						case a == ctnetlink.ProtoinfoSCTPVTagOrig:
							en.SCTP.VTagOrig = be32(v)
						case a == ctnetlink.ProtoinfoSCTPVTagReply:
							en.SCTP.VTagReply = be32(v)
						}
						return nil
					})
				}
				return nil
			})
		}
		return nil
	})
	if err != nil || !orig || !reply {
		return 0, Entry{}, false
	}
	return t, en, true
}

func be32(v []byte) uint32 {
	if len(v) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}
