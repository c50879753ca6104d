package ruleset

import (
	"encoding/binary"
	"fmt"
	"iter"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nftgate/nftgate/model"
)

// tableState is what nftgate knows one family's table to hold: every chain
// with a fingerprint of its rules, every set, every map element. It is filled
// from a committed batch, or from reading the kernel back.
type TableState struct {
	Exists bool
	// replace is set for a table of nftgate's layout without nftgate's
	// mark, read as empty: it is deleted and created anew, marked.
	Replace bool
	Chains  map[string]ChainInfo
	Sets    map[string]SetDef
	Elems   Elems
	// Picks are the destinations' elements in the endpoint maps.
	Picks Picks
	// Flowtables is nil while the table has none.
	Flowtables map[string]FlowtableDef
}

func NewTableState() *TableState {
	return &TableState{Chains: map[string]ChainInfo{}, Sets: map[string]SetDef{}}
}

// FlowtableDef is what the state keeps of a flowtable: its priority, its
// devices, sorted and joined, and whether it counts. nftgate changes a
// flowtable by deleting and adding it.
type FlowtableDef struct {
	Priority int32
	Devices  string
	Counter  bool
}

// FlowtableDefOf is the definition of ft, in any order of its devices.
func FlowtableDefOf(ft *Flowtable) FlowtableDef {
	return FlowtableDef{Priority: ft.Priority, Devices: devicesKey(ft.Devices), Counter: ft.Counter}
}

// FlowtableDefFrom is the definition of a flowtable read from the kernel.
func FlowtableDefFrom(priority int32, devices []string, counter bool) FlowtableDef {
	return FlowtableDef{Priority: priority, Devices: devicesKey(devices), Counter: counter}
}

func devicesKey(devices []string) string {
	d := slices.Clone(devices)
	slices.Sort(d)
	return strings.Join(slices.Compact(d), ",")
}

// chainInfo is what the state keeps of a chain: the fingerprint of its hook
// and rules, and how many rules it has.
type ChainInfo struct {
	FP    uint64
	Rules int32
}

// setDef is the part of a set's definition that the kernel cannot change in
// place; a set whose definition differs is recreated.
type SetDef struct {
	Map       bool
	Shape     KeyShape
	Timeout   int64 // milliseconds
	Counter   bool
	Endpoints bool
}

func DefOf(s *Set) SetDef {
	return SetDef{Map: s.Map, Shape: s.Shape, Timeout: s.Timeout.Milliseconds(), Counter: s.Counter, Endpoints: s.Endpoints}
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
	b = r.AppendText(b, f)
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
func ChainFingerprint(hook *Hook, RuleFPs []uint64) uint64 {
	h := uint64(fnvOffset64)
	if hook != nil {
		h = fnv64a(h, fmt.Appendf(nil, "%s/%s/%d|", hook.Type, hook.Hook, hook.Priority))
	}
	var b [8]byte
	for _, fp := range RuleFPs {
		binary.BigEndian.PutUint64(b[:], fp)
		h = fnv64a(h, b[:])
	}
	return h
}

// chainPlan is a chain with its rules' fingerprints computed once.
type ChainPlan struct {
	Chain   *Chain
	RuleFPs []uint64
	FP      uint64
}

func PlanChain(f Family, c *Chain, scratch *[]byte) ChainPlan {
	fps := make([]uint64, len(c.Rules))
	for i, r := range c.Rules {
		fps[i] = ruleFingerprint(f, r, scratch)
	}
	return ChainPlan{Chain: c, RuleFPs: fps, FP: ChainFingerprint(c.Hook, fps)}
}

// familyOps are the changes to one family's table, in the order a batch
// must carry them so that nothing ever references a missing object:
// sets and chains first, then rules, then map elements; removals last.
type Ops struct {
	CreateTable   bool
	ReplaceTable  bool // delete the table before creating it
	AddSets       []*Set
	AddChains     []ChainPlan // new chains, with their rules
	RewriteChains []ChainPlan // existing chains whose rules changed: flush and refill
	DelElems      []Element
	AddElems      []Element
	FlushChains   []string // chains to remove: flushed first, so that chains
	DelChains     []string // referencing each other can all be deleted
	DelSets       []string
	// recreateSets are sets whose definition changed: deleted (after the
	// rules using them are flushed) and added again.
	RecreateSets []*Set
	// Flowtables, like sets: added with the table's new sets, recreated
	// (when their devices or priority changed) and deleted after the
	// rules that use them are flushed.
	AddFlowtables      []*Flowtable
	RecreateFlowtables []*Flowtable
	DelFlowtables      []string
	// SetPicks and DelPicks record in the state the picks whose elements
	// AddElems and DelElems add and delete.
	SetPicks []PickState
	DelPicks []ElemID
}

// Empty tells whether the operations change nothing.
func (o *Ops) Empty() bool {
	return !o.CreateTable && len(o.AddSets) == 0 && len(o.AddChains) == 0 && len(o.RewriteChains) == 0 &&
		len(o.DelElems) == 0 && len(o.AddElems) == 0 && len(o.FlushChains) == 0 && len(o.DelChains) == 0 &&
		len(o.DelSets) == 0 && len(o.RecreateSets) == 0 && len(o.AddFlowtables) == 0 &&
		len(o.RecreateFlowtables) == 0 && len(o.DelFlowtables) == 0 && len(o.SetPicks) == 0 && len(o.DelPicks) == 0
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

// Add counts the operations of one table.
func (c *Counts) Add(o *Ops) {
	c.ChainsAdded += len(o.AddChains)
	c.ChainsChanged += len(o.RewriteChains)
	c.ChainsDeleted += len(o.DelChains)
	c.SetsAdded += len(o.AddSets) + len(o.RecreateSets)
	c.SetsDeleted += len(o.DelSets)
	changed := 0
	del := map[ElemID]bool{}
	for _, e := range o.DelElems {
		del[e.ID()] = true
	}
	for _, e := range o.AddElems {
		if del[e.ID()] {
			changed++
		}
	}
	c.ElementsChanged += changed
	c.ElementsAdded += len(o.AddElems) - changed
	c.ElementsDeleted += len(o.DelElems) - changed
}

// differ accumulates the operations that bring a table from its state to
// the desired objects it is shown, one object name at a time.
type differ struct {
	f     Family
	state *TableState
	ops   Ops
	seen  map[string]bool // chains and sets already decided in this plan
	picks map[ElemID]bool // picks already decided in this plan
	// sharedSeen are the shared chains and maps (rendered once for all
	// Services: endpoints.go) this plan met, by pointer.
	sharedSeen map[any]bool
	// rewriteAll rewrites every existing chain, because a set they may
	// reference is being recreated.
	rewriteAll bool
	text       []byte // scratch for rule fingerprints
}

func newDiffer(f Family, st *TableState) *differ {
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
	p := PlanChain(d.f, desired, &d.text)
	d.plannedChain(name, &p)
}

// plannedChain is chain for a desired chain whose rules are already
// fingerprinted.
func (d *differ) plannedChain(name string, desired *ChainPlan) {
	if d.decided("c/" + name) {
		return
	}
	cur, exists := d.state.Chains[name]
	switch {
	case desired == nil && exists:
		d.ops.FlushChains = append(d.ops.FlushChains, name)
		d.ops.DelChains = append(d.ops.DelChains, name)
	case desired != nil && !exists:
		d.ops.AddChains = append(d.ops.AddChains, *desired)
	case desired != nil && exists:
		if desired.FP != cur.FP || d.rewriteAll {
			d.ops.RewriteChains = append(d.ops.RewriteChains, *desired)
		}
	}
}

// set decides one set: desired nil means it must not exist.
func (d *differ) set(name string, desired *Set) {
	if d.decided("s/" + name) {
		return
	}
	cur, exists := d.state.Sets[name]
	switch {
	case desired == nil && exists:
		d.ops.DelSets = append(d.ops.DelSets, name)
	case desired != nil && !exists:
		d.ops.AddSets = append(d.ops.AddSets, desired)
	case desired != nil && exists && cur != DefOf(desired):
		d.ops.RecreateSets = append(d.ops.RecreateSets, desired)
		// The new set starts empty, and every rule using the old one
		// must let go of it first.
		d.state.Elems.DeleteSet(name)
		d.rewriteAll = true
	}
}

// flowtable decides one flowtable: desired nil means it must not exist.
func (d *differ) flowtable(name string, desired *Flowtable) {
	if d.decided("f/" + name) {
		return
	}
	cur, exists := d.state.Flowtables[name]
	switch {
	case desired == nil && exists:
		// The rule that adds flows to it is gone from its chain, which
		// is rewritten before the flowtable is deleted.
		d.ops.DelFlowtables = append(d.ops.DelFlowtables, name)
	case desired != nil && !exists:
		d.ops.AddFlowtables = append(d.ops.AddFlowtables, desired)
	case desired != nil && exists && cur != FlowtableDefOf(desired):
		d.ops.RecreateFlowtables = append(d.ops.RecreateFlowtables, desired)
		d.rewriteAll = true
	}
}

// element decides one map element: desired nil means it must not exist.
func (d *differ) element(id ElemID, desired *Verdict) {
	cur, exists := d.state.Elems.Get(id)
	switch {
	case desired == nil && exists:
		d.ops.DelElems = append(d.ops.DelElems, Element{Map: id.Map(), Key: id.Key(), Verdict: cur})
	case desired != nil && !exists:
		d.ops.AddElems = append(d.ops.AddElems, Element{Map: id.Map(), Key: id.Key(), Verdict: *desired})
	case desired != nil && exists && cur != *desired:
		// Replacing a verdict is a delete and an add of the same key in
		// one batch: the element never disappears for packets.
		d.ops.DelElems = append(d.ops.DelElems, Element{Map: id.Map(), Key: id.Key(), Verdict: cur})
		d.ops.AddElems = append(d.ops.AddElems, Element{Map: id.Map(), Key: id.Key(), Verdict: *desired})
	}
}

// pick decides the elements of one destination in the endpoint maps:
// desired nil means it must have none. A pick that changes is deleted
// whole and added whole in the same batch: the state knows how many
// elements it has, not which endpoints.
func (d *differ) pick(id ElemID, desired *Pick) {
	if d.picks[id] {
		return
	}
	cur, exists := d.state.Picks.Get(id)
	if desired == nil && !exists {
		return // nothing to decide: a partial sync asks every shard
	}
	if d.picks == nil {
		d.picks = map[ElemID]bool{}
	}
	d.picks[id] = true
	var info PickInfo
	if desired != nil {
		if info = desired.Info(); exists && info == cur {
			return
		}
	}
	if exists {
		nodePort, k := PickIsNodePort(id), id.Key()
		for i := range int(cur.N) {
			d.ops.DelElems = append(d.ops.DelElems, Element{Map: EndpointMap(nodePort, i), Key: k})
		}
		if desired == nil {
			d.ops.DelPicks = append(d.ops.DelPicks, id)
		}
	}
	if desired != nil {
		d.ops.AddElems = desired.AppendElements(d.ops.AddElems)
		d.ops.SetPicks = append(d.ops.SetPicks, PickState{ID: id, Info: info})
	}
}

// Apply records a committed plan in the state, and returns by how many
// rules it changed the table's count of rules.
func (st *TableState) Apply(o *Ops) (rules int) {
	setChain := func(name string, info ChainInfo) {
		rules += int(info.Rules) - int(st.Chains[name].Rules)
		st.Chains[name] = info
	}
	if o.CreateTable {
		st.Exists, st.Replace = true, false
	}
	for _, s := range o.AddSets {
		st.Sets[s.Name] = DefOf(s)
	}
	for _, s := range o.RecreateSets {
		st.Sets[s.Name] = DefOf(s)
	}
	// A table filled by one batch (a shard at a cold start, or at a
	// repair onto no tables) gets its maps at their size.
	if len(st.Chains) == 0 && len(o.AddChains) > 0 {
		st.Chains = make(map[string]ChainInfo, len(o.AddChains))
	}
	if st.Elems.Len() == 0 {
		st.Elems.reserve(o.AddElems)
	}
	if st.Picks.Len() == 0 && len(o.SetPicks) > 0 {
		st.Picks.reserve(o.SetPicks)
	}
	for _, c := range o.AddChains {
		setChain(c.Chain.Name, ChainInfo{c.FP, int32(len(c.RuleFPs))})
	}
	for _, c := range o.RewriteChains {
		setChain(c.Chain.Name, ChainInfo{c.FP, int32(len(c.RuleFPs))})
	}
	for _, e := range o.DelElems {
		st.Elems.Delete(e.ID())
	}
	for _, e := range o.AddElems {
		if !e.To.IsValid() { // an endpoint map's element is in its pick
			st.Elems.Put(e.ID(), e.Verdict)
		}
	}
	for _, id := range o.DelPicks {
		st.Picks.Delete(id)
	}
	for _, p := range o.SetPicks {
		st.Picks.Put(p.ID, p.Info)
	}
	for _, n := range o.DelChains {
		rules -= int(st.Chains[n].Rules)
		delete(st.Chains, n)
	}
	for _, n := range o.DelSets {
		delete(st.Sets, n)
	}
	for _, ft := range append(slices.Clip(o.AddFlowtables), o.RecreateFlowtables...) {
		if st.Flowtables == nil {
			st.Flowtables = map[string]FlowtableDef{}
		}
		st.Flowtables[ft.Name] = FlowtableDefOf(ft)
	}
	for _, n := range o.DelFlowtables {
		delete(st.Flowtables, n)
	}
	return rules
}

// planFull decides everything a full sync changes: the tables must hold
// the skeleton and every Service, and nothing else. It is pure: observed is
// what the kernel holds, per table of ts (an empty state for a cold start).
func PlanFull(cfg *Config, ts *Tables, observed []*TableState, services map[model.ServiceKey]*model.Service) ([]*Ops, *Claims, []string) {
	fp := NewFullPlan(cfg, ts, observed, services, true, nil)
	batches := fp.Main()
	for i := range ts.k {
		batches = append(batches, fp.Shard(i)...)
	}
	return MergeBatches(len(ts.Refs), batches), fp.Claims(), fp.Conflicts()
}

// MergeBatches gathers batches into one plan of n tables: a table that
// several batches touch (a main table, whose elements come with each
// shard) gets their element operations, sorted once. The batches stay as
// they are.
func MergeBatches(n int, batches []Batch) []*Ops {
	ds := make([]*Ops, n)
	merged := make([]bool, n)
	for _, b := range batches {
		for j, slot := range b.Slots {
			part := b.Ops[j]
			switch {
			case ds[slot] == nil:
				ds[slot] = part
			case len(part.AddElems) > 0 || len(part.DelElems) > 0:
				if !merged[slot] {
					o := *ds[slot]
					o.AddElems, o.DelElems = slices.Clone(o.AddElems), slices.Clone(o.DelElems)
					ds[slot], merged[slot] = &o, true
				}
				ds[slot].AddElems = append(ds[slot].AddElems, part.AddElems...)
				ds[slot].DelElems = append(ds[slot].DelElems, part.DelElems...)
			}
		}
	}
	for slot, o := range ds {
		if merged[slot] {
			slices.SortFunc(o.AddElems, compareElems)
			slices.SortFunc(o.DelElems, compareElems)
		}
	}
	return ds
}

// Batch is operations on tables (by slot) to commit together.
type Batch struct {
	Slots []int
	Ops   []*Ops
}

// FullPlan is a full sync's plan, made a batch at a time: NewFullPlan
// renders every Service once to learn which Service holds each map element
// and what the main tables hold; Main and Shard then plan the main tables
// and each shard's. Unless it keeps what it rendered (keep), each Shard
// renders that shard's Services again, so that only one shard's rendered
// rules and operations are in memory at a time, and the first shards can
// be committed before every Service is planned. Then Shard may run beside
// the commit of other batches and their application to observed: it reads
// the states of its own tables, and its own copy of the main tables'
// elements.
//
// Streamed, the elements a Service puts in the main tables (its
// ClusterIPs, its endpoints for hairpin masquerade, its ports without
// endpoints) come with its shard, in the same batch: a Service is served with all of them or
// none, and the main tables' first batch is their skeleton, the firewall
// chains and elements of source ranges, and the elements several Services
// share.
type FullPlan struct {
	ts        *Tables
	observed  []*TableState
	services  map[model.ServiceKey]*model.Service
	keys      []model.ServiceKey // sorted
	shardKeys [][]int            // per shard, indexes into keys
	rendered  []renderedService  // per key, when kept
	book      *Claims
	conflicts []string
	slotElems [][]famElem // the map elements with a verdict each table's own batch holds
	main      []*differ   // per family, planned by NewFullPlan
	// split sends the main tables' elements of a shard's Services with
	// the shard (streamed); kept, every batch goes into one, and they
	// stay in the main tables' own.
	split bool
	// mainElems are the main tables' elements as observed, per family,
	// for Shard: copies when Shard may run beside the commit of a batch,
	// which applies to observed.
	mainElems []*TableState
}

// fullPlanBlock is how many Services NewFullPlan renders at a time when it
// keeps none: their rules are dropped once their claims are in the book.
const fullPlanBlock = 4096

// NewFullPlan renders every Service and plans the main tables; see
// FullPlan. A book, when given, holds the claims of exactly these Services
// (those of the last sync, when no Service changed since: the repair after
// another program deleted nftgate's tables): the plan takes it as its own,
// and renders before the first batch only the Services with chains in the
// main tables.
func NewFullPlan(cfg *Config, ts *Tables, observed []*TableState, services map[model.ServiceKey]*model.Service, keep bool, book *Claims) *FullPlan {
	fp := &FullPlan{ts: ts, observed: observed, services: services, book: book, split: !keep}
	if book == nil {
		fp.book = newClaimBookSized(len(services))
	}
	fp.keys = make([]model.ServiceKey, 0, len(services))
	for k := range services {
		fp.keys = append(fp.keys, k)
	}
	sort.Slice(fp.keys, func(i, j int) bool { return fp.keys[i].Less(fp.keys[j]) })
	fp.shardKeys = make([][]int, ts.k)
	for i, k := range fp.keys {
		s := cfg.ShardOf(k)
		fp.shardKeys[s] = append(fp.shardKeys[s], i)
	}
	for _, f := range Families {
		slot := ts.Main(f)
		fp.main = append(fp.main, fp.skeleton(slot))
		st := observed[slot]
		if !keep {
			st = &TableState{Elems: st.Elems.Clone()}
		}
		fp.mainElems = append(fp.mainElems, st)
	}
	if keep {
		fp.rendered = renderAll(ts, fp.keys, services, nil)
	}
	claims := &fp.book.verdicts
	keys := fp.keys
	if book != nil && !keep {
		keys = nil
		for _, k := range fp.keys {
			if hasMainChains(services[k]) {
				keys = append(keys, k)
			}
		}
	}
	for lo := 0; lo < len(keys); lo += fullPlanBlock {
		hi := min(lo+fullPlanBlock, len(keys))
		var rs []renderedService
		if keep {
			rs = fp.rendered[lo:hi]
		} else {
			rs = renderAll(ts, keys[lo:hi], services, MainChain)
		}
		for i := range rs {
			k := keys[lo+i]
			svc := services[k]
			for fi, f := range Families {
				fr := rs[i].Of(f)
				for j, c := range fr.Chains {
					if MainChain(c.Name) {
						fp.main[fi].plannedChain(c.Name, &rs[i].plans[fi][j])
					}
				}
				if book != nil {
					continue
				}
				countShared(fp.book, ts.Shard(f, k), fr, +1, nil)
				for _, e := range fr.Elements {
					if plainSet(e.Map) {
						fe := famElem{f, e.ID()}
						fp.book.plain.put(fe, fp.book.plain.at(fe)+1)
					} else {
						addClaim(claims, famElem{f, e.ID()}, claim{svc: k, created: svc.Created, verdict: e.Verdict, pick: pickFP(fr, &e)})
					}
				}
			}
		}
	}
	fp.slotElems = make([][]famElem, len(ts.Refs))
	for fe, cs := range claims.all() {
		fp.conflicts = append(fp.conflicts, conflicts(fe, cs)...)
		if fp.split && MainSet(fe.id.Map()) && fe.id.Map() != MapFirewallIPs {
			continue // with the winner's shard
		}
		slot := ts.elem(fe, cs.winner().svc)
		fp.slotElems[slot] = append(fp.slotElems[slot], fe)
	}
	sort.Strings(fp.conflicts)
	return fp
}

// Claims is the book of the plan's claims on map elements.
func (fp *FullPlan) Claims() *Claims { return fp.book }

// Conflicts lists the elements Services claim with different verdicts.
func (fp *FullPlan) Conflicts() []string { return fp.conflicts }

// Main is the main tables' first batch, one per family: everything of them
// but the elements that come with a shard.
func (fp *FullPlan) Main() []Batch {
	var out []Batch
	for fi, f := range Families {
		slot := fp.ts.Main(f)
		out = append(out, Batch{Slots: []int{slot}, Ops: fp.finish([]int{slot}, fp.main[fi:fi+1])})
	}
	return out
}

// Shard is shard i's batches, one per family: the shard's table, and
// (streamed) the elements its Services alone put in the main table.
func (fp *FullPlan) Shard(i int) []Batch {
	var slots []int
	var ds, mains []*differ
	for _, f := range Families {
		slot := fp.ts.Main(f) + 1 + i
		slots = append(slots, slot)
		ds = append(ds, fp.skeleton(slot))
		mains = append(mains, newDiffer(f, fp.mainElems[familyIndex(f)]))
	}
	keys := fp.shardKeys[i]
	var rendered []renderedService
	if fp.rendered != nil {
		rendered = make([]renderedService, 0, len(keys))
		for _, ki := range keys {
			rendered = append(rendered, fp.rendered[ki])
		}
	} else {
		ks := make([]model.ServiceKey, len(keys))
		for j, ki := range keys {
			ks[j] = fp.keys[ki]
		}
		rendered = renderAll(fp.ts, ks, fp.services, nil)
	}
	// The table's elements at once: those of its Services' picks and
	// those the book gives it (grown element by element, they were a
	// third of a cold sync's garbage).
	for fi, f := range Families {
		n, picks := len(fp.slotElems[slots[fi]]), 0
		for r := range rendered {
			for _, p := range rendered[r].Of(f).Picks {
				n += len(p.To)
				picks++
			}
		}
		d := ds[fi]
		d.ops.AddElems = slices.Grow(d.ops.AddElems, n)
		d.ops.SetPicks = slices.Grow(d.ops.SetPicks, picks)
		if d.picks == nil && picks > 0 {
			d.picks = make(map[ElemID]bool, picks)
		}
	}
	claims, plain := &fp.book.verdicts, &fp.book.plain
	for r := range rendered {
		k := fp.keys[keys[r]]
		for fi, f := range Families {
			fr := rendered[r].Of(f)
			d := ds[fi]
			for _, s := range fr.Sets {
				if d.sharedSet(s) {
					d.set(s.Name, s)
				}
			}
			for j, c := range fr.Chains {
				switch {
				case MainChain(c.Name):
				case Shared(c.Name):
					if d.sharedChain(c) {
						d.plannedChain(c.Name, sharedPlan(f, c))
					}
				default:
					d.plannedChain(c.Name, &rendered[r].plans[fi][j])
				}
			}
			for pi := range fr.Picks {
				p := &fr.Picks[pi]
				if cs := claims.at(famElem{f, dispatchID(p)}); cs != nil && cs.winner().svc == k {
					d.pick(p.ID(), p)
				}
			}
			for _, e := range fr.Elements {
				if !fp.split || !MainSet(e.Map) || e.Map == MapFirewallIPs {
					continue
				}
				fe := famElem{f, e.ID()}
				if plainSet(e.Map) {
					if plain.at(fe) == 1 {
						mains[fi].element(fe.id, &Verdict{})
					}
				} else if cs := claims.at(fe); cs != nil {
					// A Service listing a key twice claims it once.
					if w := cs.winner(); w.svc == k && mains[fi].firstElem(fe.id) {
						mains[fi].element(fe.id, &w.verdict)
					}
				}
			}
		}
	}
	ops := fp.finish(slots, ds)
	var out []Batch
	if !fp.split {
		for fi := range Families {
			out = append(out, Batch{Slots: slots[fi : fi+1], Ops: ops[fi : fi+1]})
		}
		return out
	}
	mainOps := sortOps(mains)
	for fi, f := range Families {
		out = append(out, Batch{Slots: []int{fp.ts.Main(f), slots[fi]}, Ops: []*Ops{mainOps[fi], ops[fi]}})
	}
	return out
}

// firstElem tells whether an element is decided for the first time in
// this plan, and marks it decided.
func (d *differ) firstElem(id ElemID) bool {
	return !d.decided("e/" + id.Map() + "/" + id.Key().String())
}

// skeleton starts the plan of the table in slot with its skeleton.
func (fp *FullPlan) skeleton(slot int) *differ {
	observed := fp.observed[slot]
	d := newDiffer(fp.ts.Refs[slot].Family, observed)
	d.ops.CreateTable = !observed.Exists
	d.ops.ReplaceTable = observed.Replace
	st := &fp.ts.Skeletons[slot]
	// Flowtables first: recreating one rewrites every chain.
	for _, ft := range st.Flowtables {
		d.flowtable(ft.Name, ft)
	}
	for _, s := range st.Sets {
		d.set(s.Name, s)
	}
	for _, c := range st.Chains {
		d.chain(c.Name, c)
	}
	return d
}

// finish adds the elements of each table's own batch, removes whatever
// else the tables hold, and returns the sorted operations.
func (fp *FullPlan) finish(slots []int, ds []*differ) []*Ops {
	claims, plain := &fp.book.verdicts, &fp.book.plain
	for i, slot := range slots {
		d := ds[i]
		for _, fe := range fp.slotElems[slot] {
			d.element(fe.id, &claims.at(fe).winner().verdict)
		}
		if slot == fp.ts.Main(d.f) {
			// The plain elements several Services share, or all of
			// them when nothing comes with the shards.
			for fe, n := range plain.all() {
				if fe.f == d.f && (n > 1 || !fp.split) {
					d.element(fe.id, &Verdict{})
				}
			}
		}
		for name := range d.state.Chains {
			d.chain(name, nil)
		}
		for name := range d.state.Sets {
			d.set(name, nil)
		}
		for name := range d.state.Flowtables {
			d.flowtable(name, nil)
		}
		for id := range d.state.Elems.All() {
			fe := famElem{d.f, id}
			var want bool
			if _, ok := plain.get(fe); ok {
				want = slot == fp.ts.Main(fe.f)
			} else if cs, ok := claims.get(fe); ok {
				want = slot == fp.ts.elem(fe, cs.winner().svc)
			}
			if !want {
				d.element(id, nil)
			}
		}
		for id := range d.state.Picks.All() {
			d.pick(id, nil)
		}
	}
	return sortOps(ds)
}

// renderedService is a Service's fragments with their chains' plans.
type renderedService struct {
	ByFamily
	plans [2][]ChainPlan // per family, per chain of the fragment
}

// renderAll renders the Services of keys and fingerprints their chains'
// rules (those plan names, or all when it is nil): a pure function of each
// Service, and most of what planning a full sync costs, so it runs on every
// CPU.
func renderAll(ts *Tables, keys []model.ServiceKey, services map[model.ServiceKey]*model.Service, plan func(chain string) bool) []renderedService {
	out := make([]renderedService, len(keys))
	// Services are handed out in blocks: lookups in the map and the
	// scratch buffer stay per worker.
	const block = 256
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), (len(keys)+block-1)/block) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []byte
			for {
				lo := int(next.Add(block)) - block
				if lo >= len(keys) {
					return
				}
				for i := lo; i < min(lo+block, len(keys)); i++ {
					rs := &out[i]
					rs.ByFamily = ts.Render(services[keys[i]])
					for fi, f := range Families {
						chains := rs.Of(f).Chains
						for j, c := range chains {
							if (plan == nil || plan(c.Name)) && !Shared(c.Name) {
								if rs.plans[fi] == nil {
									rs.plans[fi] = make([]ChainPlan, len(chains))
								}
								rs.plans[fi][j] = PlanChain(f, c, &scratch)
							}
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// changedServices lists the Services of want that differ from programmed
// (by pointer: the caller passes the same *model.Service for a Service
// that did not change), and those gone from it, as nil.
func ChangedServices(programmed, want map[model.ServiceKey]*model.Service) map[model.ServiceKey]*model.Service {
	changes := map[model.ServiceKey]*model.Service{}
	for k, s := range want {
		if programmed[k] != s {
			changes[k] = s
		}
	}
	for k := range programmed {
		if _, ok := want[k]; !ok {
			changes[k] = nil
		}
	}
	return changes
}

// planPartial decides what changing some Services changes in the tables,
// given what is programmed. It updates claims in place and returns, for
// each element it touched, the claims as they were (nil where there were
// none), so that a refused batch can be undone.
func PlanPartial(cfg *Config, ts *Tables, state []*TableState, book *Claims, programmed, changes map[model.ServiceKey]*model.Service) ([]*Ops, *Claims, []string) {
	claims := &book.verdicts
	var conflictList []string
	ds := make([]*differ, len(ts.Refs))
	for slot, ref := range ts.Refs {
		ds[slot] = newDiffer(ref.Family, state[slot])
	}
	var undo elemMap[claimSet]
	var undoPlain elemMap[int32]
	undoShared := map[sharedObject]int32{}
	var sharedObjs []sharedObject // in the order first touched
	touchShared := func(o sharedObject) {
		if _, ok := undoShared[o]; !ok {
			undoShared[o] = book.shared[o]
			sharedObjs = append(sharedObjs, o)
		}
	}
	count := func(fe famElem, delta int32) {
		n, ok := book.plain.get(fe)
		if _, seen := undoPlain.get(fe); !seen {
			undoPlain.put(fe, n)
		}
		if !ok && delta < 0 {
			return
		}
		if n += delta; n > 0 {
			book.plain.put(fe, n)
		} else {
			book.plain.del(fe)
		}
	}
	touch := func(fe famElem) {
		if _, ok := undo.get(fe); !ok {
			if cs, ok := claims.get(fe); ok {
				undo.put(fe, slices.Clone(cs))
			} else {
				undo.put(fe, nil)
			}
		}
	}
	// rendered are the Services' renderings as they are to be: the
	// changed ones', and those of others whose picks are needed.
	rendered := make(map[model.ServiceKey]*ByFamily, len(changes))
	pickOf := func(f Family, svc model.ServiceKey, dispatch ElemID) *Pick {
		r := rendered[svc]
		if r == nil {
			r = &ByFamily{}
			if s := programmed[svc]; s != nil {
				*r = ts.Render(s)
			}
			rendered[svc] = r
		}
		return r.Of(f).PickFor(dispatch.Map() == MapServiceNodePorts, dispatch.Key())
	}
	for k, svc := range changes {
		var oldR, newR ByFamily
		if old := programmed[k]; old != nil {
			oldR = ts.Render(old)
		}
		if svc != nil {
			newR = ts.Render(svc)
		}
		rendered[k] = &newR
		for _, f := range Families {
			main, shard := ds[ts.Main(f)], ds[ts.Shard(f, k)]
			in := func(chain string) *differ {
				if MainChain(chain) {
					return main
				}
				return shard
			}
			o, n := oldR.Of(f), newR.Of(f)
			newChains := make(map[string]bool, len(n.Chains))
			for _, c := range n.Chains {
				newChains[c.Name] = true
				in(c.Name).chain(c.Name, c)
			}
			for _, c := range o.Chains {
				if !newChains[c.Name] && !Shared(c.Name) {
					in(c.Name).chain(c.Name, nil)
				}
			}
			slot := ts.Shard(f, k)
			countShared(book, slot, o, -1, touchShared)
			countShared(book, slot, n, +1, touchShared)
			newSets := make(map[string]bool, len(n.Sets))
			for _, s := range n.Sets {
				newSets[s.Name] = true
				shard.set(s.Name, s)
			}
			for _, s := range o.Sets {
				if !newSets[s.Name] && !Shared(s.Name) {
					shard.set(s.Name, nil)
				}
			}
			for _, e := range o.Elements {
				fe := famElem{f, e.ID()}
				if plainSet(e.Map) {
					count(fe, -1)
					continue
				}
				touch(fe)
				removeClaim(claims, fe, k)
			}
			for _, e := range n.Elements {
				fe := famElem{f, e.ID()}
				if plainSet(e.Map) {
					count(fe, +1)
					continue
				}
				touch(fe)
				addClaim(claims, fe, claim{svc: k, created: svc.Created, verdict: e.Verdict, pick: pickFP(n, &e)})
			}
		}
	}
	for fe := range undo.all() {
		want := -1
		pid, picked := pickOfDispatch(fe.id)
		if cs, ok := claims.get(fe); ok {
			w := cs.winner()
			want = ts.elem(fe, w.svc)
			ds[want].element(fe.id, &w.verdict)
			if picked {
				// The winner's endpoints for the destination, if it
				// chooses through the endpoint maps.
				ds[want].pick(pid, pickOf(fe.f, w.svc, fe.id))
			}
			conflictList = append(conflictList, conflicts(fe, cs)...)
		}
		// The element leaves every other table it may be in: a shard
		// map's element moves when another Service's claim wins it.
		for _, slot := range ts.holders(fe) {
			if slot != want {
				ds[slot].element(fe.id, nil)
				if picked {
					ds[slot].pick(pid, nil)
				}
			}
		}
	}
	for fe := range undoPlain.all() {
		d := ds[ts.Main(fe.f)]
		if book.plain.at(fe) > 0 {
			d.element(fe.id, &Verdict{})
		} else {
			d.element(fe.id, nil)
		}
	}
	// Shared chains and maps no Service lists any more go; those
	// listed are in the plan already.
	for _, o := range sharedObjs {
		if book.shared[o] > 0 {
			continue
		}
		// The undo's value is the count before: the object is in the
		// kernel unless this plan added it.
		if o.chain {
			ds[o.slot].chain(o.name, nil)
		} else {
			ds[o.slot].set(o.name, nil)
		}
	}
	return sortOps(ds), &Claims{verdicts: undo, plain: undoPlain, shared: undoShared}, conflictList
}

// countShared adds delta to the counts of the shared chains and maps fr
// lists, in slot, and tells touch (unless nil) of each. It builds no list:
// a cold plan counts them for every Service.
func countShared(book *Claims, slot int, fr *Fragment, delta int32, touch func(sharedObject)) {
	count := func(o sharedObject) {
		if touch != nil {
			touch(o) // before the count changes: touch records it for undo
		}
		book.countShared(o, delta)
	}
	for _, c := range fr.Chains {
		if Shared(c.Name) {
			count(sharedObject{slot, true, c.Name})
		}
	}
	for _, s := range fr.Sets {
		if Shared(s.Name) {
			count(sharedObject{slot, false, s.Name})
		}
	}
}

func familyIndex(f Family) int {
	if f == IPv6 {
		return 1
	}
	return 0
}

// compareElems orders elements by map, then key.
func compareElems(a, b Element) int {
	if c := strings.Compare(a.Map, b.Map); c != 0 {
		return c
	}
	return a.Key.compare(b.Key)
}

// sortOps returns the differs' operations, sorted: it makes batches deterministic, which keeps them comparable in tests
// and logs.
func sortOps(ds []*differ) []*Ops {
	byName := func(a, b ChainPlan) int { return strings.Compare(a.Chain.Name, b.Chain.Name) }
	for _, d := range ds {
		o := &d.ops
		slices.SortFunc(o.AddChains, byName)
		slices.SortFunc(o.RewriteChains, byName)
		slices.Sort(o.FlushChains)
		slices.Sort(o.DelChains)
		slices.Sort(o.DelSets)
		slices.SortFunc(o.AddSets, func(a, b *Set) int { return strings.Compare(a.Name, b.Name) })
		slices.SortFunc(o.AddElems, compareElems)
		slices.SortFunc(o.DelElems, compareElems)
		slices.SortFunc(o.SetPicks, func(a, b PickState) int { return compareIDs(a.ID, b.ID) })
		slices.SortFunc(o.DelPicks, compareIDs)
	}
	ops := make([]*Ops, len(ds))
	for i, d := range ds {
		ops[i] = &d.ops
	}
	return ops
}

// Recreates tells whether a plan recreates a set.
func Recreates(plan []*Ops) bool {
	for _, o := range plan {
		if len(o.RecreateSets) > 0 {
			return true
		}
	}
	return false
}

func CloneServices(m map[model.ServiceKey]*model.Service) map[model.ServiceKey]*model.Service {
	out := make(map[model.ServiceKey]*model.Service, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// compareStates describes how the kernel's table differs from what nftgate
// last committed.
func CompareStates(t TableRef, want, got *TableState) []string {
	if want == nil {
		return nil
	}
	f := t.Family
	if want.Exists && !got.Exists {
		return []string{fmt.Sprintf("%s table %s is missing", f, t.Name)}
	}
	var out []string
	missing, changed, extra := 0, 0, 0
	for n, c := range want.Chains {
		g, ok := got.Chains[n]
		switch {
		case !ok:
			missing++
		case g.FP != c.FP:
			changed++
		}
	}
	for n := range got.Chains {
		if _, ok := want.Chains[n]; !ok {
			extra++
		}
	}
	if missing+changed+extra > 0 {
		out = append(out, fmt.Sprintf("%s %s chains: %d missing, %d with changed rules, %d unknown", f, t.Name, missing, changed, extra))
	}
	if missing, changed, extra := diffKeyed[Verdict](&want.Elems, &got.Elems); missing+changed+extra > 0 {
		out = append(out, fmt.Sprintf("%s %s map elements: %d missing, %d changed, %d unknown", f, t.Name, missing, changed, extra))
	}
	if missing, changed, extra := diffKeyed[PickInfo](&want.Picks, &got.Picks); missing+changed+extra > 0 {
		out = append(out, fmt.Sprintf("%s %s endpoint map destinations: %d missing, %d changed, %d unknown", f, t.Name, missing, changed, extra))
	}
	missing = 0
	for n := range want.Sets {
		if _, ok := got.Sets[n]; !ok {
			missing++
		}
	}
	if missing > 0 {
		out = append(out, fmt.Sprintf("%s %s sets: %d missing", f, t.Name, missing))
	}
	for n, def := range want.Flowtables {
		switch g, ok := got.Flowtables[n]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s %s flowtable %s is missing", f, t.Name, n))
		case g.Counter != def.Counter:
			out = append(out, fmt.Sprintf("%s %s flowtable %s has counter %t, want %t", f, t.Name, n, g.Counter, def.Counter))
		case g != def:
			out = append(out, fmt.Sprintf("%s %s flowtable %s has devices %q, want %q", f, t.Name, n, g.Devices, def.Devices))
		}
	}
	for n := range got.Flowtables {
		if _, ok := want.Flowtables[n]; !ok {
			out = append(out, fmt.Sprintf("%s %s flowtable %s is unknown", f, t.Name, n))
		}
	}
	return out
}

// keyed is a table state's elements or picks.
type keyed[V any] interface {
	All() iter.Seq2[ElemID, V]
	Get(ElemID) (V, bool)
}

// diffKeyed counts what want has that got lacks or holds otherwise, and
// what got has that want does not.
func diffKeyed[V comparable](want, got keyed[V]) (missing, changed, extra int) {
	for id, v := range want.All() {
		g, ok := got.Get(id)
		switch {
		case !ok:
			missing++
		case g != v:
			changed++
		}
	}
	for id := range got.All() {
		if _, ok := want.Get(id); !ok {
			extra++
		}
	}
	return missing, changed, extra
}
