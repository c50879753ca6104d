package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
)

// udataFingerprint is the user-data TLV type carrying a rule's fingerprint.
// nft ignores TLV types it does not know, so `nft list ruleset` is unchanged.
const udataFingerprint = 0xf0

func fingerprintUserData(fp uint64) []byte {
	b := make([]byte, 2+8)
	b[0], b[1] = udataFingerprint, 8
	binary.BigEndian.PutUint64(b[2:], fp)
	return b
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

// note describes one message of a batch, formatted on demand.
type note struct {
	format string
	args   []any
}

func (n note) String() string { return fmt.Sprintf(n.format, n.args...) }

// ruleText prints a rule when a note is formatted.
type ruleText struct {
	f Family
	r Rule
}

func (t ruleText) String() string { return t.r.Text(t.f) }

// encoder turns planned operations into google/nftables calls on a Conn
// that only records messages (see batch.go), in the order that keeps every
// reference valid inside the batch.
type encoder struct {
	conn  *nftables.Conn
	table *nftables.Table
	f     Family
	sets  map[string]*nftables.Set // sets referenced or created in this batch
	err   error
	// describe records what each message does, for error reports. It is
	// formatted only when the kernel refuses a message: at the size of a
	// cold sync, formatting every message would be most of the garbage.
	describe []note
}

func (e *encoder) note(format string, args ...any) {
	e.describe = append(e.describe, note{format, args})
}

func (e *encoder) fail(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

func nftFamily(f Family) nftables.TableFamily {
	if f == IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

func (e *encoder) setDefinition(s *Set) *nftables.Set {
	ns := &nftables.Set{Table: e.table, Name: s.Name}
	addr := nftables.TypeIPAddr
	if e.f == IPv6 {
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

// set returns the set of that name for references from rules.
func (e *encoder) set(name string) *nftables.Set {
	if s, ok := e.sets[name]; ok {
		return s
	}
	s := &nftables.Set{Table: e.table, Name: name}
	e.sets[name] = s
	return s
}

func (e *encoder) addSet(s *Set) {
	ns := e.setDefinition(s)
	e.fail(e.conn.AddSet(ns, nil))
	e.sets[s.Name] = ns
	e.note("add set %s %s %s", e.f, e.table.Name, s.Name)
}

var hookNums = map[string]*nftables.ChainHook{
	"prerouting":  nftables.ChainHookPrerouting,
	"input":       nftables.ChainHookInput,
	"forward":     nftables.ChainHookForward,
	"output":      nftables.ChainHookOutput,
	"postrouting": nftables.ChainHookPostrouting,
}

func (e *encoder) chainRef(name string) *nftables.Chain {
	return &nftables.Chain{Table: e.table, Name: name}
}

func (e *encoder) addChain(c *Chain) {
	nc := e.chainRef(c.Name)
	if h := c.Hook; h != nil {
		nc.Type = nftables.ChainType(h.Type)
		nc.Hooknum = hookNums[h.Hook]
		nc.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(h.Priority))
		accept := nftables.ChainPolicyAccept
		nc.Policy = &accept
	}
	e.conn.AddChain(nc)
	e.note("add chain %s %s %s", e.f, e.table.Name, c.Name)
}

func (e *encoder) addRules(p chainPlan) {
	ref := e.chainRef(p.chain.Name)
	for i, r := range p.chain.Rules {
		var exprs []expr.Any
		for _, s := range r {
			exprs = append(exprs, s.encode(e.f, e)...)
		}
		e.conn.AddRule(&nftables.Rule{Table: e.table, Chain: ref, Exprs: exprs, UserData: fingerprintUserData(p.ruleFPs[i])})
		e.note("add rule %s %s %s %s", e.f, e.table.Name, p.chain.Name, ruleText{e.f, r})
	}
}

func keyBytes(f Family, shape KeyShape, k Key) []byte {
	var b []byte
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

func (e *encoder) elementSet(name string) *nftables.Set {
	shape := setShape(name)
	return e.setDefinition(&Set{Name: name, Map: shape != KeyAddr && shape != KeyAddrPair, Shape: shape})
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

func elementOf(f Family, el Element) nftables.SetElement {
	key := keyBytes(f, setShape(el.Map), el.Key)
	if el.Verdict.Kind == 0 {
		return nftables.SetElement{Key: key}
	}
	v := el.Verdict.encode(f, nil)[0].(*expr.Verdict)
	return nftables.SetElement{Key: key, VerdictData: v}
}

// elements adds or deletes map elements, grouped per map into one message.
func (e *encoder) elements(els []Element, del bool) {
	byMap := map[string][]nftables.SetElement{}
	var order []string
	for _, el := range els {
		if _, ok := byMap[el.Map]; !ok {
			order = append(order, el.Map)
		}
		byMap[el.Map] = append(byMap[el.Map], elementOf(e.f, el))
	}
	for _, m := range order {
		s := e.elementSet(m)
		// Elements travel in messages of bounded size: the kernel caps one
		// netlink attribute at 64 KiB.
		for chunk := range chunks(byMap[m], 500) {
			if del {
				e.fail(e.conn.SetDeleteElements(s, chunk))
				e.note("delete %d elements from map %s %s %s", len(chunk), e.f, e.table.Name, m)
			} else {
				e.fail(e.conn.SetAddElements(s, chunk))
				e.note("add %d elements to map %s %s %s", len(chunk), e.f, e.table.Name, m)
			}
		}
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
func (e *encoder) encode(o *familyOps) {
	if o.createTable {
		e.conn.AddTable(e.table)
		e.note("add table %s %s", e.f, e.table.Name)
	}
	for _, s := range o.addSets {
		e.addSet(s)
	}
	for _, c := range o.addChains {
		e.addChain(c.chain)
	}
	// Chains being removed and chains being rewritten are flushed before
	// any set they use is recreated or deleted.
	for _, c := range o.rewriteChains {
		e.conn.FlushChain(e.chainRef(c.chain.Name))
		e.note("flush chain %s %s %s", e.f, e.table.Name, c.chain.Name)
	}
	for _, n := range o.flushChains {
		e.conn.FlushChain(e.chainRef(n))
		e.note("flush chain %s %s %s", e.f, e.table.Name, n)
	}
	for _, s := range o.recreateSets {
		e.conn.DelSet(e.setDefinition(s))
		e.note("delete set %s %s %s", e.f, e.table.Name, s.Name)
		e.addSet(s)
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
		e.conn.DelChain(e.chainRef(n))
		e.note("delete chain %s %s %s", e.f, e.table.Name, n)
	}
	for _, n := range o.delSets {
		e.conn.DelSet(&nftables.Set{Table: e.table, Name: n})
		e.note("delete set %s %s %s", e.f, e.table.Name, n)
	}
}

// recorder is a google/nftables Conn whose transport only records the
// messages it would send, so that nftgate can send them in one batch of its
// own (see batch.go).
type recorder struct {
	conn *nftables.Conn
	msgs []netlink.Message
}

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
	return msgs, nil
}
