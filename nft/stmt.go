package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
)

// Stmt is one statement of a rule: a match, an action or a verdict. The set
// of statements is closed: each knows its nft text and its bytecode, and the
// tracer knows what each does to a packet.
type Stmt interface {
	text(f Family) string
	encode(f Family, e *setRefs) []expr.Any
}

// Register numbers as nft allocates them, so that `nft --debug=netlink` of a
// rule written by hand and of the same rule written by nftgate agree.
const (
	reg1   = 1  // 128-bit register 1
	reg2   = 2  // 128-bit register 2
	reg3   = 3  // 128-bit register 3
	reg32a = 9  // second 32-bit slot of register 1
	reg32b = 10 // third 32-bit slot of register 1
	reg32c = 13 // second 32-bit slot of register 2
)

func saddrOffset(f Family) uint32 {
	if f == IPv6 {
		return 8
	}
	return 12
}

func daddrOffset(f Family) uint32 {
	if f == IPv6 {
		return 24
	}
	return 16
}

// Dir selects the source or destination address of a packet.
type Dir uint8

// Address directions.
const (
	Src Dir = iota
	Dst
)

func (d Dir) word() string {
	if d == Src {
		return "saddr"
	}
	return "daddr"
}

func loadAddr(f Family, d Dir, reg, length uint32) *expr.Payload {
	p := loadAddrValue(f, d, reg, length)
	return &p
}

func loadAddrValue(f Family, d Dir, reg, length uint32) expr.Payload {
	off := saddrOffset(f)
	if d == Dst {
		off = daddrOffset(f)
	}
	return expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: length}
}

// MatchAddr matches the source or destination address against a prefix (a
// single address is a full-length prefix).
type MatchAddr struct {
	Dir    Dir
	Prefix netip.Prefix
	Not    bool
}

func (m MatchAddr) text(f Family) string {
	op := ""
	if m.Not {
		op = "!= "
	}
	v := m.Prefix.String()
	if m.Prefix.IsSingleIP() {
		v = m.Prefix.Addr().String()
	}
	return fmt.Sprintf("%s %s %s%s", f, m.Dir.word(), op, v)
}

func (m MatchAddr) encode(f Family, _ *setRefs) []expr.Any {
	op := expr.CmpOpEq
	if m.Not {
		op = expr.CmpOpNeq
	}
	bits := m.Prefix.Bits()
	addr := m.Prefix.Addr().AsSlice()
	if bits%8 == 0 {
		// Whole bytes: load just those, as nft does.
		n := uint32(bits / 8)
		return []expr.Any{
			loadAddr(f, m.Dir, reg1, n),
			&expr.Cmp{Op: op, Register: reg1, Data: addr[:n]},
		}
	}
	mask := make([]byte, len(addr))
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		loadAddr(f, m.Dir, reg1, f.addrLen()),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: f.addrLen(), Mask: mask, Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: op, Register: reg1, Data: addr},
	}
}

// MatchAddrInSet matches the source address against a named address set.
type MatchAddrInSet struct {
	Dir Dir
	Set string
}

func (m MatchAddrInSet) text(f Family) string { return string(m.appendText(nil, f)) }

func (m MatchAddrInSet) appendText(b []byte, f Family) []byte {
	b = append(b, f.String()...)
	b = append(b, ' ')
	b = append(b, m.Dir.word()...)
	b = append(b, " @"...)
	return append(b, m.Set...)
}

func (m MatchAddrInSet) encode(f Family, e *setRefs) []expr.Any {
	s := e.set(m.Set)
	return []expr.Any{
		loadAddr(f, m.Dir, reg1, f.addrLen()),
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

// MatchAddrPairInSet matches a packet whose source and destination address
// pair is in a set: the hairpin set holds "A . A" for every endpoint A, so
// after DNAT it finds the endpoints that are talking to themselves.
type MatchAddrPairInSet struct {
	Set string
}

func (m MatchAddrPairInSet) text(f Family) string {
	return fmt.Sprintf("%s saddr . %s daddr @%s", f, f, m.Set)
}

func (m MatchAddrPairInSet) encode(f Family, e *setRefs) []expr.Any {
	s := e.set(m.Set)
	daddrReg := uint32(reg32a)
	if f == IPv6 {
		daddrReg = reg2
	}
	return []expr.Any{
		loadAddr(f, Src, reg1, f.addrLen()),
		loadAddr(f, Dst, daddrReg, f.addrLen()),
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

// MatchLocal matches when the source or destination address is one of the
// gateway's own (fib ... type local). Excluding loopback keeps NodePorts off
// 127.0.0.1, as kube-proxy's nftables mode does.
type MatchLocal struct {
	Dir Dir
}

func (m MatchLocal) text(Family) string { return "fib " + m.Dir.word() + " type local" }

func (m MatchLocal) encode(Family, *setRefs) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, ResultADDRTYPE: true, FlagSADDR: m.Dir == Src, FlagDADDR: m.Dir == Dst},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// MatchCtNew matches the first packet of a connection.
type MatchCtNew struct{}

func (MatchCtNew) text(Family) string { return "ct state new" }

func (MatchCtNew) encode(Family, *setRefs) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

// MatchMarkUnset matches packets without the masquerade mark bit.
type MatchMarkUnset struct{ Bit uint32 }

func (m MatchMarkUnset) text(Family) string {
	return fmt.Sprintf("meta mark & %#08x == 0", m.Bit)
}

func (m MatchMarkUnset) encode(Family, *setRefs) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(m.Bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 4)},
	}
}

// SetMark sets (Or) or toggles (Xor) a mark bit.
type SetMark struct {
	Bit uint32
	Xor bool
}

func (m SetMark) text(Family) string {
	if m.Xor {
		return fmt.Sprintf("meta mark set meta mark ^ %#08x", m.Bit)
	}
	return fmt.Sprintf("meta mark set meta mark | %#08x", m.Bit)
}

func (m SetMark) encode(Family, *setRefs) []expr.Any {
	mask := ^m.Bit
	if m.Xor {
		mask = 0xffffffff
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(m.Bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1, SourceRegister: true},
	}
}

// Masquerade rewrites the source to the outgoing interface's address, with
// fully random ports so many clients never collide on one backend.
type Masquerade struct{}

func (Masquerade) text(Family) string { return "masquerade fully-random" }

func (Masquerade) encode(Family, *setRefs) []expr.Any {
	return []expr.Any{&expr.Masq{FullyRandom: true}}
}

// Reject answers with ICMP port unreachable, so a client of a Service with no
// endpoint fails at once instead of waiting for a timeout.
type Reject struct{}

func (Reject) text(Family) string { return "reject" }

func (Reject) encode(f Family, _ *setRefs) []expr.Any {
	code := uint8(3) // ICMP port unreachable
	if f == IPv6 {
		code = 4 // ICMPv6 port unreachable
	}
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code}}
}

// Verdicts as statements.
func (v Verdict) text(Family) string { return v.String() }

func (v Verdict) appendText(b []byte, _ Family) []byte {
	switch v.Kind {
	case Goto:
		return append(append(b, "goto "...), v.Chain...)
	case Jump:
		return append(append(b, "jump "...), v.Chain...)
	}
	return append(b, v.String()...)
}

func (v Verdict) put(_ Family, w *wire) {
	w.verdict(&expr.Verdict{Kind: v.nftKind(), Chain: v.Chain})
}

func (v Verdict) encode(Family, *setRefs) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: v.nftKind(), Chain: v.Chain}}
}

func (v Verdict) nftKind() expr.VerdictKind {
	switch v.Kind {
	case Goto:
		return expr.VerdictGoto
	case Jump:
		return expr.VerdictJump
	case Return:
		return expr.VerdictReturn
	case Drop:
		return expr.VerdictDrop
	case Accept:
		return expr.VerdictAccept
	}
	return 0
}

// VmapDispatch looks the packet up in a verdict map: by destination address,
// protocol and port, or by protocol and port alone (NodePorts).
type VmapDispatch struct {
	Map   string
	Shape KeyShape
}

func (d VmapDispatch) text(f Family) string {
	if d.Shape == KeyProtoPort {
		return "meta l4proto . th dport vmap @" + d.Map
	}
	return fmt.Sprintf("%s daddr . meta l4proto . th dport vmap @%s", f, d.Map)
}

func (d VmapDispatch) encode(f Family, e *setRefs) []expr.Any {
	s := e.set(d.Map)
	lookup := &expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID, DestRegister: 0, IsDestRegSet: true}
	dport := &expr.Payload{Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if d.Shape == KeyProtoPort {
		dport.DestRegister = reg32a
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, dport, lookup}
	}
	protoReg := uint32(reg32a)
	dport.DestRegister = reg32b
	if f == IPv6 {
		protoReg, dport.DestRegister = reg2, reg32c
	}
	return []expr.Any{
		loadAddr(f, Dst, reg1, f.addrLen()),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: protoReg},
		dport,
		lookup,
	}
}

// HashBucket matches the flows whose Jenkins hash of the client's address
// and port, modulo Modulus, is Bucket. A Service with N endpoints has one
// rule per endpoint, bucket i sending to endpoint i. It replaces
// kube-proxy's `numgen random`, which the appliance kernel lacks, and makes
// every gateway that sees a flow choose the same endpoint.
//
// One rule per bucket rather than a map from bucket to endpoint: a map in a
// rule is an anonymous set, and the kernel looks those up by scanning the
// whole transaction, which makes a cold sync of 4,000 Services take 50 s
// instead of 1 s.
type HashBucket struct {
	Seed    uint32
	Modulus uint32
	Bucket  uint32
}

func (h HashBucket) text(f Family) string { return string(h.appendText(nil, f)) }

// appendText writes "jhash ip saddr . th sport mod 4 seed 0x7 0".
func (h HashBucket) appendText(b []byte, f Family) []byte {
	b = append(b, "jhash "...)
	b = append(b, f.String()...)
	b = append(b, " saddr . th sport mod "...)
	b = strconv.AppendUint(b, uint64(h.Modulus), 10)
	b = append(b, " seed 0x"...)
	b = strconv.AppendUint(b, uint64(h.Seed), 16)
	b = append(b, ' ')
	return strconv.AppendUint(b, uint64(h.Bucket), 10)
}

func (h HashBucket) put(f Family, w *wire) {
	sportReg, length := uint32(reg32c), uint32(8)
	if f == IPv6 {
		sportReg, length = reg3, 20
	}
	saddr := loadAddrValue(f, Src, reg2, f.addrLen())
	w.payload(&saddr)
	w.payload(&expr.Payload{DestRegister: sportReg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2})
	w.hash(&expr.Hash{SourceRegister: reg2, DestRegister: reg1, Length: length, Modulus: h.Modulus,
		Seed: h.Seed, Type: expr.HashTypeJenkins})
	var bucket [4]byte
	binary.NativeEndian.PutUint32(bucket[:], h.Bucket)
	w.cmp(&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: bucket[:]})
}

func (h HashBucket) encode(f Family, _ *setRefs) []expr.Any {
	sportReg, length := uint32(reg32c), uint32(8)
	if f == IPv6 {
		sportReg, length = reg3, 20
	}
	return []expr.Any{
		loadAddr(f, Src, reg2, f.addrLen()),
		&expr.Payload{DestRegister: sportReg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		&expr.Hash{SourceRegister: reg2, DestRegister: reg1, Length: length, Modulus: h.Modulus,
			Seed: h.Seed, Type: expr.HashTypeJenkins},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(h.Bucket)},
	}
}

// UpdateAffinity records the client's address in an endpoint's affinity set,
// refreshing its timeout.
type UpdateAffinity struct{ Set string }

func (u UpdateAffinity) text(f Family) string { return string(u.appendText(nil, f)) }

func (u UpdateAffinity) appendText(b []byte, f Family) []byte {
	b = append(b, "update @"...)
	b = append(b, u.Set...)
	b = append(b, " { "...)
	b = append(b, f.String()...)
	return append(b, " saddr }"...)
}

func (u UpdateAffinity) encode(f Family, e *setRefs) []expr.Any {
	s := e.set(u.Set)
	return []expr.Any{
		loadAddr(f, Src, reg1, f.addrLen()),
		&expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE},
	}
}

// DNAT sends the packet to an endpoint. It carries its protocol because a
// port rewrite needs a transport protocol match first.
type DNAT struct {
	Proto model.Protocol
	To    netip.AddrPort
}

func (d DNAT) text(f Family) string { return string(d.appendText(nil, f)) }

// appendText writes "meta l4proto tcp dnat to 10.0.0.1:80" (or
// "[fd00::1]:80").
func (d DNAT) appendText(b []byte, _ Family) []byte {
	b = append(b, "meta l4proto "...)
	b = append(b, d.Proto.String()...)
	b = append(b, " dnat to "...)
	return d.To.AppendTo(b)
}

func (d DNAT) put(f Family, w *wire) {
	fam := uint32(unix.NFPROTO_IPV4)
	if f == IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	w.meta(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1})
	proto := [1]byte{byte(d.Proto)}
	w.cmp(&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: proto[:]})
	var addr []byte
	if a := d.To.Addr(); a.Is4() {
		a4 := a.As4()
		addr = a4[:]
	} else {
		a16 := a.As16()
		addr = a16[:]
	}
	w.immediate(&expr.Immediate{Register: reg1, Data: addr})
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], d.To.Port())
	w.immediate(&expr.Immediate{Register: reg2, Data: port[:]})
	w.nat(&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: reg1, RegProtoMin: reg2, Specified: true})
}

func (d DNAT) encode(f Family, _ *setRefs) []expr.Any {
	fam := uint32(unix.NFPROTO_IPV4)
	if f == IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{byte(d.Proto)}},
		&expr.Immediate{Register: reg1, Data: d.To.Addr().AsSlice()},
		&expr.Immediate{Register: reg2, Data: binaryutil.BigEndian.PutUint16(d.To.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: reg1, RegProtoMin: reg2, Specified: true},
	}
}
