package ruleset

import (
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/model"
)

func TestPlanRestore(t *testing.T) {
	key := func(a string) Key { return Key{Addr: netip.MustParseAddr(a), Proto: model.TCP, Port: 80} }
	id := func(a string) ElemID { return NewElemID(MapServiceIPs, key(a)) }
	believed, observed := NewTableState(), NewTableState()
	believed.Elems.Put(id("198.19.0.1"), Verdict{Kind: Goto, Chain: "svc-a"})
	believed.Elems.Put(id("198.19.0.2"), Verdict{Kind: Goto, Chain: "svc-b"})
	believed.Elems.Put(id("198.19.0.3"), Verdict{Kind: Goto, Chain: "svc-c"})
	observed.Elems.Put(id("198.19.0.1"), Verdict{Kind: Goto, Chain: "svc-a"}) // as believed
	observed.Elems.Put(id("198.19.0.3"), Verdict{Kind: Goto, Chain: "svc-x"}) // changed
	observed.Elems.Put(id("198.19.0.4"), Verdict{Kind: Goto, Chain: "svc-a"}) // unknown
	o := PlanRestore(believed, observed, func(ElemID) *Pick { return nil })
	want := &Ops{
		DelElems: []Element{{Map: MapServiceIPs, Key: key("198.19.0.3"), Verdict: Verdict{Kind: Goto, Chain: "svc-x"}}, {Map: MapServiceIPs, Key: key("198.19.0.4"), Verdict: Verdict{Kind: Goto, Chain: "svc-a"}}},
		AddElems: []Element{{Map: MapServiceIPs, Key: key("198.19.0.2"), Verdict: Verdict{Kind: Goto, Chain: "svc-b"}}, {Map: MapServiceIPs, Key: key("198.19.0.3"), Verdict: Verdict{Kind: Goto, Chain: "svc-c"}}},
	}
	if len(o.DelElems) != len(want.DelElems) || len(o.AddElems) != len(want.AddElems) {
		t.Fatalf("PlanRestore = %+v, want %+v", o, want)
	}
	for i := range want.DelElems {
		if o.DelElems[i] != want.DelElems[i] {
			t.Errorf("DelElems[%d] = %v, want %v", i, o.DelElems[i], want.DelElems[i])
		}
	}
	for i := range want.AddElems {
		if o.AddElems[i] != want.AddElems[i] {
			t.Errorf("AddElems[%d] = %v, want %v", i, o.AddElems[i], want.AddElems[i])
		}
	}
	observed.Apply(o)
	if observed.Elems.Len() != believed.Elems.Len() {
		t.Fatalf("after the plan: %d elements, want %d", observed.Elems.Len(), believed.Elems.Len())
	}
	for k, v := range believed.Elems.All() {
		if got, _ := observed.Elems.Get(k); got != v {
			t.Fatalf("after the plan: %s is %v, want %v", k, got, v)
		}
	}
}
