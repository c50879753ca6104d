package nft

import (
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nftgate/nftgate/model"
)

// Programmer keeps nftgate's tables in the kernel equal to the desired
// ruleset. Every sync is one netlink batch: the kernel applies all of it or
// none of it, and the Programmer's own record of the kernel changes only
// when the kernel accepted the batch.
type Programmer struct {
	mu     sync.Mutex
	cfg    Config
	tables *tableSet
	batch  *batchConn
	reader *reader

	synced     bool
	reconciles uint32
	// generation is the kernel's ruleset generation after nftgate's last
	// commit, when genKnown: known only when that commit was the one
	// transaction between two readings of it. While the kernel is at that
	// generation nobody has changed any table since, and a full sync need
	// not read the tables back.
	generation   uint32
	genKnown     bool
	staticChains map[string]bool
	state        []*tableState                       // per table of p.tables
	services     map[model.ServiceKey]*model.Service // as programmed
	claims       *claimBook
	// bisectOnly makes isolation ignore what the refused messages name,
	// for tests of the bisection.
	bisectOnly bool
	// losses are, per Service, the elements it claims that another
	// Service holds, and why, as programmed.
	losses map[model.ServiceKey]map[famElem]string
}

// reconcileRounds is how many full syncs it takes to read every rule back.
const reconcileRounds = 8

// Options locate the kernel to program.
type Options struct {
	// NetNSFD, when non-zero, is a network namespace to program instead
	// of the process's own.
	NetNSFD int
	// RefuseForTest, when set, picks Service models whose rules are
	// programmed with one more rule the kernel refuses (a jump to a chain
	// that does not exist): tests use it to watch the kernel refuse one
	// Service.
	RefuseForTest func(*model.Service) bool
}

type famElem struct {
	f  Family
	id ElemID
}

// claim is one Service's wish for a map element.
type claim struct {
	svc     model.ServiceKey
	created time.Time
	verdict Verdict
}

// claimSet holds every claim on one element; the oldest Service wins, as the
// API server's allocator would have kept the address for it.
type claimSet []claim

func (cs claimSet) winner() *claim {
	var w *claim
	for i := range cs {
		c := &cs[i]
		if w == nil || c.created.Before(w.created) || (c.created.Equal(w.created) && c.svc.Less(w.svc)) {
			w = c
		}
	}
	return w
}

// claimBook records which Services want which elements.
type claimBook struct {
	// verdicts are the claims on map elements: the oldest Service wins.
	verdicts map[famElem]*claimSet
	// plain counts the Services that want each element of a plain
	// address set (ClusterIPs, hairpin pairs): every claim on one is the
	// same, so a count is all it takes. Most elements are of this kind.
	plain map[famElem]int32
}

func newClaimBook() *claimBook { return newClaimBookSized(0) }

// newClaimBookSized makes a book for about n Services: most have a
// ClusterIP and a verdict for it, and growing the maps a cold sync fills
// costs more than filling them.
func newClaimBookSized(n int) *claimBook {
	return &claimBook{verdicts: make(map[famElem]*claimSet, n), plain: make(map[famElem]int32, n)}
}

// conflicts lists every element claimed by Services that disagree.
func (b *claimBook) conflicts() []string {
	var out []string
	for fe, cs := range b.verdicts {
		if len(*cs) > 1 {
			out = append(out, conflicts(fe, *cs)...)
		}
	}
	sort.Strings(out)
	return out
}

// plainSet tells whether a set's elements carry no verdict.
func plainSet(name string) bool {
	shape := setShape(name)
	return shape == KeyAddr || shape == KeyAddrPair
}

// Result describes one sync.
type Result struct {
	Full     bool
	Counts   Counts
	Messages int
	Duration time.Duration
	// Kernel is the part of Duration between sending the batch and the
	// kernel's answer: nf_tables checking and applying it.
	Kernel time.Duration
	// Drift describes how the kernel differed from what nftgate had
	// programmed, when a full sync found it changed behind its back.
	Drift []string
	// ReadBack tells whether a full sync read the tables back. It does
	// not when no transaction has been committed since nftgate's last.
	ReadBack bool
	// Conflicts name elements claimed by more than one Service.
	Conflicts []string
	// Refused are the Services whose rules the kernel refused, with its
	// error: each stays as it was last programmed (absent if it never
	// was), and everything else of the sync is in place. A Service that
	// stays refused is tried again whenever it changes, and by every Full.
	Refused map[model.ServiceKey]string
	// ServiceConflicts hold, for each Service whose conflicts changed in
	// this sync, every element it claims that another Service holds, and
	// why (empty when it now has none).
	ServiceConflicts map[model.ServiceKey][]string
}

// NewProgrammer opens the netlink sockets. It changes nothing in the kernel.
func NewProgrammer(cfg Config, opts Options) (*Programmer, error) {
	if cfg.Table == "" {
		return nil, errors.New("nft: table name is empty")
	}
	if cfg.MasqueradeBit == 0 {
		cfg.MasqueradeBit = DefaultMasqueradeBit
	}
	b, err := dialBatch(opts.NetNSFD)
	if err != nil {
		return nil, err
	}
	r, err := newReader(opts.NetNSFD)
	if err != nil {
		b.Close()
		return nil, err
	}
	// A table of nftgate's names that is not nftgate's stops it here,
	// before it changes anything.
	if err := r.checkOwnership(&cfg); err != nil {
		r.Close()
		b.Close()
		return nil, err
	}
	p := &Programmer{cfg: cfg, batch: b, reader: r, services: map[model.ServiceKey]*model.Service{}, claims: newClaimBook(),
		losses: map[model.ServiceKey]map[famElem]string{}}
	p.tables = newTableSet(&p.cfg)
	p.tables.refuse = opts.RefuseForTest
	p.staticChains = map[string]bool{}
	for _, fr := range p.tables.static {
		for _, c := range fr.Chains {
			p.staticChains[c.Name] = true
		}
	}
	return p, nil
}

// Close closes the sockets. The rules stay in the kernel.
func (p *Programmer) Close() error {
	p.reader.Close()
	return p.batch.Close()
}

// Totals counts what nftgate's tables hold, as of the last sync.
type Totals struct{ Chains, Rules, Elements int }

// Totals returns the size of the programmed ruleset.
func (p *Programmer) Totals() Totals {
	p.mu.Lock()
	defer p.mu.Unlock()
	var t Totals
	for _, st := range p.state {
		if st == nil {
			continue
		}
		t.Chains += len(st.chains)
		t.Elements += len(st.elems)
		for _, c := range st.chains {
			t.Rules += int(c.rules)
		}
	}
	return t
}

// Config returns the ruleset configuration.
func (p *Programmer) Config() Config { return p.cfg }

// Full brings the kernel to exactly the given Services: it reads the tables
// back, repairs whatever differs (someone deleted the table, flushed a chain,
// edited an element), removes everything stale, and records the result. The
// first sync after start is a Full one: rules already in place from an
// earlier run are left untouched where they are right.
func (p *Programmer) Full(services map[model.ServiceKey]*model.Service) (Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	res := Result{Full: true}

	// Every full sync reads chains, sets and elements, and the rules of
	// the skeleton's chains and of one eighth of the others, in turn: a
	// hand edit of a Service's rule is found within eight reconciles, any
	// other drift at once, and then everything is read for an exact repair.
	p.reconciles++
	sampled := func(chain string) bool {
		if p.staticChains[chain] {
			return true
		}
		h := fnv.New32a()
		h.Write([]byte(chain))
		return h.Sum32()%reconcileRounds == p.reconciles%reconcileRounds
	}
	if p.synced && p.genKnown {
		if g, err := p.batch.generation(); err == nil && g == p.generation {
			// Nothing was committed since nftgate's last transaction:
			// the kernel holds what nftgate believes, without reading it.
			res, err := p.partialLocked(start, res, changedServices(p.services, services))
			if err == nil {
				res.Conflicts = p.claims.conflicts()
			}
			return res, err
		}
	}
	res.ReadBack = true
	observed, drop, err := p.observe(&res, p.synced, sampled)
	if err != nil {
		return res, err
	}

	if p.synced && len(res.Drift) == 0 {
		// The kernel holds what nftgate believes: only the Services that
		// changed since the last sync need planning, as in a partial sync.
		// Rendering all of them again is most of a full sync's cost, and
		// would change nothing.
		res, err := p.partialLocked(start, res, changedServices(p.services, services))
		if err == nil {
			res.Conflicts = p.claims.conflicts()
		}
		return res, err
	}

	ds, claims, conflicts := planFull(&p.cfg, p.tables, observed, services)
	res.Conflicts = conflicts

	n, kernel, err := p.commit(ds, drop)
	res.Messages, res.Kernel = n, kernel
	var be *BatchError
	if errors.As(err, &be) {
		err = p.fullIsolating(&res, observed, drop, recreates(ds), services, be)
		res.Duration = time.Since(start)
		return res, err
	}
	res.Duration = time.Since(start)
	if err != nil {
		return res, err
	}
	p.committedFull(&res, ds, observed, claims, services)
	return res, nil
}

// committedFull records a full sync's plan that the kernel accepted.
func (p *Programmer) committedFull(res *Result, ds []*differ, observed []*tableState, claims *claimBook, services map[model.ServiceKey]*model.Service) {
	for slot, d := range ds {
		observed[slot].apply(&d.ops)
		res.Counts.add(&d.ops)
	}
	p.state = observed
	p.claims = claims
	res.ServiceConflicts = p.rebuildLosses()
	p.services = cloneServices(services)
	p.synced = true
}

// observe reads nftgate's tables back: what each holds, and the shard
// tables of another shard count, to drop. With believe, the rules of the
// chains sampled does not pick are taken to be what nftgate committed,
// unless the kernel is found to have drifted; differences are added to
// res.Drift.
func (p *Programmer) observe(res *Result, believe bool, sampled func(string) bool) ([]*tableState, []tableRef, error) {
	observed := make([]*tableState, len(p.tables.refs))
	var drop []tableRef
	for _, f := range Families {
		slots := p.tables.slots(f)
		var believed []*tableState
		if believe {
			believed = p.state[slots[0] : slots[len(slots)-1]+1]
		}
		sts, extra, err := p.reader.readFamily(&p.cfg, f, p.tables.names(f), believed, sampled)
		if err == nil && believed != nil {
			var drift []string
			for i, slot := range slots {
				drift = append(drift, compareStates(p.tables.refs[slot], believed[i], sts[i])...)
			}
			if len(drift) > 0 {
				res.Drift = append(res.Drift, drift...)
				sts, extra, err = p.reader.readFamily(&p.cfg, f, p.tables.names(f), nil, nil)
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read %s tables back: %w", f, err)
		}
		for i, slot := range slots {
			observed[slot] = sts[i]
		}
		for _, name := range extra {
			drop = append(drop, tableRef{f: f, name: name})
			res.Drift = append(res.Drift, fmt.Sprintf("%s table %s is from another shard count: deleted", f, name))
		}
	}
	return observed, drop, nil
}

// planFull decides everything a full sync changes: the tables must hold
// the skeleton and every Service, and nothing else. It is pure: observed is
// what the kernel holds, per table of ts (an empty state for a cold start).
func planFull(cfg *Config, ts *tableSet, observed []*tableState, services map[model.ServiceKey]*model.Service) ([]*differ, *claimBook, []string) {
	book := newClaimBookSized(len(services))
	claims := book.verdicts
	keys := make([]model.ServiceKey, 0, len(services))
	for k := range services {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })

	ds := make([]*differ, len(ts.refs))
	for slot, ref := range ts.refs {
		d := newDiffer(ref.f, observed[slot])
		d.ops.createTable = !observed[slot].exists
		d.ops.replaceTable = observed[slot].replace
		st := &ts.static[slot]
		for _, s := range st.Sets {
			d.set(s.Name, s)
		}
		for _, c := range st.Chains {
			d.chain(c.Name, c)
		}
		ds[slot] = d
	}
	rendered := renderAll(ts, keys, services)
	for i, k := range keys {
		svc := services[k]
		r := &rendered[i].ByFamily
		for fi, f := range Families {
			fr := r.Of(f)
			main, shard := ds[ts.main(f)], ds[ts.shard(f, k)]
			for _, s := range fr.Sets {
				shard.set(s.Name, s)
			}
			for j, c := range fr.Chains {
				if mainChain(c.Name) {
					main.plannedChain(c.Name, &rendered[i].plans[fi][j])
				} else {
					shard.plannedChain(c.Name, &rendered[i].plans[fi][j])
				}
			}
			for _, e := range fr.Elements {
				if plainSet(e.Map) {
					book.plain[famElem{f, e.ID()}]++
				} else {
					addClaim(claims, famElem{f, e.ID()}, claim{svc: k, created: svc.Created, verdict: e.Verdict})
				}
			}
		}
	}
	var conflictList []string
	for fe, cs := range claims {
		w := cs.winner()
		ds[ts.elem(fe, w.svc)].element(fe.id, &w.verdict)
		conflictList = append(conflictList, conflicts(fe, *cs)...)
	}
	for fe := range book.plain {
		ds[ts.main(fe.f)].element(fe.id, &Verdict{})
	}
	// wanted tells whether an element belongs in the table of slot.
	wanted := func(slot int, fe famElem) bool {
		if _, ok := book.plain[fe]; ok {
			return slot == ts.main(fe.f)
		}
		if cs, ok := claims[fe]; ok {
			return slot == ts.elem(fe, cs.winner().svc)
		}
		return false
	}
	for slot, d := range ds {
		for name := range d.state.chains {
			d.chain(name, nil)
		}
		for name := range d.state.sets {
			d.set(name, nil)
		}
		for id := range d.state.elems {
			if !wanted(slot, famElem{d.f, id}) {
				d.element(id, nil)
			}
		}
	}
	sort.Strings(conflictList)
	sortOps(ds)
	return ds, book, conflictList
}

// renderedService is a Service's fragments with their chains' plans.
type renderedService struct {
	ByFamily
	plans [2][]chainPlan // per family, per chain of the fragment
}

// renderAll renders the Services of keys and fingerprints their chains'
// rules: a pure function of each Service, and most of what planning a full
// sync costs, so it runs on every CPU.
func renderAll(ts *tableSet, keys []model.ServiceKey, services map[model.ServiceKey]*model.Service) []renderedService {
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
					rs.ByFamily = ts.render(services[keys[i]])
					for fi, f := range Families {
						chains := rs.Of(f).Chains
						if len(chains) == 0 {
							continue
						}
						rs.plans[fi] = make([]chainPlan, len(chains))
						for j, c := range chains {
							rs.plans[fi][j] = planChain(f, c, &scratch)
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// Partial applies the changed Services (nil for a deleted one) on top of the
// last sync, sending only what differs. It needs one Full sync first.
func (p *Programmer) Partial(changes map[model.ServiceKey]*model.Service) (Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.synced {
		return Result{}, errors.New("nft: partial sync before the first full sync")
	}
	return p.partialLocked(time.Now(), Result{}, changes)
}

// changedServices lists the Services of want that differ from programmed
// (by pointer: the caller passes the same *model.Service for a Service
// that did not change), and those gone from it, as nil.
func changedServices(programmed, want map[model.ServiceKey]*model.Service) map[model.ServiceKey]*model.Service {
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

func (p *Programmer) partialLocked(start time.Time, res Result, changes map[model.ServiceKey]*model.Service) (Result, error) {
	err, isolatable := p.attempt(&res, changes)
	if isolatable {
		// The kernel refused this batch, and nothing else changed the
		// ruleset since nftgate's last transaction: the refusal is of
		// what these changes ask for. Everything else is programmed.
		var be *BatchError
		errors.As(err, &be)
		refused := map[model.ServiceKey]string{}
		err = p.isolate(&res, changes, be, refused)
		if len(refused) > 0 {
			res.Refused = refused
		}
	}
	res.Duration = time.Since(start)
	return res, err
}

// attempt plans and commits one partial sync. When the kernel refuses the
// batch, nothing changes, in the kernel or in p; isolatable then tells
// whether the refusal can only be of these changes: no other program
// committed since nftgate's last transaction, and nftgate's record of the
// kernel still holds.
func (p *Programmer) attempt(res *Result, changes map[model.ServiceKey]*model.Service) (err error, isolatable bool) {
	ds, undo, conflicts := planPartial(&p.cfg, p.tables, p.state, p.claims, p.services, changes)
	res.Conflicts = conflicts

	n, kernel, err := p.commit(ds, nil)
	res.Messages += n
	res.Kernel += kernel
	if err != nil {
		for fe, cs := range undo.verdicts {
			if cs == nil {
				delete(p.claims.verdicts, fe)
			} else {
				p.claims.verdicts[fe] = cs
			}
		}
		for fe, n := range undo.plain {
			if n == 0 {
				delete(p.claims.plain, fe)
			} else {
				p.claims.plain[fe] = n
			}
		}
		if recreates(ds) {
			// Planning a set's recreation forgot its elements: only a
			// read-back knows the kernel again.
			p.genKnown = false
		}
		var be *BatchError
		return err, errors.As(err, &be) && p.genKnown
	}
	for slot, d := range ds {
		p.state[slot].apply(&d.ops)
		res.Counts.add(&d.ops)
	}
	// Isolation commits in several attempts: their changes add up.
	for k, c := range p.updateLosses(undo.verdicts) {
		if res.ServiceConflicts == nil {
			res.ServiceConflicts = map[model.ServiceKey][]string{}
		}
		res.ServiceConflicts[k] = c
	}
	for k, svc := range changes {
		if svc == nil {
			delete(p.services, k)
		} else {
			p.services[k] = svc
		}
	}
	return nil, false
}

// planPartial decides what changing some Services changes in the tables,
// given what is programmed. It updates claims in place and returns, for
// each element it touched, the claims as they were (nil where there were
// none), so that a refused batch can be undone.
func planPartial(cfg *Config, ts *tableSet, state []*tableState, book *claimBook, programmed, changes map[model.ServiceKey]*model.Service) ([]*differ, *claimBook, []string) {
	claims := book.verdicts
	var conflictList []string
	ds := make([]*differ, len(ts.refs))
	for slot, ref := range ts.refs {
		ds[slot] = newDiffer(ref.f, state[slot])
	}
	undo := map[famElem]*claimSet{}
	undoPlain := map[famElem]int32{}
	count := func(fe famElem, delta int32) {
		n, ok := book.plain[fe]
		if _, seen := undoPlain[fe]; !seen {
			undoPlain[fe] = n
		}
		if !ok && delta < 0 {
			return
		}
		if n += delta; n > 0 {
			book.plain[fe] = n
		} else {
			delete(book.plain, fe)
		}
	}
	touch := func(fe famElem) {
		if _, ok := undo[fe]; !ok {
			if cs, ok := claims[fe]; ok {
				c := append(claimSet(nil), *cs...)
				undo[fe] = &c
			} else {
				undo[fe] = nil
			}
		}
	}
	for k, svc := range changes {
		var oldR, newR ByFamily
		if old := programmed[k]; old != nil {
			oldR = ts.render(old)
		}
		if svc != nil {
			newR = ts.render(svc)
		}
		for _, f := range Families {
			main, shard := ds[ts.main(f)], ds[ts.shard(f, k)]
			in := func(chain string) *differ {
				if mainChain(chain) {
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
				if !newChains[c.Name] {
					in(c.Name).chain(c.Name, nil)
				}
			}
			newSets := make(map[string]bool, len(n.Sets))
			for _, s := range n.Sets {
				newSets[s.Name] = true
				shard.set(s.Name, s)
			}
			for _, s := range o.Sets {
				if !newSets[s.Name] {
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
				addClaim(claims, fe, claim{svc: k, created: svc.Created, verdict: e.Verdict})
			}
		}
	}
	for fe := range undo {
		want := -1
		if cs, ok := claims[fe]; ok {
			w := cs.winner()
			want = ts.elem(fe, w.svc)
			ds[want].element(fe.id, &w.verdict)
			conflictList = append(conflictList, conflicts(fe, *cs)...)
		}
		// The element leaves every other table it may be in: a shard
		// map's element moves when another Service's claim wins it.
		for _, slot := range ts.holders(fe) {
			if slot != want {
				ds[slot].element(fe.id, nil)
			}
		}
	}
	for fe := range undoPlain {
		d := ds[ts.main(fe.f)]
		if book.plain[fe] > 0 {
			d.element(fe.id, &Verdict{})
		} else {
			d.element(fe.id, nil)
		}
	}
	sortOps(ds)
	return ds, &claimBook{verdicts: undo, plain: undoPlain}, conflictList
}

// commit encodes the operations of every table, and the deletion of the
// tables in drop, into one batch and sends it. It returns the number of
// messages and how long the kernel took to answer.
func (p *Programmer) commit(ds []*differ, drop []tableRef) (int, time.Duration, error) {
	w, err := encodeBatch(p.tables, ds, drop, false)
	if err != nil {
		return 0, 0, err
	}
	defer w.release()
	// A refused batch is encoded again, with notes, to name the messages
	// the kernel refused: the encoding is deterministic.
	describe := func() []note {
		d, err := encodeBatch(p.tables, ds, drop, true)
		if err != nil {
			return nil
		}
		return d.notes()
	}
	if w.count() == 0 {
		return 0, 0, nil
	}
	before, genErr := p.batch.generation()
	known := p.genKnown && genErr == nil && before == p.generation
	p.genKnown = false
	start := time.Now()
	err = p.batch.send(w, describe)
	took := time.Since(start)
	if genErr == nil {
		after, aerr := p.batch.generation()
		switch {
		case aerr != nil:
		case err == nil && after == before+1:
			p.generation, p.genKnown = after, true
		case err != nil && known && after == before:
			// A refused batch commits nothing: nftgate's record of the
			// kernel still holds.
			p.genKnown = true
		}
	}
	return w.count(), took, err
}

// Cleanup deletes nftgate's tables (the main table and every service
// shard, whatever their count), and with them everything nftgate made.
// Tables of those names that nftgate did not make are left as they are: the
// error then names them.
func Cleanup(table string, opts Options) error {
	b, err := dialBatch(opts.NetNSFD)
	if err != nil {
		return err
	}
	defer b.Close()
	r, err := newReader(opts.NetNSFD)
	if err != nil {
		return err
	}
	defer r.Close()
	cfg := Config{Table: table}
	var drop []tableRef
	var left []string
	for _, f := range Families {
		own, foreign, err := r.owned(&cfg, f)
		if err != nil {
			return err
		}
		for name := range own {
			drop = append(drop, tableRef{f, name})
		}
		for _, name := range foreign {
			left = append(left, fmt.Sprintf("%s %s", f, name))
		}
	}
	sort.Slice(drop, func(i, j int) bool {
		if drop[i].f != drop[j].f {
			return drop[i].f < drop[j].f
		}
		return drop[i].name < drop[j].name
	})
	if len(drop) > 0 {
		w, err := encodeBatch(&tableSet{}, nil, drop, true)
		if err != nil {
			return err
		}
		if err := b.send(w, w.notes); err != nil {
			return err
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left in place, not made by nftgate (no %q comment): table %s", TableComment, strings.Join(left, ", table "))
	}
	return nil
}

func familyIndex(f Family) int {
	if f == IPv6 {
		return 1
	}
	return 0
}

func addClaim(m map[famElem]*claimSet, fe famElem, c claim) {
	cs, ok := m[fe]
	if !ok {
		cs = &claimSet{}
		m[fe] = cs
	}
	for _, x := range *cs {
		if x.svc == c.svc {
			return // a Service listing the same key twice keeps its first
		}
	}
	*cs = append(*cs, c)
}

func removeClaim(m map[famElem]*claimSet, fe famElem, svc model.ServiceKey) {
	cs, ok := m[fe]
	if !ok {
		return
	}
	out := (*cs)[:0]
	for _, x := range *cs {
		if x.svc != svc {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		delete(m, fe)
		return
	}
	*cs = out
}

func conflicts(fe famElem, cs claimSet) []string {
	var out []string
	for _, l := range losses(fe, cs) {
		out = append(out, fmt.Sprintf("service %s: %s", l.svc, l.why))
	}
	return out
}

// loss is a Service's claim on an element that another Service won.
type loss struct {
	svc model.ServiceKey
	why string
}

// losses lists the claims of cs that lose fe to the winner's.
func losses(fe famElem, cs claimSet) []loss {
	if len(cs) < 2 {
		return nil
	}
	w := cs.winner()
	same := true
	for _, c := range cs {
		same = same && c.verdict == w.verdict
	}
	if same {
		return nil // Services agreeing on an element (shared endpoints) is no conflict
	}
	var out []loss
	for _, c := range cs {
		if c.svc != w.svc {
			out = append(out, loss{c.svc, fmt.Sprintf("%s %s in %s is already used by service %s, which keeps it as the older Service (by creation time, then namespace/name)",
				fe.f, fe.id.Key, fe.id.Map, w.svc)})
		}
	}
	return out
}

// lossList is one Service's losses, sorted.
func lossList(m map[famElem]string) []string {
	out := make([]string, 0, len(m))
	for _, why := range m {
		out = append(out, why)
	}
	sort.Strings(out)
	return out
}

// updateLosses brings p.losses up to date for the elements a partial
// sync touched (before holds their claims as they were; nil where there
// were none) and returns the conflicts of the Services whose conflicts
// changed.
func (p *Programmer) updateLosses(before map[famElem]*claimSet) map[model.ServiceKey][]string {
	was := map[model.ServiceKey][]string{}
	note := func(cs *claimSet) {
		if cs == nil {
			return
		}
		for _, c := range *cs {
			if _, ok := was[c.svc]; !ok {
				was[c.svc] = lossList(p.losses[c.svc])
			}
		}
	}
	for fe, old := range before {
		note(old)
		note(p.claims.verdicts[fe])
	}
	if len(was) == 0 {
		return nil
	}
	for fe, old := range before {
		if old != nil {
			for _, c := range *old {
				if m := p.losses[c.svc]; m != nil {
					delete(m, fe)
					if len(m) == 0 {
						delete(p.losses, c.svc)
					}
				}
			}
		}
		if cs := p.claims.verdicts[fe]; cs != nil {
			for _, l := range losses(fe, *cs) {
				m := p.losses[l.svc]
				if m == nil {
					m = map[famElem]string{}
					p.losses[l.svc] = m
				}
				m[fe] = l.why
			}
		}
	}
	var changed map[model.ServiceKey][]string
	for k, old := range was {
		if now := lossList(p.losses[k]); !slices.Equal(old, now) {
			if changed == nil {
				changed = map[model.ServiceKey][]string{}
			}
			changed[k] = now
		}
	}
	return changed
}

// rebuildLosses makes p.losses anew from p.claims, after a full sync
// planned every element, and returns the conflicts of the Services whose
// conflicts changed.
func (p *Programmer) rebuildLosses() map[model.ServiceKey][]string {
	next := map[model.ServiceKey]map[famElem]string{}
	for fe, cs := range p.claims.verdicts {
		for _, l := range losses(fe, *cs) {
			m := next[l.svc]
			if m == nil {
				m = map[famElem]string{}
				next[l.svc] = m
			}
			m[fe] = l.why
		}
	}
	var changed map[model.ServiceKey][]string
	diff := func(k model.ServiceKey) {
		if now := lossList(next[k]); !slices.Equal(lossList(p.losses[k]), now) {
			if changed == nil {
				changed = map[model.ServiceKey][]string{}
			}
			changed[k] = now
		}
	}
	for k := range next {
		diff(k)
	}
	for k := range p.losses {
		if _, ok := next[k]; !ok {
			diff(k)
		}
	}
	p.losses = next
	return changed
}

// sortOps makes batches deterministic, which keeps them comparable in tests
// and logs.
func sortOps(ds []*differ) {
	byName := func(a, b chainPlan) int { return strings.Compare(a.chain.Name, b.chain.Name) }
	elems := func(a, b Element) int {
		if c := strings.Compare(a.Map, b.Map); c != 0 {
			return c
		}
		return a.Key.compare(b.Key)
	}
	for _, d := range ds {
		o := &d.ops
		slices.SortFunc(o.addChains, byName)
		slices.SortFunc(o.rewriteChains, byName)
		slices.Sort(o.flushChains)
		slices.Sort(o.delChains)
		slices.Sort(o.delSets)
		slices.SortFunc(o.addSets, func(a, b *Set) int { return strings.Compare(a.Name, b.Name) })
		slices.SortFunc(o.addElems, elems)
		slices.SortFunc(o.delElems, elems)
	}
}

func cloneServices(m map[model.ServiceKey]*model.Service) map[model.ServiceKey]*model.Service {
	out := make(map[model.ServiceKey]*model.Service, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// compareStates describes how the kernel's table differs from what nftgate
// last committed.
func compareStates(t tableRef, want, got *tableState) []string {
	if want == nil {
		return nil
	}
	f := t.f
	if want.exists && !got.exists {
		return []string{fmt.Sprintf("%s table %s is missing", f, t.name)}
	}
	var out []string
	missing, changed, extra := 0, 0, 0
	for n, c := range want.chains {
		g, ok := got.chains[n]
		switch {
		case !ok:
			missing++
		case g.fp != c.fp:
			changed++
		}
	}
	for n := range got.chains {
		if _, ok := want.chains[n]; !ok {
			extra++
		}
	}
	if missing+changed+extra > 0 {
		out = append(out, fmt.Sprintf("%s %s chains: %d missing, %d with changed rules, %d unknown", f, t.name, missing, changed, extra))
	}
	missing, changed, extra = 0, 0, 0
	for id, v := range want.elems {
		g, ok := got.elems[id]
		switch {
		case !ok:
			missing++
		case g != v:
			changed++
		}
	}
	for id := range got.elems {
		if _, ok := want.elems[id]; !ok {
			extra++
		}
	}
	if missing+changed+extra > 0 {
		out = append(out, fmt.Sprintf("%s %s map elements: %d missing, %d changed, %d unknown", f, t.name, missing, changed, extra))
	}
	missing = 0
	for n := range want.sets {
		if _, ok := got.sets[n]; !ok {
			missing++
		}
	}
	if missing > 0 {
		out = append(out, fmt.Sprintf("%s %s sets: %d missing", f, t.name, missing))
	}
	return out
}
