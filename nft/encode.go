package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/nftgate/nftgate/ruleset"
	"golang.org/x/sys/unix"
)

// udataFingerprint is the user-data TLV type carrying a rule's fingerprint.
// nft ignores TLV types it does not know, so `nft list ruleset` is unchanged.
const udataFingerprint = 0xf0

// appendFingerprint appends the user data of a rule with fingerprint fp.
func appendFingerprint(b []byte, fp uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, udataFingerprint, 8), fp)
}

// fingerprintFromUserData returns the fingerprint nftgate stored, if any.
func fingerprintFromUserData(b []byte) (uint64, bool) {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if len(b) < 2+l {
			return 0, false
		}
		if t == udataFingerprint && l == 8 {
			return binary.BigEndian.Uint64(b[2:10]), true
		}
		b = b[2+l:]
	}
	return 0, false
}

// noteOp is what one message of a batch does.
type noteOp uint8

const (
	noteAddTable noteOp = iota + 1
	noteDelTable
	noteAddSet
	noteDelSet
	noteAddChain
	noteFlushChain
	noteDelChain
	noteAddRule
	noteAddElems
	noteDelElems
	noteAddFlowtable
	noteDelFlowtable
	noteDestroyTraffic
)

// note describes one message of a batch. It is formatted only when the
// kernel refuses that message: at the size of a cold sync, formatting (or
// even boxing the arguments of) every message would be much of the garbage.
type note struct {
	op    noteOp
	f     ruleset.Family
	table string
	name  string // chain, set or map
	rule  ruleset.Rule
	n     int // elements
}

func (n note) String() string {
	switch n.op {
	case noteAddTable:
		return fmt.Sprintf("add table %s %s", n.f, n.table)
	case noteDelTable:
		return fmt.Sprintf("delete table %s %s", n.f, n.table)
	case noteAddSet:
		return fmt.Sprintf("add set %s %s %s", n.f, n.table, n.name)
	case noteDelSet:
		return fmt.Sprintf("delete set %s %s %s", n.f, n.table, n.name)
	case noteAddChain:
		return fmt.Sprintf("add chain %s %s %s", n.f, n.table, n.name)
	case noteFlushChain:
		return fmt.Sprintf("flush chain %s %s %s", n.f, n.table, n.name)
	case noteDelChain:
		return fmt.Sprintf("delete chain %s %s %s", n.f, n.table, n.name)
	case noteAddRule:
		return fmt.Sprintf("add rule %s %s %s %s", n.f, n.table, n.name, n.rule.Text(n.f))
	case noteAddElems:
		return fmt.Sprintf("add %d elements to map %s %s %s", n.n, n.f, n.table, n.name)
	case noteDelElems:
		return fmt.Sprintf("delete %d elements from map %s %s %s", n.n, n.f, n.table, n.name)
	case noteAddFlowtable:
		return fmt.Sprintf("add flowtable %s %s %s", n.f, n.table, n.name)
	case noteDelFlowtable:
		return fmt.Sprintf("delete flowtable %s %s %s", n.f, n.table, n.name)
	case noteDestroyTraffic:
		return fmt.Sprintf("destroy %d elements of set %s %s %s", n.n, n.f, n.table, n.name)
	}
	return "?"
}

// encoder writes planned operations for one table into a batch, in the
// order that keeps every reference valid inside the batch. Every message is
// written straight into the batch (wire.go); the statements of rules write
// their expressions into it themselves, through the encoder as their
// bytecode.Sink.
type encoder struct {
	w      *wire
	table  string
	f      ruleset.Family
	ids    map[string]uint32 // sets created in this batch, by name
	lastID *atomic.Uint32    // numbers the sets of one batch
	err    error
}

func newEncoder(w *wire, lastID *atomic.Uint32, table string, f ruleset.Family) *encoder {
	return &encoder{w: w, table: table, f: f, lastID: lastID}
}

func (e *encoder) note(n note) {
	if e.w.describe {
		n.f, n.table = e.f, e.table
		e.w.notes = append(e.w.notes, n)
	}
}

func (e *encoder) fail(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

// Set data types, as the kernel and nft know them (nft's datatype.h).
const (
	typeVerdict     = 1
	typeIPAddr      = 7
	typeIP6Addr     = 8
	typeInetProto   = 12
	typeInetService = 13
	typeInteger     = 4 // a Maglev slot: a 32-bit integer in host byte order
	// concatTypeBits is the width of one type in a concatenation's type.
	concatTypeBits = 6
	// nftSetConcat is NFT_SET_CONCAT, which x/sys/unix lacks.
	nftSetConcat = 0x80
	// nftaSetDescConcat is NFTA_SET_DESC_CONCAT, which x/sys/unix lacks.
	nftaSetDescConcat = 2
	// nftDataVerdict is NFT_DATA_VERDICT, a verdict map's data type.
	nftDataVerdict = 0xffffff00
	// nftaSetFieldLen is NFTA_SET_FIELD_LEN, which x/sys/unix lacks.
	nftaSetFieldLen = 1
)

// setKey is the key type of a set of shape, in family f: the types of its
// fields, and their lengths.
func setKey(f ruleset.Family, s *ruleset.Set) (types []uint32, lens []uint32) {
	addr, addrLen := uint32(typeIPAddr), f.AddrLen()
	if f == ruleset.IPv6 {
		addr = typeIP6Addr
	}
	switch {
	case s.Shape == ruleset.KeySlot:
		return []uint32{typeInteger}, []uint32{4}
	case s.Shape == ruleset.KeyProto:
		return []uint32{typeInetProto}, []uint32{1}
	case s.Shape == ruleset.KeyTraffic:
		return []uint32{addr, typeInetProto, typeInetService, addr, typeInetService}, []uint32{addrLen, 1, 2, addrLen, 2}
	case s.Map && s.Shape == ruleset.KeyProtoPort:
		return []uint32{typeInetProto, typeInetService}, []uint32{1, 2}
	case s.Map:
		return []uint32{addr, typeInetProto, typeInetService}, []uint32{addrLen, 1, 2}
	case s.Shape == ruleset.KeyAddrPair:
		return []uint32{addr, addr}, []uint32{addrLen, addrLen}
	}
	return []uint32{addr}, []uint32{addrLen}
}

// nftaSetExpr is NFTA_SET_EXPR, which x/sys/unix lacks.
const nftaSetExpr = 0x11

// addSet writes a new set, numbered for the rules of the batch that use
// it, as google/nftables writes it.
func (e *encoder) addSet(s *ruleset.Set) {
	types, lens := setKey(e.f, s)
	var flags, magic, keyLen uint32
	for i, t := range types {
		magic = magic<<concatTypeBits | t
		keyLen += (lens[i] + 3) &^ 3 // each field of a concatenation takes whole registers
	}
	concat := len(types) > 1
	if len(types) == 1 {
		keyLen = lens[0]
	}
	if s.Map {
		flags |= unix.NFT_SET_MAP
	}
	if s.Timeout > 0 {
		flags |= unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL
	}
	if concat {
		flags |= nftSetConcat
	}
	id := e.lastID.Add(1)
	if e.ids == nil {
		e.ids = map[string]uint32{}
	}
	e.ids[s.Name] = id
	w := e.w
	w.begin(unix.NFT_MSG_NEWSET, flagsCreate, byte(e.f))
	w.str(unix.NFTA_SET_TABLE, e.table)
	w.str(unix.NFTA_SET_NAME, s.Name)
	w.u32(unix.NFTA_SET_FLAGS, flags)
	w.u32(unix.NFTA_SET_KEY_TYPE, magic)
	w.u32(unix.NFTA_SET_KEY_LEN, keyLen)
	w.u32(unix.NFTA_SET_ID, id)
	switch {
	case s.Endpoints:
		// An endpoint's address and port, each in whole registers.
		addr := uint32(typeIPAddr)
		if e.f == ruleset.IPv6 {
			addr = typeIP6Addr
		}
		w.u32(unix.NFTA_SET_DATA_TYPE, addr<<concatTypeBits|typeInetService)
		w.u32(unix.NFTA_SET_DATA_LEN, e.f.AddrLen()+4)
	case s.Addresses:
		addr := uint32(typeIPAddr)
		if e.f == ruleset.IPv6 {
			addr = typeIP6Addr
		}
		w.u32(unix.NFTA_SET_DATA_TYPE, addr)
		w.u32(unix.NFTA_SET_DATA_LEN, e.f.AddrLen())
	case s.Map:
		w.u32(unix.NFTA_SET_DATA_TYPE, nftDataVerdict)
		w.u32(unix.NFTA_SET_DATA_LEN, 0)
	}
	if s.Timeout > 0 {
		w.u64(unix.NFTA_SET_TIMEOUT, uint64(s.Timeout.Milliseconds()))
	}
	if concat || s.Size > 0 {
		desc := w.nest(unix.NFTA_SET_DESC)
		if s.Size > 0 {
			w.u32(unix.NFTA_SET_DESC_SIZE, s.Size)
		}
		if concat {
			cat := w.nest(nftaSetDescConcat)
			for _, l := range lens {
				field := w.open(unix.NFTA_LIST_ELEM)
				w.u32(nftaSetFieldLen, l)
				w.close(field)
			}
			w.close(cat)
		}
		w.close(desc)
	}
	if s.Shape == ruleset.KeySlot {
		// The key's byte order for nft's listing (libnftnl's
		// NFTNL_UDATA_SET_KEYBYTEORDER: host), as nft writes it.
		w.attr(unix.NFTA_SET_USERDATA, []byte{0, 4, 1, 0, 0, 0})
	}
	if s.Counter {
		// A counter per element, written as google/nftables writes it:
		// the expression's name, and an empty attribute the kernel
		// ignores.
		x := w.nest(nftaSetExpr)
		w.str(unix.NFTA_EXPR_NAME, "counter")
		w.attr(unix.NFTA_SET_ELEM_PAD|unix.NFTA_SET_ELEM_DATA, nil)
		w.close(x)
	}
	w.end()
	e.note(note{op: noteAddSet, name: s.Name})
}

// delSet writes the deletion of a set.
func (e *encoder) delSet(name string) {
	e.chainMessage(unix.NFT_MSG_DELSET, netlink.Request, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, name)
	e.note(note{op: noteDelSet, name: name})
}

// addFlowtable writes a new flowtable on the ingress hook of its devices,
// as google/nftables' AddFlowtable writes it (names without the NUL).
func (e *encoder) addFlowtable(ft *ruleset.Flowtable) {
	w := e.w
	w.begin(nftables.NFT_MSG_NEWFLOWTABLE, flagsCreate, byte(e.f))
	w.bytesAttr(nftables.NFTA_FLOWTABLE_TABLE, e.table)
	w.bytesAttr(nftables.NFTA_FLOWTABLE_NAME, ft.Name)
	flags := uint32(0)
	if ft.Counter {
		flags = uint32(nftables.FlowtableFlagsCounter)
	}
	w.u32(nftables.NFTA_FLOWTABLE_FLAGS, flags)
	hook := w.nest(nftables.NFTA_FLOWTABLE_HOOK)
	w.u32(nftables.NFTA_FLOWTABLE_HOOK_NUM, unix.NF_NETDEV_INGRESS)
	w.u32(nftables.NFTA_FLOWTABLE_PRIORITY, uint32(ft.Priority))
	if len(ft.Devices) > 0 {
		devs := w.nest(nftables.NFTA_FLOWTABLE_DEVS)
		for _, d := range ft.Devices {
			w.bytesAttr(nftables.NFTA_DEVICE_NAME, d)
		}
		w.close(devs)
	}
	w.close(hook)
	w.end()
	e.note(note{op: noteAddFlowtable, name: ft.Name})
}

// delFlowtable writes the deletion of a flowtable, as google/nftables'
// DelFlowtable writes it.
func (e *encoder) delFlowtable(name string) {
	w := e.w
	w.begin(nftables.NFT_MSG_DELFLOWTABLE, netlink.Request, byte(e.f))
	w.bytesAttr(nftables.NFTA_FLOWTABLE_TABLE, e.table)
	w.bytesAttr(nftables.NFTA_FLOWTABLE_NAME, name)
	w.end()
	e.note(note{op: noteDelFlowtable, name: name})
}

var hookNums = map[string]uint32{
	"prerouting":  unix.NF_INET_PRE_ROUTING,
	"input":       unix.NF_INET_LOCAL_IN,
	"forward":     unix.NF_INET_FORWARD,
	"output":      unix.NF_INET_LOCAL_OUT,
	"postrouting": unix.NF_INET_POST_ROUTING,
}

// Message flags as google/nftables sets them, less the acknowledgement and
// echo that batch.go asks for only once per batch.
const (
	flagsCreate = netlink.Request | netlink.Create
	flagsAppend = netlink.Request | netlink.Create | unix.NLM_F_APPEND
)

// chainMessage writes a message naming one chain of the table.
func (e *encoder) chainMessage(typ uint16, flags netlink.HeaderFlags, tableAttr, nameAttr uint16, name string) {
	w := e.w
	w.begin(typ, flags, byte(e.f))
	w.str(tableAttr, e.table)
	w.str(nameAttr, name)
	w.end()
}

// tableMessage writes a message on the table, as google/nftables writes
// it, with user data when ud is not nil: nftgate's mark.
func (e *encoder) tableMessage(typ uint16, flags netlink.HeaderFlags, ud []byte) {
	w := e.w
	w.begin(typ, flags, byte(e.f))
	w.str(unix.NFTA_TABLE_NAME, e.table)
	w.u32(unix.NFTA_TABLE_FLAGS, 0)
	if ud != nil {
		w.attr(nftaTableUserdata, ud)
	}
	w.end()
}

func (e *encoder) addChain(c *ruleset.Chain) {
	w := e.w
	w.begin(unix.NFT_MSG_NEWCHAIN, flagsCreate, byte(e.f))
	w.str(unix.NFTA_CHAIN_TABLE, e.table)
	w.str(unix.NFTA_CHAIN_NAME, c.Name)
	if h := c.Hook; h != nil {
		num, ok := hookNums[h.Hook]
		if !ok {
			e.fail(fmt.Errorf("chain %s: unknown hook %q", c.Name, h.Hook))
		}
		at := w.nest(unix.NFTA_CHAIN_HOOK)
		w.u32(unix.NFTA_HOOK_HOOKNUM, uint32(num))
		w.u32(unix.NFTA_HOOK_PRIORITY, uint32(h.Priority))
		w.close(at)
		w.u32(unix.NFTA_CHAIN_POLICY, uint32(nftables.ChainPolicyAccept))
		w.str(unix.NFTA_CHAIN_TYPE, h.Type)
	}
	w.end()
	e.note(note{op: noteAddChain, name: c.Name})
}

func (e *encoder) addRules(p ruleset.ChainPlan) {
	w := e.w
	fam := byte(e.f)
	for i, r := range p.Chain.Rules {
		w.begin(unix.NFT_MSG_NEWRULE, flagsAppend, fam)
		w.str(unix.NFTA_RULE_TABLE, e.table)
		w.str(unix.NFTA_RULE_CHAIN, p.Chain.Name)
		at := w.nest(unix.NFTA_RULE_EXPRESSIONS)
		for _, s := range r {
			s.Encode(e.f, e)
		}
		w.close(at)
		var ud [10]byte
		w.attr(unix.NFTA_RULE_USERDATA, appendFingerprint(ud[:0], p.RuleFPs[i]))
		w.end()
		e.note(note{op: noteAddRule, name: p.Chain.Name, rule: r})
	}
}

// appendKey appends a map key as the kernel stores it: each field of a
// concatenation padded to four bytes.
func appendKey(b []byte, shape ruleset.KeyShape, k ruleset.Key) []byte {
	if shape == ruleset.KeySlot {
		return binary.NativeEndian.AppendUint32(b, k.Slot) // as the hash expression writes it
	}
	if shape == ruleset.KeyProto {
		return append(b, byte(k.Proto))
	}
	if k.Addr.IsValid() {
		b = append(b, k.Addr.AsSlice()...)
	}
	if shape == ruleset.KeyAddrPair {
		return append(b, k.Addr.AsSlice()...)
	}
	if k.Proto == 0 && k.Port == 0 {
		return b // a plain address
	}
	b = append(b, byte(k.Proto), 0, 0, 0)
	b = append(b, byte(k.Port>>8), byte(k.Port), 0, 0)
	return b
}

// appendEndpoint appends an endpoint map's data: the address, then the
// port in network byte order, padded to four bytes.
func appendEndpoint(b []byte, to netip.AddrPort) []byte {
	b = append(b, to.Addr().AsSlice()...)
	return append(b, byte(to.Port()>>8), byte(to.Port()), 0, 0)
}

// elementsPerMessage bounds the elements of one message: the kernel caps a
// netlink attribute, the list of them, at 64 KiB.
const elementsPerMessage = 500

// elements adds or deletes map elements, grouped per map into messages of
// bounded size.
func (e *encoder) elements(els []ruleset.Element, del bool) {
	typ, op := uint16(unix.NFT_MSG_NEWSETELEM), noteAddElems
	if del {
		typ, op = unix.NFT_MSG_DELSETELEM, noteDelElems
	}
	w := e.w
	fam := byte(e.f)
	var key, data []byte
	for len(els) > 0 {
		m := els[0].Map
		shape := ruleset.SetShape(m)
		w.begin(typ, flagsCreate, fam)
		w.str(unix.NFTA_SET_ELEM_LIST_SET, m)
		w.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, 0)
		w.str(unix.NFTA_SET_ELEM_LIST_TABLE, e.table)
		list := w.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		n := 0
		// Stay clear of the attribute limit whatever the chain names' length.
		for n < elementsPerMessage && n < len(els) && els[n].Map == m && len(w.b)-list < maxAttrLen-1024 {
			el := &els[n]
			n++
			item := w.nest(uint16(n))
			key = appendKey(key[:0], shape, el.Key)
			w.value(unix.NFTA_SET_ELEM_KEY, key)
			switch {
			case el.To.IsValid() && !del && m == ruleset.MapMidstreamHomes:
				data = append(data[:0], el.To.Addr().AsSlice()...)
				w.value(unix.NFTA_SET_ELEM_DATA, data)
			case el.To.IsValid() && !del:
				data = appendEndpoint(data[:0], el.To)
				w.value(unix.NFTA_SET_ELEM_DATA, data)
			case el.Verdict.Kind != 0:
				w.verdictData(unix.NFTA_SET_ELEM_DATA, el.Verdict.Bytecode())
			}
			w.close(item)
		}
		w.close(list)
		w.end()
		w.elements += n - 1
		e.note(note{op: op, name: m, n: n})
		els = els[n:]
	}
}

// head writes the table and its new sets. The heads of all tables come
// first in a batch.
func (e *encoder) head(o *ruleset.Ops) {
	if o.ReplaceTable {
		e.tableMessage(unix.NFT_MSG_DELTABLE, netlink.Request, nil)
		e.note(note{op: noteDelTable})
	}
	if o.CreateTable {
		e.tableMessage(unix.NFT_MSG_NEWTABLE, flagsCreate, tableMark)
		e.note(note{op: noteAddTable})
	}
	for _, s := range o.AddSets {
		e.addSet(s)
	}
	for _, ft := range o.AddFlowtables {
		e.addFlowtable(ft)
	}
}

// body writes the rest of the table's operations, after every head.
func (e *encoder) body(o *ruleset.Ops) {
	for _, c := range o.AddChains {
		e.addChain(c.Chain)
	}
	// Chains being removed and chains being rewritten are flushed before
	// any set they use is recreated or deleted.
	for _, c := range o.RewriteChains {
		e.chainMessage(unix.NFT_MSG_DELRULE, netlink.Request, unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN, c.Chain.Name)
		e.note(note{op: noteFlushChain, name: c.Chain.Name})
	}
	for _, n := range o.FlushChains {
		e.chainMessage(unix.NFT_MSG_DELRULE, netlink.Request, unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN, n)
		e.note(note{op: noteFlushChain, name: n})
	}
	for _, s := range o.RecreateSets {
		e.delSet(s.Name)
		e.addSet(s)
	}
	for _, ft := range o.RecreateFlowtables {
		e.delFlowtable(ft.Name)
		e.addFlowtable(ft)
	}
	for _, c := range o.AddChains {
		e.addRules(c)
	}
	for _, c := range o.RewriteChains {
		e.addRules(c)
	}
	e.elements(o.DelElems, true)
	e.elements(o.AddElems, false)
	for _, n := range o.DelChains {
		e.chainMessage(unix.NFT_MSG_DELCHAIN, netlink.Request, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, n)
		e.note(note{op: noteDelChain, name: n})
	}
	for _, n := range o.DelSets {
		e.delSet(n)
	}
	for _, n := range o.DelFlowtables {
		e.delFlowtable(n)
	}
	e.fail(e.w.err)
}

// encodeBatch encodes the operations of every table of ts, the deletion
// of the tables in drop, the destruction of the traffic elements of forget
// and the parts extra encode, into one batch; with a note on every message
// when describe is set.
func encodeBatch(ts *ruleset.Tables, ds []*ruleset.Ops, drop []ruleset.TableRef, forget []trafficKey, describe bool, extra ...func(*atomic.Uint32, bool) *wire) (*batch, error) {
	var lastID atomic.Uint32
	head := newWire(4096, 64, describe)
	head.marker(unix.NFNL_MSG_BATCH_BEGIN)
	encs := make([]*encoder, len(ds))
	for slot, o := range ds {
		if !o.Empty() {
			ref := ts.Refs[slot]
			encs[slot] = newEncoder(head, &lastID, ref.Name, ref.Family)
			encs[slot].head(o)
		}
	}
	// Each table's body is a part of its own, encoded on any CPU; set IDs
	// stay unique in the batch.
	bodies := make([]*wire, len(ds))
	errs := make([]error, len(ds))
	sizes, counts := make([]int, len(ds)), make([]int, len(ds))
	total := 0
	for slot, e := range encs {
		if e != nil {
			sizes[slot], counts[slot] = estimate(ds[slot])
			total += sizes[slot]
		}
	}
	bt := &batch{parts: []*wire{head}}
	offsets := make([]int, len(ds))
	if total >= arenaThreshold {
		bt.arena = newArena(total)
		off := 0
		for slot := range ds {
			offsets[slot] = off
			off += sizes[slot]
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(ds)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				slot := int(next.Add(1)) - 1
				if slot >= len(ds) {
					return
				}
				e := encs[slot]
				if e == nil {
					continue
				}
				o := ds[slot]
				if bt.arena != nil {
					off := offsets[slot]
					e.w = newWireIn(bt.arena[off:off:off+sizes[slot]], counts[slot], describe)
				} else {
					e.w = newWire(sizes[slot], counts[slot], describe)
				}
				e.body(o)
				bodies[slot], errs[slot] = e.w, e.err
			}
		}()
	}
	wg.Wait()
	for slot, w := range bodies {
		if errs[slot] != nil {
			bt.release()
			ref := ts.Refs[slot]
			return nil, fmt.Errorf("encode %s %s table: %w", ref.Family, ref.Name, errs[slot])
		}
		if w != nil && w.count > 0 {
			bt.parts = append(bt.parts, w)
		}
	}
	if len(drop) > 0 {
		tail := newWire(1024, len(drop), describe)
		for _, t := range drop {
			e := newEncoder(tail, &lastID, t.Name, t.Family)
			e.tableMessage(unix.NFT_MSG_DELTABLE, netlink.Request, nil)
			e.note(note{op: noteDelTable})
		}
		bt.parts = append(bt.parts, tail)
	}
	if len(forget) > 0 {
		bt.parts = append(bt.parts, encodeForget(ts, &lastID, forget, describe))
	}
	for _, x := range extra {
		if w := x(&lastID, describe); w != nil {
			bt.parts = append(bt.parts, w)
		}
	}
	for _, w := range bt.parts {
		if w.err != nil {
			bt.release()
			return nil, fmt.Errorf("encode ruleset: %w", w.err)
		}
	}
	return bt, nil
}

// estimate is about the size in bytes of the batch carrying the
// operations (rather more than less: a buffer that must grow copies
// itself), and the number of its messages.
func estimate(o *ruleset.Ops) (size, messages int) {
	// A rule of nftgate's is up to about 480 bytes of expressions, plus
	// its chain's name, twice for a jump or goto.
	chains := func(cs []ruleset.ChainPlan) {
		for _, c := range cs {
			size += 128 + len(c.Chain.Name) + len(c.Chain.Rules)*(480+2*len(c.Chain.Name))
			messages += 1 + len(c.Chain.Rules)
		}
	}
	chains(o.AddChains)
	chains(o.RewriteChains)
	for _, els := range [][]ruleset.Element{o.AddElems, o.DelElems} {
		for i := range els {
			size += 40 // an address pair, or an address, protocol and port
			if els[i].Verdict.Kind != 0 {
				size += 28 + len(els[i].Verdict.Chain)
			}
			if els[i].To.IsValid() {
				size += 32 // an address and a port
			}
		}
		messages += len(els)/elementsPerMessage + 4
	}
	names := len(o.FlushChains) + len(o.DelChains) + len(o.DelSets) + len(o.DelFlowtables) + 3*len(o.RecreateFlowtables)
	messages += names + len(o.AddSets) + 2*len(o.RecreateSets) + 2*len(o.RecreateFlowtables) + 1
	return size + 128*names + 512, messages
}
