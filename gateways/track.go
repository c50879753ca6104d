package gateways

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// A gateway whose link to a segment it serves is cut (a cable, a switch
// port) still hears its peers over the channel's other links, so nothing
// in the set's heartbeats says it cannot carry what it holds. The Tracker
// watches the links of Config.TrackInterfaces and makes the gateway faulty
// (Set.SetFault) while one is not operationally up, and fit again once all
// have been up for Config.TrackUpAfter.

// trackPoll is how often the Tracker reads every tracked link, besides
// the kernel's link notifications: a notification lost to an overflow of
// the socket is made good within it.
const trackPoll = time.Second

// TrackOptions are what a Tracker needs besides the Config.
type TrackOptions struct {
	// Fault receives why the gateway is faulty ("" when fit) whenever
	// that changes: Set.SetFault.
	Fault func(why string)
	Log   *slog.Logger
	// Clock drives TrackUpAfter and the poll; nil is the real clock.
	Clock clock.WithTicker
	// Namespace, when set, is the network namespace whose links are
	// watched (tests); else this process's.
	Namespace *netns.NsHandle
	// Towards are addresses (the BGP peers) whose links are tracked too:
	// the link of each one's route, looked up at the start. One without a
	// route then is left out, and logged.
	Towards []netip.Addr
}

// Tracker watches the tracked links. Run does the work.
type Tracker struct {
	o     TrackOptions
	mu    sync.Mutex // guards w
	w     linkWatch
	h     *netlink.Handle
	clock clock.WithTicker
	log   *slog.Logger
	told  string
	once  bool
}

// NewTracker prepares a Tracker of cfg.TrackInterfaces (cfg after
// WithDefaults) and the links towards o.Towards; nil when there are none.
func NewTracker(cfg Config, o TrackOptions) (*Tracker, error) {
	if len(cfg.TrackInterfaces) == 0 && len(o.Towards) == 0 {
		return nil, nil
	}
	t := &Tracker{o: o, clock: o.Clock, log: o.Log, w: linkWatch{upAfter: *cfg.TrackUpAfter,
		up: map[string]bool{}, since: map[string]time.Time{}, state: map[string]string{}}}
	if t.clock == nil {
		t.clock = clock.RealClock{}
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	ns := netns.None()
	if o.Namespace != nil {
		ns = *o.Namespace
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("%s.track_interfaces: netlink: %w", Key, err)
	}
	t.h = h
	for i, n := range cfg.TrackInterfaces {
		if _, err := h.LinkByName(n); err != nil {
			h.Close()
			return nil, fmt.Errorf("%s.track_interfaces[%d] = %q: %w", Key, i, n, err)
		}
	}
	t.w.names = slices.Clone(cfg.TrackInterfaces)
	for _, a := range o.Towards {
		n, err := t.linkTowards(a)
		if err != nil {
			t.log.Warn("gateways: no route to a BGP peer at the start; its link is not tracked", "peer", a, "err", err)
			continue
		}
		if !slices.Contains(t.w.names, n) {
			t.w.names = append(t.w.names, n)
		}
	}
	if len(t.w.names) == 0 {
		h.Close()
		return nil, nil
	}
	t.log.Info("gateways: tracking links: while one is down this gateway is faulty", "links", t.w.names, "track_up_after", cfg.TrackUpAfter.String())
	// The links as they are at the start count as up for long: a gateway
	// that starts with its links up is fit at once.
	t.readAll(time.Time{})
	return t, nil
}

// linkTowards is the name of the link of the route to a (a zone names it
// itself).
func (t *Tracker) linkTowards(a netip.Addr) (string, error) {
	if z := a.Zone(); z != "" {
		return z, nil
	}
	routes, err := t.h.RouteGet(a.AsSlice())
	if err != nil {
		return "", err
	}
	if len(routes) == 0 || routes[0].LinkIndex == 0 {
		return "", fmt.Errorf("no route with a link")
	}
	l, err := t.h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", err
	}
	return l.Attrs().Name, nil
}

// Fault is why the gateway is faulty now ("" when fit).
func (t *Tracker) Fault() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	why, _ := t.w.fault(t.clock.Now())
	return why
}

// Run watches the links until ctx ends, telling Fault every change (and
// once at the start).
func (t *Tracker) Run(ctx context.Context) {
	defer t.h.Close()
	poll := t.clock.NewTicker(trackPoll)
	defer poll.Stop()
	var hold clock.Timer
	defer func() {
		if hold != nil {
			hold.Stop()
		}
	}()
	var updates chan netlink.LinkUpdate
	var done chan struct{}
	subscribe := func() {
		if done != nil {
			close(done)
		}
		updates, done = make(chan netlink.LinkUpdate, 64), make(chan struct{})
		opts := netlink.LinkSubscribeOptions{Namespace: t.o.Namespace, ErrorCallback: func(err error) {
			t.log.Debug("gateways: link notifications", "err", err)
		}}
		if err := netlink.LinkSubscribeWithOptions(updates, done, opts); err != nil {
			t.log.Warn("gateways: link notifications unavailable; reading the tracked links every second", "err", err)
			updates = nil
		}
	}
	subscribe()
	defer func() { close(done) }()
	for {
		t.mu.Lock()
		why, recheck := t.w.fault(t.clock.Now())
		t.mu.Unlock()
		if why != t.told || !t.once {
			t.told, t.once = why, true
			t.o.Fault(why)
		}
		var holdC <-chan time.Time
		if hold != nil {
			hold.Stop()
			hold = nil
		}
		if recheck > 0 {
			hold = t.clock.NewTimer(recheck)
			holdC = hold.C()
		}
		select {
		case <-ctx.Done():
			return
		case u, ok := <-updates:
			if !ok {
				// The socket failed: the poll covers the gap and
				// subscribes again at its next tick.
				updates = nil
				continue
			}
			if t.w.tracked(u.Attrs().Name) {
				t.readAll(t.clock.Now())
			}
		case <-poll.C():
			if updates == nil {
				subscribe()
			}
			t.readAll(t.clock.Now())
		case <-holdC:
		}
	}
}

// readAll reads every tracked link's state as of now. A notification is
// only the cue: the state comes from a read, so that one delivered late
// never undoes a newer one.
func (t *Tracker) readAll(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.w.names {
		l, err := t.h.LinkByName(n)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			t.w.observe(n, false, "gone", now)
		case err != nil:
			// Unknown: keep what was known.
			t.log.Debug("gateways: reading a tracked link", "link", n, "err", err)
		default:
			up := l.Attrs().RawFlags&(unix.IFF_UP|unix.IFF_RUNNING) == unix.IFF_UP|unix.IFF_RUNNING
			state := "down"
			if l.Attrs().RawFlags&unix.IFF_UP != 0 {
				state = "without carrier"
			}
			t.w.observe(n, up, state, now)
		}
	}
}

// linkWatch is the Tracker's state, without I/O: which tracked links are
// up, and since when.
type linkWatch struct {
	names   []string
	upAfter time.Duration
	up      map[string]bool
	since   map[string]time.Time // when the link last came up
	state   map[string]string    // why it is not up
}

func (w *linkWatch) tracked(name string) bool {
	for _, n := range w.names {
		if n == name {
			return true
		}
	}
	return false
}

// observe records link name up or not (state: why not) at now. The first
// observation of an up link dates it at now, which the Tracker's first
// read sets to long ago.
func (w *linkWatch) observe(name string, up bool, state string, now time.Time) {
	was, seen := w.up[name]
	w.up[name] = up
	if !up {
		w.state[name] = state
		return
	}
	if !was || !seen {
		w.since[name] = now
	}
}

// fault tells why the gateway is faulty at now ("" when fit): the first
// tracked link (in the configured order) that is not up, else the first
// that has not been up for upAfter; and in how long to look again
// (0: only on a change).
func (w *linkWatch) fault(now time.Time) (string, time.Duration) {
	for _, n := range w.names {
		if up, seen := w.up[n]; !up {
			if !seen {
				return fmt.Sprintf("link %s not read yet", n), 0
			}
			return fmt.Sprintf("link %s %s", n, w.state[n]), 0
		}
	}
	for _, n := range w.names {
		if left := w.since[n].Add(w.upAfter).Sub(now); left > 0 {
			return fmt.Sprintf("link %s back up, fit after track_up_after (%s)", n, w.upAfter), left
		}
	}
	return "", 0
}
