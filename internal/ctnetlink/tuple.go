package ctnetlink

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/nftgate/nftgate/internal/nlattr"
)

// Tuple is one direction of a conntrack entry: protocol, source and
// destination.
type Tuple struct {
	Proto    uint8
	Src, Dst netip.AddrPort
}

// ErrShortTuple: a tuple without both addresses.
var ErrShortTuple = errors.New("conntrack tuple without both addresses")

// ParseTuple reads the value of a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY
// attribute in place.
func ParseTuple(b []byte) (Tuple, error) {
	var t Tuple
	var src, dst netip.Addr
	var sport, dport uint16
	err := nlattr.Walk(b, func(typ uint16, v []byte) error {
		switch typ {
		case TupleIP:
			return nlattr.Walk(v, func(typ uint16, v []byte) error {
				switch typ {
				case IPv4Src, IPv6Src:
					src, _ = netip.AddrFromSlice(v)
				case IPv4Dst, IPv6Dst:
					dst, _ = netip.AddrFromSlice(v)
				}
				return nil
			})
		case TupleProto:
			return nlattr.Walk(v, func(typ uint16, v []byte) error {
				switch {
				case typ == ProtoNum && len(v) >= 1:
					t.Proto = v[0]
				case typ == ProtoSrcPort && len(v) >= 2:
					sport = binary.BigEndian.Uint16(v)
				case typ == ProtoDstPort && len(v) >= 2:
					dport = binary.BigEndian.Uint16(v)
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	if !src.IsValid() || !dst.IsValid() {
		return t, ErrShortTuple
	}
	t.Src = netip.AddrPortFrom(src, sport)
	t.Dst = netip.AddrPortFrom(dst, dport)
	return t, nil
}

// Unmapped is ap with an IPv4-mapped IPv6 address made IPv4.
func Unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
