package nft

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
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
)

// note describes one message of a batch. It is formatted only when the
// kernel refuses that message: at the size of a cold sync, formatting (or
// even boxing the arguments of) every message would be much of the garbage.
type note struct {
	op    noteOp
	f     Family
	table string
	name  string // chain, set or map
	rule  Rule
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
	}
	return "?"
}

// setRefs resolves the set names in one table's rules to google/nftables
// sets: the sets created in the same batch carry the ID the kernel also
// knows them by.
type setRefs struct {
	table *nftables.Table
	sets  map[string]*nftables.Set
}

func newSetRefs(name string, f Family) setRefs {
	return setRefs{table: &nftables.Table{Name: name, Family: nftFamily(f)}, sets: map[string]*nftables.Set{}}
}

// set returns the set of that name for references from rules.
func (r *setRefs) set(name string) *nftables.Set {
	if s, ok := r.sets[name]; ok {
		return s
	}
	s := &nftables.Set{Table: r.table, Name: name}
	r.sets[name] = s
	return s
}

// wireStmt is a statement that writes its expressions into a batch itself,
// without making google/nftables expressions of them first: the statements
// a cold sync has by the ten thousand (endpoint choice, DNAT, verdicts).
// Their encode says the same for tests and the rest; the tests hold the
// two to the same bytes.
type wireStmt interface {
	put(f Family, w *wire)
}

// encoder writes planned operations for one table into a batch, in the
// order that keeps every reference valid inside the batch. Rules, chains
// and map elements are written straight into the batch (wire.go); tables
// and sets are made by google/nftables on a Conn that only records them.
type encoder struct {
	setRefs
	w     *wire
	rec   *recorder
	f     Family
	err   error
	exprs []expr.Any // scratch for one rule
}

func newEncoder(w *wire, rec *recorder, name string, f Family) *encoder {
	return &encoder{setRefs: newSetRefs(name, f), w: w, rec: rec, f: f}
}

func (e *encoder) note(n note) {
	if e.w.describe {
		n.f, n.table = e.f, e.table.Name
		e.w.notes = append(e.w.notes, n)
	}
}

func (e *encoder) fail(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

// recorded moves what google/nftables recorded into the batch, so that it
// keeps its place among the messages written directly.
func (e *encoder) recorded() {
	msgs, err := e.rec.take()
	e.fail(err)
	for _, m := range msgs {
		e.w.message(m)
	}
}

func nftFamily(f Family) nftables.TableFamily {
	if f == IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

func setDefinition(table *nftables.Table, f Family, s *Set) *nftables.Set {
	ns := &nftables.Set{Table: table, Name: s.Name}
	addr := nftables.TypeIPAddr
	if f == IPv6 {
		addr = nftables.TypeIP6Addr
	}
	switch {
	case s.Map:
		ns.IsMap, ns.Concatenation, ns.DataType = true, true, nftables.TypeVerdict
		if s.Shape == KeyProtoPort {
			ns.KeyType = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
		} else {
			ns.KeyType = nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
		}
	case s.Shape == KeyAddrPair:
		ns.Concatenation = true
		ns.KeyType = nftables.MustConcatSetType(addr, addr)
	default:
		ns.KeyType = addr
		if s.Timeout > 0 {
			ns.Dynamic, ns.HasTimeout, ns.Timeout = true, true, s.Timeout
		}
	}
	return ns
}

// addSet has google/nftables record a new set; recorded moves it into
// the batch.
func (e *encoder) addSet(s *Set) {
	ns := setDefinition(e.table, e.f, s)
	ns.ID = e.rec.setID()
	e.fail(e.rec.conn.AddSet(ns, nil))
	e.sets[s.Name] = ns
	e.note(note{op: noteAddSet, name: s.Name})
}

var hookNums = map[string]nftables.ChainHook{
	"prerouting":  *nftables.ChainHookPrerouting,
	"input":       *nftables.ChainHookInput,
	"forward":     *nftables.ChainHookForward,
	"output":      *nftables.ChainHookOutput,
	"postrouting": *nftables.ChainHookPostrouting,
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
	w.begin(typ, flags, byte(e.table.Family))
	w.str(tableAttr, e.table.Name)
	w.str(nameAttr, name)
	w.end()
}

// tableMessage writes a message on the table, as google/nftables writes
// it, with user data when ud is not nil: nftgate's mark.
func (e *encoder) tableMessage(typ uint16, flags netlink.HeaderFlags, ud []byte) {
	w := e.w
	w.begin(typ, flags, byte(e.table.Family))
	w.str(unix.NFTA_TABLE_NAME, e.table.Name)
	w.u32(unix.NFTA_TABLE_FLAGS, 0)
	if ud != nil {
		w.attr(nftaTableUserdata, ud)
	}
	w.end()
}

func (e *encoder) addChain(c *Chain) {
	w := e.w
	w.begin(unix.NFT_MSG_NEWCHAIN, flagsCreate, byte(e.table.Family))
	w.str(unix.NFTA_CHAIN_TABLE, e.table.Name)
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

func (e *encoder) addRules(p chainPlan) {
	w := e.w
	fam := byte(e.table.Family)
	for i, r := range p.chain.Rules {
		w.begin(unix.NFT_MSG_NEWRULE, flagsAppend, fam)
		w.str(unix.NFTA_RULE_TABLE, e.table.Name)
		w.str(unix.NFTA_RULE_CHAIN, p.chain.Name)
		at := w.nest(unix.NFTA_RULE_EXPRESSIONS)
		for _, s := range r {
			if ws, ok := s.(wireStmt); ok {
				ws.put(e.f, w)
				continue
			}
			e.exprs = append(e.exprs[:0], s.encode(e.f, &e.setRefs)...)
			for _, x := range e.exprs {
				w.expr(fam, x)
			}
		}
		w.close(at)
		var ud [10]byte
		w.attr(unix.NFTA_RULE_USERDATA, appendFingerprint(ud[:0], p.ruleFPs[i]))
		w.end()
		e.note(note{op: noteAddRule, name: p.chain.Name, rule: r})
	}
}

// appendKey appends a map key as the kernel stores it: each field of a
// concatenation padded to four bytes.
func appendKey(b []byte, shape KeyShape, k Key) []byte {
	if k.Addr.IsValid() {
		b = append(b, k.Addr.AsSlice()...)
	}
	if shape == KeyAddrPair {
		return append(b, k.Addr.AsSlice()...)
	}
	if k.Proto == 0 && k.Port == 0 {
		return b // a plain address
	}
	b = append(b, byte(k.Proto), 0, 0, 0)
	b = append(b, byte(k.Port>>8), byte(k.Port), 0, 0)
	return b
}

// setShape is the key shape of each set whose elements nftgate writes, and
// zero for the sets the packet path fills.
func setShape(name string) KeyShape {
	switch name {
	case MapServiceNodePorts, MapNoEndpointNodePorts:
		return KeyProtoPort
	case MapServiceIPs, MapNoEndpointServices, MapFirewallIPs:
		return KeyAddrProtoPort
	case SetClusterIPs:
		return KeyAddr
	case SetHairpin:
		return KeyAddrPair
	}
	return 0
}

// elementsPerMessage bounds the elements of one message: the kernel caps a
// netlink attribute, the list of them, at 64 KiB.
const elementsPerMessage = 500

// elements adds or deletes map elements, grouped per map into messages of
// bounded size.
func (e *encoder) elements(els []Element, del bool) {
	typ, op := uint16(unix.NFT_MSG_NEWSETELEM), noteAddElems
	if del {
		typ, op = unix.NFT_MSG_DELSETELEM, noteDelElems
	}
	w := e.w
	fam := byte(e.table.Family)
	var key []byte
	for len(els) > 0 {
		m := els[0].Map
		shape := setShape(m)
		w.begin(typ, flagsCreate, fam)
		w.str(unix.NFTA_SET_ELEM_LIST_SET, m)
		w.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, 0)
		w.str(unix.NFTA_SET_ELEM_LIST_TABLE, e.table.Name)
		list := w.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		n := 0
		// Stay clear of the attribute limit whatever the chain names' length.
		for n < elementsPerMessage && n < len(els) && els[n].Map == m && len(w.b)-list < maxAttrLen-1024 {
			el := &els[n]
			n++
			item := w.nest(uint16(n))
			key = appendKey(key[:0], shape, el.Key)
			w.value(unix.NFTA_SET_ELEM_KEY, key)
			if el.Verdict.Kind != 0 {
				w.verdictData(unix.NFTA_SET_ELEM_DATA, el.Verdict.encode(e.f, nil)[0].(*expr.Verdict))
			}
			w.close(item)
		}
		w.close(list)
		w.end()
		e.note(note{op: op, name: m, n: n})
		els = els[n:]
	}
}

func chunks[T any](s []T, n int) func(func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}

// encode appends one family's operations to the batch.
// head has the table and its new sets recorded. The heads of all tables
// come first in a batch, and are moved into it together: each move costs
// google/nftables a Flush.
func (e *encoder) head(o *familyOps) {
	if o.replaceTable || o.createTable {
		e.recorded() // what google/nftables recorded keeps its place
	}
	if o.replaceTable {
		e.tableMessage(unix.NFT_MSG_DELTABLE, netlink.Request, nil)
		e.note(note{op: noteDelTable})
	}
	if o.createTable {
		e.tableMessage(unix.NFT_MSG_NEWTABLE, flagsCreate, tableMark)
		e.note(note{op: noteAddTable})
	}
	for _, s := range o.addSets {
		e.addSet(s)
	}
}

// body writes the rest of the table's operations, after every head.
func (e *encoder) body(o *familyOps) {
	for _, c := range o.addChains {
		e.addChain(c.chain)
	}
	// Chains being removed and chains being rewritten are flushed before
	// any set they use is recreated or deleted.
	for _, c := range o.rewriteChains {
		e.chainMessage(unix.NFT_MSG_DELRULE, netlink.Request, unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN, c.chain.Name)
		e.note(note{op: noteFlushChain, name: c.chain.Name})
	}
	for _, n := range o.flushChains {
		e.chainMessage(unix.NFT_MSG_DELRULE, netlink.Request, unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN, n)
		e.note(note{op: noteFlushChain, name: n})
	}
	for _, s := range o.recreateSets {
		e.rec.conn.DelSet(setDefinition(e.table, e.f, s))
		e.note(note{op: noteDelSet, name: s.Name})
		e.addSet(s)
		e.recorded()
	}
	for _, c := range o.addChains {
		e.addRules(c)
	}
	for _, c := range o.rewriteChains {
		e.addRules(c)
	}
	e.elements(o.delElems, true)
	e.elements(o.addElems, false)
	for _, n := range o.delChains {
		e.chainMessage(unix.NFT_MSG_DELCHAIN, netlink.Request, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, n)
		e.note(note{op: noteDelChain, name: n})
	}
	for _, n := range o.delSets {
		e.rec.conn.DelSet(&nftables.Set{Table: e.table, Name: n})
		e.note(note{op: noteDelSet, name: n})
	}
	if len(o.delSets) > 0 {
		e.recorded()
	}
	e.fail(e.w.err)
}

// batch is a batch being built: its first part holds its beginning, the
// tables and their new sets; then one part per table, encoded in parallel.
// It is sent as one datagram.
type batch struct {
	parts []*wire
	arena []byte // mapped memory the parts are in, if any
}

// arenaThreshold is the size of a batch above which its parts are placed
// in memory mapped for it rather than on the Go heap. A cold sync's batch is
// tens of megabytes of bytes for the kernel: on the heap it would bring the
// next collection forward, which then scans everything the sync holds, for
// memory that holds no pointers and is freed right after sending.
const arenaThreshold = 4 << 20

func newArena(size int) []byte {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil // the parts go on the heap
	}
	return b
}

// release returns the batch's mapped memory; the batch must not be used
// afterwards.
func (bt *batch) release() {
	if bt.arena != nil {
		_ = unix.Munmap(bt.arena)
		bt.arena, bt.parts = nil, nil
	}
}

func (bt *batch) count() int {
	n := 0
	for _, w := range bt.parts {
		n += w.count
	}
	return n
}

func (bt *batch) size() int {
	n := 0
	for _, w := range bt.parts {
		n += len(w.b)
	}
	return n
}

// notes describe the batch's messages in order, when it was encoded with
// describe.
func (bt *batch) notes() []note {
	var out []note
	for _, w := range bt.parts {
		out = append(out, w.notes...)
	}
	return out
}

// encodeBatch encodes the operations of every table of ts, and the
// deletion of the tables in drop, into one batch; with a note on every
// message when describe is set.
func encodeBatch(ts *tableSet, ds []*differ, drop []tableRef, describe bool) (*batch, error) {
	rec, err := newRecorder(new(uint32))
	if err != nil {
		return nil, err
	}
	head := newWire(4096, 64, describe)
	head.marker(unix.NFNL_MSG_BATCH_BEGIN)
	encs := make([]*encoder, len(ds))
	heads := false
	for slot, d := range ds {
		if !d.ops.empty() {
			ref := ts.refs[slot]
			encs[slot] = newEncoder(head, rec, ref.name, ref.f)
			encs[slot].head(&d.ops)
			heads = heads || d.ops.createTable || len(d.ops.addSets) > 0
		}
	}
	if heads {
		msgs, err := rec.take()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			head.message(m)
		}
	}
	// Each table's body is a part of its own, encoded on any CPU. Those
	// that need google/nftables (recreated and deleted sets) get a
	// recorder per worker; set IDs stay unique in the batch.
	bodies := make([]*wire, len(ds))
	errs := make([]error, len(ds))
	sizes, counts := make([]int, len(ds)), make([]int, len(ds))
	total := 0
	for slot, e := range encs {
		if e != nil {
			sizes[slot], counts[slot] = ds[slot].ops.estimate()
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
			var wrec *recorder
			for {
				slot := int(next.Add(1)) - 1
				if slot >= len(ds) {
					return
				}
				e := encs[slot]
				if e == nil {
					continue
				}
				o := &ds[slot].ops
				if bt.arena != nil {
					off := offsets[slot]
					e.w = newWireIn(bt.arena[off:off:off+sizes[slot]], counts[slot], describe)
				} else {
					e.w = newWire(sizes[slot], counts[slot], describe)
				}
				if len(o.recreateSets) > 0 || len(o.delSets) > 0 {
					if wrec == nil {
						r, err := newRecorder(rec.lastID)
						if err != nil {
							errs[slot] = err
							continue
						}
						wrec = r
					}
					e.rec = wrec
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
			ref := ts.refs[slot]
			return nil, fmt.Errorf("encode %s %s table: %w", ref.f, ref.name, errs[slot])
		}
		if w != nil && w.count > 0 {
			bt.parts = append(bt.parts, w)
		}
	}
	if len(drop) > 0 {
		tail := newWire(1024, len(drop), describe)
		for _, t := range drop {
			rec.conn.DelTable(&nftables.Table{Name: t.name, Family: nftFamily(t.f)})
			if describe {
				tail.notes = append(tail.notes, note{op: noteDelTable, f: t.f, table: t.name})
			}
		}
		msgs, err := rec.take()
		if err != nil {
			bt.release()
			return nil, err
		}
		for _, m := range msgs {
			tail.message(m)
		}
		bt.parts = append(bt.parts, tail)
	}
	for _, w := range bt.parts {
		if w.err != nil {
			bt.release()
			return nil, fmt.Errorf("encode ruleset: %w", w.err)
		}
	}
	return bt, nil
}

// recorder is a google/nftables Conn whose transport only records the
// messages it would send, so that nftgate can send them in one batch of its
// own (see batch.go).
type recorder struct {
	conn   *nftables.Conn
	msgs   []netlink.Message
	lastID *uint32 // shared by the recorders of one batch
}

// setID numbers the sets a batch creates, by which the kernel finds them
// within the batch. nftgate numbers them itself: google/nftables counts in
// a package variable that concurrent batches would share unguarded.
func (r *recorder) setID() uint32 {
	return atomic.AddUint32(r.lastID, 1)
}

// newRecorder makes a recorder numbering sets with lastID.
func newRecorder(lastID *uint32) (*recorder, error) {
	r := &recorder{lastID: lastID}
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
	return msgs, nil
}
