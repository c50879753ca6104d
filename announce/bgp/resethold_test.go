package bgp

import (
	"testing"
	"time"
)

// A flapping session waits twice as long after each reset, up to the
// max, and the base again once it has stayed up.
func TestResetHoldDoublesUpToMaxAndSettles(t *testing.T) {
	h := resetHold{base: 3 * time.Second, max: 20 * time.Second, cur: 3 * time.Second}
	var got []time.Duration
	for range 5 {
		got = append(got, h.down())
	}
	want := []time.Duration{6 * time.Second, 12 * time.Second, 20 * time.Second, 20 * time.Second, 20 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits after successive resets: %v, want %v", got, want)
		}
	}
	if d := h.stable(); d != h.base {
		t.Fatalf("after a stable session: %v, want %v", d, h.base)
	}
	flat := resetHold{base: 3 * time.Second, max: 3 * time.Second, cur: 3 * time.Second}
	if d := flat.down(); d != 3*time.Second {
		t.Fatalf("max = base: %v, want no dampening", d)
	}
}
