package statesync

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/nftgate/nftgate/gateways"
)

// The messages of the sync on the gateway set's channel, each the payload
// of one frame of its own type. Every message starts with the codec's
// version; a receiver refuses a version it does not know (counted as a
// decode refusal) rather than guess.
//
//	batch:       version u8, seq u64, stamp i64, count uvarint, count × (op u8, entry)
//	ack:         version u8, seq u64, stamp i64, written uvarint, refused uvarint
//	resync done: version u8
//	resync begin: version u8 (sent before a resync's first batch)
//
// An entry is: proto u8, family u8 (4 or 6), then the original source,
// original destination, reply source and reply destination, each an
// address (4 or 16 bytes) and a port u16; status, timeout and mark, u32
// each; for TCP (proto 6) five more bytes: state, window scale and flags
// of each direction; for SCTP (proto 132) nine more: state, then the
// verification tag of each direction (u32). Integers are big-endian. stamp is the sender's clock
// (Unix nanoseconds) at the oldest event the batch carries: the ack
// echoes it, so the sender measures the lag on its own clock.
const (
	msgBatch byte = gateways.FirstUserType + iota
	msgAck
	msgResyncDone
	msgResyncBegin
)

// codecVersion is the version of the encoding.
const codecVersion = 2

// Operations of a batch.
const (
	opPut byte = 1
	opDel byte = 2
)

// Sizes of the encoding.
const (
	batchHead    = 1 + 8 + 8
	minEntrySize = 1 + 1 + 4*(4+2) + 3*4
	maxEntrySize = 1 + 1 + 4*(16+2) + 3*4 + 9
)

// op is one operation of a batch.
type op struct {
	del   bool
	entry Entry
}

// errEncode: an entry whose four addresses are not of one family (the
// kernel's entries always are).
var errEncode = errors.New("statesync: an entry's addresses are not all of one family")

// appendEntry appends e's encoding to b.
func appendEntry(b []byte, e *Entry) ([]byte, error) {
	a := []netip.Addr{e.Orig.Src.Addr(), e.Orig.Dst.Addr(), e.Reply.Src.Addr(), e.Reply.Dst.Addr()}
	is4 := a[0].Is4()
	for _, x := range a {
		if !x.IsValid() || x.Is4() != is4 {
			return b, errEncode
		}
	}
	fam := byte(6)
	if is4 {
		fam = 4
	}
	b = append(b, e.Proto, fam)
	for i, ap := range []netip.AddrPort{e.Orig.Src, e.Orig.Dst, e.Reply.Src, e.Reply.Dst} {
		if is4 {
			x := a[i].As4()
			b = append(b, x[:]...)
		} else {
			x := a[i].As16()
			b = append(b, x[:]...)
		}
		b = binary.BigEndian.AppendUint16(b, ap.Port())
	}
	b = binary.BigEndian.AppendUint32(b, e.Status)
	b = binary.BigEndian.AppendUint32(b, e.Timeout)
	b = binary.BigEndian.AppendUint32(b, e.Mark)
	if e.Proto == protoTCP {
		b = append(b, e.TCP.State, e.TCP.WScaleOrig, e.TCP.WScaleReply, e.TCP.FlagsOrig, e.TCP.FlagsReply)
	}
	if e.Proto == protoSCTP {
		b = append(b, e.SCTP.State)
		b = binary.BigEndian.AppendUint32(b, e.SCTP.VTagOrig)
		b = binary.BigEndian.AppendUint32(b, e.SCTP.VTagReply)
	}
	return b, nil
}

// decoder reads an encoding; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.fail("truncated: %d bytes left, want %d", len(d.b), n)
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) u8() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad count")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) version() {
	if v := d.u8(); d.err == nil && v != codecVersion {
		d.fail("encoding version %d, this gateway reads %d", v, codecVersion)
	}
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the end", len(d.b))
	}
	return d.err
}

func (d *decoder) entry(e *Entry) {
	e.Proto = d.u8()
	n := 0
	switch f := d.u8(); f {
	case 4:
		n = 4
	case 6:
		n = 16
	default:
		d.fail("address family %d", f)
		return
	}
	for _, ap := range []*netip.AddrPort{&e.Orig.Src, &e.Orig.Dst, &e.Reply.Src, &e.Reply.Dst} {
		raw := d.take(n)
		port := d.u16()
		if d.err != nil {
			return
		}
		a, _ := netip.AddrFromSlice(raw)
		*ap = netip.AddrPortFrom(a, port)
	}
	e.Status = d.u32()
	e.Timeout = d.u32()
	e.Mark = d.u32()
	if e.Proto == protoTCP {
		if b := d.take(5); b != nil {
			e.TCP = TCPInfo{State: b[0], WScaleOrig: b[1], WScaleReply: b[2], FlagsOrig: b[3], FlagsReply: b[4]}
		}
	}
	if e.Proto == protoSCTP {
		e.SCTP = SCTPInfo{State: d.u8(), VTagOrig: d.u32(), VTagReply: d.u32()}
	}
}

// batch is a decoded batch message.
type batch struct {
	seq   uint64
	stamp int64
	ops   []op
}

// batchEncoder builds one batch message.
type batchEncoder struct {
	buf   []byte
	n     int
	seq   uint64
	stamp int64
	body  []byte
}

func (be *batchEncoder) reset(seq uint64, stamp int64) {
	be.seq, be.stamp, be.n = seq, stamp, 0
	be.body = be.body[:0]
}

// add appends one operation; it fails only for an entry that cannot be
// encoded (which is then left out).
func (be *batchEncoder) add(o *op) error {
	mark := len(be.body)
	kind := opPut
	if o.del {
		kind = opDel
	}
	b, err := appendEntry(append(be.body, kind), &o.entry)
	if err != nil {
		be.body = be.body[:mark]
		return err
	}
	be.body = b
	be.n++
	return nil
}

// size is the message's size so far.
func (be *batchEncoder) size() int { return batchHead + binary.MaxVarintLen64 + len(be.body) }

// finish returns the message (valid until the next reset).
func (be *batchEncoder) finish() []byte {
	b := append(be.buf[:0], codecVersion)
	b = binary.BigEndian.AppendUint64(b, be.seq)
	b = binary.BigEndian.AppendUint64(b, uint64(be.stamp))
	b = binary.AppendUvarint(b, uint64(be.n))
	b = append(b, be.body...)
	be.buf = b
	return b
}

// decodeBatch reads a batch message; ops reuses into's storage.
func decodeBatch(msg []byte, into []op) (batch, error) {
	d := decoder{b: msg}
	d.version()
	bt := batch{seq: d.u64(), stamp: int64(d.u64())}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)/(1+minEntrySize)) {
		d.fail("%d entries in %d bytes", n, len(d.b))
	}
	bt.ops = into[:0]
	for i := uint64(0); i < n && d.err == nil; i++ {
		var o op
		switch k := d.u8(); k {
		case opPut:
		case opDel:
			o.del = true
		default:
			d.fail("operation %d of entry %d", k, i)
		}
		d.entry(&o.entry)
		bt.ops = append(bt.ops, o)
	}
	if err := d.end(); err != nil {
		return batch{}, fmt.Errorf("statesync: batch: %w", err)
	}
	return bt, nil
}

// ack is a decoded ack message.
type ack struct {
	seq              uint64
	stamp            int64
	written, refused uint64
}

func encodeAck(a ack) []byte {
	b := []byte{codecVersion}
	b = binary.BigEndian.AppendUint64(b, a.seq)
	b = binary.BigEndian.AppendUint64(b, uint64(a.stamp))
	b = binary.AppendUvarint(b, a.written)
	return binary.AppendUvarint(b, a.refused)
}

func decodeAck(msg []byte) (ack, error) {
	d := decoder{b: msg}
	d.version()
	a := ack{seq: d.u64(), stamp: int64(d.u64()), written: d.uvarint(), refused: d.uvarint()}
	if err := d.end(); err != nil {
		return ack{}, fmt.Errorf("statesync: ack: %w", err)
	}
	return a, nil
}

func encodeResyncDone() []byte { return []byte{codecVersion} }

func decodeResyncDone(msg []byte) error {
	d := decoder{b: msg}
	d.version()
	if err := d.end(); err != nil {
		return fmt.Errorf("statesync: resync done: %w", err)
	}
	return nil
}

// A resync begin is, like a resync done, only the version.
func encodeResyncBegin() []byte          { return encodeResyncDone() }
func decodeResyncBegin(msg []byte) error { return decodeResyncDone(msg) }
