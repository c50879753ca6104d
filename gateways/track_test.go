package gateways

import (
	"strings"
	"testing"
	"time"
)

func TestLinkWatchFaultAndHold(t *testing.T) {
	w := linkWatch{names: []string{"up0", "cl0"}, upAfter: 2 * time.Second, up: map[string]bool{}, since: map[string]time.Time{}, state: map[string]string{}}
	var zero time.Time
	now := time.Unix(1000, 0)
	if why, _ := w.fault(now); !strings.Contains(why, "up0 not read yet") {
		t.Fatalf("before any read: %q, want up0 not read yet", why)
	}
	// Up at the start: fit at once.
	w.observe("up0", true, "", zero)
	w.observe("cl0", true, "", zero)
	if why, again := w.fault(now); why != "" || again != 0 {
		t.Fatalf("both up from the start: %q, %v; want fit", why, again)
	}
	// The upstream link loses its carrier: faulty at once, until told.
	now = now.Add(time.Second)
	w.observe("up0", false, "without carrier", now)
	if why, again := w.fault(now); why != "link up0 without carrier" || again != 0 {
		t.Fatalf("carrier lost: %q, %v", why, again)
	}
	// Both down: the first in the configured order names the fault.
	w.observe("cl0", false, "gone", now)
	if why, _ := w.fault(now); why != "link up0 without carrier" {
		t.Fatalf("both down: %q", why)
	}
	w.observe("up0", true, "", now)
	if why, _ := w.fault(now); why != "link cl0 gone" {
		t.Fatalf("cl0 still gone: %q", why)
	}
	// Back: faulty for track_up_after more, then fit.
	now = now.Add(500 * time.Millisecond)
	w.observe("cl0", true, "", now)
	why, again := w.fault(now)
	if !strings.Contains(why, "back up") || again != 1500*time.Millisecond {
		t.Fatalf("up0 up 0.5 s, cl0 just now: %q, look again in %v; want back up, 1.5s", why, again)
	}
	// A flap within the hold starts it again.
	now = now.Add(time.Second)
	w.observe("cl0", false, "without carrier", now)
	w.observe("cl0", true, "", now.Add(100*time.Millisecond))
	now = now.Add(time.Second)
	if why, again := w.fault(now); !strings.Contains(why, "cl0 back up") || again != 1100*time.Millisecond {
		t.Fatalf("after a flap: %q, %v; want cl0 back up, 1.1s", why, again)
	}
	// The same up state observed again does not restart the hold.
	w.observe("cl0", true, "", now)
	if why, _ := w.fault(now.Add(1100 * time.Millisecond)); why != "" {
		t.Fatalf("held long enough: %q, want fit", why)
	}
}
