package ruleset

import "testing"

func TestAutoShardCount(t *testing.T) {
	for _, c := range []struct{ n, inPlace, want int }{
		{0, 0, 1},
		{100, 0, 1},
		{1_000, 0, 1},
		{1_001, 0, 2},
		{5_000, 0, 8},
		{8_001, 0, 16},
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
		{10_000, 8, 8},
		{600, 1, 1},
		{1_500, 1, 1},
		// ...others are not.
		{100_000, 16, 64},
		{100_000, 32, 64}, // 32 is for up to 32,000: not within 50,000-200,000
		{5_000, 64, 8},
		{100_000, 128, 64},
		{10_000, 4, 16},
		{100, 16, 1}, // the count of an older nftgate's "auto" for a small cluster
		{3_000, 1, 4},
	} {
		if got := AutoShardCount(c.n, c.inPlace); got != c.want {
			t.Errorf("AutoShardCount(%d, %d) = %d, want %d", c.n, c.inPlace, got, c.want)
		}
	}
}
