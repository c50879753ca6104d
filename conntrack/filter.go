package conntrack

// Netlink messages of ctnetlink (net/netfilter/nf_conntrack_netlink.c).
//
// What the kernel filters (checked against Linux 6.18):
//   - A dump (IPCTNL_MSG_CT_GET with NLM_F_DUMP) accepts CTA_FILTER since
//     Linux 5.8: flag words for the original and the reply tuple select the
//     fields of CTA_TUPLE_ORIG / CTA_TUPLE_REPLY that must be equal. The
//     family comes from nfgenmsg.
//   - Ports are compared only for TCP and UDP; for SCTP the port flags are
//     accepted and ignored, so an SCTP dump returns every flow of the
//     addresses asked for.
//   - IPv6 addresses are compared with the result of ipv6_addr_cmp inverted,
//     so a filter on an IPv6 address returns every flow except the ones
//     asked for. IPv6 filters therefore carry protocol and ports only.
//   - IPCTNL_MSG_CT_DELETE with CTA_FILTER (present in 6.18) deletes in the
//     kernel without a dump, but it reports no count and would
//     apply the SCTP and IPv6 inaccuracies above to deletions, and it cannot
//     express "any local address" for node ports. Dump, verify, delete by
//     tuple keeps every deletion exact and counted.
//   - Kernels without CTA_FILTER ignore the attribute and dump everything of
//     the family; the user-space check keeps the result correct, only slower.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/nlattr"
)

const (
	netlinkNetfilter = unix.NETLINK_NETFILTER

	// CTA_FILTER_F_* from net/netfilter/nf_internals.h.
	filterIPSrc     = 1 << 0
	filterIPDst     = 1 << 1
	filterProtoNum  = 1 << 3
	filterSrcPort   = 1 << 4
	filterDstPort   = 1 << 5
	ctMsgTypeGet    = ctnetlink.Subsys<<8 | ctnetlink.MsgGet
	ctMsgTypeDelete = ctnetlink.Subsys<<8 | ctnetlink.MsgDelete
)

// kernelFilter is one filtered dump. Zero fields are not filtered on; the
// zero value dumps every flow of the group's family and protocol.
type kernelFilter struct {
	dst      netip.Addr     // original destination address
	dport    uint16         // original destination port
	replySrc netip.AddrPort // reply source: the endpoint that answered
}

func (f kernelFilter) describe(k groupKey) string {
	s := fmt.Sprintf("%s ipv%d", k.proto, map[uint8]int{unix.AF_INET: 4, unix.AF_INET6: 6}[k.family])
	switch {
	case f.dst.IsValid():
		s += " to " + netip.AddrPortFrom(f.dst, f.dport).String()
	case f.dport != 0:
		s += fmt.Sprintf(" to node port %d", f.dport)
	default:
		s += " (all flows)"
	}
	if f.replySrc.IsValid() {
		s += " from endpoint " + f.replySrc.String()
	}
	return s
}

func nfgenmsg(family uint8) []byte {
	return []byte{family, ctnetlink.NFNetlinkV0, 0, 0}
}

// dumpRequest builds the filtered dump for f. Fields the kernel would get
// wrong (see the top of this file) are left to the user-space check.
func dumpRequest(k groupKey, f kernelFilter) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ipExact := k.family == unix.AF_INET

	origFlags := uint32(filterProtoNum)
	ae.Nested(ctnetlink.TupleOrig, func(nae *netlink.AttributeEncoder) error {
		if f.dst.IsValid() && ipExact {
			origFlags |= filterIPDst
			nae.Nested(ctnetlink.TupleIP, func(ipe *netlink.AttributeEncoder) error {
				ipe.Bytes(ctnetlink.IPv4Dst, f.dst.AsSlice())
				return nil
			})
		}
		nae.Nested(ctnetlink.TupleProto, func(pe *netlink.AttributeEncoder) error {
			pe.Uint8(ctnetlink.ProtoNum, uint8(k.proto))
			if f.dport != 0 {
				origFlags |= filterDstPort
				pe.Bytes(ctnetlink.ProtoDstPort, be16(f.dport))
			}
			return nil
		})
		return nil
	})

	var replyFlags uint32
	if f.replySrc.IsValid() {
		replyFlags = filterProtoNum | filterSrcPort
		ae.Nested(ctnetlink.TupleReply, func(nae *netlink.AttributeEncoder) error {
			if ipExact {
				replyFlags |= filterIPSrc
				nae.Nested(ctnetlink.TupleIP, func(ipe *netlink.AttributeEncoder) error {
					ipe.Bytes(ctnetlink.IPv4Src, f.replySrc.Addr().AsSlice())
					return nil
				})
			}
			nae.Nested(ctnetlink.TupleProto, func(pe *netlink.AttributeEncoder) error {
				pe.Uint8(ctnetlink.ProtoNum, uint8(k.proto))
				pe.Bytes(ctnetlink.ProtoSrcPort, be16(f.replySrc.Port()))
				return nil
			})
			return nil
		})
	}

	ae.Nested(ctnetlink.Filter, func(fe *netlink.AttributeEncoder) error {
		// Flag words are host-endian NLA_U32.
		fe.Uint32(ctnetlink.FilterOrigFlags, origFlags)
		if replyFlags != 0 {
			fe.Uint32(ctnetlink.FilterReplyFlags, replyFlags)
		}
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		// Only fixed-size attributes are encoded above.
		panic(fmt.Sprintf("conntrack: encode dump filter: %v", err))
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  ctMsgTypeGet,
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append(nfgenmsg(k.family), attrs...),
	}
}

func be16(v uint16) []byte {
	return binary.BigEndian.AppendUint16(nil, v)
}

// tuple is the part of an original tuple a delete needs.
type tuple struct {
	src, dst netip.AddrPort
	proto    uint8
}

// entry is the part of a dumped conntrack entry the cleaner looks at.
type entry struct {
	family   uint8
	proto    uint8
	orig     tuple
	origDst  netip.AddrPort
	replySrc netip.AddrPort
	id       uint32
	hasID    bool
	zone     uint16
	hasZone  bool
}

type deleteReq struct {
	orig    tuple
	id      uint32
	hasID   bool
	zone    uint16
	hasZone bool
}

func (e *entry) deleteReq() deleteReq {
	return deleteReq{orig: e.orig, id: e.id, hasID: e.hasID, zone: e.zone, hasZone: e.hasZone}
}

// deleteMessage deletes one entry by its original tuple. The id makes the
// kernel refuse if the tuple now belongs to a newer flow.
func deleteMessage(family uint8, d *deleteReq) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctnetlink.TupleOrig, func(nae *netlink.AttributeEncoder) error {
		nae.Nested(ctnetlink.TupleIP, func(ipe *netlink.AttributeEncoder) error {
			if family == unix.AF_INET {
				ipe.Bytes(ctnetlink.IPv4Src, d.orig.src.Addr().AsSlice())
				ipe.Bytes(ctnetlink.IPv4Dst, d.orig.dst.Addr().AsSlice())
			} else {
				ipe.Bytes(ctnetlink.IPv6Src, d.orig.src.Addr().AsSlice())
				ipe.Bytes(ctnetlink.IPv6Dst, d.orig.dst.Addr().AsSlice())
			}
			return nil
		})
		nae.Nested(ctnetlink.TupleProto, func(pe *netlink.AttributeEncoder) error {
			pe.Uint8(ctnetlink.ProtoNum, d.orig.proto)
			pe.Bytes(ctnetlink.ProtoSrcPort, be16(d.orig.src.Port()))
			pe.Bytes(ctnetlink.ProtoDstPort, be16(d.orig.dst.Port()))
			return nil
		})
		return nil
	})
	if d.hasID {
		ae.Bytes(ctnetlink.ID, binary.BigEndian.AppendUint32(nil, d.id))
	}
	if d.hasZone {
		ae.Bytes(ctnetlink.Zone, be16(d.zone))
	}
	attrs, err := ae.Encode()
	if err != nil {
		panic(fmt.Sprintf("conntrack: encode delete: %v", err))
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  ctMsgTypeDelete,
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append(nfgenmsg(family), attrs...),
	}
}

var errShortEntry = errors.New("conntrack entry without complete tuples")

// parseEntry reads the tuples, id and zone of one dumped entry, walking the
// attributes in place without building a full flow object.
func parseEntry(b []byte, e *entry) error {
	*e = entry{}
	if len(b) < ctnetlink.NFGenMsgLen {
		return errShortEntry
	}
	e.family = b[0]
	var origOK, replyOK bool
	err := nlattr.Walk(b[ctnetlink.NFGenMsgLen:], func(typ uint16, v []byte) error {
		switch typ {
		case ctnetlink.TupleOrig:
			t, err := parseTuple(v)
			if err != nil {
				return err
			}
			e.orig, e.proto, e.origDst, origOK = t, t.proto, t.dst, true
		case ctnetlink.TupleReply:
			t, err := parseTuple(v)
			if err != nil {
				return err
			}
			e.replySrc, replyOK = t.src, true
		case ctnetlink.ID:
			if len(v) >= 4 {
				e.id, e.hasID = binary.BigEndian.Uint32(v), true
			}
		case ctnetlink.Zone:
			if len(v) >= 2 {
				e.zone, e.hasZone = binary.BigEndian.Uint16(v), true
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !origOK || !replyOK {
		return errShortEntry
	}
	return nil
}

func parseTuple(b []byte) (tuple, error) {
	t, err := ctnetlink.ParseTuple(b)
	if errors.Is(err, ctnetlink.ErrShortTuple) {
		err = errShortEntry
	}
	return tuple{src: t.Src, dst: t.Dst, proto: t.Proto}, err
}

// isNotFound reports whether a delete failed because the entry was already
// gone.
func isNotFound(err error) bool {
	var oe *netlink.OpError
	if errors.As(err, &oe) {
		return errors.Is(oe.Err, unix.ENOENT)
	}
	return errors.Is(err, unix.ENOENT)
}
