package nft

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
)

// fuzzReader hands out the fuzzer's bytes as fields; past the end it gives
// zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) u8() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) u16() uint16 { return uint16(r.u8())<<8 | uint16(r.u8()) }
func (r *fuzzReader) u32() uint32 { return uint32(r.u16())<<16 | uint32(r.u16()) }
func (r *fuzzReader) flag() bool  { return r.u8()&1 == 1 }

func (r *fuzzReader) bytes() []byte {
	n := int(r.u8() % 20)
	out := make([]byte, 0, n)
	for range n {
		out = append(out, r.u8())
	}
	return out
}

var fuzzVerdicts = []expr.VerdictKind{expr.VerdictReturn, expr.VerdictGoto, expr.VerdictJump, expr.VerdictBreak,
	expr.VerdictContinue, expr.VerdictDrop, expr.VerdictAccept, expr.VerdictStolen, expr.VerdictQueue, expr.VerdictRepeat, expr.VerdictStop}

// expr builds one expression of any kind the encoder writes itself (and a
// few it hands to google/nftables), with the fuzzer's field values; name
// is the chain or set it names.
func (r *fuzzReader) expr(name string) expr.Any {
	switch r.u8() % 15 {
	case 0:
		return &expr.Payload{OperationType: expr.PayloadOperationType(r.u8() % 2), DestRegister: r.u32(), SourceRegister: r.u32(),
			Base: expr.PayloadBase(r.u8() % 4), Offset: r.u32(), Len: r.u32(), CsumType: expr.PayloadCsumType(r.u8() % 3), CsumOffset: r.u32()}
	case 1:
		return &expr.Cmp{Op: expr.CmpOp(r.u8() % 6), Register: r.u32(), Data: r.bytes()}
	case 2:
		return &expr.Bitwise{SourceRegister: r.u32(), DestRegister: r.u32(), Len: r.u32(), Mask: r.bytes(), Xor: r.bytes()}
	case 3:
		return &expr.Lookup{SourceRegister: r.u32(), DestRegister: r.u32(), IsDestRegSet: r.flag(), SetName: name, SetID: r.u32(), Invert: r.flag()}
	case 4:
		return &expr.Meta{Key: expr.MetaKey(r.u8() % 32), Register: r.u32(), SourceRegister: r.flag()}
	case 5:
		return &expr.Ct{Register: r.u32(), Key: expr.CtKey(r.u8() % 32), Direction: r.u32(), SourceRegister: r.flag()}
	case 6:
		return &expr.Fib{Register: r.u32(), ResultOIF: r.flag(), ResultOIFNAME: r.flag(), ResultADDRTYPE: r.flag(),
			FlagSADDR: r.flag(), FlagDADDR: r.flag(), FlagMARK: r.flag(), FlagIIF: r.flag(), FlagOIF: r.flag(), FlagPRESENT: r.flag()}
	case 7:
		return &expr.Hash{SourceRegister: r.u32(), DestRegister: r.u32(), Length: r.u32(), Modulus: r.u32(), Seed: r.u32(),
			Offset: r.u32(), Type: expr.HashType(r.u8() % 2)}
	case 8:
		return &expr.Immediate{Register: r.u32(), Data: r.bytes()}
	case 9:
		return &expr.Verdict{Kind: fuzzVerdicts[int(r.u8())%len(fuzzVerdicts)], Chain: name}
	case 10:
		return &expr.NAT{Type: expr.NATType(r.u8() % 2), Family: uint32(r.u8()), RegAddrMin: r.u32(), RegAddrMax: r.u32(),
			RegProtoMin: r.u32(), RegProtoMax: r.u32(), Random: r.flag(), FullyRandom: r.flag(), Persistent: r.flag(),
			Prefix: r.flag(), Specified: r.flag()}
	case 11:
		d := &expr.Dynset{SrcRegKey: r.u32(), SrcRegData: r.u32(), SetID: r.u32(), SetName: name, Operation: r.u32() % 3,
			Timeout: time.Duration(r.u32()) * time.Millisecond, Invert: r.flag()}
		if r.flag() {
			d.Exprs = []expr.Any{&expr.Counter{}}
		}
		return d
	case 12:
		return &expr.Masq{Random: r.flag(), FullyRandom: r.flag(), Persistent: r.flag(), ToPorts: r.flag(),
			RegProtoMin: r.u32(), RegProtoMax: r.u32()}
	case 13:
		return &expr.Reject{Type: r.u32(), Code: r.u8()}
	default:
		return &expr.Counter{Bytes: uint64(r.u32()), Packets: uint64(r.u32())}
	}
}

// FuzzWireMatchesGoogleNftables: the netlink the encoder writes is byte for
// byte what google/nftables writes, for expressions with any field values
// and names, and for whole batches of a Service with any names and
// endpoints.
func FuzzWireMatchesGoogleNftables(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzWireMatchesGoogleNftables.
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		r := &fuzzReader{b: data}
		for _, fam := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
			r := &fuzzReader{b: data}
			for len(r.b) > 0 {
				e := r.expr(name)
				want, err := expr.Marshal(fam, e)
				if err != nil {
					continue // google/nftables refuses it: nothing to compare
				}
				wantList, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: want}})
				if err != nil {
					continue
				}
				var w wire
				w.expr(fam, e)
				if w.err != nil {
					continue // an attribute over 64 KiB: refused, not written
				}
				if !bytes.Equal(w.b, wantList) {
					t.Fatalf("family %d, %T %+v:\n got: % x\nwant: % x", fam, e, e, w.b, wantList)
				}
			}
		}

		// A whole batch: one Service of these names, with endpoints from
		// the bytes, programmed cold and then removed.
		svc := fuzzService(name, r)
		cfg := Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, Shards: 2}
		ts := newTableSet(&cfg)
		state := make([]*tableState, len(ts.refs))
		for i := range state {
			state[i] = newTableState()
		}
		ds, book, _ := planFull(&cfg, ts, state, map[model.ServiceKey]*model.Service{svc.Key: svc})
		compareBatches(t, "cold", wireMessages(encodeOps(t, ts, ds)), refEncode(t, ts, ds))
		for slot, d := range ds {
			state[slot].apply(&d.ops)
		}
		ds, _, _ = planPartial(&cfg, ts, state, book, map[model.ServiceKey]*model.Service{svc.Key: svc}, map[model.ServiceKey]*model.Service{svc.Key: nil})
		compareBatches(t, "removal", wireMessages(encodeOps(t, ts, ds)), refEncode(t, ts, ds))
	})
}

// fuzzService is a Service named name in namespace name, whose shape and
// endpoints come from the fuzzer's bytes.
func fuzzService(name string, r *fuzzReader) *model.Service {
	svc := &model.Service{Key: model.ServiceKey{Namespace: name, Name: name}, Type: "LoadBalancer", IPv4: true, IPv6: true,
		ClusterIPs:      []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 0, r.u8()})},
		LoadBalancerIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 1, r.u8()})},
		SourceRanges:    []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, r.u8(), 0}), 24)},
		ExternalLocal:   r.flag(), InternalLocal: r.flag()}
	if r.flag() {
		svc.AffinityTimeout = time.Duration(1+r.u16()) * time.Second
	}
	for range 1 + r.u8()%3 {
		p := model.ServicePort{Name: name, Protocol: []model.Protocol{model.TCP, model.UDP, model.SCTP}[r.u8()%3],
			Port: r.u16(), NodePort: r.u16()}
		if r.flag() {
			p.Name = ""
		}
		for range r.u8() % 5 {
			a := netip.AddrFrom4([4]byte{198, 18, 2, r.u8()})
			if r.flag() {
				var b [16]byte
				binary.BigEndian.PutUint32(b[:], 0xfd000002)
				b[15] = r.u8()
				a = netip.AddrFrom16(b)
			}
			p.Endpoints = append(p.Endpoints, model.Endpoint{Addr: a, Port: r.u16(), Ready: r.flag(), Serving: true,
				Terminating: r.flag(), NodeName: []string{"gw", "other"}[r.u8()%2]})
		}
		svc.Ports = append(svc.Ports, p)
	}
	return svc
}
