package ruleset

import (
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/model"
)

// Elems answers as a map of ElemID to Verdict would, whatever mix of
// elements with and without a verdict its sets hold.
func TestElemsAsAMap(t *testing.T) {
	id := func(set, addr string, port uint16) ElemID {
		return NewElemID(set, Key{Addr: netip.MustParseAddr(addr), Proto: model.TCP, Port: port})
	}
	goTo := func(c string) Verdict { return Verdict{Kind: Goto, Chain: c} }
	var e Elems
	want := map[ElemID]Verdict{}
	check := func(step string) {
		t.Helper()
		if e.Len() != len(want) {
			t.Fatalf("%s: Len %d, want %d", step, e.Len(), len(want))
		}
		for k, v := range want {
			if got, ok := e.Get(k); !ok || got != v {
				t.Fatalf("%s: Get(%s) = %v, %v; want %v", step, k, got, ok, v)
			}
		}
		n := 0
		for k, v := range e.All() {
			n++
			if w, ok := want[k]; !ok || w != v {
				t.Fatalf("%s: All yields %s %v, want %v (held: %v)", step, k, v, w, ok)
			}
		}
		if n != len(want) {
			t.Fatalf("%s: All yields %d elements, want %d", step, n, len(want))
		}
	}
	put := func(k ElemID, v Verdict) { e.Put(k, v); want[k] = v }
	del := func(k ElemID) { e.Delete(k); delete(want, k) }

	check("empty")
	// Room made for a batch is no element yet.
	e.reserve([]Element{{Map: "service-ips", Verdict: goTo("svc-a")}, {Map: "cluster-ips"}})
	check("room made")
	if _, ok := e.Get(id("service-ips", "10.0.0.1", 80)); ok {
		t.Fatal("an empty Elems holds an element")
	}
	a, b, c := id("service-ips", "10.0.0.1", 80), id("service-ips", "10.0.0.2", 80), id("cluster-ips", "10.0.0.1", 0)
	put(a, goTo("svc-a"))
	put(b, goTo("svc-b"))
	put(c, Verdict{})
	put(id("service-ips", "fd00::1", 80), goTo("svc-6"))
	check("added")
	put(a, goTo("svc-a2")) // a new verdict
	put(b, Verdict{})      // a verdict dropped
	put(c, goTo("svc-c"))  // and one given
	check("replaced")
	put(c, goTo("svc-c"))
	check("the same again")
	clone := e.Clone()
	del(a)
	del(id("service-ips", "10.0.0.9", 80)) // never held
	check("deleted")
	if clone.Len() != 4 {
		t.Fatalf("the clone has %d elements after its original lost one, want 4", clone.Len())
	}
	e.DeleteSet("service-ips")
	for k := range want {
		if k.Map() == "service-ips" {
			delete(want, k)
		}
	}
	check("set deleted")
	for k := range e.All() {
		e.Delete(k)
		delete(want, k)
	}
	check("deleted while listed")
}
