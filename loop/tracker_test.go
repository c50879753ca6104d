package loop

import (
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
