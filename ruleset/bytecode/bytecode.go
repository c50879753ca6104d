// Package bytecode holds the nf_tables expressions that nftgate's statements
// are made of, as plain values, and the Sink a statement writes them into.
//
// Each statement of package ruleset writes its expressions once, into a
// Sink: the kernel package's batch buffer writes them as netlink attributes
// straight into the batch; its tests' oracle writes them as
// github.com/google/nftables expressions to compare the bytes. The values
// carry the kernel's numbers (registers, keys, operators) and hold their
// constants by value, so that writing a rule allocates nothing.
//
// The package imports no netlink: it is what the ruleset says, not how it
// travels.
package bytecode

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Registers as nft allocates them, so that `nft --debug=netlink` of a rule
// written by hand and of the same rule written by nftgate agree.
const (
	RegVerdict = unix.NFT_REG_VERDICT
	Reg1       = 1  // 128-bit register 1
	Reg2       = 2  // 128-bit register 2
	Reg3       = 3  // 128-bit register 3
	Reg32First = 8  // the first 32-bit slot of register 1, by 32-bit number
	Reg32a     = 9  // second 32-bit slot of register 1
	Reg32b     = 10 // third 32-bit slot of register 1
	Reg32c     = 13 // second 32-bit slot of register 2
)

// Data is a constant of up to 16 bytes (an IPv6 address), held by value.
type Data struct {
	n uint8
	b [16]byte
}

// Bytes makes a constant of b, which must be at most 16 bytes.
func Bytes(b ...byte) Data {
	var d Data
	d.n = uint8(copy(d.b[:], b))
	return d
}

// U32 is a 32-bit constant in the host's byte order, as nf_tables keeps
// marks, ct states, fib results and hash results in registers.
func U32(v uint32) Data {
	var d Data
	d.n = 4
	nativePut32(d.b[:4], v)
	return d
}

// Zero is n zero bytes.
func Zero(n int) Data { return Data{n: uint8(n)} }

// Slice returns the constant's bytes.
func (d *Data) Slice() []byte { return d.b[:d.n] }

// Len is the constant's length in bytes.
func (d *Data) Len() int { return int(d.n) }

// Payload bases.
const (
	NetworkHeader   = unix.NFT_PAYLOAD_NETWORK_HEADER
	TransportHeader = unix.NFT_PAYLOAD_TRANSPORT_HEADER
)

// Payload loads Len bytes at Offset of a header into Dreg.
type Payload struct {
	Base, Offset, Len, Dreg uint32
}

// Comparison operators. The kernel compares a register's bytes in memory
// order (memcmp), so an order (CmpGt) holds for a big-endian value: a
// counter, which conntrack keeps in the host's order, goes through a
// Byteorder first, as nft writes it.
const (
	CmpEq  = unix.NFT_CMP_EQ
	CmpNeq = unix.NFT_CMP_NEQ
	CmpGt  = unix.NFT_CMP_GT
)

// Cmp compares register Sreg with Data; the rule stops when it does not
// hold.
type Cmp struct {
	Op, Sreg uint32
	Data     Data
}

// ByteorderHton turns host-order values into network (big-endian) order.
const ByteorderHton = unix.NFT_BYTEORDER_HTON

// Byteorder converts Len bytes of Sreg, in values of Size bytes each, by
// Op into Dreg.
type Byteorder struct {
	Sreg, Dreg, Op, Len, Size uint32
}

// U64BE is a 64-bit constant in network byte order, as a counter
// compares after a Byteorder to it.
func U64BE(v uint64) Data {
	var d Data
	d.n = 8
	binary.BigEndian.PutUint64(d.b[:8], v)
	return d
}

// Bitwise computes Dreg = (Sreg & Mask) ^ Xor over Len bytes.
type Bitwise struct {
	Sreg, Dreg, Len uint32
	Mask, Xor       Data
}

// Lookup looks Sreg up in the named set; for a verdict map (Dreg set, to
// RegVerdict) the element's verdict is applied.
type Lookup struct {
	Sreg    uint32
	Set     string
	Dreg    uint32
	HasDreg bool
	// Invert matches a key that is not in the set (no Dreg then).
	Invert bool
}

// Meta keys nftgate uses.
const (
	MetaMark    = unix.NFT_META_MARK
	MetaL4Proto = unix.NFT_META_L4PROTO
	MetaCPU     = unix.NFT_META_CPU
)

// Meta loads a packet's meta key into Reg, or with Set, sets the key from
// Reg.
type Meta struct {
	Key, Reg uint32
	Set      bool
}

// CtState is the conntrack key of a connection's state; CtStateNew and
// CtStateEstablished its bits for a new and an established connection.
// CtStatus is the key of a connection's status bits; CtStatusDstNAT the
// bit of a translated destination.
const (
	CtState            = unix.NFT_CT_STATE
	CtStateNew         = 1 << 3 // NF_CT_STATE_BIT(IP_CT_NEW)
	CtStateEstablished = 1 << 1 // NF_CT_STATE_BIT(IP_CT_ESTABLISHED)
	CtStateUntracked   = 1 << 6 // NF_CT_STATE_UNTRACKED_BIT
	CtStateInvalid     = 1 << 0 // NF_CT_STATE_INVALID_BIT
	CtStatus           = unix.NFT_CT_STATUS
	CtStatusSrcNAT     = 1 << 4 // IPS_SRC_NAT
	CtStatusDstNAT     = 1 << 5 // IPS_DST_NAT
	CtStatusAssured    = 1 << 2 // IPS_ASSURED
	// CtMark is the connection's mark.
	CtMark = unix.NFT_CT_MARK
	// CtDirection is the direction of the packet in its connection
	// (CtDirOriginal or CtDirReply); CtDstIP and CtDstIP6 the destination
	// address and CtProtoDst the destination port of the connection's
	// original tuple (CtSrcIP, CtSrcIP6, CtProtoSrc its source's). The
	// address is loaded by its family's key, as nft does: nft reads the
	// generic NFT_CT_DST back as 128 bits, and a concatenation it starts
	// as longer than the set's key (nft 1.0.6 aborts listing such a rule).
	CtDirection   = unix.NFT_CT_DIRECTION
	CtSrcIP       = unix.NFT_CT_SRC_IP
	CtSrcIP6      = unix.NFT_CT_SRC_IP6
	CtDstIP       = unix.NFT_CT_DST_IP
	CtDstIP6      = unix.NFT_CT_DST_IP6
	CtProtoSrc    = unix.NFT_CT_PROTO_SRC
	CtProtoDst    = unix.NFT_CT_PROTO_DST
	CtDirOriginal = 0 // IP_CT_DIR_ORIGINAL
	CtDirReply    = 1 // IP_CT_DIR_REPLY
)

// CtPackets is the key of the packets a connection has passed, both
// directions, a 64-bit counter in the host's order (conntrack's
// accounting: a rule that reads it turns nf_conntrack_acct on in its
// namespace, for the connections made after it).
const CtPackets = unix.NFT_CT_PKTS

// CtEventMask is the key of the conntrack events the kernel reports for a
// connection (the IPCT_* bits; set only). A connection whose mask is 0
// makes no event for any listener.
const CtEventMask = unix.NFT_CT_EVENTMASK

// CtLabels is the key of a connection's 128 label bits (16 bytes, a whole
// register); a set changes only the bits the value has.
const CtLabels = unix.NFT_CT_LABELS

// Ct loads a conntrack key into Dreg, or with Set, sets the key (the mark,
// the event mask) from Dreg. The keys of a tuple (CtDstIP, CtProtoDst, ...)
// are read from the original direction's: the kernel reads the direction as
// one byte and google/nftables, the encoder's oracle, writes four, which
// agree only on zero.
type Ct struct {
	Key, Dreg uint32
	Set       bool
}

// CtTupleKey tells the keys that read one direction's tuple.
func CtTupleKey(key uint32) bool {
	switch key {
	case unix.NFT_CT_SRC, unix.NFT_CT_DST, unix.NFT_CT_SRC_IP, CtDstIP, unix.NFT_CT_SRC_IP6, CtDstIP6, unix.NFT_CT_PROTO_SRC, CtProtoDst:
		return true
	}
	return false
}

// Fib flags and results.
const (
	FibSaddr        = unix.NFTA_FIB_F_SADDR
	FibDaddr        = unix.NFTA_FIB_F_DADDR
	FibAddrType     = unix.NFT_FIB_RESULT_ADDRTYPE
	RouteTypeLocal  = unix.RTN_LOCAL
	HashJenkins     = unix.NFT_HASH_JENKINS
	NATDest         = unix.NFT_NAT_DNAT
	NATSource       = unix.NFT_NAT_SNAT
	NATSpecified    = unix.NF_NAT_RANGE_PROTO_SPECIFIED
	NATFullyRandom  = unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY
	DynsetAdd       = unix.NFT_DYNSET_OP_ADD
	DynsetUpdate    = unix.NFT_DYNSET_OP_UPDATE
	RejectICMPUnrch = unix.NFT_REJECT_ICMP_UNREACH
	RejectTCPReset  = unix.NFT_REJECT_TCP_RST
)

// Fib looks the packet's route up, by the addresses Flags select, and
// loads Result (an address type) into Dreg.
type Fib struct {
	Dreg, Flags, Result uint32
}

// Hash computes the Jenkins hash of Len bytes from Sreg, with Seed, modulo
// Modulus, into Dreg.
type Hash struct {
	Sreg, Dreg, Len, Modulus, Seed uint32
}

// Immediate loads Data into Dreg.
type Immediate struct {
	Dreg uint32
	Data Data
}

// Verdict codes as the kernel reads them.
const (
	VerdictDrop   = 0 // NF_DROP
	VerdictAccept = 1 // NF_ACCEPT
	VerdictJump   = unix.NFT_JUMP
	VerdictGoto   = unix.NFT_GOTO
	VerdictReturn = unix.NFT_RETURN
)

// Verdict ends the rule with Code, to Chain for a jump or goto.
type Verdict struct {
	Code  int32
	Chain string
}

// NAT translates the address (from RegAddr) and port (from RegProto, or
// a range from RegProto to RegProtoMax) of the packet's family.
type NAT struct {
	Type, Family, RegAddr, RegProto, RegProtoMax, Flags uint32
}

// Dynset adds (DynsetAdd: an element that exists is left as it is) or
// updates (DynsetUpdate: its timeout starts again) the key in Sreg in the
// named set. With Counter, the element carries a counter that every update
// counts the packet in (the element's expression list); with a Limit (a
// Rate above zero), a limit of its own that the packet must be within for
// the update to match (never both).
type Dynset struct {
	Sreg, Op uint32
	Set      string
	Counter  bool
	Limit    Limit
}

// Masq masquerades with Flags, to a port from the range RegProtoMin to
// RegProtoMax when they are set (with NATSpecified in Flags, as nft writes
// it: the kernel takes the flags as they are).
type Masq struct {
	Flags, RegProtoMin, RegProtoMax uint32
}

// Redir redirects the packet to the gateway itself (the primary address of
// the interface it arrived on, or loopback for its own traffic), to the
// port in RegProto when it is set.
type Redir struct {
	RegProto, Flags uint32
}

// Dup sends a copy of the packet, untracked, towards the address in
// RegAddr (the copy keeps its own addresses: only its route is chosen by
// it).
type Dup struct {
	RegAddr uint32
}

// Reject answers the packet with an ICMP error of Type and Code, or with
// Type RejectTCPReset, a TCP reset.
type Reject struct {
	Type uint32
	Code uint8
}

// Limit matches while the rule's packets come at no more than Rate a
// second, with Burst packets of credit (a token bucket, one for the rule).
type Limit struct {
	Rate  uint64
	Burst uint32
}

// FlowOffload adds the packet's connection to the named flowtable.
type FlowOffload struct {
	Flowtable string
}

// Sink receives a rule's expressions in order.
type Sink interface {
	Payload(Payload)
	Cmp(Cmp)
	Bitwise(Bitwise)
	Byteorder(Byteorder)
	Lookup(Lookup)
	Meta(Meta)
	Ct(Ct)
	Fib(Fib)
	Hash(Hash)
	Immediate(Immediate)
	Verdict(Verdict)
	NAT(NAT)
	Dynset(Dynset)
	Masq(Masq)
	Redir(Redir)
	Reject(Reject)
	Dup(Dup)
	Limit(Limit)
	FlowOffload(FlowOffload)
	// Counter counts packets and bytes, from zero.
	Counter()
}
