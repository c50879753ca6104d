package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
)

// A flow in a flowtable stays in conntrack with the OFFLOAD status bit, and
// the kernel dumps it without its timeout and protocol state
// (ctnetlink_dump_info skips both for IPS_OFFLOAD): the cleaner reads such
// an entry, and deletes it by its tuple and id, as any other.
func TestParseOffloadedEntry(t *testing.T) {
	const ipsOffload = 1 << 14 // IPS_OFFLOAD
	client := netip.MustParseAddrPort("10.123.1.2:40000")
	svc := netip.MustParseAddrPort("10.96.0.20:53")
	ep := netip.MustParseAddrPort("10.123.2.2:5353")
	gw := netip.MustParseAddrPort("10.123.2.1:40000")
	tupleAttrs := func(src, dst netip.AddrPort) func(*netlink.AttributeEncoder) error {
		return func(ae *netlink.AttributeEncoder) error {
			ae.Nested(ctnetlink.TupleIP, func(ipe *netlink.AttributeEncoder) error {
				ipe.Bytes(ctnetlink.IPv4Src, src.Addr().AsSlice())
				ipe.Bytes(ctnetlink.IPv4Dst, dst.Addr().AsSlice())
				return nil
			})
			ae.Nested(ctnetlink.TupleProto, func(pe *netlink.AttributeEncoder) error {
				pe.Uint8(ctnetlink.ProtoNum, unix.IPPROTO_UDP)
				pe.Bytes(ctnetlink.ProtoSrcPort, be16(src.Port()))
				pe.Bytes(ctnetlink.ProtoDstPort, be16(dst.Port()))
				return nil
			})
			return nil
		}
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctnetlink.TupleOrig, tupleAttrs(client, svc))
	ae.Nested(ctnetlink.TupleReply, tupleAttrs(ep, gw))
	ae.Bytes(3, binary.BigEndian.AppendUint32(nil, ipsOffload|0x2|0x8|0x20)) // CTA_STATUS: seen reply, confirmed, dnat
	ae.Bytes(ctnetlink.ID, binary.BigEndian.AppendUint32(nil, 77))
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var e entry
	if err := parseEntry(append(nfgenmsg(unix.AF_INET), b...), &e); err != nil {
		t.Fatalf("offloaded entry: %v", err)
	}
	if e.origDst != svc || e.replySrc != ep || e.proto != unix.IPPROTO_UDP || !e.hasID || e.id != 77 {
		t.Errorf("offloaded entry read as %+v", e)
	}
	if d := e.deleteReq(); d.orig.src != client || d.orig.dst != svc || d.id != 77 {
		t.Errorf("delete request %+v", d)
	}
}
