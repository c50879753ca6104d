package appliance

import (
	"fmt"
	"slices"
	"testing"
)

func TestServiceListWith(t *testing.T) {
	row := func(ns, name, typ string) Service {
		return Service{Namespace: ns, Name: name, Type: typ, EndpointsFunc: func() []Endpoint { return nil }, EndpointCount: 2, UsedCount: 1}
	}
	names := func(l ServiceList) []string {
		var out []string
		for s := range l.All() {
			out = append(out, s.Namespace+"/"+s.Name+" "+s.Type)
		}
		return out
	}
	old := NewServiceList(row("b", "db", "ClusterIP"), row("a", "web", "ClusterIP"), row("a", "api", "ClusterIP"))
	kept := names(old)
	refused := row("a", "web", "NodePort")
	refused.KernelError = "refused"
	got := old.With([]Service{refused, row("a", "aaa", "NodePort"), row("a", "mail", "NodePort"), row("c", "last", "NodePort")},
		Service{Namespace: "b", Name: "db"}, Service{Namespace: "c", Name: "none"})
	want := []string{"a/aaa NodePort", "a/api ClusterIP", "a/mail NodePort", "a/web NodePort", "c/last NodePort"}
	if !slices.Equal(names(got), want) {
		t.Errorf("rows:\n%q\nwant\n%q", names(got), want)
	}
	if !slices.Equal(names(old), []string{"a/api ClusterIP", "a/web ClusterIP", "b/db ClusterIP"}) || !slices.Equal(names(old), kept) {
		t.Errorf("the old list changed: %q", names(old))
	}
	if s, ok := got.Get("a", "web"); !ok || s.KernelError != "refused" {
		t.Errorf("Get(a, web) = %+v, %v", s, ok)
	}
	if _, ok := got.Get("b", "db"); ok {
		t.Error("Get(b, db) found a removed row")
	}
	if sum, want := got.Summary(), (SummaryJSON{Total: 5, Endpoints: 10, KernelRefused: 1}); sum != want {
		t.Errorf("summary %+v, want %+v", sum, want)
	}
	if sum, want := old.Summary(), (SummaryJSON{Total: 3, Endpoints: 6}); sum != want {
		t.Errorf("old summary %+v, want %+v", sum, want)
	}
	var empty ServiceList
	if empty.Len() != 0 || empty.Summary() != (SummaryJSON{}) || len(names(empty)) != 0 {
		t.Errorf("the zero list is not empty")
	}
	if _, ok := empty.Get("a", "b"); ok {
		t.Error("Get on the zero list found something")
	}
}

// BenchmarkServiceListWith replaces one row of a list of n: the cost must
// not grow with n (ns/op and B/op alike at 1,000 and 100,000).
func BenchmarkServiceListWith(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			l := NewServiceList(manyServices(n)...)
			rows := make([]Service, 0, n)
			for s := range l.All() {
				rows = append(rows, *s)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				r := rows[(i*7919)%n]
				r.UsedCount = i % 3
				l = l.With([]Service{r})
			}
		})
	}
}
