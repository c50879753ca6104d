package ruleset

import (
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
)

// The oldest Service wins an element, as Older orders them, also for
// creation times a Unix nanosecond count does not hold (the zero time of a
// Service whose creation is unknown, a manifest's year 9999).
func TestClaimWinnerIsTheOldest(t *testing.T) {
	k := func(n string) model.ServiceKey { return model.NewServiceKey("default", n) }
	times := []time.Time{
		{}, time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i, a := range times {
		for j, b := range times {
			if (i == 0) != (j == 0) && (i == 1 || j == 1) {
				continue // both before 1678: one instant, ordered by name
			}
			for _, names := range [][2]string{{"a", "b"}, {"b", "a"}} {
				cs := claimSet{
					{svc: k(names[0]), created: model.InstantOf(a), verdict: Verdict{Kind: Goto, Chain: "x"}},
					{svc: k(names[1]), created: model.InstantOf(b), verdict: Verdict{Kind: Goto, Chain: "y"}},
				}
				want := k(names[1])
				if a.Before(b) || a.Equal(b) && k(names[0]).Less(k(names[1])) {
					want = k(names[0])
				}
				if got := cs.winner().svc; got != want {
					t.Errorf("%v (%s) against %v (%s): %s won, want %s", a, names[0], b, names[1], got, want)
				}
			}
		}
	}
}
