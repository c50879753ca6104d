package ruleset

import "testing"

func TestAutoShardCount(t *testing.T) {
	for _, c := range []struct{ n, inPlace, want int }{
		{0, 0, 16},
		{100, 0, 16},
		{16_000, 0, 16},
		{16_001, 0, 32},
		{32_000, 0, 32},
		{40_000, 0, 64},
		{100_000, 0, 64},
		{1_000_000, 0, 64},
		// Tables in place within a factor of two are kept...
		{20_000, 16, 16},
		{20_000, 64, 64},
		{10_000, 32, 32},
		{10_000, 20, 20}, // a count set by hand before, in range
		// ...others are not.
		{100_000, 16, 64},
		{100_000, 32, 64}, // 32 is for up to 32,000: not within 50,000-200,000
		{5_000, 64, 16},
		{100_000, 128, 64},
		{10_000, 8, 16},
	} {
		if got := AutoShardCount(c.n, c.inPlace); got != c.want {
			t.Errorf("AutoShardCount(%d, %d) = %d, want %d", c.n, c.inPlace, got, c.want)
		}
	}
}
