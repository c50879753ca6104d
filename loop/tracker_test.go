package loop

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
)

func trackedSlice(namespace, name, service string) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if service != "" {
		sl.Labels = map[string]string{model.LabelServiceName: service}
	}
	return sl
}

// sliceNames takes the pending changes and returns, for each changed
// Service, the names of its slices in order.
func sliceNames(t *Tracker) map[model.ServiceKey][]string {
	dirty, _ := t.TakeDirty()
	out := map[model.ServiceKey][]string{}
	for k, o := range dirty {
		names := []string{}
		for _, sl := range o.Slices {
			names = append(names, sl.Name)
		}
		slices.Sort(names)
		out[k] = names
	}
	return out
}

func TestTrackerSlices(t *testing.T) {
	web := model.NewServiceKey("a", "web")
	api := model.NewServiceKey("a", "api")
	webB := model.NewServiceKey("b", "web")
	tr := NewTracker()

	tr.SetService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web"}})
	tr.SetSlice(trackedSlice("a", "web-1", "web"))
	tr.SetSlice(trackedSlice("a", "web-2", "web"))
	tr.SetSlice(trackedSlice("b", "web-1", "web")) // same name, other namespace
	step := func(name string, want map[model.ServiceKey][]string) {
		t.Helper()
		if got := sliceNames(tr); !equalNames(got, want) {
			t.Errorf("%s: changed Services and their slices = %v, want %v", name, got, want)
		}
	}
	step("added", map[model.ServiceKey][]string{web: {"web-1", "web-2"}, webB: {"web-1"}})

	updated := trackedSlice("a", "web-1", "web")
	updated.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-22T04:00:00Z"}
	tr.SetSlice(updated)
	dirty, triggers := tr.TakeDirty()
	if len(dirty) != 1 || len(dirty[web].Slices) != 2 || !slices.ContainsFunc(dirty[web].Slices, func(o *model.SliceObject) bool {
		return o.Name == "web-1" && !o.Trigger().IsZero()
	}) {
		t.Errorf("update: changed = %v, want web with the new web-1 among its 2 slices", dirty)
	}
	if want := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC); len(triggers) != 1 || !triggers[0].Equal(want) {
		t.Errorf("update: triggers = %v, want [%v]", triggers, want)
	}

	tr.SetSlice(trackedSlice("a", "web-2", "api")) // relabelled to another Service
	step("moved", map[model.ServiceKey][]string{web: {"web-1"}, api: {"web-2"}})

	tr.SetSlice(trackedSlice("a", "web-2", "")) // label removed
	step("unlabelled", map[model.ServiceKey][]string{api: {}})

	tr.DeleteSlice("a", "web-1")
	step("deleted", map[model.ServiceKey][]string{web: {}})

	tr.DeleteSlice("a", "web-1") // already gone: nothing changes
	tr.DeleteSlice("a", "never-seen")
	step("deleted again", map[model.ServiceKey][]string{})

	all, _ := tr.All()
	if len(all) != 1 || all[web].Service == nil || len(all[web].Slices) != 0 {
		t.Errorf("All = %v, want only web, without slices", all)
	}
	if o := tr.objectsLocked(webB); len(o.Slices) != 1 || o.Slices[0].Namespace() != "b" {
		t.Errorf("slice of namespace b = %v, want b/web-1 untouched", o.Slices)
	}
}

func equalNames(a, b map[model.ServiceKey][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

// TestTrackerOwnersByName checks that the tracker finds the Service a
// slice is listed under from the slice's name, or from oddOwners when the
// name is not its Service's: random sets, moves and deletions of slices
// whose names share prefixes with several Services, against a plain map
// of slice to Service.
func TestTrackerOwnersByName(t *testing.T) {
	services := []string{"web", "web-api", "web-api-x", "api", "w"}
	names := []string{"web", "web-1", "web-api", "web-api-1", "web-api-x-1", "web-api-x", "api-1", "w-web", "odd", "w", "webapi"}
	rng := rand.New(rand.NewPCG(1, 2))
	tr := NewTracker()
	for _, ns := range []string{"a", "b"} {
		for _, s := range services {
			tr.SetService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s}})
		}
	}
	type slice struct{ ns, name string }
	want := map[slice]string{} // slice -> its Service
	for step := range 5000 {
		sl := slice{[]string{"a", "b"}[rng.IntN(2)], names[rng.IntN(len(names))]}
		switch op := rng.IntN(4); op {
		case 0:
			tr.DeleteSlice(sl.ns, sl.name)
			delete(want, sl)
		case 1:
			tr.SetSlice(trackedSlice(sl.ns, sl.name, "")) // unlabelled
			delete(want, sl)
		default:
			s := services[rng.IntN(len(services))]
			tr.SetSlice(trackedSlice(sl.ns, sl.name, s))
			want[sl] = s
		}
		all, _ := tr.All()
		got := map[slice]string{}
		for k, o := range all {
			for _, so := range o.Slices {
				if so.Namespace() != k.Namespace() {
					t.Fatalf("step %d: slice %s/%s listed under %s", step, so.Namespace(), so.Name, k)
				}
				s := slice{so.Namespace(), so.Name}
				if prev, dup := got[s]; dup {
					t.Fatalf("step %d: slice %v listed under both %s and %s", step, s, prev, k.Name())
				}
				got[s] = k.Name()
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: slices by Service = %v, want %v", step, got, want)
		}
	}
	if len(want) > 0 && len(tr.oddOwners) == 0 {
		t.Errorf("no slice listed in oddOwners: the test makes none not named after its Service")
	}
	for sk, k := range tr.oddOwners {
		if namedAfter(sk.name, k.Name()) || want[slice{sk.namespace.Value(), sk.name}] != k.Name() {
			t.Errorf("oddOwners holds %s/%s under %s, which it need not or should not", sk.namespace.Value(), sk.name, k)
		}
	}
}

// Until the Syncer first takes them, every Service counts as changed, by
// TakeDirty as by All; after that, only those changed since.
func TestTrackerEveryServiceDirtyUntilTaken(t *testing.T) {
	for _, first := range []string{"TakeDirty", "All"} {
		tr := NewTracker()
		for _, n := range []string{"a", "b", "c"} {
			tr.SetService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: n}})
		}
		take := tr.TakeDirty
		if first == "All" {
			take = tr.All
		}
		if got, _ := take(); len(got) != 3 {
			t.Fatalf("%s first: %d Services, want all 3", first, len(got))
		}
		if got, _ := tr.TakeDirty(); len(got) != 0 {
			t.Fatalf("after %s: %d Services dirty, want none", first, len(got))
		}
		tr.SetService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}})
		tr.DeleteService(model.NewServiceKey("ns", "c"))
		got, _ := tr.TakeDirty()
		if len(got) != 2 || got[model.NewServiceKey("ns", "b")].Service == nil || got[model.NewServiceKey("ns", "c")].Service != nil {
			t.Fatalf("after %s, b changed and c deleted: %v", first, got)
		}
	}
}
