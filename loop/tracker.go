// Package loop is the sync loop: it tracks which Services changed,
// coalesces bursts of changes, and drives the ruleset programmer.
//
// Data flows one way: a source (package source) writes API objects into
// the Tracker; the Syncer takes the Services whose objects changed, builds
// their model, and hands the changes to the Programmer in one batch.
package loop

import (
	"slices"
	"strings"
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
	// a megabyte. A slice change or deletion finds the Service a slice is
	// listed under from the slice's name (ownerLocked), without a walk
	// over every Service, which at ten thousand Services made the first
	// sync quadratic, and without an index of every slice (5 MB at a
	// hundred thousand): a slice is named after its Service, as the
	// EndpointSlice controller names them (<service>-<suffix>), or is
	// listed in oddOwners.
	services  map[model.ServiceKey]tracked
	oddOwners map[sliceKey]model.ServiceKey
	dirty     map[model.ServiceKey]struct{}
	// allDirty is set until the Syncer first takes the Services: every
	// one counts as changed, and dirty is not kept (a first load of a
	// hundred thousand Services wrote each key in it twice, a tenth of
	// the time from the manifests read to the first sync).
	allDirty bool
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
		services:  map[model.ServiceKey]tracked{},
		oddOwners: map[sliceKey]model.ServiceKey{},
		dirty:     map[model.ServiceKey]struct{}{},
		allDirty:  true,
		changed:   make(chan struct{}, 1),
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
	if !t.allDirty {
		t.dirty[k] = struct{}{}
	}
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
	ns := sl.Namespace()
	k, ok := sl.Service()
	trigger := sl.Trigger()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, listed := t.services[k]
	i := -1
	if ok && listed {
		i = e.slices.index(sl.Name)
	}
	if i < 0 {
		// Not listed under its Service yet: new, or moved from another.
		if old, found := t.ownerLocked(ns, sl.Name); found {
			t.removeSliceLocked(old, ns, sl.Name)
			e = t.services[k]
		}
	}
	if !ok {
		return
	}
	if i >= 0 {
		e.slices.set(i, sl)
	} else {
		e.slices.add(sl)
		if !namedAfter(sl.Name, k.Name()) {
			t.oddOwners[sliceKey{unique.Make(ns), sl.Name}] = k
		}
	}
	t.services[k] = e
	if !trigger.IsZero() {
		t.triggers = append(t.triggers, trigger)
	}
	t.markLocked(k)
}

// namedAfter tells whether a slice's name is its Service's, or starts
// with it and a '-', as the EndpointSlice controller names slices: then
// ownerLocked finds the Service from the slice's name alone.
func namedAfter(slice, service string) bool {
	return len(slice) >= len(service) && slice[:len(service)] == service &&
		(len(slice) == len(service) || slice[len(service)] == '-')
}

// ownerLocked returns the Service the slice namespace/name is listed
// under, if any. A slice is listed under one Service at most, and one
// named after it (namedAfter) is listed under a Service whose name is the
// slice's or the part of it before one of its '-'s; another is in
// oddOwners.
func (t *Tracker) ownerLocked(namespace, name string) (model.ServiceKey, bool) {
	if len(t.oddOwners) > 0 {
		if k, ok := t.oddOwners[sliceKey{unique.Make(namespace), name}]; ok {
			return k, true
		}
	}
	for end := len(name); end > 0; {
		k := model.NewServiceKey(namespace, name[:end])
		if e, ok := t.services[k]; ok && e.slices.index(name) >= 0 {
			return k, true
		}
		end = strings.LastIndexByte(name[:end], '-')
	}
	return model.ServiceKey{}, false
}

// removeSliceLocked takes the slice namespace/name off the list of
// Service k.
func (t *Tracker) removeSliceLocked(k model.ServiceKey, namespace, name string) {
	if !namedAfter(name, k.Name()) {
		delete(t.oddOwners, sliceKey{unique.Make(namespace), name})
	}
	e := t.services[k]
	e.slices.remove(name)
	t.putLocked(k, e)
	t.markLocked(k)
}

// DeleteSlice records that an EndpointSlice is gone.
func (t *Tracker) DeleteSlice(namespace, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k, ok := t.ownerLocked(namespace, name); ok {
		t.removeSliceLocked(k, namespace, name)
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
	if t.allDirty {
		return t.takeLocked(func(tracked) bool { return true })
	}
	out := make(map[model.ServiceKey]Objects, len(t.dirty))
	for k := range t.dirty {
		out[k] = t.objectsLocked(k)
	}
	return out, t.clearLocked()
}

// All returns the objects of every Service, and forgets pending changes:
// they are all included.
func (t *Tracker) All() (map[model.ServiceKey]Objects, []time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.takeLocked(func(e tracked) bool { return e.svc != nil })
}

// takeLocked returns the objects of the Services whose entry want
// accepts, and clears what is pending.
func (t *Tracker) takeLocked(want func(tracked) bool) (map[model.ServiceKey]Objects, []time.Time) {
	out := make(map[model.ServiceKey]Objects, len(t.services))
	for k, e := range t.services {
		if want(e) {
			out[k] = Objects{Service: e.svc, Slices: e.slices.all()}
		}
	}
	return out, t.clearLocked()
}

// clearLocked forgets what is pending, and returns the pending trigger
// times.
func (t *Tracker) clearLocked() []time.Time {
	// A new map, not clear: a cleared map keeps the table it grew to,
	// which after the first sync holds every Service.
	t.dirty = map[model.ServiceKey]struct{}{}
	t.allDirty = false
	triggers := t.triggers
	t.triggers = nil
	return triggers
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
	return Objects{Service: e.svc, Slices: e.slices.all()}
}

// tracked is one Service's objects: its own (nil while only slices that
// name it are known) and its slices.
type tracked struct {
	svc    *model.ServiceObject
	slices sliceList
}

// sliceList is a Service's slices: most have one, held without an array
// of its own (a hundred thousand of them were 0.8 MB, and the map's
// entries 8 bytes each larger).
type sliceList struct {
	one  *model.SliceObject    // the only slice, when more is nil
	more *[]*model.SliceObject // two or more
}

func (l *sliceList) len() int {
	switch {
	case l.more != nil:
		return len(*l.more)
	case l.one != nil:
		return 1
	}
	return 0
}

// all returns a new array of the slices (nil for none).
func (l *sliceList) all() []*model.SliceObject {
	switch {
	case l.more != nil:
		return slices.Clone(*l.more)
	case l.one != nil:
		return []*model.SliceObject{l.one}
	}
	return nil
}

// index returns the position of the slice named name, or -1.
func (l *sliceList) index(name string) int {
	switch {
	case l.more != nil:
		return slices.IndexFunc(*l.more, func(o *model.SliceObject) bool { return o.Name == name })
	case l.one != nil && l.one.Name == name:
		return 0
	}
	return -1
}

func (l *sliceList) set(i int, sl *model.SliceObject) {
	if l.more != nil {
		(*l.more)[i] = sl
	} else {
		l.one = sl
	}
}

func (l *sliceList) add(sl *model.SliceObject) {
	switch {
	case l.more != nil:
		*l.more = append(*l.more, sl)
	case l.one != nil:
		l.more = &[]*model.SliceObject{l.one, sl}
		l.one = nil
	default:
		l.one = sl
	}
}

// remove takes the slice named name out, if it is there.
func (l *sliceList) remove(name string) {
	i := l.index(name)
	switch {
	case i < 0:
	case l.more == nil:
		l.one = nil
	case len(*l.more) == 2:
		l.one, l.more = (*l.more)[1-i], nil
	default:
		*l.more = slices.Delete(*l.more, i, i+1)
	}
}

// putLocked stores a Service's entry, or removes it when it holds nothing.
func (t *Tracker) putLocked(k model.ServiceKey, e tracked) {
	if e.svc == nil && e.slices.len() == 0 {
		delete(t.services, k)
		return
	}
	t.services[k] = e
}
