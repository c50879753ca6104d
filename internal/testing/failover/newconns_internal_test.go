package failover

import (
	"testing"
	"time"
)

// TestNewConnStatsWindow: behind ECMP, failures alternate with successes
// (only the share hashed to the dead gateway fails): the window runs from
// the first failure to the first success after the last one; a failure
// that ended before the failure counts apart.
func TestNewConnStatsWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	a := func(start, end int, err string) attempt { return attempt{start: at(start), end: at(end), err: err} }
	as := []attempt{
		a(-50, -49, "refused"),  // before the failure
		a(-10, 1000, "timeout"), // cut by it
		a(0, 1, ""),
		a(10, 1010, "timeout"),
		a(20, 21, ""),
		a(30, 31, ""),
		a(270, 1270, "timeout"),
		a(280, 300, ""),
		a(290, 291, ""),
	}
	s := newConnStats(as, t0, at(2000), 10*time.Millisecond, time.Second)
	if s.Attempts != 8 || s.Failed != 3 || s.FailedBefore != 1 || s.Reasons["timeout"] != 3 {
		t.Errorf("%+v", s)
	}
	if s.GapMs != 290 || s.LastFailedMs != 270 || s.SlowestMs != 20 {
		t.Errorf("window %.0f ms, last failed %.0f ms, slowest %.0f ms; want 290, 270, 20", s.GapMs, s.LastFailedMs, s.SlowestMs)
	}
	// Still failing at the end: the window runs to the end.
	s = newConnStats(append(as, a(1500, 2500, "timeout")), t0, at(2000), 10*time.Millisecond, time.Second)
	if s.GapMs != 2010 {
		t.Errorf("window %.0f ms, want 2010 (to the end)", s.GapMs)
	}
}
