package ipam

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// As client-go's event recorder (tools/record): per object a burst of 25
// Events, then one every five minutes; the last 4096 distinct Events
// remembered, so that one that happens again bumps the count of the Event
// already written instead of writing another.
const (
	eventBurst      = 25
	eventEvery      = 5 * time.Minute
	eventCacheSize  = 4096
	eventQueueDepth = 1000
)

// eventWriter writes core/v1 Events as client-go's recorder does, without
// linking it (it imports every API group's registration): in the
// background, dropped when the queue is full or the object is over its
// rate, deduplicated (an Event seen before is patched with count + 1 and a
// new lastTimestamp). Names are the object's and a suffix the API server
// makes unique.
type eventWriter struct {
	client rest.Interface
	source corev1.EventSource
	clock  clock.PassiveClock
	log    *slog.Logger
	queue  chan *corev1.Event

	// Only run's goroutine uses these.
	written *lru.Cache // eventKey → writtenEvent
	limits  *lru.Cache // object → *rate.Limiter
}

// writtenEvent is what is remembered of an Event written.
type writtenEvent struct {
	name  string
	first metav1.Time
	count int32
}

func newEventWriter(client rest.Interface, source corev1.EventSource, clk clock.PassiveClock, log *slog.Logger) *eventWriter {
	return &eventWriter{client: client, source: source, clock: clk, log: log,
		queue: make(chan *corev1.Event, eventQueueDepth), written: lru.New(eventCacheSize), limits: lru.New(eventCacheSize)}
}

// event queues an Event about ref; it never blocks.
func (w *eventWriter) event(ref *corev1.ObjectReference, eventType, reason, message string) {
	t := metav1.NewTime(w.clock.Now())
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: ref.Name + ".", Namespace: ns},
		InvolvedObject:      *ref,
		Reason:              reason,
		Message:             message,
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		Type:                eventType,
		Source:              w.source,
		ReportingController: w.source.Component,
		ReportingInstance:   w.source.Host,
	}
	select {
	case w.queue <- ev:
	default:
		w.log.Debug("Event dropped: too many queued", "reason", reason, "object", ref.Namespace+"/"+ref.Name)
	}
}

// run writes the queued Events until ctx ends.
func (w *eventWriter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.queue:
			w.write(ctx, ev)
		}
	}
}

func eventKey(ev *corev1.Event) string {
	o := ev.InvolvedObject
	return strings.Join([]string{ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name, o.FieldPath,
		string(o.UID), o.APIVersion, ev.Type, ev.Reason, ev.Message}, "\x00")
}

func objectKey(ev *corev1.Event) string {
	o := ev.InvolvedObject
	return strings.Join([]string{ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name,
		string(o.UID), o.APIVersion, ev.Type}, "\x00")
}

// write creates ev, or bumps the count of the same Event written before.
func (w *eventWriter) write(ctx context.Context, ev *corev1.Event) {
	now := w.clock.Now()
	ok := objectKey(ev)
	lim, found := w.limits.Get(ok)
	if !found {
		lim = rate.NewLimiter(rate.Every(eventEvery), eventBurst)
	}
	w.limits.Add(ok, lim)
	if !lim.(*rate.Limiter).AllowN(now, 1) {
		w.log.Debug("Event dropped: too many about the object", "reason", ev.Reason, "object", ev.InvolvedObject.Namespace+"/"+ev.InvolvedObject.Name)
		return
	}
	key := eventKey(ev)
	var out corev1.Event
	var err error
	if v, seen := w.written.Get(key); seen {
		prev := v.(writtenEvent)
		ev.Name, ev.FirstTimestamp, ev.Count = prev.name, prev.first, prev.count+1
		patch, _ := json.Marshal(map[string]any{"count": ev.Count, "lastTimestamp": ev.LastTimestamp, "message": ev.Message})
		err = w.client.Patch(types.MergePatchType).Namespace(ev.Namespace).Resource("events").Name(ev.Name).
			Body(patch).Do(ctx).Into(&out)
		if apierrors.IsNotFound(err) { // expired meanwhile: a new one
			ev.Name, ev.FirstTimestamp, ev.Count = "", ev.LastTimestamp, 1
			err = w.create(ctx, ev, &out)
		}
	} else {
		err = w.create(ctx, ev, &out)
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("writing an Event failed", "reason", ev.Reason, "object", ev.InvolvedObject.Namespace+"/"+ev.InvolvedObject.Name, "err", err)
		}
		return
	}
	w.written.Add(key, writtenEvent{name: out.Name, first: out.FirstTimestamp, count: out.Count})
}

func (w *eventWriter) create(ctx context.Context, ev *corev1.Event, out *corev1.Event) error {
	return w.client.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Into(out)
}
