package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables/expr"
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

// seal ends the batch: the last message asks for the acknowledgement, and
// every message gets its sequence number, from first on, and the port ID.
// It returns the sequence numbers of the first and the last message after
// the batch's beginning, and the parts to send.
func (bt *batch) seal(first, pid uint32) (uint32, uint32, [][]byte) {
	for i := len(bt.parts) - 1; i >= 0; i-- {
		if w := bt.parts[i]; w.last >= 0 {
			flags := binary.NativeEndian.Uint16(w.b[w.last+6:])
			binary.NativeEndian.PutUint16(w.b[w.last+6:], flags|uint16(netlink.Acknowledge))
			break
		}
	}
	tail := bt.parts[len(bt.parts)-1]
	tail.marker(unix.NFNL_MSG_BATCH_END)
	seq := first - 1 // the batch's beginning
	bufs := make([][]byte, 0, len(bt.parts))
	for _, w := range bt.parts {
		for off := 0; off < len(w.b); {
			binary.NativeEndian.PutUint32(w.b[off+8:], seq)
			binary.NativeEndian.PutUint32(w.b[off+12:], pid)
			seq++
			off += int(binary.NativeEndian.Uint32(w.b[off:]))
		}
		bufs = append(bufs, w.b)
	}
	return first, first + uint32(bt.count()) - 1, bufs
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

// message copies a message built by google/nftables, without the
// acknowledgement and echo it asks for every message (see batch.go).
func (w *wire) message(m netlink.Message) {
	w.last = len(w.b)
	w.count++
	w.b = binary.NativeEndian.AppendUint32(w.b, uint32(nlmsgHeaderLen+len(m.Data)))
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(m.Header.Type))
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(m.Header.Flags&^(netlink.Acknowledge|unix.NLM_F_ECHO)))
	w.b = append(w.b, 0, 0, 0, 0, 0, 0, 0, 0)
	w.b = append(w.b, m.Data...)
	w.pad()
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

// expr writes one expression as an element of a rule's expression list,
// exactly as expr.Marshal does. Kinds and fields nftgate does not use go
// through expr.Marshal itself.
func (w *wire) expr(fam byte, e expr.Any) {
	switch e := e.(type) {
	case *expr.Payload:
		if e.OperationType == expr.PayloadLoad && e.CsumType == 0 {
			w.payload(e)
			return
		}
	case *expr.Cmp:
		w.cmp(e)
		return
	case *expr.Bitwise:
		w.bitwise(e)
		return
	case *expr.Lookup:
		w.lookup(e)
		return
	case *expr.Meta:
		w.meta(e)
		return
	case *expr.Ct:
		if e.Key != expr.CtKeySRC && e.Key != expr.CtKeyDST && e.Key != expr.CtKeyPROTOSRC && e.Key != expr.CtKeyPROTODST {
			w.ct(e)
			return
		}
	case *expr.Fib:
		w.fib(e)
		return
	case *expr.Hash:
		w.hash(e)
		return
	case *expr.Immediate:
		w.immediate(e)
		return
	case *expr.Verdict:
		w.verdict(e)
		return
	case *expr.NAT:
		w.nat(e)
		return
	case *expr.Dynset:
		if len(e.Exprs) == 0 {
			w.dynset(e)
			return
		}
	case *expr.Masq:
		w.masq(e)
		return
	case *expr.Reject:
		w.reject(e)
		return
	}
	// Anything else is written by google/nftables itself.
	b, err := expr.Marshal(fam, e)
	if err != nil {
		w.fail(err)
		return
	}
	elem := w.nest(unix.NFTA_LIST_ELEM)
	w.b = append(w.b, b...)
	w.close(elem)
}

// Each of the following writes one expression of its kind as a list
// element. They take the expressions by pointer without keeping them, so
// that a caller's expression can live on its stack.

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

func (w *wire) payload(e *expr.Payload) {
	elem, at := w.exprBegin("payload")
	w.u32(unix.NFTA_PAYLOAD_DREG, e.DestRegister)
	w.u32(unix.NFTA_PAYLOAD_BASE, uint32(e.Base))
	w.u32(unix.NFTA_PAYLOAD_OFFSET, e.Offset)
	w.u32(unix.NFTA_PAYLOAD_LEN, e.Len)
	w.exprEnd(elem, at)
}

func (w *wire) cmp(e *expr.Cmp) {
	elem, at := w.exprBegin("cmp")
	w.u32(unix.NFTA_CMP_SREG, e.Register)
	w.u32(unix.NFTA_CMP_OP, uint32(e.Op))
	w.value(unix.NFTA_CMP_DATA, e.Data)
	w.exprEnd(elem, at)
}

func (w *wire) bitwise(e *expr.Bitwise) {
	elem, at := w.exprBegin("bitwise")
	w.u32(unix.NFTA_BITWISE_SREG, e.SourceRegister)
	w.u32(unix.NFTA_BITWISE_DREG, e.DestRegister)
	w.u32(unix.NFTA_BITWISE_LEN, e.Len)
	w.value(unix.NFTA_BITWISE_MASK, e.Mask)
	w.value(unix.NFTA_BITWISE_XOR, e.Xor)
	w.exprEnd(elem, at)
}

func (w *wire) lookup(e *expr.Lookup) {
	elem, at := w.exprBegin("lookup")
	if e.SourceRegister != 0 {
		w.u32(unix.NFTA_LOOKUP_SREG, e.SourceRegister)
	}
	if e.IsDestRegSet {
		w.u32(unix.NFTA_LOOKUP_DREG, e.DestRegister)
	}
	if e.Invert {
		w.u32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
	}
	w.str(unix.NFTA_LOOKUP_SET, e.SetName)
	w.u32(unix.NFTA_LOOKUP_SET_ID, e.SetID)
	w.exprEnd(elem, at)
}

func (w *wire) meta(e *expr.Meta) {
	elem, at := w.exprBegin("meta")
	w.u32(unix.NFTA_META_KEY, uint32(e.Key))
	if e.SourceRegister {
		w.u32(unix.NFTA_META_SREG, e.Register)
	} else {
		w.u32(unix.NFTA_META_DREG, e.Register)
	}
	w.exprEnd(elem, at)
}

func (w *wire) ct(e *expr.Ct) {
	elem, at := w.exprBegin("ct")
	w.u32(unix.NFTA_CT_KEY, uint32(e.Key))
	if e.SourceRegister {
		w.u32(unix.NFTA_CT_SREG, e.Register)
	} else {
		w.u32(unix.NFTA_CT_DREG, e.Register)
	}
	w.exprEnd(elem, at)
}

// flagBit is a flag bit and whether it is set.
type flagBit struct {
	set bool
	bit uint32
}

// flagBits ors the bits that are set.
func flagBits(bits ...flagBit) uint32 {
	var v uint32
	for _, b := range bits {
		if b.set {
			v |= b.bit
		}
	}
	return v
}

func (w *wire) fib(e *expr.Fib) {
	elem, at := w.exprBegin("fib")
	w.u32(unix.NFTA_FIB_DREG, e.Register)
	flags := flagBits(flagBit{e.FlagSADDR, unix.NFTA_FIB_F_SADDR}, flagBit{e.FlagDADDR, unix.NFTA_FIB_F_DADDR},
		flagBit{e.FlagMARK, unix.NFTA_FIB_F_MARK}, flagBit{e.FlagIIF, unix.NFTA_FIB_F_IIF},
		flagBit{e.FlagOIF, unix.NFTA_FIB_F_OIF}, flagBit{e.FlagPRESENT, unix.NFTA_FIB_F_PRESENT})
	if flags != 0 {
		w.u32(unix.NFTA_FIB_FLAGS, flags)
	}
	results := flagBits(flagBit{e.ResultOIF, unix.NFT_FIB_RESULT_OIF}, flagBit{e.ResultOIFNAME, unix.NFT_FIB_RESULT_OIFNAME},
		flagBit{e.ResultADDRTYPE, unix.NFT_FIB_RESULT_ADDRTYPE})
	if results != 0 {
		w.u32(unix.NFTA_FIB_RESULT, results)
	}
	w.exprEnd(elem, at)
}

func (w *wire) hash(e *expr.Hash) {
	elem, at := w.exprBegin("hash")
	w.u32(unix.NFTA_HASH_SREG, e.SourceRegister)
	w.u32(unix.NFTA_HASH_DREG, e.DestRegister)
	w.u32(unix.NFTA_HASH_LEN, e.Length)
	w.u32(unix.NFTA_HASH_MODULUS, e.Modulus)
	if e.Seed != 0 {
		w.u32(unix.NFTA_HASH_SEED, e.Seed)
	}
	w.u32(unix.NFTA_HASH_OFFSET, e.Offset)
	w.u32(unix.NFTA_HASH_TYPE, uint32(e.Type))
	w.exprEnd(elem, at)
}

func (w *wire) immediate(e *expr.Immediate) {
	elem, at := w.exprBegin("immediate")
	w.u32(unix.NFTA_IMMEDIATE_DREG, e.Register)
	w.value(unix.NFTA_IMMEDIATE_DATA, e.Data)
	w.exprEnd(elem, at)
}

func (w *wire) verdict(e *expr.Verdict) {
	elem, at := w.exprBegin("immediate")
	w.u32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
	w.verdictData(unix.NFTA_IMMEDIATE_DATA, e)
	w.exprEnd(elem, at)
}

// verdictData writes a verdict as the data attribute attr (of an
// immediate expression, or of a map element).
func (w *wire) verdictData(attr uint16, e *expr.Verdict) {
	data := w.nest(attr)
	v := w.nest(unix.NFTA_DATA_VERDICT)
	w.u32(unix.NFTA_VERDICT_CODE, uint32(e.Kind))
	if e.Chain != "" {
		w.str(unix.NFTA_VERDICT_CHAIN, e.Chain)
	}
	w.close(v)
	w.close(data)
}

func (w *wire) nat(e *expr.NAT) {
	elem, at := w.exprBegin("nat")
	w.u32(unix.NFTA_NAT_TYPE, uint32(e.Type))
	w.u32(unix.NFTA_NAT_FAMILY, e.Family)
	if e.RegAddrMin != 0 {
		w.u32(unix.NFTA_NAT_REG_ADDR_MIN, e.RegAddrMin)
		if e.RegAddrMax != 0 {
			w.u32(unix.NFTA_NAT_REG_ADDR_MAX, e.RegAddrMax)
		}
	}
	if e.RegProtoMin != 0 {
		w.u32(unix.NFTA_NAT_REG_PROTO_MIN, e.RegProtoMin)
		if e.RegProtoMax != 0 {
			w.u32(unix.NFTA_NAT_REG_PROTO_MAX, e.RegProtoMax)
		}
	}
	flags := flagBits(flagBit{e.Random, expr.NF_NAT_RANGE_PROTO_RANDOM}, flagBit{e.FullyRandom, expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY},
		flagBit{e.Persistent, expr.NF_NAT_RANGE_PERSISTENT}, flagBit{e.Prefix, expr.NF_NAT_RANGE_PREFIX},
		flagBit{e.Specified, expr.NF_NAT_RANGE_PROTO_SPECIFIED})
	if flags != 0 {
		w.u32(unix.NFTA_NAT_FLAGS, flags)
	}
	w.exprEnd(elem, at)
}

func (w *wire) dynset(e *expr.Dynset) {
	elem, at := w.exprBegin("dynset")
	w.u32(unix.NFTA_DYNSET_SREG_KEY, e.SrcRegKey)
	if e.SrcRegData != 0 {
		w.u32(unix.NFTA_DYNSET_SREG_DATA, e.SrcRegData)
	}
	w.u32(unix.NFTA_DYNSET_OP, e.Operation)
	if e.Timeout != 0 {
		w.u64(unix.NFTA_DYNSET_TIMEOUT, uint64(e.Timeout.Milliseconds()))
	}
	w.str(unix.NFTA_DYNSET_SET_NAME, e.SetName)
	w.u32(unix.NFTA_DYNSET_SET_ID, e.SetID)
	var flags uint32
	if e.Invert {
		flags |= unix.NFT_DYNSET_F_INV
	}
	w.u32(unix.NFTA_DYNSET_FLAGS, flags)
	w.exprEnd(elem, at)
}

func (w *wire) masq(e *expr.Masq) {
	elem, at := w.exprBegin("masq")
	if e.ToPorts {
		w.u32(unix.NFTA_MASQ_REG_PROTO_MIN, e.RegProtoMin)
		if e.RegProtoMax != 0 {
			w.u32(unix.NFTA_MASQ_REG_PROTO_MAX, e.RegProtoMax)
		}
	} else {
		flags := flagBits(flagBit{e.Random, expr.NF_NAT_RANGE_PROTO_RANDOM}, flagBit{e.FullyRandom, expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY},
			flagBit{e.Persistent, expr.NF_NAT_RANGE_PERSISTENT})
		if flags != 0 {
			w.u32(unix.NFTA_MASQ_FLAGS, flags)
		}
	}
	w.exprEnd(elem, at)
}

func (w *wire) reject(e *expr.Reject) {
	elem, at := w.exprBegin("reject")
	w.u32(unix.NFTA_REJECT_TYPE, e.Type)
	w.attr(unix.NFTA_REJECT_ICMP_CODE, []byte{e.Code})
	w.exprEnd(elem, at)
}
