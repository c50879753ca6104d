package ruleset

import "sort"

// PlanRestore plans putting a table's map elements back to believed (what
// nftgate last committed) where the kernel holds observed, when another
// program added, changed or deleted elements and nothing else: elements
// missing or changed are added (a changed one deleted first), unknown ones
// deleted. Nothing needs rendering but the picks that differ: pickOf gives
// the pick nftgate last committed for a destination (Tables.PickOf).
func PlanRestore(believed, observed *TableState, pickOf func(ElemID) *Pick) *Ops {
	d := newDiffer(0, observed)
	for id, info := range believed.Picks.All() {
		if got, ok := observed.Picks.Get(id); ok && got == info {
			continue
		}
		if p := pickOf(id); p != nil {
			d.pick(id, p)
		}
	}
	for id := range observed.Picks.All() {
		if _, ok := believed.Picks.Get(id); !ok {
			d.pick(id, nil)
		}
	}
	o := &d.ops
	for id, v := range believed.Elems.All() {
		got, ok := observed.Elems.Get(id)
		if ok && got == v {
			continue
		}
		if ok {
			o.DelElems = append(o.DelElems, Element{Map: id.Map(), Key: id.Key(), Verdict: got})
		}
		o.AddElems = append(o.AddElems, Element{Map: id.Map(), Key: id.Key(), Verdict: v})
	}
	for id, v := range observed.Elems.All() {
		if _, ok := believed.Elems.Get(id); !ok {
			o.DelElems = append(o.DelElems, Element{Map: id.Map(), Key: id.Key(), Verdict: v})
		}
	}
	for _, es := range [][]Element{o.DelElems, o.AddElems} {
		sort.Slice(es, func(i, j int) bool {
			if es[i].Map != es[j].Map {
				return es[i].Map < es[j].Map
			}
			return es[i].Key.String() < es[j].Key.String()
		})
	}
	return o
}
