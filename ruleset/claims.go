package ruleset

import (
	"fmt"
	"slices"
	"sort"

	"github.com/nftgate/nftgate/model"
)

// Claims: several Services may ask for the same map element (an address
// and port two Services both list); the oldest one wins it, as the API
// server's allocator would have kept the address for it, and the others
// are told why they lost it. Claims is the book of who asks for what; the
// planners (plan.go) consult and update it.

// famElem is one element of one family's tables.
type famElem struct {
	f  Family
	id ElemID
}

// claim is one Service's wish for a map element.
type claim struct {
	svc model.ServiceKey
	// created is when the Service was created.
	created model.Instant
	verdict Verdict
	// pick is the fingerprint of the endpoints a dispatch element's
	// destination has in the endpoint maps (zero when it has none): two
	// Services jumping to the same shared chain agree only if they also
	// send to the same endpoints.
	pick uint64
}

// claimSet holds every claim on one element; the oldest Service wins, as the
// API server's allocator would have kept the address for it.
type claimSet []claim

func (cs claimSet) winner() *claim {
	var w *claim
	for i := range cs {
		c := &cs[i]
		if w == nil || c.created < w.created || c.created == w.created && c.svc.Less(w.svc) {
			w = c
		}
	}
	return w
}

// Older tells whether Service a (created at ac) wins an element both it and
// b ask for: the older one, by creation time, then namespace/name.
func Older(ac model.Instant, a model.ServiceKey, bc model.Instant, b model.ServiceKey) bool {
	return ac < bc || (ac == bc && a.Less(b))
}

// Claims records which Services want which elements, and which Services
// lose elements they claim to others.
type Claims struct {
	// verdicts are the claims on map elements: the oldest Service wins.
	verdicts elemMap[claimSet]
	// plain counts the Services that want each element of a plain
	// address set (ClusterIPs, hairpin pairs): every claim on one is the
	// same, so a count is all it takes. Most elements are of this kind.
	plain elemMap[int32]
	// losses are, per Service, the elements it claims that another
	// Service holds, and why.
	losses map[model.ServiceKey]map[famElem]string
	// shared counts, per table, the Services' listings of each shared
	// chain and map (endpoints.go): one no Service lists is removed.
	shared map[sharedObject]int32
}

// sharedObject is a shared chain or map of the table in a slot.
type sharedObject struct {
	slot  int
	chain bool
	name  string
}

// NewClaims makes an empty book.
func NewClaims() *Claims { return newClaimBookSized(0) }

// newClaimBookSized makes a book for about n Services: most have a
// ClusterIP and a verdict for it, and growing the maps a cold sync fills
// costs more than filling them.
func newClaimBookSized(n int) *Claims {
	return &Claims{verdicts: elemMap[claimSet]{sized: n}, plain: elemMap[int32]{sized: n},
		losses: map[model.ServiceKey]map[famElem]string{}}
}

// Conflicts lists every element claimed by Services that disagree.
func (b *Claims) Conflicts() []string {
	var out []string
	for fe, cs := range b.verdicts.all() {
		if len(cs) > 1 {
			out = append(out, conflicts(fe, cs)...)
		}
	}
	sort.Strings(out)
	return out
}

// plainSet tells whether a set's elements carry no verdict.
func plainSet(name string) bool {
	shape := SetShape(name)
	return shape == KeyAddr || shape == KeyAddrPair
}

func addClaim(m *elemMap[claimSet], fe famElem, c claim) {
	cs := m.at(fe)
	for _, x := range cs {
		if x.svc == c.svc {
			return // a Service listing the same key twice keeps its first
		}
	}
	m.put(fe, append(cs, c))
}

func removeClaim(m *elemMap[claimSet], fe famElem, svc model.ServiceKey) {
	cs, ok := m.get(fe)
	if !ok {
		return
	}
	out := cs[:0]
	for _, x := range cs {
		if x.svc != svc {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		m.del(fe)
		return
	}
	m.put(fe, out)
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
		same = same && c.verdict == w.verdict && c.pick == w.pick
	}
	if same {
		return nil // Services agreeing on an element (shared endpoints) is no conflict
	}
	var out []loss
	for _, c := range cs {
		if c.svc != w.svc {
			out = append(out, loss{c.svc, fmt.Sprintf("%s %s in %s is already used by service %s, which keeps it as the older Service (by creation time, then namespace/name)",
				fe.f, fe.id.Key(), fe.id.Map(), w.svc)})
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

// Undo puts back the claims a refused partial plan changed: undo is what
// PlanPartial returned with it.
func (b *Claims) Undo(undo *Claims) {
	for fe, cs := range undo.verdicts.all() {
		if cs == nil {
			b.verdicts.del(fe)
		} else {
			b.verdicts.put(fe, cs)
		}
	}
	for fe, n := range undo.plain.all() {
		if n == 0 {
			b.plain.del(fe)
		} else {
			b.plain.put(fe, n)
		}
	}
	for o, n := range undo.shared {
		b.countShared(o, n-b.shared[o])
	}
}

// countShared adds delta to a shared object's count and returns the new
// count.
func (b *Claims) countShared(o sharedObject, delta int32) int32 {
	n := b.shared[o] + delta
	if n <= 0 {
		delete(b.shared, o)
		return 0
	}
	if b.shared == nil {
		b.shared = map[sharedObject]int32{}
	}
	b.shared[o] = n
	return n
}

// UpdateLosses brings the losses up to date for the elements a committed
// partial plan touched (undo is what PlanPartial returned with it) and
// returns the conflicts of the Services whose conflicts changed.
func (b *Claims) UpdateLosses(undo *Claims) map[model.ServiceKey][]string {
	before := undo.verdicts.all()
	was := map[model.ServiceKey][]string{}
	note := func(cs claimSet) {
		for _, c := range cs {
			if _, ok := was[c.svc]; !ok {
				was[c.svc] = lossList(b.losses[c.svc])
			}
		}
	}
	for fe, old := range before {
		note(old)
		note(b.verdicts.at(fe))
	}
	if len(was) == 0 {
		return nil
	}
	for fe, old := range before {
		if old != nil {
			for _, c := range old {
				if m := b.losses[c.svc]; m != nil {
					delete(m, fe)
					if len(m) == 0 {
						delete(b.losses, c.svc)
					}
				}
			}
		}
		if cs := b.verdicts.at(fe); cs != nil {
			for _, l := range losses(fe, cs) {
				m := b.losses[l.svc]
				if m == nil {
					m = map[famElem]string{}
					b.losses[l.svc] = m
				}
				m[fe] = l.why
			}
		}
	}
	var changed map[model.ServiceKey][]string
	for k, old := range was {
		if now := lossList(b.losses[k]); !slices.Equal(old, now) {
			if changed == nil {
				changed = map[model.ServiceKey][]string{}
			}
			changed[k] = now
		}
	}
	return changed
}

// RebuildLosses makes the losses anew, after a full sync planned every
// element, and returns the conflicts of the Services whose conflicts
// changed since the book prev (the one in effect before).
func (b *Claims) RebuildLosses(prev *Claims) map[model.ServiceKey][]string {
	next := map[model.ServiceKey]map[famElem]string{}
	for fe, cs := range b.verdicts.all() {
		for _, l := range losses(fe, cs) {
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
		if now := lossList(next[k]); !slices.Equal(lossList(prev.losses[k]), now) {
			if changed == nil {
				changed = map[model.ServiceKey][]string{}
			}
			changed[k] = now
		}
	}
	for k := range next {
		diff(k)
	}
	for k := range prev.losses {
		if _, ok := next[k]; !ok {
			diff(k)
		}
	}
	b.losses = next
	return changed
}

// Losses lists, per Service, every element it claims that another Service
// holds, and why.
func (b *Claims) Losses() map[model.ServiceKey][]string {
	out := make(map[model.ServiceKey][]string, len(b.losses))
	for k, m := range b.losses {
		out[k] = lossList(m)
	}
	return out
}

// Holder returns the Service that holds map element id of family f: the
// winner of its claims.
func (b *Claims) Holder(f Family, id ElemID) (model.ServiceKey, bool) {
	cs := b.verdicts.at(famElem{f, id})
	if cs == nil {
		return model.ServiceKey{}, false
	}
	w := cs.winner()
	if w == nil {
		return model.ServiceKey{}, false
	}
	return w.svc, true
}

// EachHolder calls fn with every map element that a Service holds, its
// family, and the Service.
func (b *Claims) EachHolder(fn func(f Family, id ElemID, svc model.ServiceKey)) {
	for fe, cs := range b.verdicts.all() {
		if w := cs.winner(); w != nil {
			fn(fe.f, fe.id, w.svc)
		}
	}
}
