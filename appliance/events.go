package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Event kinds of the gateway's timeline.
const (
	EventSync         = "sync"         // a sync that changed something or failed
	EventRepair       = "repair"       // drift repaired
	EventAnnouncement = "announcement" // an address announced or withdrawn
	EventFailover     = "failover"     // a peer gateway up or down, a role taken or lost
	EventRefused      = "refused"      // input refused: a Service, a file, a peer, an entry
)

// DefaultEventsSize is how many events Events keeps when NewEvents is
// given zero.
const DefaultEventsSize = 1000

// Event is one entry of the gateway's timeline.
type Event struct {
	Time    time.Time         `json:"time"`
	Kind    string            `json:"kind"`
	Level   string            `json:"level"`
	Message string            `json:"message"`
	Attrs   map[string]string `json:"attrs,omitempty"`
}

// Events is the gateway's timeline: a ring of the last events, the
// oldest dropped first.
type Events struct {
	mu    sync.Mutex
	ring  []Event
	next  int
	total uint64
}

// NewEvents returns a timeline keeping the last size events
// (DefaultEventsSize when size is zero or less).
func NewEvents(size int) *Events {
	if size <= 0 {
		size = DefaultEventsSize
	}
	return &Events{ring: make([]Event, 0, size)}
}

// Add records ev; a zero Time is now.
func (e *Events) Add(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if ev.Level == "" {
		ev.Level = "INFO"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.total++
	if len(e.ring) < cap(e.ring) {
		e.ring = append(e.ring, ev)
		return
	}
	e.ring[e.next] = ev
	e.next = (e.next + 1) % len(e.ring)
}

// List returns the kept events, newest first, and how many were ever
// added.
func (e *Events) List() ([]Event, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Event, 0, len(e.ring))
	out = append(out, e.ring[e.next:]...)
	out = append(out, e.ring[:e.next]...)
	slices.Reverse(out)
	return out, e.total
}

// EventsJSON is the body of GET /api/v1/events.
type EventsJSON struct {
	// Total counts every event since the start; Events holds the newest
	// (the ring's size at most), newest first.
	Total  uint64  `json:"total"`
	Events []Event `json:"events"`
}

func (s *server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	list, total := s.opts.Events.List()
	if kind := q.Get("kind"); kind != "" {
		list = slices.DeleteFunc(list, func(e Event) bool { return e.Kind != kind })
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeJSON(w, r, http.StatusBadRequest, ErrorJSON{Error: "limit: " + strconv.Quote(v) + " is not a positive number"})
			return
		}
		list = list[:min(n, len(list))]
	}
	s.writeJSON(w, r, http.StatusOK, EventsJSON{Total: total, Events: list})
}

// EventHandler passes every record on to the next handler and copies
// those whose message names an event kind into the timeline: the events
// are what the gateway already logs, kept for the page.
type EventHandler struct {
	next   slog.Handler
	events *Events
	kinds  map[string]string // message → kind
	attrs  []slog.Attr
	group  string
}

// NewEventHandler returns a handler writing to next, and adding to events
// the records of level Info or more whose message is a key of kinds.
func NewEventHandler(next slog.Handler, events *Events, kinds map[string]string) *EventHandler {
	return &EventHandler{next: next, events: events, kinds: kinds}
}

// Enabled implements slog.Handler.
func (h *EventHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.next.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *EventHandler) Handle(ctx context.Context, r slog.Record) error {
	if kind, ok := h.kinds[r.Message]; ok && r.Level >= slog.LevelInfo {
		attrs := make(map[string]string, len(h.attrs)+r.NumAttrs())
		for _, a := range h.attrs {
			attrs[a.Key] = fmt.Sprint(a.Value.Resolve().Any())
		}
		r.Attrs(func(a slog.Attr) bool {
			if !a.Equal(slog.Attr{}) {
				attrs[grouped(h.group, a.Key)] = fmt.Sprint(a.Value.Resolve().Any())
			}
			return true
		})
		h.events.Add(Event{Time: r.Time, Kind: kind, Level: r.Level.String(), Message: r.Message, Attrs: attrs})
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

// WithAttrs implements slog.Handler.
func (h *EventHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(as)
	c.attrs = slices.Clip(h.attrs)
	for _, a := range as {
		c.attrs = append(c.attrs, slog.Attr{Key: grouped(h.group, a.Key), Value: a.Value})
	}
	return &c
}

// WithGroup implements slog.Handler.
func (h *EventHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	c.group = grouped(h.group, name)
	return &c
}

// grouped is key in group, as slog's text handler writes it.
func grouped(group, key string) string {
	if group == "" {
		return key
	}
	return group + "." + key
}
