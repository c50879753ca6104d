package source

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
)

// The informer keeps Services and slices converted (cachedService,
// cachedSlice): it must still find their keys, and the tracker must still
// learn a slice's Service and trigger time.
func TestCachedSlice(t *testing.T) {
	sl := labelledSlice("shop", "web-1", "web")
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-22T04:00:00.5Z", "other": "x"}
	sl.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.1"}, TargetRef: &corev1.ObjectReference{Name: "pod"}}}
	obj, err := (&KubeSource{}).convertForCache(sl)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := obj.(*cachedSlice)
	if !ok {
		t.Fatalf("transform gave %T, want *cachedSlice", obj)
	}
	if key, err := cache.MetaNamespaceKeyFunc(obj); err != nil || key != "shop/web-1" {
		t.Errorf("informer key = %q, %v; want shop/web-1", key, err)
	}
	if again, _ := (&KubeSource{}).convertForCache(obj); again != obj {
		t.Errorf("transform of a cachedSlice gave %v, want it unchanged", again)
	}
	if cp := c.DeepCopyObject().(*cachedSlice); cp == c || cp.SliceObject != c.SliceObject {
		t.Errorf("deep copy %+v of %+v", cp, c)
	}
	svcObj, err := (&KubeSource{}).convertForCache(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}})
	if err != nil {
		t.Fatal(err)
	}
	if key, err := cache.MetaNamespaceKeyFunc(svcObj); err != nil || key != "shop/web" {
		t.Errorf("informer key of the Service = %q, %v; want shop/web", key, err)
	}

	tr := loop.NewTracker()
	setCachedSlice(tr, obj)
	dirty, triggers := tr.TakeDirty()
	web := model.NewServiceKey("shop", "web")
	if len(dirty) != 1 || len(dirty[web].Slices) != 1 || dirty[web].Slices[0].Name != "web-1" {
		t.Errorf("tracker after the cached slice: %v, want shop/web with web-1", dirty)
	}
	if want := time.Date(2026, 11, 22, 4, 0, 0, 5e8, time.UTC); len(triggers) != 1 || !triggers[0].Equal(want) {
		t.Errorf("triggers = %v, want [%v]", triggers, want)
	}

	// Relabelled to no Service: it leaves shop/web.
	unlabelled, _ := (&KubeSource{}).convertForCache(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1"}})
	setCachedSlice(tr, unlabelled)
	if dirty, _ := tr.TakeDirty(); len(dirty) != 1 || len(dirty[web].Slices) != 0 {
		t.Errorf("after the label went: %v, want shop/web without slices", dirty)
	}
}

// labelledSlice is an empty EndpointSlice of a Service.
func labelledSlice(namespace, name, service string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
		Labels: map[string]string{model.LabelServiceName: service}}}
}
