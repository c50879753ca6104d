package nft

import (
	"encoding/binary"
	"fmt"
)

// tableState is what nftgate knows one family's table to hold: every chain
// with a fingerprint of its rules, every set, every map element. It is filled
// from a committed batch, or from reading the kernel back.
type tableState struct {
	exists bool
	// replace is set for a table of nftgate's layout without nftgate's
	// mark, read as empty: it is deleted and created anew, marked.
	replace bool
	chains  map[string]chainInfo
	sets    map[string]setDef
	elems   map[ElemID]Verdict
}

func newTableState() *tableState {
	return &tableState{chains: map[string]chainInfo{}, sets: map[string]setDef{}, elems: map[ElemID]Verdict{}}
}

// chainInfo is what the state keeps of a chain: the fingerprint of its hook
// and rules, and how many rules it has.
type chainInfo struct {
	fp    uint64
	rules int32
}

// setDef is the part of a set's definition that the kernel cannot change in
// place; a set whose definition differs is recreated.
type setDef struct {
	Map     bool
	Shape   KeyShape
	Timeout int64 // seconds
}

func defOf(s *Set) setDef {
	return setDef{Map: s.Map, Shape: s.Shape, Timeout: int64(s.Timeout.Seconds())}
}

// ruleFingerprint identifies a rule by its nft text. It is stored in the
// rule's user data in the kernel, so reading a table back tells whether each
// rule is still the one nftgate wrote, without decoding bytecode.
//
// scratch, when not nil, is a buffer to reuse for the text.
func ruleFingerprint(f Family, r Rule, scratch *[]byte) uint64 {
	var b []byte
	if scratch != nil {
		b = (*scratch)[:0]
	}
	b = r.appendText(b, f)
	if scratch != nil {
		*scratch = b
	}
	return fnv64a(fnvOffset64, b)
}

// FNV-1a, 64 bits, as hash/fnv computes it, without its allocation per
// hash: a cold sync fingerprints tens of thousands of rules.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnv64a(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime64
	}
	return h
}

// chainFingerprint combines the hook and the rule fingerprints of a chain.
func chainFingerprint(hook *Hook, ruleFPs []uint64) uint64 {
	h := uint64(fnvOffset64)
	if hook != nil {
		h = fnv64a(h, fmt.Appendf(nil, "%s/%s/%d|", hook.Type, hook.Hook, hook.Priority))
	}
	var b [8]byte
	for _, fp := range ruleFPs {
		binary.BigEndian.PutUint64(b[:], fp)
		h = fnv64a(h, b[:])
	}
	return h
}

// chainPlan is a chain with its rules' fingerprints computed once.
type chainPlan struct {
	chain   *Chain
	ruleFPs []uint64
	fp      uint64
}

func planChain(f Family, c *Chain, scratch *[]byte) chainPlan {
	fps := make([]uint64, len(c.Rules))
	for i, r := range c.Rules {
		fps[i] = ruleFingerprint(f, r, scratch)
	}
	return chainPlan{chain: c, ruleFPs: fps, fp: chainFingerprint(c.Hook, fps)}
}

// familyOps are the changes to one family's table, in the order a batch
// must carry them so that nothing ever references a missing object:
// sets and chains first, then rules, then map elements; removals last.
type familyOps struct {
	createTable   bool
	replaceTable  bool // delete the table before creating it
	addSets       []*Set
	addChains     []chainPlan // new chains, with their rules
	rewriteChains []chainPlan // existing chains whose rules changed: flush and refill
	delElems      []Element
	addElems      []Element
	flushChains   []string // chains to remove: flushed first, so that chains
	delChains     []string // referencing each other can all be deleted
	delSets       []string
	// recreateSets are sets whose definition changed: deleted (after the
	// rules using them are flushed) and added again.
	recreateSets []*Set
}

func (o *familyOps) empty() bool {
	return !o.createTable && len(o.addSets) == 0 && len(o.addChains) == 0 && len(o.rewriteChains) == 0 &&
		len(o.delElems) == 0 && len(o.addElems) == 0 && len(o.flushChains) == 0 && len(o.delChains) == 0 &&
		len(o.delSets) == 0 && len(o.recreateSets) == 0
}

// estimate is about the size in bytes of the batch carrying the
// operations (rather more than less: a buffer that must grow copies
// itself), and the number of its messages.
func (o *familyOps) estimate() (size, messages int) {
	// A rule of nftgate's is up to about 480 bytes of expressions, plus
	// its chain's name, twice for a jump or goto.
	chains := func(cs []chainPlan) {
		for _, c := range cs {
			size += 128 + len(c.chain.Name) + len(c.chain.Rules)*(480+2*len(c.chain.Name))
			messages += 1 + len(c.chain.Rules)
		}
	}
	chains(o.addChains)
	chains(o.rewriteChains)
	for _, els := range [][]Element{o.addElems, o.delElems} {
		for i := range els {
			size += 40 // an address pair, or an address, protocol and port
			if els[i].Verdict.Kind != 0 {
				size += 28 + len(els[i].Verdict.Chain)
			}
		}
		messages += len(els)/elementsPerMessage + 4
	}
	names := len(o.flushChains) + len(o.delChains) + len(o.delSets)
	messages += names + len(o.addSets) + 2*len(o.recreateSets) + 1
	return size + 128*names + 512, messages
}

// Counts of what a sync changed, for logs and metrics.
type Counts struct {
	ChainsAdded, ChainsChanged, ChainsDeleted       int
	SetsAdded, SetsDeleted                          int
	ElementsAdded, ElementsChanged, ElementsDeleted int
}

// Changes is the total number of objects changed.
func (c Counts) Changes() int {
	return c.ChainsAdded + c.ChainsChanged + c.ChainsDeleted + c.SetsAdded + c.SetsDeleted +
		c.ElementsAdded + c.ElementsChanged + c.ElementsDeleted
}

func (c *Counts) add(o *familyOps) {
	c.ChainsAdded += len(o.addChains)
	c.ChainsChanged += len(o.rewriteChains)
	c.ChainsDeleted += len(o.delChains)
	c.SetsAdded += len(o.addSets) + len(o.recreateSets)
	c.SetsDeleted += len(o.delSets)
	changed := 0
	del := map[ElemID]bool{}
	for _, e := range o.delElems {
		del[e.ID()] = true
	}
	for _, e := range o.addElems {
		if del[e.ID()] {
			changed++
		}
	}
	c.ElementsChanged += changed
	c.ElementsAdded += len(o.addElems) - changed
	c.ElementsDeleted += len(o.delElems) - changed
}

// differ accumulates the operations that bring a table from its state to
// the desired objects it is shown, one object name at a time.
type differ struct {
	f     Family
	state *tableState
	ops   familyOps
	seen  map[string]bool // chains and sets already decided in this plan
	// rewriteAll rewrites every existing chain, because a set they may
	// reference is being recreated.
	rewriteAll bool
	text       []byte // scratch for rule fingerprints
}

func newDiffer(f Family, st *tableState) *differ {
	return &differ{f: f, state: st}
}

// decided marks an object as decided in this plan and tells whether it
// already was. The map is made on first use: a partial sync has a differ
// for every table and touches two or three.
func (d *differ) decided(key string) bool {
	if d.seen[key] {
		return true
	}
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	d.seen[key] = true
	return false
}

// chain decides one chain: desired nil means it must not exist.
func (d *differ) chain(name string, desired *Chain) {
	if desired == nil {
		d.plannedChain(name, nil)
		return
	}
	p := planChain(d.f, desired, &d.text)
	d.plannedChain(name, &p)
}

// plannedChain is chain for a desired chain whose rules are already
// fingerprinted.
func (d *differ) plannedChain(name string, desired *chainPlan) {
	if d.decided("c/" + name) {
		return
	}
	cur, exists := d.state.chains[name]
	switch {
	case desired == nil && exists:
		d.ops.flushChains = append(d.ops.flushChains, name)
		d.ops.delChains = append(d.ops.delChains, name)
	case desired != nil && !exists:
		d.ops.addChains = append(d.ops.addChains, *desired)
	case desired != nil && exists:
		if desired.fp != cur.fp || d.rewriteAll {
			d.ops.rewriteChains = append(d.ops.rewriteChains, *desired)
		}
	}
}

// set decides one set: desired nil means it must not exist.
func (d *differ) set(name string, desired *Set) {
	if d.decided("s/" + name) {
		return
	}
	cur, exists := d.state.sets[name]
	switch {
	case desired == nil && exists:
		d.ops.delSets = append(d.ops.delSets, name)
	case desired != nil && !exists:
		d.ops.addSets = append(d.ops.addSets, desired)
	case desired != nil && exists && cur != defOf(desired):
		d.ops.recreateSets = append(d.ops.recreateSets, desired)
		// The new set starts empty, and every rule using the old one
		// must let go of it first.
		for id := range d.state.elems {
			if id.Map == name {
				delete(d.state.elems, id)
			}
		}
		d.rewriteAll = true
	}
}

// element decides one map element: desired nil means it must not exist.
func (d *differ) element(id ElemID, desired *Verdict) {
	cur, exists := d.state.elems[id]
	switch {
	case desired == nil && exists:
		d.ops.delElems = append(d.ops.delElems, Element{Map: id.Map, Key: id.Key, Verdict: cur})
	case desired != nil && !exists:
		d.ops.addElems = append(d.ops.addElems, Element{Map: id.Map, Key: id.Key, Verdict: *desired})
	case desired != nil && exists && cur != *desired:
		// Replacing a verdict is a delete and an add of the same key in
		// one batch: the element never disappears for packets.
		d.ops.delElems = append(d.ops.delElems, Element{Map: id.Map, Key: id.Key, Verdict: cur})
		d.ops.addElems = append(d.ops.addElems, Element{Map: id.Map, Key: id.Key, Verdict: *desired})
	}
}

// apply records a committed plan in the state.
func (st *tableState) apply(o *familyOps) {
	if o.createTable {
		st.exists, st.replace = true, false
	}
	for _, s := range o.addSets {
		st.sets[s.Name] = defOf(s)
	}
	for _, s := range o.recreateSets {
		st.sets[s.Name] = defOf(s)
	}
	for _, c := range o.addChains {
		st.chains[c.chain.Name] = chainInfo{c.fp, int32(len(c.ruleFPs))}
	}
	for _, c := range o.rewriteChains {
		st.chains[c.chain.Name] = chainInfo{c.fp, int32(len(c.ruleFPs))}
	}
	for _, e := range o.delElems {
		delete(st.elems, e.ID())
	}
	for _, e := range o.addElems {
		st.elems[e.ID()] = e.Verdict
	}
	for _, n := range o.delChains {
		delete(st.chains, n)
	}
	for _, n := range o.delSets {
		delete(st.sets, n)
	}
}
