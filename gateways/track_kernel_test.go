package gateways

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// The Tracker on a real link: a veth between two namespaces of a lab,
// its far end set down (the near end loses its carrier), up again (fit
// after track_up_after on the injected clock), the near end set down, and
// deleted; and an interface that does not exist refused at the start,
// naming the key.
func TestTrackerFollowsARealLink(t *testing.T) {
	labtest.RequireRoot(t)
	l, err := lab.New("track")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	gw, err := l.AddHost("gw")
	if err != nil {
		t.Fatal(err)
	}
	sw, err := l.AddHost("sw")
	if err != nil {
		t.Fatal(err)
	}
	v, err := l.Link(gw, nil, sw, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns := netns.NsHandle(gw.FD())
	upAfter := 2 * time.Second
	cfg := Config{TrackInterfaces: []string{"nosuch0"}, TrackUpAfter: &upAfter}
	if _, err := NewTracker(cfg, TrackOptions{Fault: func(string) {}, Namespace: &ns}); err == nil || !strings.Contains(err.Error(), `gateways.track_interfaces[0] = "nosuch0"`) {
		t.Fatalf("an interface that does not exist: %v, want an error naming gateways.track_interfaces[0]", err)
	}

	clk := clocktesting.NewFakeClock(time.Now())
	var mu sync.Mutex
	var told []string
	cfg.TrackInterfaces = []string{v.A}
	tr, err := NewTracker(cfg, TrackOptions{Clock: clk, Namespace: &ns, Fault: func(why string) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, why)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tr.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitTold := func(what string, ok func(string) bool) {
		t.Helper()
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(told) == 0 || !ok(told[len(told)-1]) {
				return &waitErr{what, told}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitTold("fit at the start", func(s string) bool { return s == "" })

	far, err := sw.Netlink().LinkByName(v.B)
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.Netlink().LinkSetDown(far); err != nil {
		t.Fatal(err)
	}
	waitTold("faulty: no carrier", func(s string) bool { return s == "link "+v.A+" without carrier" })
	if err := sw.Netlink().LinkSetUp(far); err != nil {
		t.Fatal(err)
	}
	waitTold("back up, held", func(s string) bool { return strings.Contains(s, "back up") })
	// Fit only once track_up_after has passed on the clock.
	clk.Step(upAfter - time.Millisecond)
	if why := tr.Fault(); !strings.Contains(why, "back up") {
		t.Fatalf("1 ms before track_up_after: %q, want still held", why)
	}
	clk.Step(time.Millisecond)
	waitTold("fit after track_up_after", func(s string) bool { return s == "" })

	near, err := gw.Netlink().LinkByName(v.A)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Netlink().LinkSetDown(near); err != nil {
		t.Fatal(err)
	}
	waitTold("faulty: set down", func(s string) bool { return s == "link "+v.A+" down" })
	if err := gw.Netlink().LinkDel(near); err != nil {
		t.Fatal(err)
	}
	waitTold("faulty: gone", func(s string) bool { return s == "link "+v.A+" gone" })
}

type waitErr struct {
	what string
	told []string
}

func (e *waitErr) Error() string {
	return "waiting for " + e.what + "; told " + strings.Join(quoteAll(e.told), ", ")
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "\"" + s + "\""
	}
	return out
}
