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
	plain    elemMap[struct{}] // the elements without a verdict
	verdicts elemMap[Verdict]
}

// elem is id as a key of Elems' maps: a table is of one family.
func elem(id ElemID) famElem { return famElem{id: id} }

// Len is the number of elements.
func (e *Elems) Len() int { return e.plain.len() + e.verdicts.len() }

// Get returns the verdict of element id, and whether the table holds it.
func (e *Elems) Get(id ElemID) (Verdict, bool) {
	if v, ok := e.verdicts.get(elem(id)); ok {
		return v, true
	}
	_, ok := e.plain.get(elem(id))
	return Verdict{}, ok
}

// Put records element id with verdict v (the zero Verdict for an element
// of an address set).
func (e *Elems) Put(id ElemID, v Verdict) {
	if v == (Verdict{}) {
		e.verdicts.del(elem(id))
		e.plain.put(elem(id), struct{}{})
	} else {
		e.plain.del(elem(id))
		e.verdicts.put(elem(id), v)
	}
}

// Delete forgets element id.
func (e *Elems) Delete(id ElemID) {
	e.verdicts.del(elem(id))
	e.plain.del(elem(id))
}

// DeleteSet forgets every element of the named set.
func (e *Elems) DeleteSet(name string) {
	id := setID{set: unique.Make(name)}
	e.verdicts.delSet(id)
	e.plain.delSet(id)
}

// All yields every element and its verdict, in no particular order. The
// loop may delete the element it is given.
func (e *Elems) All() iter.Seq2[ElemID, Verdict] {
	return func(yield func(ElemID, Verdict) bool) {
		for fe, v := range e.verdicts.all() {
			if !yield(fe.id, v) {
				return
			}
		}
		for fe := range e.plain.all() {
			if !yield(fe.id, Verdict{}) {
				return
			}
		}
	}
}

// reserve makes room for the elements of a batch that fills an empty
// table: a set's map grown one element at a time ends up a third larger
// on average than one made at its size.
func (e *Elems) reserve(add []Element) {
	type count struct{ plain, verdicts int }
	counts := map[setID]count{}
	for i := range add {
		if add[i].To.IsValid() {
			continue // an endpoint map's element is in its pick
		}
		id := setID{set: unique.Make(add[i].Map)}
		c := counts[id]
		if add[i].Verdict == (Verdict{}) {
			c.plain++
		} else {
			c.verdicts++
		}
		counts[id] = c
	}
	for id, c := range counts {
		e.plain.reserve(id, c.plain)
		e.verdicts.reserve(id, c.verdicts)
	}
}

// Clone returns a copy of e.
func (e *Elems) Clone() Elems {
	return Elems{plain: e.plain.clone(), verdicts: e.verdicts.clone()}
}

// setID names one family's set.
type setID struct {
	f   Family
	set unique.Handle[string]
}

// elemMap maps elements of several families' sets to values, by set and
// key, as Elems does for one table: the claims book holds one for the
// claims on verdicts and one for the counts of address-set elements. A
// set's map is made for sized elements when the set is one every Service
// has an element in (its ClusterIP, its verdict for it); the zero elemMap
// is empty and ready to use.
type elemMap[V any] struct {
	sets  map[setID]map[elemKey]V
	n     int
	sized int
}

func (m *elemMap[V]) len() int { return m.n }

// set returns the map of fe's set, made when create is set (else nil
// when there is none).
func (m *elemMap[V]) set(fe famElem, create bool) map[elemKey]V {
	id := setID{fe.f, fe.id.set}
	s := m.sets[id]
	if s == nil && create {
		n := 0
		if name := fe.id.Map(); name == SetClusterIPs || name == MapServiceIPs {
			n = m.sized
		}
		s = m.makeSet(id, n)
	}
	return s
}

// makeSet makes set id's map for n elements.
func (m *elemMap[V]) makeSet(id setID, n int) map[elemKey]V {
	if m.sets == nil {
		m.sets = map[setID]map[elemKey]V{}
	}
	s := make(map[elemKey]V, n)
	m.sets[id] = s
	return s
}

func (m *elemMap[V]) get(fe famElem) (V, bool) {
	v, ok := m.set(fe, false)[fe.id.elemKey]
	return v, ok
}

// at is the value of fe, or the zero value.
func (m *elemMap[V]) at(fe famElem) V {
	v, _ := m.get(fe)
	return v
}

func (m *elemMap[V]) put(fe famElem, v V) {
	s := m.set(fe, true)
	if _, ok := s[fe.id.elemKey]; !ok {
		m.n++
	}
	s[fe.id.elemKey] = v
}

func (m *elemMap[V]) del(fe famElem) {
	s := m.set(fe, false)
	if _, ok := s[fe.id.elemKey]; !ok {
		return
	}
	delete(s, fe.id.elemKey)
	m.n--
	if len(s) == 0 {
		delete(m.sets, setID{fe.f, fe.id.set})
	}
}

// reserve makes set id's map for n elements, if it has none.
func (m *elemMap[V]) reserve(id setID, n int) {
	if n > 0 && m.sets[id] == nil {
		m.makeSet(id, n)
	}
}

func (m *elemMap[V]) delSet(id setID) {
	m.n -= len(m.sets[id])
	delete(m.sets, id)
}

func (m *elemMap[V]) clone() elemMap[V] {
	c := elemMap[V]{n: m.n, sized: m.sized}
	if m.sets != nil {
		c.sets = make(map[setID]map[elemKey]V, len(m.sets))
		for id, s := range m.sets {
			c.sets[id] = maps.Clone(s)
		}
	}
	return c
}

// all yields every element and its value, in no particular order. The
// loop may delete the element it is given.
func (m *elemMap[V]) all() iter.Seq2[famElem, V] {
	return func(yield func(famElem, V) bool) {
		for id, s := range m.sets {
			for k, v := range s {
				if !yield(famElem{id.f, ElemID{set: id.set, elemKey: k}}, v) {
					return
				}
			}
		}
	}
}

// ElemIndex numbers elements (the counters number each Service address's
// element by its port): kept by set as Elems keeps them, and made for about
// n elements in the sets every Service has one in.
type ElemIndex struct{ m elemMap[int32] }

// NewElemIndex returns an empty index sized for about n Services.
func NewElemIndex(n int) *ElemIndex { return &ElemIndex{elemMap[int32]{sized: n}} }

// Get returns the number of element id.
func (x *ElemIndex) Get(id ElemID) (int32, bool) { return x.m.get(elem(id)) }

// Put numbers element id.
func (x *ElemIndex) Put(id ElemID, v int32) { x.m.put(elem(id), v) }
