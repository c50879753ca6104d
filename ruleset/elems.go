package ruleset

import (
	"iter"
	"maps"
	"unique"
)

// Elems is what a table's state keeps of its set and map elements: each
// element's verdict, by set and key. A table holds one element or two
// for every Service (its ClusterIP in the main table's address set, its
// verdict in its shard's map), and one map of ElemID to Verdict, 56
// bytes a slot, was the largest part of the state at 100,000 Services.
// Kept by set, a key is 24 bytes without pointers, and an element without
// a verdict (an address set's) is its key alone: the collector need not
// scan those maps at all. The zero Elems is empty and ready to use.
type Elems struct {
	sets map[unique.Handle[string]]*setElems
	n    int
}

// setElems are one set's elements: those without a verdict in plain, the
// others in verdicts.
type setElems struct {
	plain    map[elemKey]struct{}
	verdicts map[elemKey]Verdict
}

// Len is the number of elements.
func (e *Elems) Len() int { return e.n }

// Get returns the verdict of element id, and whether the table holds it.
func (e *Elems) Get(id ElemID) (Verdict, bool) {
	se := e.sets[id.set]
	if se == nil {
		return Verdict{}, false
	}
	if v, ok := se.verdicts[id.elemKey]; ok {
		return v, true
	}
	_, ok := se.plain[id.elemKey]
	return Verdict{}, ok
}

// Put records element id with verdict v (the zero Verdict for an element
// of an address set).
func (e *Elems) Put(id ElemID, v Verdict) {
	if e.sets == nil {
		e.sets = map[unique.Handle[string]]*setElems{}
	}
	se := e.sets[id.set]
	if se == nil {
		se = &setElems{}
		e.sets[id.set] = se
	}
	if v == (Verdict{}) {
		if _, ok := se.verdicts[id.elemKey]; ok {
			delete(se.verdicts, id.elemKey)
			e.n--
		}
		if se.plain == nil {
			se.plain = map[elemKey]struct{}{}
		}
		if _, ok := se.plain[id.elemKey]; !ok {
			se.plain[id.elemKey] = struct{}{}
			e.n++
		}
		return
	}
	if _, ok := se.plain[id.elemKey]; ok {
		delete(se.plain, id.elemKey)
		e.n--
	}
	if se.verdicts == nil {
		se.verdicts = map[elemKey]Verdict{}
	}
	if _, ok := se.verdicts[id.elemKey]; !ok {
		e.n++
	}
	se.verdicts[id.elemKey] = v
}

// Delete forgets element id.
func (e *Elems) Delete(id ElemID) {
	se := e.sets[id.set]
	if se == nil {
		return
	}
	if _, ok := se.verdicts[id.elemKey]; ok {
		delete(se.verdicts, id.elemKey)
		e.n--
	} else if _, ok := se.plain[id.elemKey]; ok {
		delete(se.plain, id.elemKey)
		e.n--
	}
	if len(se.verdicts) == 0 && len(se.plain) == 0 {
		delete(e.sets, id.set)
	}
}

// DeleteSet forgets every element of the named set.
func (e *Elems) DeleteSet(name string) {
	h := unique.Make(name)
	if se := e.sets[h]; se != nil {
		e.n -= len(se.plain) + len(se.verdicts)
		delete(e.sets, h)
	}
}

// All yields every element and its verdict, in no particular order. The
// loop may delete the element it is given.
func (e *Elems) All() iter.Seq2[ElemID, Verdict] {
	return func(yield func(ElemID, Verdict) bool) {
		for h, se := range e.sets {
			for k, v := range se.verdicts {
				if !yield(ElemID{set: h, elemKey: k}, v) {
					return
				}
			}
			for k := range se.plain {
				if !yield(ElemID{set: h, elemKey: k}, Verdict{}) {
					return
				}
			}
		}
	}
}

// Clone returns a copy of e.
func (e *Elems) Clone() Elems {
	c := Elems{n: e.n}
	if e.sets != nil {
		c.sets = make(map[unique.Handle[string]]*setElems, len(e.sets))
		for h, se := range e.sets {
			c.sets[h] = &setElems{plain: maps.Clone(se.plain), verdicts: maps.Clone(se.verdicts)}
		}
	}
	return c
}
