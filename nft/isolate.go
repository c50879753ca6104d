package nft

import (
	"errors"
	"sort"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Failure isolation: the kernel applies a batch all or nothing, so one
// Service whose rules it refuses (a name it finds too long, a feature it
// lacks) would hold back every other change of the sync. When it refuses a
// batch, the Programmer finds the Services responsible, programs
// everything else, and leaves those Services as they were last programmed,
// reporting the kernel's error for each in Result.Refused.
//
// The refused messages usually name a chain or a set, and so the Service
// that owns it: the other Services are programmed in one batch, and each
// named Service alone. Otherwise the changes are bisected: each half is
// tried in turn, and a refused half split again, down to single Services.
// It costs about two batches per refused Service and level of the
// bisection, and happens only when the kernel refuses.

// maxRefused bounds the Services one sync isolates: past it, the refusal
// is not of a few Services but of something they share, and the sync fails
// as a whole, to be retried later.
const maxRefused = 64

// isolate programs the changes that the kernel accepts, after it refused
// cause for all of them together; it records each Service refused on its
// own in refused. Changes are tried in groups of Services; the Services of a
// refused group stay as they were.
func (p *Programmer) isolate(res *Result, changes map[model.ServiceKey]*model.Service, cause *BatchError, refused map[model.ServiceKey]string) error {
	if len(changes) == 1 {
		for k := range changes {
			refused[k] = cause.Error()
		}
		return nil
	}
	if len(refused) >= maxRefused {
		return cause
	}
	keys := make([]model.ServiceKey, 0, len(changes))
	for k := range changes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	var groups [][]model.ServiceKey
	if suspects := p.suspects(cause, changes); len(suspects) > 0 && len(suspects) < len(keys) {
		rest := make([]model.ServiceKey, 0, len(keys)-len(suspects))
		for _, k := range keys {
			if !suspects[k] {
				rest = append(rest, k)
			}
		}
		groups = append(groups, rest)
		for _, k := range keys {
			if suspects[k] {
				groups = append(groups, []model.ServiceKey{k})
			}
		}
	} else {
		groups = [][]model.ServiceKey{keys[:len(keys)/2], keys[len(keys)/2:]}
	}
	for _, g := range groups {
		sub := make(map[model.ServiceKey]*model.Service, len(g))
		for _, k := range g {
			sub[k] = changes[k]
		}
		err, isolatable := p.attempt(res, sub)
		if err == nil {
			continue
		}
		var be *BatchError
		if !isolatable || !errors.As(err, &be) {
			return err
		}
		if err := p.isolate(res, sub, be, refused); err != nil {
			return err
		}
	}
	return nil
}

// suspects are the Services among changes whose chains or sets (as
// programmed, or as changed) the refused messages of cause name.
func (p *Programmer) suspects(cause *BatchError, changes map[model.ServiceKey]*model.Service) map[model.ServiceKey]bool {
	if len(cause.refused) == 0 || p.bisectOnly {
		return nil
	}
	type object struct {
		f           ruleset.Family
		table, name string
	}
	owner := map[object]model.ServiceKey{}
	for k, svc := range changes {
		for _, m := range []*model.Service{p.services[k], svc} {
			if m == nil {
				continue
			}
			r := p.tables.Render(m)
			for _, f := range ruleset.Families {
				fr := r.Of(f)
				shard := p.cfg.TableOf(k)
				// The objects a shard's Services share are no one's.
				for _, c := range fr.Chains {
					if ruleset.Shared(c.Name) {
						continue
					}
					table := shard
					if ruleset.MainChain(c.Name) {
						table = p.cfg.Table
					}
					owner[object{f, table, c.Name}] = k
				}
				for _, s := range fr.Sets {
					if !ruleset.Shared(s.Name) {
						owner[object{f, shard, s.Name}] = k
					}
				}
			}
		}
	}
	out := map[model.ServiceKey]bool{}
	for _, n := range cause.refused {
		switch n.op {
		case noteAddChain, noteFlushChain, noteDelChain, noteAddRule, noteAddSet, noteDelSet:
			if k, ok := owner[object{n.f, n.table, n.name}]; ok {
				out[k] = true
			}
		}
	}
	return out
}

// fullIsolating finishes a full sync whose batch the kernel refused
// (cause). The Services that differ from what was programmed are the
// candidates: those the refused messages name, or all of them if they name
// none, are left out of the full sync, which then programs everything
// else (or the last good state of those left out); the Services left out
// are then applied as a partial sync that isolates refusals. recreated
// tells that the refused plan recreated sets, which made observed forget
// their elements: the tables are then read again.
func (p *Programmer) fullIsolating(res *Result, observed []*ruleset.TableState, drop []ruleset.TableRef, recreated bool, services map[model.ServiceKey]*model.Service, cause *BatchError) error {
	candidates := ruleset.ChangedServices(p.services, services)
	out := p.suspects(cause, candidates)
	if len(out) == 0 {
		out = make(map[model.ServiceKey]bool, len(candidates))
		for k := range candidates {
			out[k] = true
		}
	}
	base := ruleset.CloneServices(services)
	later := map[model.ServiceKey]*model.Service{}
	for k := range out {
		if old := p.services[k]; old != nil {
			base[k] = old
		} else {
			delete(base, k)
		}
		later[k] = services[k]
	}
	if recreated {
		var err error
		if observed, drop, err = p.observe(res, false, nil, nil); err != nil {
			return err
		}
	}
	ds, claims, _ := ruleset.PlanFull(&p.cfg, p.tables, observed, base)
	n, kernel, err := p.commit(ds, drop, nil)
	res.Messages += n
	res.Kernel += kernel
	if err != nil {
		return err // not of the Services left out: of what they share
	}
	applyPlan(res, ds, observed)
	p.committedFull(res, observed, claims, base)
	refused := map[model.ServiceKey]string{}
	err, isolatable := p.attempt(res, later)
	if isolatable {
		var be *BatchError
		errors.As(err, &be)
		err = p.isolate(res, later, be, refused)
	}
	if len(refused) > 0 {
		res.Refused = refused
	}
	res.Conflicts = p.claims.Conflicts()
	return err
}
