// Package loop is the sync loop: it tracks which Services changed,
// coalesces bursts of changes, and drives the ruleset programmer.
//
// Data flows one way: a source (package source) writes API objects into
// the Tracker; the Syncer takes the Services whose objects changed, builds
// their model, and hands the changes to the Programmer in one batch.
package loop

import (
	"slices"
	"sync"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nftgate/nftgate/model"
)

// Tracker holds what the model needs of the latest Service and
// EndpointSlice objects from a source (model.ServiceObject and
// model.SliceObject, not the objects themselves) and remembers which
// Services changed since the Syncer last looked.
type Tracker struct {
	mu sync.Mutex
	// services holds each Service and its EndpointSlices (most have one),
	// in one map: at ten thousand Services every map keyed by Service is
	// a megabyte. sliceOwner tells under which Service a slice is listed:
	// a slice change or deletion finds its entry without a walk over every
	// Service, which at ten thousand Services made the first sync
	// quadratic. It holds the slice itself, whose Service is the owner:
	// a pointer is a smaller entry than a second key.
	services   map[model.ServiceKey]tracked
	sliceOwner map[sliceKey]*model.SliceObject
	dirty      map[model.ServiceKey]struct{}
	// triggers are the last-change-trigger-time annotations of the
	// EndpointSlice changes not synced yet: when the change that led to
	// them happened, for the network programming latency.
	triggers []time.Time
	synced   bool
	// changed is signalled (without blocking) whenever dirty grows or the
	// source becomes synced; one pending signal covers any number of
	// changes, which is what coalesces bursts.
	changed chan struct{}
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{
		services:   map[model.ServiceKey]tracked{},
		sliceOwner: map[sliceKey]*model.SliceObject{},
		dirty:      map[model.ServiceKey]struct{}{},
		changed:    make(chan struct{}, 1),
	}
}

// Changed is signalled when there is something new to sync.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }

func (t *Tracker) signal() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

func (t *Tracker) markLocked(k model.ServiceKey) {
	t.dirty[k] = struct{}{}
	t.signal()
}

// SetService records a Service's current object.
func (t *Tracker) SetService(svc *corev1.Service) {
	t.SetServiceObject(model.NewServiceObject(svc))
}

// SetServiceObject records a Service's current object, converted.
func (t *Tracker) SetServiceObject(o *model.ServiceObject) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.services[o.Key]
	e.svc = o
	t.services[o.Key] = e
	t.markLocked(o.Key)
}

// DeleteService records that a Service is gone.
func (t *Tracker) DeleteService(k model.ServiceKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.services[k]
	if !ok || e.svc == nil {
		return
	}
	e.svc = nil
	t.putLocked(k, e)
	t.markLocked(k)
}

// sliceKey names an EndpointSlice: its namespace as a handle to the one
// copy every slice of it shares (8 bytes, where a string is 16).
type sliceKey struct {
	namespace unique.Handle[string]
	name      string
}

// SetSlice records an EndpointSlice's current object. A slice that moved to
// another Service (its label changed) is removed from the old one.
func (t *Tracker) SetSlice(sl *discoveryv1.EndpointSlice) {
	t.SetSliceObject(model.NewSliceObject(sl))
}

// SetSliceObject records an EndpointSlice's current object, converted.
func (t *Tracker) SetSliceObject(sl *model.SliceObject) {
	sk := sliceKey{unique.Make(sl.Namespace()), sl.Name}
	k, ok := sl.Service()
	trigger := sl.Trigger()
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, found := t.sliceOwner[sk]; found && (!ok || oldService(old) != k) {
		t.removeSliceLocked(oldService(old), sk)
	}
	if !ok {
		return
	}
	t.sliceOwner[sk] = sl
	e := t.services[k]
	i := slices.IndexFunc(e.slices, func(o *model.SliceObject) bool { return o.Name == sl.Name })
	if i >= 0 {
		e.slices[i] = sl
	} else {
		e.slices = append(e.slices, sl)
		t.services[k] = e
	}
	if !trigger.IsZero() {
		t.triggers = append(t.triggers, trigger)
	}
	t.markLocked(k)
}

// removeSliceLocked takes a slice off the list of Service k.
func (t *Tracker) removeSliceLocked(k model.ServiceKey, sk sliceKey) {
	delete(t.sliceOwner, sk)
	e := t.services[k]
	e.slices = slices.DeleteFunc(e.slices, func(o *model.SliceObject) bool { return o.Name == sk.name })
	if len(e.slices) == 0 {
		e.slices = nil
	}
	t.putLocked(k, e)
	t.markLocked(k)
}

// DeleteSlice records that an EndpointSlice is gone.
func (t *Tracker) DeleteSlice(namespace, name string) {
	sk := sliceKey{unique.Make(namespace), name}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.sliceOwner[sk]; ok {
		t.removeSliceLocked(oldService(old), sk)
	}
}

// SetSynced records that the source has delivered its complete initial
// state. Until then the Syncer changes nothing in the kernel, so a restart
// never publishes a partial view.
func (t *Tracker) SetSynced() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.synced = true
	t.signal()
}

// Synced tells whether the initial state is complete.
func (t *Tracker) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.synced
}

// Objects are what is kept of one Service's API objects.
type Objects struct {
	Service *model.ServiceObject // nil when the Service does not exist
	Slices  []*model.SliceObject
}

// TakeDirty returns the objects of every Service that changed since the
// last call and the trigger times of those changes, and forgets them.
func (t *Tracker) TakeDirty() (map[model.ServiceKey]Objects, []time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return takeLocked(t, t.dirty)
}

// All returns the objects of every Service, and forgets pending changes:
// they are all included.
func (t *Tracker) All() (map[model.ServiceKey]Objects, []time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	existing := make(map[model.ServiceKey]struct{}, len(t.services))
	for k, e := range t.services {
		if e.svc != nil {
			existing[k] = struct{}{}
		}
	}
	return takeLocked(t, existing)
}

// takeLocked returns the objects of the Services keyed in keys, with the
// pending trigger times, and clears what is pending.
func takeLocked[V any](t *Tracker, keys map[model.ServiceKey]V) (map[model.ServiceKey]Objects, []time.Time) {
	out := make(map[model.ServiceKey]Objects, len(keys))
	for k := range keys {
		out[k] = t.objectsLocked(k)
	}
	// A new map, not clear: a cleared map keeps the table it grew to,
	// which after the first sync holds every Service.
	t.dirty = map[model.ServiceKey]struct{}{}
	triggers := t.triggers
	t.triggers = nil
	return out, triggers
}

// MarkDirty queues Services again, with their trigger times, after a
// failed sync.
func (t *Tracker) MarkDirty(keys []model.ServiceKey, triggers []time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.triggers = append(t.triggers, triggers...)
	for _, k := range keys {
		t.markLocked(k)
	}
}

func (t *Tracker) objectsLocked(k model.ServiceKey) Objects {
	e := t.services[k]
	return Objects{Service: e.svc, Slices: slices.Clone(e.slices)}
}

// tracked is one Service's objects: its own (nil while only slices that
// name it are known) and its slices.
type tracked struct {
	svc    *model.ServiceObject
	slices []*model.SliceObject
}

// putLocked stores a Service's entry, or removes it when it holds nothing.
func (t *Tracker) putLocked(k model.ServiceKey, e tracked) {
	if e.svc == nil && len(e.slices) == 0 {
		delete(t.services, k)
		return
	}
	t.services[k] = e
}

// oldService is the Service a slice kept in sliceOwner is listed under
// (it has one, or it would not be kept).
func oldService(sl *model.SliceObject) model.ServiceKey {
	k, _ := sl.Service()
	return k
}
