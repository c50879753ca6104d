package nft

import (
	"encoding/binary"
	"fmt"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// wire is a batch of nf_tables messages being built in one contiguous
// buffer, in the exact form the kernel reads them, so that sending it is one
// sendmsg with no copying.
//
// google/nftables builds every expression, attribute and message as
// allocations of their own and marshals them attribute by attribute: at
// the size of a cold sync (tens of thousands of rules of ten expressions)
// that was most of the sync's user-space time and garbage. The messages
// nftgate sends by the ten thousand (rules, chains, map elements) are
// written here instead, byte for byte as google/nftables writes them (the
// tests compare both); the rare ones (tables, sets) still come from
// google/nftables and are copied in.
type wire struct {
	b []byte
	// count of messages, and the offset of the last one.
	count, last int
	// elements is how many map elements the messages hold beyond one
	// each: the kernel announces every element on its own.
	elements int
	// notes describe the messages, one each, for error reports, when
	// describe is set. A batch is described only once the kernel refused
	// it: at the size of a cold sync the notes would be garbage by the ten
	// thousand, for nothing.
	notes    []note
	describe bool
	err      error
}

const (
	nlmsgHeaderLen = 16
	nfgenHeaderLen = 4
	// maxAttrLen is the largest netlink attribute: its length is 16 bits.
	maxAttrLen = 0xffff
)

// newWire starts a part of a batch of about size bytes and count
// messages, with notes when describe is set.
func newWire(size, count int, describe bool) *wire {
	return newWireIn(make([]byte, 0, size), count, describe)
}

// newWireIn starts a part of a batch in buffer b.
func newWireIn(b []byte, count int, describe bool) *wire {
	w := &wire{b: b, describe: describe, last: -1}
	if describe {
		w.notes = make([]note, 0, count)
	}
	return w
}

// marker writes the message that begins or ends a batch.
func (w *wire) marker(typ uint16) {
	w.b = binary.NativeEndian.AppendUint32(w.b, nlmsgHeaderLen+nfgenHeaderLen)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(netlink.Request))
	w.b = append(w.b, 0, 0, 0, 0, 0, 0, 0, 0)
	w.b = append(w.b, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES)
}

func (w *wire) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

// begin starts a message of nf_tables type typ for family f. Sequence
// numbers and the port ID are filled in when the batch is sent.
func (w *wire) begin(typ uint16, flags netlink.HeaderFlags, f byte) {
	w.last = len(w.b)
	w.count++
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // length, set by end
	w.b = binary.NativeEndian.AppendUint16(w.b, unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(flags))
	w.b = append(w.b, 0, 0, 0, 0, 0, 0, 0, 0) // sequence, port ID
	w.b = append(w.b, f, unix.NFNETLINK_V0, 0, 0)
}

// end finishes the message begun last.
func (w *wire) end() {
	binary.NativeEndian.PutUint32(w.b[w.last:], uint32(len(w.b)-w.last))
}

func (w *wire) pad() {
	for len(w.b)%4 != 0 {
		w.b = append(w.b, 0)
	}
}

// nest opens a nested attribute and returns its offset for close.
func (w *wire) nest(typ uint16) int {
	at := len(w.b)
	w.b = binary.NativeEndian.AppendUint16(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ|unix.NLA_F_NESTED)
	return at
}

// close ends the nested attribute opened at offset at.
func (w *wire) close(at int) {
	n := len(w.b) - at
	if n > maxAttrLen {
		w.fail(fmt.Errorf("netlink attribute of %d bytes is over the limit of %d", n, maxAttrLen))
	}
	binary.NativeEndian.PutUint16(w.b[at:], uint16(n))
}

func (w *wire) attr(typ uint16, data []byte) {
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(4+len(data)))
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = append(w.b, data...)
	w.pad()
}

// str writes a NUL-terminated string attribute.
func (w *wire) str(typ uint16, s string) {
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(4+len(s)+1))
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = append(w.b, s...)
	w.b = append(w.b, 0)
	w.pad()
}

// bytesAttr writes a string attribute without the NUL, as google/nftables
// writes the names of flowtables and their devices.
func (w *wire) bytesAttr(typ uint16, s string) {
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(4+len(s)))
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = append(w.b, s...)
	w.pad()
}

// u32 writes a big-endian 32-bit attribute, as nf_tables takes them.
func (w *wire) u32(typ uint16, v uint32) {
	w.b = binary.NativeEndian.AppendUint16(w.b, 8)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.BigEndian.AppendUint32(w.b, v)
}

func (w *wire) u64(typ uint16, v uint64) {
	w.b = binary.NativeEndian.AppendUint16(w.b, 12)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.BigEndian.AppendUint64(w.b, v)
}

// value writes data as a nested NFTA_DATA_VALUE.
func (w *wire) value(typ uint16, data []byte) {
	at := w.nest(typ)
	w.attr(unix.NFTA_DATA_VALUE, data)
	w.close(at)
}

// open opens an attribute holding others, without the nested flag, and
// returns its offset for close.
func (w *wire) open(typ uint16) int {
	at := len(w.b)
	w.b = binary.NativeEndian.AppendUint16(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	return at
}

// The expressions of rules: the encoder is the bytecode.Sink of the
// statements it encodes, and writes each expression as an element of the
// rule's expression list, exactly as google/nftables' expr.Marshal does
// (the tests compare both). The expressions come by value, constants and
// all, so that writing a rule allocates nothing.

// exprBegin opens the list element and the data of an expression named
// name; exprEnd closes both.
func (w *wire) exprBegin(name string) (int, int) {
	elem := w.nest(unix.NFTA_LIST_ELEM)
	w.str(unix.NFTA_EXPR_NAME, name)
	return elem, w.nest(unix.NFTA_EXPR_DATA)
}

func (w *wire) exprEnd(elem, data int) {
	w.close(data)
	w.close(elem)
}

// Payload writes a payload load.
func (e *encoder) Payload(x bc.Payload) {
	w := e.w
	elem, at := w.exprBegin("payload")
	w.u32(unix.NFTA_PAYLOAD_DREG, x.Dreg)
	w.u32(unix.NFTA_PAYLOAD_BASE, x.Base)
	w.u32(unix.NFTA_PAYLOAD_OFFSET, x.Offset)
	w.u32(unix.NFTA_PAYLOAD_LEN, x.Len)
	w.exprEnd(elem, at)
}

// Cmp writes a comparison.
func (e *encoder) Cmp(x bc.Cmp) {
	w := e.w
	elem, at := w.exprBegin("cmp")
	w.u32(unix.NFTA_CMP_SREG, x.Sreg)
	w.u32(unix.NFTA_CMP_OP, x.Op)
	w.value(unix.NFTA_CMP_DATA, x.Data.Slice())
	w.exprEnd(elem, at)
}

// Bitwise writes a mask and xor.
func (e *encoder) Bitwise(x bc.Bitwise) {
	w := e.w
	elem, at := w.exprBegin("bitwise")
	w.u32(unix.NFTA_BITWISE_SREG, x.Sreg)
	w.u32(unix.NFTA_BITWISE_DREG, x.Dreg)
	w.u32(unix.NFTA_BITWISE_LEN, x.Len)
	w.value(unix.NFTA_BITWISE_MASK, x.Mask.Slice())
	w.value(unix.NFTA_BITWISE_XOR, x.Xor.Slice())
	w.exprEnd(elem, at)
}

// Byteorder writes a byte order conversion.
func (e *encoder) Byteorder(x bc.Byteorder) {
	w := e.w
	elem, at := w.exprBegin("byteorder")
	w.u32(unix.NFTA_BYTEORDER_SREG, x.Sreg)
	w.u32(unix.NFTA_BYTEORDER_DREG, x.Dreg)
	w.u32(unix.NFTA_BYTEORDER_OP, x.Op)
	w.u32(unix.NFTA_BYTEORDER_LEN, x.Len)
	w.u32(unix.NFTA_BYTEORDER_SIZE, x.Size)
	w.exprEnd(elem, at)
}

// Lookup writes a set lookup, with the ID of a set created in the same
// batch.
func (e *encoder) Lookup(x bc.Lookup) {
	w := e.w
	elem, at := w.exprBegin("lookup")
	if x.Sreg != 0 {
		w.u32(unix.NFTA_LOOKUP_SREG, x.Sreg)
	}
	if x.HasDreg {
		w.u32(unix.NFTA_LOOKUP_DREG, x.Dreg)
	}
	if x.Invert {
		w.u32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
	}
	w.str(unix.NFTA_LOOKUP_SET, x.Set)
	w.u32(unix.NFTA_LOOKUP_SET_ID, e.ids[x.Set])
	w.exprEnd(elem, at)
}

// Meta writes a meta load or store.
func (e *encoder) Meta(x bc.Meta) {
	w := e.w
	elem, at := w.exprBegin("meta")
	w.u32(unix.NFTA_META_KEY, x.Key)
	if x.Set {
		w.u32(unix.NFTA_META_SREG, x.Reg)
	} else {
		w.u32(unix.NFTA_META_DREG, x.Reg)
	}
	w.exprEnd(elem, at)
}

// Ct writes a conntrack load (or, with Set, a store).
func (e *encoder) Ct(x bc.Ct) {
	w := e.w
	elem, at := w.exprBegin("ct")
	w.u32(unix.NFTA_CT_KEY, x.Key)
	if x.Set {
		w.u32(unix.NFTA_CT_SREG, x.Dreg)
	} else {
		w.u32(unix.NFTA_CT_DREG, x.Dreg)
	}
	if bc.CtTupleKey(x.Key) {
		w.u32(unix.NFTA_CT_DIRECTION, bc.CtDirOriginal)
	}
	w.exprEnd(elem, at)
}

// Fib writes a route lookup.
func (e *encoder) Fib(x bc.Fib) {
	w := e.w
	elem, at := w.exprBegin("fib")
	w.u32(unix.NFTA_FIB_DREG, x.Dreg)
	if x.Flags != 0 {
		w.u32(unix.NFTA_FIB_FLAGS, x.Flags)
	}
	if x.Result != 0 {
		w.u32(unix.NFTA_FIB_RESULT, x.Result)
	}
	w.exprEnd(elem, at)
}

// Hash writes a Jenkins hash.
func (e *encoder) Hash(x bc.Hash) {
	w := e.w
	elem, at := w.exprBegin("hash")
	w.u32(unix.NFTA_HASH_SREG, x.Sreg)
	w.u32(unix.NFTA_HASH_DREG, x.Dreg)
	w.u32(unix.NFTA_HASH_LEN, x.Len)
	w.u32(unix.NFTA_HASH_MODULUS, x.Modulus)
	if x.Seed != 0 {
		w.u32(unix.NFTA_HASH_SEED, x.Seed)
	}
	w.u32(unix.NFTA_HASH_OFFSET, 0)
	w.u32(unix.NFTA_HASH_TYPE, bc.HashJenkins)
	w.exprEnd(elem, at)
}

// Immediate writes a constant load.
func (e *encoder) Immediate(x bc.Immediate) {
	w := e.w
	elem, at := w.exprBegin("immediate")
	w.u32(unix.NFTA_IMMEDIATE_DREG, x.Dreg)
	w.value(unix.NFTA_IMMEDIATE_DATA, x.Data.Slice())
	w.exprEnd(elem, at)
}

// Verdict writes a verdict.
func (e *encoder) Verdict(x bc.Verdict) {
	w := e.w
	elem, at := w.exprBegin("immediate")
	w.u32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
	w.verdictData(unix.NFTA_IMMEDIATE_DATA, x)
	w.exprEnd(elem, at)
}

// verdictData writes a verdict as the data attribute attr (of an
// immediate expression, or of a map element).
func (w *wire) verdictData(attr uint16, x bc.Verdict) {
	data := w.nest(attr)
	v := w.nest(unix.NFTA_DATA_VERDICT)
	w.u32(unix.NFTA_VERDICT_CODE, uint32(x.Code))
	if x.Chain != "" {
		w.str(unix.NFTA_VERDICT_CHAIN, x.Chain)
	}
	w.close(v)
	w.close(data)
}

// NAT writes an address and port translation.
func (e *encoder) NAT(x bc.NAT) {
	w := e.w
	elem, at := w.exprBegin("nat")
	w.u32(unix.NFTA_NAT_TYPE, x.Type)
	w.u32(unix.NFTA_NAT_FAMILY, x.Family)
	if x.RegAddr != 0 {
		w.u32(unix.NFTA_NAT_REG_ADDR_MIN, x.RegAddr)
	}
	if x.RegProto != 0 {
		w.u32(unix.NFTA_NAT_REG_PROTO_MIN, x.RegProto)
		if x.RegProtoMax != 0 {
			w.u32(unix.NFTA_NAT_REG_PROTO_MAX, x.RegProtoMax)
		}
	}
	if x.Flags != 0 {
		w.u32(unix.NFTA_NAT_FLAGS, x.Flags)
	}
	w.exprEnd(elem, at)
}

// Dynset writes a set update from the packet path, with the ID of a set
// created in the same batch, and the expression its elements carry (a
// counter, or a limit; never both) as google/nftables writes a list of one.
func (e *encoder) Dynset(x bc.Dynset) {
	w := e.w
	elem, at := w.exprBegin("dynset")
	w.u32(unix.NFTA_DYNSET_SREG_KEY, x.Sreg)
	w.u32(unix.NFTA_DYNSET_OP, x.Op)
	w.str(unix.NFTA_DYNSET_SET_NAME, x.Set)
	w.u32(unix.NFTA_DYNSET_SET_ID, e.ids[x.Set])
	if x.Counter || x.Limit.Rate > 0 {
		ex := w.open(unix.NFTA_DYNSET_EXPR)
		name := "limit"
		if x.Counter {
			name = "counter"
		}
		w.str(unix.NFTA_EXPR_NAME, name)
		data := w.nest(unix.NFTA_EXPR_DATA)
		if x.Counter {
			w.u64(unix.NFTA_COUNTER_BYTES, 0)
			w.u64(unix.NFTA_COUNTER_PACKETS, 0)
		} else {
			e.limitData(x.Limit)
		}
		w.close(data)
		w.close(ex)
	}
	w.u32(unix.NFTA_DYNSET_FLAGS, 0)
	w.exprEnd(elem, at)
}

// Masq writes a masquerade.
func (e *encoder) Masq(x bc.Masq) {
	w := e.w
	elem, at := w.exprBegin("masq")
	if x.Flags != 0 {
		w.u32(unix.NFTA_MASQ_FLAGS, x.Flags)
	}
	if x.RegProtoMin != 0 {
		w.u32(unix.NFTA_MASQ_REG_PROTO_MIN, x.RegProtoMin)
		if x.RegProtoMax != 0 {
			w.u32(unix.NFTA_MASQ_REG_PROTO_MAX, x.RegProtoMax)
		}
	}
	w.exprEnd(elem, at)
}

// Redir writes a redirect to the gateway itself.
func (e *encoder) Redir(x bc.Redir) {
	w := e.w
	elem, at := w.exprBegin("redir")
	if x.RegProto != 0 {
		w.u32(unix.NFTA_REDIR_REG_PROTO_MIN, x.RegProto)
	}
	if x.Flags != 0 {
		w.u32(unix.NFTA_REDIR_FLAGS, x.Flags)
	}
	w.exprEnd(elem, at)
}

// nftaFlowTableName is NFTA_FLOW_TABLE_NAME, which x/sys/unix lacks.
const nftaFlowTableName = 1

// FlowOffload writes a flow offload to a flowtable of the table, named
// without the NUL as google/nftables writes it.
func (e *encoder) FlowOffload(x bc.FlowOffload) {
	w := e.w
	elem, at := w.exprBegin("flow_offload")
	w.bytesAttr(nftaFlowTableName, x.Flowtable)
	w.exprEnd(elem, at)
}

// Counter writes a counter from zero, as google/nftables writes it.
func (e *encoder) Counter() {
	w := e.w
	elem, at := w.exprBegin("counter")
	w.u64(unix.NFTA_COUNTER_BYTES, 0)
	w.u64(unix.NFTA_COUNTER_PACKETS, 0)
	w.exprEnd(elem, at)
}

// Dup writes a duplication towards the address in a register.
func (e *encoder) Dup(x bc.Dup) {
	w := e.w
	elem, at := w.exprBegin("dup")
	w.u32(unix.NFTA_DUP_SREG_ADDR, x.RegAddr)
	w.exprEnd(elem, at)
}

// Limit writes a limit on packets a second, as nft writes it.
func (e *encoder) Limit(x bc.Limit) {
	w := e.w
	elem, at := w.exprBegin("limit")
	e.limitData(x)
	w.exprEnd(elem, at)
}

// limitData writes a limit's attributes: the rule's, or a set element's.
func (e *encoder) limitData(x bc.Limit) {
	w := e.w
	w.u64(unix.NFTA_LIMIT_RATE, x.Rate)
	w.u64(unix.NFTA_LIMIT_UNIT, 1) // seconds
	w.u32(unix.NFTA_LIMIT_BURST, x.Burst)
	w.u32(unix.NFTA_LIMIT_TYPE, 0) // NFT_LIMIT_PKTS
	w.u32(unix.NFTA_LIMIT_FLAGS, 0)
}

// Reject writes a reject (ICMP, or a TCP reset, whose code the kernel
// ignores).
func (e *encoder) Reject(x bc.Reject) {
	w := e.w
	elem, at := w.exprBegin("reject")
	w.u32(unix.NFTA_REJECT_TYPE, x.Type)
	w.attr(unix.NFTA_REJECT_ICMP_CODE, []byte{x.Code})
	w.exprEnd(elem, at)
}
