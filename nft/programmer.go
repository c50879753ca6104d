package nft

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Programmer keeps nftgate's tables in the kernel equal to the desired
// ruleset. Every sync is one netlink batch: the kernel applies all of it or
// none of it, and the Programmer's own record of the kernel changes only
// when the kernel accepted the batch. The one exception is a full sync
// onto no tables (a cold start, or a repair after every table was
// deleted), which commits shard by shard (see Full and commitEach).
type Programmer struct {
	mu       sync.Mutex
	cfg      ruleset.Config
	streamed func() // Options.Streamed
	tables   *ruleset.Tables
	batch    *batchConn
	reader   *reader

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
	state        []*ruleset.TableState // per table of p.tables
	// rules counts the rules of state, kept up to date by partial syncs
	// for Totals: counting them walks every chain. rulesOf is the state
	// the count is of (its first table's); any other is counted afresh.
	rules    int
	rulesOf  *ruleset.TableState
	services map[model.ServiceKey]*model.Service // as programmed
	claims   *ruleset.Claims
	// changes counts the times services or claims may have changed: the
	// counters' index of destinations, made from them, is made again
	// only when it moved.
	changes uint64
	// trusted tells whether nftgate's record of its tables (state) is
	// what the kernel holds, as far as nftgate's own transactions go: it
	// is not after a batch whose fate is unknown, or whose planning
	// forgot elements, until a read-back.
	trusted bool
	// partway tells that state is not the record of services, but what a
	// full sync onto no tables committed before it stopped: the one
	// before it was dropped when it began (a record of tables another
	// program deleted, as large as the new one). The next full sync reads
	// every table back and plans every Service.
	partway bool
	// watch is what the kernel's notifications told (Watch), and
	// readDrifts its count of drifts when the tables were last read back.
	watch      *watchState
	readDrifts uint64
	netnsFD    int
	ownTables  map[tableRef]bool
	refuse     func(*model.Service) bool // Options.RefuseForTest
	// chooseShards is Options.ChooseShards; chosen tells that the first
	// full sync has chosen, and inPlace is the shard count of the tables
	// in the kernel before it.
	chooseShards func(services, inPlace int) int
	chosen       bool
	inPlace      int
	counters     counterCache
	// destroy tells whether the kernel destroys set elements (probed at
	// the first full sync, when traffic is counted): a partial sync then
	// deletes the traffic elements of the destinations it removes.
	destroy, destroyProbed bool
	// forgotten is what partial syncs removed since the counters were
	// last read (forget.go).
	forgotten forgotten
	// bisectOnly makes isolation ignore what the refused messages name,
	// for tests of the bisection.
	bisectOnly bool
	// mutedSend, when set, runs while the notification socket is out of
	// the group, before the batch is sent: tests commit another
	// program's transaction there.
	mutedSend func()
	// failSend, when set, runs before each batch is sent; an error it
	// returns is the send's, as when a batch is lost on its way (tests of
	// what a failed sync leaves).
	failSend func() error
	// beforeReceive, when set, runs before each read of the
	// notification socket: tests hold the watcher there.
	beforeReceive func()
	// homes are the elements of the maps of homes and the flags of a
	// dead peer (SetMidstreamElements); homesDue tells that the next
	// batch writes them.
	homes    []ruleset.Element
	homesDue bool
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
	// Streamed, when set, is called when a full sync goes onto no tables
	// (a cold start, the repair after nft flush ruleset), from the
	// goroutine calling Full: it holds one shard's rules at a time, not
	// the whole ruleset, so a memory limit lifted for the full sync can be
	// put back.
	Streamed func()
	// ChooseShards, when set, chooses the shard count (cfg.Shards is
	// then ignored) at the first full sync, from the number of Services
	// and the shard count of nftgate's tables already in the kernel (0
	// for none): ruleset.AutoShardCount. The layout then stays until the
	// process ends; every later full sync asks it again, with the count
	// in place, and tells the answer where it differs
	// (Result.ShardsWanted).
	ChooseShards func(services, inPlace int) int
}

// Result describes one sync.
type Result struct {
	Full     bool
	Counts   ruleset.Counts
	Messages int
	Duration time.Duration
	// Kernel is the part of Duration between sending the batch and the
	// kernel's answer: nf_tables checking and applying it.
	Kernel time.Duration
	// Shards is the shard count of the tables a full sync programmed.
	Shards int
	// ShardsWanted, for a full sync after the first with
	// Options.ChooseShards, is the count it would choose now from the
	// Services and the tables in place, when that is not theirs: the
	// layout stays until the process ends, so a restart would move to it.
	ShardsWanted int
	// FirstServed, for a full sync onto no tables (a cold start, the
	// repair after nft flush ruleset), is when its first shard was in the
	// kernel, since the sync started: the Services of the busiest shard
	// were served from then on.
	FirstServed time.Duration
	// Drift describes how the kernel differed from what nftgate had
	// programmed, when a full sync found it changed behind its back.
	Drift []string
	// ReadBack tells whether a full sync read the tables back. It does
	// not when no transaction has been committed since nftgate's last.
	ReadBack bool
	// ReadTables is how many tables a read-back read: every table, or
	// those another program changed, as the kernel's notifications
	// named them.
	ReadTables int
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
func NewProgrammer(cfg ruleset.Config, opts Options) (*Programmer, error) {
	if cfg.Table == "" {
		return nil, errors.New("nft: table name is empty")
	}
	if cfg.MasqueradeBit == 0 {
		cfg.MasqueradeBit = ruleset.DefaultMasqueradeBit
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
	// widest is the layout of every table nftgate may program: with the
	// shard count chosen later (ChooseShards), every shard count's.
	widest := cfg
	if opts.ChooseShards != nil {
		widest.Shards = ruleset.MaxShards
	}
	// A table of nftgate's names that is not nftgate's stops it here,
	// before it changes anything.
	inPlace, err := r.checkOwnership(&widest)
	if err != nil {
		r.Close()
		b.Close()
		return nil, err
	}
	p := &Programmer{cfg: cfg, batch: b, reader: r, services: map[model.ServiceKey]*model.Service{}, claims: ruleset.NewClaims(),
		watch: newWatchState(), netnsFD: opts.NetNSFD, ownTables: map[tableRef]bool{}, streamed: opts.Streamed,
		refuse: opts.RefuseForTest, chooseShards: opts.ChooseShards, inPlace: inPlace}
	if p.chooseShards != nil {
		// Until the first full sync chooses, the layout of the tables
		// in place, if any.
		p.cfg.Shards = cmp.Or(p.inPlace, ruleset.DefaultShards)
	}
	p.lay()
	// The tables of every layout it may have are nftgate's, for the
	// notifications: those of the layout chosen, and those of another
	// left from an earlier run, which the first full sync drops.
	own := ruleset.NewTables(&widest)
	for _, f := range ruleset.Families {
		for _, n := range own.Names(f) {
			p.ownTables[tableRef{f, n}] = true
		}
	}
	p.staticChains = map[string]bool{}
	for _, fr := range p.tables.Skeletons {
		for _, c := range fr.Chains {
			p.staticChains[c.Name] = true
		}
	}
	return p, nil
}

// lay lays the tables out for p.cfg.Shards shards.
func (p *Programmer) lay() {
	p.tables = ruleset.NewTables(&p.cfg)
	p.tables.Refuse = p.refuse
}

// chooseLayout, before the first full sync of services, chooses the shard
// count when Options.ChooseShards asks to. Before every later full sync it
// asks again, with the count in place, and returns the answer when it
// differs (Result.ShardsWanted), 0 otherwise: the layout stays.
func (p *Programmer) chooseLayout(services int) (wanted int) {
	if p.chooseShards == nil {
		return 0
	}
	inPlace := p.inPlace
	if p.chosen {
		inPlace = p.cfg.ShardCount()
	}
	n := min(max(p.chooseShards(services, inPlace), 1), ruleset.MaxShards)
	switch {
	case p.chosen && n != inPlace:
		return n
	case !p.chosen && n != p.cfg.Shards:
		p.cfg.Shards = n
		p.lay()
	}
	p.chosen = true
	return 0
}

// Close closes the sockets. The rules stay in the kernel.
func (p *Programmer) Close() error {
	p.reader.Close()
	c := &p.counters
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
	c.read.Lock()
	if c.reader != nil {
		c.reader.Close()
		c.reader = nil
	}
	c.read.Unlock()
	return p.batch.Close()
}

// Totals counts what nftgate's tables hold, as of the last sync.
type Totals struct{ Chains, Rules, Elements int }

// Totals returns the size of the programmed ruleset.
func (p *Programmer) Totals() Totals {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.state) == 0 || p.state[0] == nil {
		return Totals{}
	}
	if p.rulesOf != p.state[0] {
		p.rules, p.rulesOf = 0, p.state[0]
		for _, st := range p.state {
			if st == nil {
				continue
			}
			for _, c := range st.Chains {
				p.rules += int(c.Rules)
			}
		}
	}
	t := Totals{Rules: p.rules}
	for _, st := range p.state {
		if st == nil {
			continue
		}
		t.Chains += len(st.Chains)
		t.Elements += st.Elems.Len() + st.Picks.Elements()
	}
	return t
}

// Config returns the ruleset configuration, with the shard count chosen
// (Options.ChooseShards) once the first full sync has begun.
func (p *Programmer) Config() ruleset.Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// Full brings the kernel to exactly the given Services: it reads the tables
// back, repairs whatever differs (someone deleted the table, flushed a chain,
// edited an element), removes everything stale, and records the result. The
// first sync after start is a Full one: rules already in place from an
// earlier run are left untouched where they are right.
func (p *Programmer) Full(services map[model.ServiceKey]*model.Service) (Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	res, err := p.full(services)
	if err == nil && len(p.homes) > 0 && (res.ReadBack || res.Counts.SetsAdded > 0) {
		// The maps of homes and flags may be new (read back: another
		// program changed the tables; or made anew): their elements
		// again.
		p.homesDue = true
	}
	if err == nil && p.homesDue {
		if err = p.writeHomes(); err != nil {
			// Due still: the next full sync tries again.
			err = fmt.Errorf("the midstream elements written at run time (%s, %s): %w", ruleset.MapMidstreamHomes, ruleset.SetMidstreamPeerDead, err)
		}
	}
	return res, err
}

func (p *Programmer) full(services map[model.ServiceKey]*model.Service) (Result, error) {
	start := time.Now()
	wanted := p.chooseLayout(len(services))
	res := Result{Full: true, Shards: p.cfg.ShardCount(), ShardsWanted: wanted}
	if !p.destroyProbed && p.countsTraffic() {
		// A probe that fails otherwise than for want of the message
		// costs the counts of a reused address at most, not the sync.
		ok, _ := canDestroy(p.netnsFD, fmt.Sprintf("%s-%d", probeTableName(), probeSeq.Add(1)))
		p.destroy, p.destroyProbed = ok, true
	}

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
	// targeted: the notifications name every table another program
	// changed since the last read-back, up to generation gen, and none
	// were lost: only those tables are read back.
	targeted, gen := false, uint32(0)
	believe := p.synced && !p.partway
	if believe {
		drifts := p.watch.snapshot()
		g, err := p.batch.generation()
		// Nothing was committed since nftgate's last transaction, or the
		// kernel's notifications say no other program touched nftgate's
		// tables since they were last read: the kernel holds what
		// nftgate believes, without reading it.
		quiet := err == nil && p.genKnown && g == p.generation
		if quiet {
			p.readDrifts = drifts
			// What the notifications said of the transactions up to
			// g (a loss announced late, after the last read-back)
			// is covered: the kernel held nftgate's tables at g.
			p.watch.settle(g)
		} else if err == nil && p.trusted && p.watch.quietSince(p.readDrifts, g, watchCatchUp) {
			quiet = true
			p.generation, p.genKnown = g, true
		}
		if quiet {
			res, err := p.partialLocked(start, res, ruleset.ChangedServices(p.services, services))
			if err == nil {
				res.Conflicts = p.claims.Conflicts()
			}
			return res, err
		}
		targeted = err == nil && p.trusted && p.watch.caughtUp(g, watchCatchUp, nil)
		gen = g
	}
	res.ReadBack = true
	var only map[tableRef]bool
	var elems bool
	p.readDrifts, only, elems = p.watch.readBack(targeted)
	p.genKnown = false
	g, genErr := p.batch.generation()
	if only != nil {
		// Every other program's transaction up to gen is in only; one
		// after it may not be, and must not count as read.
		g = gen
	}
	if elems {
		return p.restoreElems(start, res, only, gen, services)
	}
	observed, drop, err := p.observe(&res, believe, sampled, only)
	if err != nil {
		if only != nil {
			// What the notifications named is consumed: read everything
			// next time.
			p.watch.update(p.watch.lost)
		}
		return res, err
	}
	res.ReadTables = len(p.tables.Refs)
	if only != nil {
		res.ReadTables = len(only)
	}
	// The tables as read are those of generation g or later: if the
	// kernel is still at g when nftgate commits next, nothing came between.
	p.generation, p.genKnown = g, genErr == nil

	if believe && len(res.Drift) == 0 {
		p.trusted = true
		// The kernel holds what nftgate believes: only the Services that
		// changed since the last sync need planning, as in a partial sync.
		// Rendering all of them again is most of a full sync's cost, and
		// would change nothing.
		res, err := p.partialLocked(start, res, ruleset.ChangedServices(p.services, services))
		if err == nil {
			res.Conflicts = p.claims.Conflicts()
		}
		return res, err
	}

	if len(drop) == 0 && !slices.ContainsFunc(observed, func(st *ruleset.TableState) bool { return st.Exists }) {
		// Onto no tables at all (a cold start, or a repair after another
		// program deleted every table: nft flush ruleset): nothing is
		// served, so nothing is lost by the tables arriving one after
		// another; the first Services are served after one table's
		// commit instead of the whole ruleset's, the busiest first, and
		// one shard's rules and batch are in memory at a time instead of
		// the whole ruleset's (commitEach).
		// After a flush, with no Service changed since the last sync,
		// which Service holds each element is known: the plan renders
		// each shard's Services only when it comes to them.
		var book *ruleset.Claims
		if p.synced && len(ruleset.ChangedServices(p.services, services)) == 0 {
			book = p.claims
		}
		if p.streamed != nil {
			p.streamed()
		}
		// The record of the tables is of tables that are gone: what
		// commitEach commits is recorded in observed, which takes its
		// place now instead of after the last shard.
		p.state, p.partway, p.trusted = observed, true, false
		fp := ruleset.NewFullPlan(&p.cfg, p.tables, observed, services, false, book)
		res.Conflicts = fp.Conflicts()
		err := p.commitEach(&res, start, fp, observed)
		if err == nil {
			res.Duration = time.Since(start)
			p.committedFull(&res, observed, fp.Claims(), services)
			return res, nil
		}
		// Some tables may be in: read them back, and sync as one batch,
		// with isolation of what the kernel refuses.
		res.Counts = ruleset.Counts{}
		if observed, drop, err = p.observe(&res, false, sampled, nil); err != nil {
			return res, err
		}
	}

	ds, claims, conflicts := ruleset.PlanFull(&p.cfg, p.tables, observed, services)
	res.Conflicts = conflicts
	n, kernel, err := p.commit(ds, drop, nil)
	res.Messages, res.Kernel = res.Messages+n, res.Kernel+kernel
	var be *BatchError
	if errors.As(err, &be) {
		err = p.fullIsolating(&res, observed, drop, ruleset.Recreates(ds), services, be)
		res.Duration = time.Since(start)
		return res, err
	}
	res.Duration = time.Since(start)
	if err != nil {
		return res, err
	}
	applyPlan(&res, ds, observed)
	p.committedFull(&res, observed, claims, services)
	return res, nil
}

// restoreElems repairs the tables in only, where another program
// changed map elements and nothing else (as the kernel's notifications
// told up to generation gen): it reads their elements back and puts them
// back as nftgate last committed them, without rendering anything, then
// syncs the Services that changed as a partial sync does.
func (p *Programmer) restoreElems(start time.Time, res Result, only map[tableRef]bool, gen uint32, services map[model.ServiceKey]*model.Service) (Result, error) {
	res.ReadTables = len(only)
	observed := slices.Clone(p.state)
	ds := make([]*ruleset.Ops, len(p.tables.Refs))
	for slot, ref := range p.tables.Refs {
		ds[slot] = &ruleset.Ops{}
		if !only[tableRef{ref.Family, ref.Name}] {
			continue
		}
		st, err := p.reader.readElems(&p.cfg, ref.Family, ref.Name, p.state[slot])
		if err != nil {
			p.watch.update(p.watch.lost)
			return res, fmt.Errorf("read %s table %s back: %w", ref.Family, ref.Name, err)
		}
		res.Drift = append(res.Drift, ruleset.CompareStates(ref, p.state[slot], st)...)
		observed[slot], ds[slot] = st, ruleset.PlanRestore(p.state[slot], st, func(id ruleset.ElemID) *ruleset.Pick {
			return p.tables.PickOf(p.claims, p.services, ref.Family, id)
		})
	}
	// The tables are as read and believed as of generation gen: if the
	// kernel is still at gen when this batch is committed, nothing came
	// between.
	p.generation, p.genKnown = gen, true
	n, kernel, err := p.commit(ds, nil, nil)
	res.Messages, res.Kernel = n, kernel
	if err != nil {
		// The next full sync reads every table back.
		p.trusted = false
		p.watch.update(p.watch.lost)
		res.Duration = time.Since(start)
		return res, err
	}
	for slot, o := range ds {
		observed[slot].Apply(o)
		res.Counts.Add(o)
	}
	p.state = observed
	res, err = p.partialLocked(start, res, ruleset.ChangedServices(p.services, services))
	if err == nil {
		res.Conflicts = p.claims.Conflicts()
	}
	return res, err
}

// applyPlan records in observed, and counts in res, operations the kernel
// accepted.
func applyPlan(res *Result, plan []*ruleset.Ops, observed []*ruleset.TableState) {
	for slot, o := range plan {
		observed[slot].Apply(o)
		res.Counts.Add(o)
	}
}

// committedFull records a full sync the kernel accepted: observed holds
// its plan applied (applyPlan).
func (p *Programmer) committedFull(res *Result, observed []*ruleset.TableState, claims *ruleset.Claims, services map[model.ServiceKey]*model.Service) {
	p.state = observed
	res.ServiceConflicts = claims.RebuildLosses(p.claims)
	p.claims = claims
	p.changes++
	if p.countsTraffic() {
		for k := range p.services {
			if services[k] == nil {
				p.forgotten.deleteService(k)
			}
		}
	}
	p.services = ruleset.CloneServices(services)
	p.synced, p.trusted, p.partway = true, true, false
}

// observe reads nftgate's tables back: what each holds, and the shard
// tables of another shard count, to drop. With believe, the rules of the
// chains sampled does not pick are taken to be what nftgate committed,
// unless the kernel is found to have drifted; differences are added to
// res.Drift. With only, just the tables it names are read: the others are
// taken to be what nftgate committed (believe must be set).
func (p *Programmer) observe(res *Result, believe bool, sampled func(string) bool, only map[tableRef]bool) ([]*ruleset.TableState, []ruleset.TableRef, error) {
	observed := make([]*ruleset.TableState, len(p.tables.Refs))
	var drop []ruleset.TableRef
	for _, f := range ruleset.Families {
		slots := p.tables.Slots(f)
		names := p.tables.Names(f)
		var believed []*ruleset.TableState
		if believe {
			believed = p.state[slots[0] : slots[len(slots)-1]+1]
		}
		var keep func(int) bool
		readRules := sampled
		if only != nil {
			// The tables another program changed are read in full.
			keep = func(i int) bool { return !only[tableRef{f, names[i]}] }
			readRules = func(string) bool { return true }
		}
		sts, extra, err := p.reader.readFamily(&p.cfg, f, names, believed, readRules, keep)
		if err == nil && believed != nil {
			var drift []string
			for i, slot := range slots {
				drift = append(drift, ruleset.CompareStates(p.tables.Refs[slot], believed[i], sts[i])...)
			}
			if len(drift) > 0 {
				res.Drift = append(res.Drift, drift...)
				if keep == nil {
					sts, extra, err = p.reader.readFamily(&p.cfg, f, names, nil, nil, nil)
				}
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read %s tables back: %w", f, err)
		}
		for i, slot := range slots {
			observed[slot] = sts[i]
		}
		for _, name := range extra {
			drop = append(drop, ruleset.TableRef{Family: f, Name: name})
			res.Drift = append(res.Drift, fmt.Sprintf("%s table %s is from another shard count: deleted", f, name))
		}
	}
	return observed, drop, nil
}

// Partial applies the changed Services (nil for a deleted one) on top of the
// last sync, sending only what differs. It needs one Full sync first.
func (p *Programmer) Partial(changes map[model.ServiceKey]*model.Service) (Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.synced {
		return Result{}, errors.New("nft: partial sync before the first full sync")
	}
	if p.partway {
		return Result{}, errors.New("nft: partial sync after a full sync that stopped part-way")
	}
	return p.partialLocked(time.Now(), Result{}, changes)
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
	p.changes++ // PlanPartial changes the claims, and Undo may put them back
	ds, undo, conflicts := ruleset.PlanPartial(&p.cfg, p.tables, p.state, p.claims, p.services, changes)
	res.Conflicts = conflicts
	var forget []trafficKey
	if p.destroy {
		forget = removedTraffic(p.services, changes)
	}

	n, kernel, err := p.commit(ds, nil, forget)
	res.Messages += n
	res.Kernel += kernel
	if err != nil {
		p.claims.Undo(undo)
		if ruleset.Recreates(ds) {
			// Planning a set's recreation forgot its elements: only a
			// read-back knows the kernel again.
			p.genKnown, p.trusted = false, false
		}
		var be *BatchError
		return err, errors.As(err, &be) && p.genKnown
	}
	for slot, o := range ds {
		p.rules += p.state[slot].Apply(o)
		res.Counts.Add(o)
	}
	// Isolation commits in several attempts: their changes add up.
	for k, c := range p.claims.UpdateLosses(undo) {
		if res.ServiceConflicts == nil {
			res.ServiceConflicts = map[model.ServiceKey][]string{}
		}
		res.ServiceConflicts[k] = c
	}
	if p.countsTraffic() {
		p.forgotten.note(p.services, changes, forget)
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

// commit encodes the operations of every table, the deletion of the
// tables in drop and the rest (encodeBatch) into one batch and sends it.
// It returns the number of messages and how long the kernel took to
// answer.
func (p *Programmer) commit(ds []*ruleset.Ops, drop []ruleset.TableRef, forget []trafficKey, extra ...func(*atomic.Uint32, bool) *wire) (int, time.Duration, error) {
	w, err := encodeBatch(p.tables, ds, drop, forget, false, extra...)
	if err != nil {
		return 0, 0, err
	}
	defer w.release()
	// A refused batch is encoded again, with notes, to name the messages
	// the kernel refused: the encoding is deterministic.
	describe := func() []note {
		d, err := encodeBatch(p.tables, ds, drop, forget, true, extra...)
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
	// A large batch of nftgate's own goes unannounced: the generation
	// after it tells whether anything else was committed meanwhile.
	muted := genErr == nil && w.announced() > muteAbove && p.mute(before)
	if muted && p.mutedSend != nil {
		p.mutedSend()
	}
	start := time.Now()
	if p.failSend != nil {
		err = p.failSend()
	}
	if err == nil {
		err = p.batch.send(w, describe)
	}
	took := time.Since(start)
	var be *BatchError
	refused := errors.As(err, &be)
	if err != nil && !refused {
		// Not the kernel's refusal: the batch may or may not be in.
		p.trusted = false
	}
	if !known && !muted {
		return w.count(), took, err
	}
	after, aerr := p.batch.generation()
	// Only this batch was committed since before (or nothing, when the
	// kernel refused it).
	alone := aerr == nil && ((err == nil && after == before+1) || (refused && after == before))
	if muted {
		p.unmute(after, alone)
	}
	// The generation stays known only from one of nftgate's transactions
	// (or read-backs) to the next with nothing between: a transaction of
	// another program before this one may have changed nftgate's tables.
	if known && alone {
		// A refused batch commits nothing: nftgate's record of the
		// kernel still holds.
		p.generation, p.genKnown = after, true
	}
	return w.count(), took, err
}

// commitEach commits a full sync onto no tables in a batch per family and
// table: the main tables' first (what the shards' rules rely on, such as
// masquerading, is in place when a Service starts being served), then each
// shard's table with the main tables' elements of its Services, those
// shards whose Services counted the most new connections between the last
// two counters readings first (shardOrder): after another program deleted
// every table, the traffic that was flowing is back first. Each shard is
// planned while the batches before it are in the kernel, and its
// operations are dropped once they are in observed. It stops at the first
// error.
func (p *Programmer) commitEach(res *Result, start time.Time, fp *ruleset.FullPlan, observed []*ruleset.TableState) error {
	shards := p.shardOrder()
	plan := func(i int) <-chan []ruleset.Batch {
		c := make(chan []ruleset.Batch, 1)
		go func() { c <- fp.Shard(i) }()
		return c
	}
	none := &ruleset.Ops{}
	one := make([]*ruleset.Ops, len(p.tables.Refs))
	put := func(batches []ruleset.Batch) error {
		for _, b := range batches {
			for i := range one {
				one[i] = none
			}
			for j, slot := range b.Slots {
				one[slot] = b.Ops[j]
			}
			n, k, err := p.commit(one, nil, nil)
			res.Messages, res.Kernel = res.Messages+n, res.Kernel+k
			if err != nil {
				return err
			}
			for j, slot := range b.Slots {
				observed[slot].Apply(b.Ops[j])
				res.Counts.Add(b.Ops[j])
			}
		}
		return nil
	}
	next := plan(shards[0]) // there is a shard at least
	if err := put(fp.Main()); err != nil {
		<-next // the caller reads its tables' states next
		return err
	}
	for n := range shards {
		cur := <-next
		if n+1 < len(shards) {
			next = plan(shards[n+1])
		}
		if err := put(cur); err != nil {
			if n+1 < len(shards) {
				<-next
			}
			return err
		}
		if n == 0 {
			res.FirstServed = time.Since(start)
		}
	}
	return nil
}

// shardSums sums, per shard, the new connections a reading counted for
// the Service ports the shard holds, since they were programmed; called
// with p.mu held.
func (p *Programmer) shardSums(rd *Reading) []uint64 {
	sums := make([]uint64, p.cfg.ShardCount())
	for ref, c := range rd.Ports() {
		sums[p.cfg.ShardOf(ref.Service)] += c.New
	}
	return sums
}

// shardOrder lists the shards, those whose Services were last found
// counting new connections first, then those that counted the most
// recently (between the last two counters readings that told something of
// the shard, nextRecent: the traffic flowing now, not what a Service
// counted once), then by what they counted since they were programmed; in
// the layout's order without a reading (a cold start, counters off). It
// reads no counter itself.
func (p *Programmer) shardOrder() []int {
	p.counters.mu.Lock()
	last, recent, seen := p.counters.shardNew, p.counters.shardRecent, p.counters.shardSeen
	p.counters.mu.Unlock()
	order := make([]int, p.cfg.ShardCount())
	for i := range order {
		order[i] = i
	}
	if len(last) != len(order) || len(recent) != len(order) || len(seen) != len(order) {
		return order
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(seen[b], seen[a]), cmp.Compare(recent[b], recent[a]), cmp.Compare(last[b], last[a]))
	})
	return order
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
	cfg := ruleset.Config{Table: table}
	var drop []ruleset.TableRef
	var left []string
	for _, f := range ruleset.Families {
		own, foreign, err := r.owned(&cfg, f)
		if err != nil {
			return err
		}
		for name := range own {
			drop = append(drop, ruleset.TableRef{Family: f, Name: name})
		}
		for _, name := range foreign {
			left = append(left, fmt.Sprintf("%s %s", f, name))
		}
	}
	sort.Slice(drop, func(i, j int) bool {
		if drop[i].Family != drop[j].Family {
			return drop[i].Family < drop[j].Family
		}
		return drop[i].Name < drop[j].Name
	})
	if len(drop) > 0 {
		w, err := encodeBatch(&ruleset.Tables{}, nil, drop, nil, true)
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
