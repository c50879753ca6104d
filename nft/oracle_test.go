package nft

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/ruleset"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// The oracle: what github.com/google/nftables writes for the same objects.
// The encoder's bytes are held to it (TestWireMatchesGoogleNftables,
// FuzzWireMatchesGoogleNftables), and google/nftables' output is held to
// nft's (TestNetlinkMatchesNft). Only tests use google/nftables to write.

// googleSink receives a statement's expressions as google/nftables
// expressions.
type googleSink struct {
	table *nftables.Table
	sets  map[string]*nftables.Set // by name; those created in the batch carry their ID
	exprs []expr.Any
}

func newGoogleSink(name string, f ruleset.Family) *googleSink {
	return &googleSink{table: &nftables.Table{Name: name, Family: nftFamily(f)}, sets: map[string]*nftables.Set{}}
}

// set returns the set of that name for references from rules.
func (g *googleSink) set(name string) *nftables.Set {
	if s, ok := g.sets[name]; ok {
		return s
	}
	s := &nftables.Set{Table: g.table, Name: name}
	g.sets[name] = s
	return s
}

func (g *googleSink) add(e expr.Any) { g.exprs = append(g.exprs, e) }

func (g *googleSink) Payload(x bc.Payload) {
	g.add(&expr.Payload{DestRegister: x.Dreg, Base: expr.PayloadBase(x.Base), Offset: x.Offset, Len: x.Len})
}

func (g *googleSink) Cmp(x bc.Cmp) {
	g.add(&expr.Cmp{Op: expr.CmpOp(x.Op), Register: x.Sreg, Data: bytes.Clone(x.Data.Slice())})
}

func (g *googleSink) Bitwise(x bc.Bitwise) {
	g.add(&expr.Bitwise{SourceRegister: x.Sreg, DestRegister: x.Dreg, Len: x.Len,
		Mask: bytes.Clone(x.Mask.Slice()), Xor: bytes.Clone(x.Xor.Slice())})
}

func (g *googleSink) Lookup(x bc.Lookup) {
	s := g.set(x.Set)
	g.add(&expr.Lookup{SourceRegister: x.Sreg, SetName: s.Name, SetID: s.ID, DestRegister: x.Dreg, IsDestRegSet: x.HasDreg, Invert: x.Invert})
}

func (g *googleSink) Meta(x bc.Meta) {
	g.add(&expr.Meta{Key: expr.MetaKey(x.Key), Register: x.Reg, SourceRegister: x.Set})
}

func (g *googleSink) Ct(x bc.Ct) {
	g.add(&expr.Ct{Register: x.Dreg, Key: expr.CtKey(x.Key), SourceRegister: x.Set})
}

func (g *googleSink) Fib(x bc.Fib) {
	g.add(&expr.Fib{Register: x.Dreg,
		FlagSADDR: x.Flags&unix.NFTA_FIB_F_SADDR != 0, FlagDADDR: x.Flags&unix.NFTA_FIB_F_DADDR != 0,
		FlagMARK: x.Flags&unix.NFTA_FIB_F_MARK != 0, FlagIIF: x.Flags&unix.NFTA_FIB_F_IIF != 0,
		FlagOIF: x.Flags&unix.NFTA_FIB_F_OIF != 0, FlagPRESENT: x.Flags&unix.NFTA_FIB_F_PRESENT != 0,
		ResultOIF: x.Result == unix.NFT_FIB_RESULT_OIF, ResultOIFNAME: x.Result == unix.NFT_FIB_RESULT_OIFNAME,
		ResultADDRTYPE: x.Result == unix.NFT_FIB_RESULT_ADDRTYPE})
}

func (g *googleSink) Hash(x bc.Hash) {
	g.add(&expr.Hash{SourceRegister: x.Sreg, DestRegister: x.Dreg, Length: x.Len, Modulus: x.Modulus, Seed: x.Seed,
		Type: expr.HashTypeJenkins})
}

func (g *googleSink) Immediate(x bc.Immediate) {
	g.add(&expr.Immediate{Register: x.Dreg, Data: bytes.Clone(x.Data.Slice())})
}

func (g *googleSink) Verdict(x bc.Verdict) {
	g.add(&expr.Verdict{Kind: expr.VerdictKind(x.Code), Chain: x.Chain})
}

func (g *googleSink) NAT(x bc.NAT) {
	g.add(&expr.NAT{Type: expr.NATType(x.Type), Family: x.Family, RegAddrMin: x.RegAddr, RegProtoMin: x.RegProto, RegProtoMax: x.RegProtoMax,
		Random: x.Flags&expr.NF_NAT_RANGE_PROTO_RANDOM != 0, FullyRandom: x.Flags&expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY != 0,
		Persistent: x.Flags&expr.NF_NAT_RANGE_PERSISTENT != 0, Prefix: x.Flags&expr.NF_NAT_RANGE_PREFIX != 0,
		Specified: x.Flags&expr.NF_NAT_RANGE_PROTO_SPECIFIED != 0})
}

func (g *googleSink) Dynset(x bc.Dynset) {
	s := g.set(x.Set)
	d := &expr.Dynset{SrcRegKey: x.Sreg, SetName: s.Name, SetID: s.ID, Operation: x.Op}
	switch {
	case x.Counter:
		d.Exprs = []expr.Any{&expr.Counter{}}
	case x.Limit.Rate > 0:
		d.Exprs = []expr.Any{googleLimit(x.Limit)}
	}
	g.add(d)
}

// Masq adds nothing for a masquerade to a port range: google/nftables
// writes one without its flags, NF_NAT_RANGE_PROTO_SPECIFIED among them,
// and the kernel then ignores the range. nft's own bytes are its oracle
// (TestNetlinkMatchesNft); here it is not comparable.
func (g *googleSink) Masq(x bc.Masq) {
	if x.RegProtoMin != 0 {
		return
	}
	g.add(&expr.Masq{Random: x.Flags&expr.NF_NAT_RANGE_PROTO_RANDOM != 0,
		FullyRandom: x.Flags&expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY != 0, Persistent: x.Flags&expr.NF_NAT_RANGE_PERSISTENT != 0})
}

func (g *googleSink) Redir(x bc.Redir) {
	g.add(&expr.Redir{RegisterProtoMin: x.RegProto, Flags: x.Flags})
}

func (g *googleSink) Reject(x bc.Reject) { g.add(&expr.Reject{Type: x.Type, Code: x.Code}) }

func (g *googleSink) Dup(x bc.Dup) { g.add(&expr.Dup{RegAddr: x.RegAddr}) }

func (g *googleSink) Limit(x bc.Limit) { g.add(googleLimit(x)) }

func googleLimit(x bc.Limit) *expr.Limit {
	return &expr.Limit{Type: expr.LimitTypePkts, Rate: x.Rate, Unit: expr.LimitTimeSecond, Burst: x.Burst}
}

func (g *googleSink) Byteorder(x bc.Byteorder) {
	g.add(&expr.Byteorder{SourceRegister: x.Sreg, DestRegister: x.Dreg, Op: expr.ByteorderOp(x.Op), Len: x.Len, Size: x.Size})
}

func (g *googleSink) FlowOffload(x bc.FlowOffload) { g.add(&expr.FlowOffload{Name: x.Flowtable}) }

func (g *googleSink) Counter() { g.add(&expr.Counter{}) }

// flowtableDefinition is a flowtable of nftgate's as google/nftables
// describes it.
func flowtableDefinition(table *nftables.Table, ft *ruleset.Flowtable) *nftables.Flowtable {
	return &nftables.Flowtable{Table: table, Name: ft.Name, Hooknum: nftables.FlowtableHookIngress,
		Priority: nftables.FlowtablePriorityRef(nftables.FlowtablePriority(ft.Priority)), Devices: ft.Devices,
		Flags: map[bool]nftables.FlowtableFlags{true: nftables.FlowtableFlagsCounter}[ft.Counter]}
}

// setDefinition is a set of nftgate's as google/nftables describes it.
func setDefinition(table *nftables.Table, f ruleset.Family, s *ruleset.Set) *nftables.Set {
	ns := &nftables.Set{Table: table, Name: s.Name, Size: s.Size}
	ns.Counter = s.Counter
	addr := nftables.TypeIPAddr
	if f == ruleset.IPv6 {
		addr = nftables.TypeIP6Addr
	}
	switch {
	case s.Shape == ruleset.KeySlot && s.Addresses:
		ns.IsMap, ns.DataType, ns.KeyType = true, addr, nftables.TypeInteger
		ns.KeyByteOrder = binaryutil.NativeEndian
	case s.Shape == ruleset.KeySlot:
		ns.IsMap, ns.DataType, ns.KeyType = true, nftables.TypeVerdict, nftables.TypeInteger
		ns.KeyByteOrder = binaryutil.NativeEndian
	case s.Endpoints:
		ns.IsMap, ns.Concatenation = true, true
		ns.DataType = nftables.MustConcatSetType(addr, nftables.TypeInetService)
		if s.Shape == ruleset.KeyProtoPort {
			ns.KeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
		} else {
			ns.KeyType = nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
		}
	case s.Map:
		ns.IsMap, ns.Concatenation, ns.DataType = true, true, nftables.TypeVerdict
		if s.Shape == ruleset.KeyProtoPort {
			ns.KeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
		} else {
			ns.KeyType = nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
		}
	case s.Shape == ruleset.KeyAddrPair:
		ns.Concatenation = true
		ns.KeyType = nftables.MustConcatSetType(addr, addr)
	case s.Shape == ruleset.KeyProto:
		ns.KeyType = nftables.TypeInetProto
	case s.Shape == ruleset.KeyTraffic:
		ns.Concatenation = true
		ns.KeyType = nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService, addr, nftables.TypeInetService)
		ns.Dynamic, ns.HasTimeout, ns.Timeout = true, true, s.Timeout
	default:
		ns.KeyType = addr
		if s.Timeout > 0 {
			ns.Dynamic, ns.HasTimeout, ns.Timeout = true, true, s.Timeout
		}
	}
	return ns
}

// recorder is a google/nftables Conn whose transport only records the
// messages it would send.
type recorder struct {
	conn   *nftables.Conn
	msgs   []netlink.Message
	lastID atomic.Uint32
}

// setID numbers the sets a batch creates, as the encoder does.
func (r *recorder) setID() uint32 { return r.lastID.Add(1) }

func newRecorder() (*recorder, error) {
	r := &recorder{}
	ack := []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			return ack, nil // google/nftables reads one acknowledgement per message
		}
		r.msgs = append(r.msgs, req...)
		return nil, nil
	}))
	if err != nil {
		return nil, err
	}
	r.conn = conn
	return r, nil
}

// take returns the recorded messages without the batch framing.
func (r *recorder) take() ([]netlink.Message, error) {
	if err := r.conn.Flush(); err != nil {
		return nil, err
	}
	msgs := r.msgs
	r.msgs = nil
	if len(msgs) >= 2 {
		msgs = msgs[1 : len(msgs)-1] // drop BATCH_BEGIN and BATCH_END
	}
	for i, m := range msgs {
		if m.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWRULE) {
			msgs[i].Data = append(m.Data[:4:4], ctDirected(m.Data[4:])...)
		}
	}
	return msgs, nil
}

// google/nftables writes a conntrack load's direction only for the generic
// tuple keys (NFT_CT_SRC, _DST, _PROTO_SRC, _PROTO_DST), not for the
// family's own address keys (NFT_CT_DST_IP, _DST_IP6, ...), which the
// kernel refuses without one. ctDirected adds, to every "ct" expression
// in an attribute stream that loads such a key without a direction, the
// original direction as the encoder writes it: the only place the oracle's
// bytes are mended.
func ctDirected(b []byte) []byte {
	var out []byte
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:])
		if l < 4 || l > len(b) {
			return append(out, b...)
		}
		data := b[4:l]
		if typ&unix.NLA_F_NESTED != 0 {
			data = ctDirected(data)
			if typ&^unix.NLA_F_NESTED == unix.NFTA_LIST_ELEM {
				data = directCt(data)
			}
		}
		out = binary.NativeEndian.AppendUint16(out, uint16(4+len(data)))
		out = binary.NativeEndian.AppendUint16(out, typ)
		out = append(out, data...)
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return out
}

// directCt mends one list element, as ctDirected says.
func directCt(elem []byte) []byte {
	ad, err := netlink.NewAttributeDecoder(elem)
	if err != nil {
		return elem
	}
	var name string
	var data []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_EXPR_NAME:
			name = ad.String()
		case unix.NFTA_EXPR_DATA:
			data = ad.Bytes()
		}
	}
	if name != "ct" || data == nil {
		return elem
	}
	ad, err = netlink.NewAttributeDecoder(data)
	if err != nil {
		return elem
	}
	ad.ByteOrder = binary.BigEndian
	familyKey, directed := false, false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CT_KEY:
			switch ad.Uint32() {
			case unix.NFT_CT_SRC_IP, unix.NFT_CT_DST_IP, unix.NFT_CT_SRC_IP6, unix.NFT_CT_DST_IP6:
				familyKey = true
			}
		case unix.NFTA_CT_DIRECTION:
			directed = true
		}
	}
	if !familyKey || directed {
		return elem
	}
	dir, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_CT_DIRECTION, Data: binaryutil.BigEndian.PutUint32(bc.CtDirOriginal)}})
	data = append(bytes.Clone(data), dir...)
	out, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: []byte("ct\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
	return out
}
