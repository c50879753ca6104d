package nft

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	bc "github.com/nftgate/nftgate/ruleset/bytecode"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
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

var fuzzVerdicts = []int32{bc.VerdictReturn, bc.VerdictGoto, bc.VerdictJump, bc.VerdictDrop, bc.VerdictAccept,
	int32(expr.VerdictBreak), int32(expr.VerdictContinue), int32(expr.VerdictStolen), int32(expr.VerdictQueue),
	int32(expr.VerdictRepeat), int32(expr.VerdictStop)}

// data is a constant from the fuzzer's bytes.
func (r *fuzzReader) data() bc.Data { return bc.Bytes(r.bytes()...) }

// expr writes one expression of any kind the statements use, with the
// fuzzer's field values; name is the chain or set it names.
func (r *fuzzReader) expr(name string) func(bc.Sink) {
	switch r.u8() % 18 {
	case 0:
		x := bc.Payload{Dreg: r.u32(), Base: uint32(r.u8() % 4), Offset: r.u32(), Len: r.u32()}
		return func(s bc.Sink) { s.Payload(x) }
	case 1:
		x := bc.Cmp{Op: uint32(r.u8() % 6), Sreg: r.u32(), Data: r.data()}
		return func(s bc.Sink) { s.Cmp(x) }
	case 2:
		x := bc.Bitwise{Sreg: r.u32(), Dreg: r.u32(), Len: r.u32(), Mask: r.data(), Xor: r.data()}
		return func(s bc.Sink) { s.Bitwise(x) }
	case 3:
		x := bc.Lookup{Sreg: r.u32(), Dreg: r.u32(), HasDreg: r.flag(), Set: name}
		return func(s bc.Sink) { s.Lookup(x) }
	case 4:
		x := bc.Meta{Key: uint32(r.u8() % 32), Reg: r.u32(), Set: r.flag()}
		return func(s bc.Sink) { s.Meta(x) }
	case 5:
		key := uint32(r.u8() % 32)
		switch key {
		case unix.NFT_CT_SRC, unix.NFT_CT_DST, unix.NFT_CT_PROTO_SRC, unix.NFT_CT_PROTO_DST:
			key = unix.NFT_CT_STATE // keys with a direction: not what the statements load
		}
		x := bc.Ct{Key: key, Dreg: r.u32(), Set: r.flag()}
		return func(s bc.Sink) { s.Ct(x) }
	case 6:
		x := bc.Fib{Dreg: r.u32(), Flags: uint32(r.u8() % 64), Result: uint32(r.u8() % 4)}
		return func(s bc.Sink) { s.Fib(x) }
	case 7:
		x := bc.Hash{Sreg: r.u32(), Dreg: r.u32(), Len: r.u32(), Modulus: r.u32(), Seed: r.u32()}
		return func(s bc.Sink) { s.Hash(x) }
	case 8:
		x := bc.Immediate{Dreg: r.u32(), Data: r.data()}
		return func(s bc.Sink) { s.Immediate(x) }
	case 9:
		x := bc.Verdict{Code: fuzzVerdicts[int(r.u8())%len(fuzzVerdicts)], Chain: name}
		return func(s bc.Sink) { s.Verdict(x) }
	case 10:
		x := bc.NAT{Type: uint32(r.u8() % 2), Family: uint32(r.u8()), RegAddr: r.u32(), RegProto: r.u32(), RegProtoMax: r.u32(), Flags: r.u32() & 0x5e}
		return func(s bc.Sink) { s.NAT(x) }
	case 11:
		x := bc.Dynset{Sreg: r.u32(), Op: r.u32() % 3, Set: name}
		return func(s bc.Sink) { s.Dynset(x) }
	case 12:
		x := bc.Masq{Flags: r.u32() & 0x1c}
		return func(s bc.Sink) { s.Masq(x) }
	case 13:
		x := bc.Redir{RegProto: r.u32(), Flags: r.u32() & 0x1e}
		return func(s bc.Sink) { s.Redir(x) }
	case 14:
		x := bc.Reject{Type: r.u32(), Code: r.u8()}
		return func(s bc.Sink) { s.Reject(x) }
	case 15:
		x := bc.Dup{RegAddr: r.u32()}
		return func(s bc.Sink) { s.Dup(x) }
	case 16:
		x := bc.Byteorder{Sreg: r.u32(), Dreg: r.u32(), Op: uint32(r.u8() % 2), Len: r.u32(), Size: r.u32()}
		return func(s bc.Sink) { s.Byteorder(x) }
	default:
		x := bc.FlowOffload{Flowtable: name}
		return func(s bc.Sink) { s.FlowOffload(x) }
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
				got, want, ok := exprBytes(t, fam, r.expr(name))
				if ok && !bytes.Equal(got, want) {
					t.Fatalf("family %d:\n got: % x\nwant: % x", fam, got, want)
				}
			}
		}

		// A whole batch: one Service of these names, with endpoints from
		// the bytes, programmed cold and then removed.
		svc := fuzzService(name, r)
		cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, Shards: 2,
			KeepClientAddress: r.flag()}
		// A pool of masquerade addresses, of either family, from none to three.
		for range r.u8() % 4 {
			a := netip.AddrFrom4([4]byte{198, 18, 3, r.u8()})
			if r.flag() {
				a = netip.AddrFrom16([16]byte{0xfd, 0, 0, 3, 15: r.u8()})
			}
			cfg.MasqueradeAddresses = append(cfg.MasqueradeAddresses, a)
		}
		if r.flag() {
			// A flowtable on a device of any name.
			cfg.FlowtableDevices = []string{name, "eth0"}
		}
		ts := ruleset.NewTables(&cfg)
		state := make([]*ruleset.TableState, len(ts.Refs))
		for i := range state {
			state[i] = ruleset.NewTableState()
		}
		ds, book, _ := ruleset.PlanFull(&cfg, ts, state, map[model.ServiceKey]*model.Service{svc.Key: svc})
		compareBatches(t, "cold", wireMessages(encodeOps(t, ts, ds)), refEncode(t, ts, ds))
		for slot, o := range ds {
			state[slot].Apply(o)
		}
		ds, _, _ = ruleset.PlanPartial(&cfg, ts, state, book, map[model.ServiceKey]*model.Service{svc.Key: svc}, map[model.ServiceKey]*model.Service{svc.Key: nil})
		compareBatches(t, "removal", wireMessages(encodeOps(t, ts, ds)), refEncode(t, ts, ds))
	})
}

// fuzzService is a Service named name in namespace name, whose shape and
// endpoints come from the fuzzer's bytes.
func fuzzService(name string, r *fuzzReader) *model.Service {
	svc := &model.Service{Key: model.NewServiceKey(name, name), Type: model.TypeLoadBalancer, IPv4: true, IPv6: true,
		ClusterIPs:    []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 0, r.u8()})},
		Rare:          &model.Rare{LoadBalancerIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 1, r.u8()})}, SourceRanges: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, r.u8(), 0}), 24)}},
		ExternalLocal: r.flag(), InternalLocal: r.flag()}
	if r.flag() {
		svc.EditRare().AffinityTimeout = time.Duration(1+r.u16()) * time.Second
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
			p.Endpoints = append(p.Endpoints, model.Endpoint{Port: r.u16(), Ready: r.flag(), Serving: true,
				Terminating: r.flag(), Place: model.On([]string{"gw", "other"}[r.u8()%2])}.WithAddr(a))
		}
		svc.Ports = append(svc.Ports, p)
	}
	return svc
}
