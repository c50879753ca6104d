package nft

import (
	"slices"
	"testing"
)

// What a shard counted recently, and the last reading that found it
// counting, survive a reading that finds its table gone or just programmed
// anew (a count gone down to zero), and follow every reading that tells
// something: an increase, or a count since the table was programmed anew.
func TestNextRecent(t *testing.T) {
	for _, c := range []struct {
		name                    string
		recent, seen, last, now []uint64
		wantRecent, wantSeen    []uint64
	}{
		{"the first reading: all it counted", nil, nil, nil, []uint64{5, 0, 2}, []uint64{5, 0, 2}, []uint64{9, 0, 9}},
		{"counts grew", []uint64{1, 1, 1}, []uint64{3, 3, 3}, []uint64{10, 4, 7}, []uint64{30, 4, 8}, []uint64{20, 0, 1}, []uint64{9, 3, 9}},
		{"read while the tables were gone", []uint64{20, 0, 1}, []uint64{8, 3, 8}, []uint64{30, 4, 8}, []uint64{0, 0, 0}, []uint64{20, 0, 1}, []uint64{8, 3, 8}},
		{"read after a repair, traffic since", []uint64{20, 0, 1}, []uint64{8, 3, 8}, []uint64{30, 4, 8}, []uint64{6, 0, 0}, []uint64{6, 0, 1}, []uint64{9, 3, 8}},
		{"after zeros, counting again", []uint64{20, 0, 1}, []uint64{8, 3, 8}, []uint64{0, 0, 0}, []uint64{9, 0, 0}, []uint64{9, 0, 0}, []uint64{9, 3, 8}},
		{"another layout", []uint64{20, 0, 1}, []uint64{8, 3, 8}, []uint64{30, 4, 8}, []uint64{1, 2}, []uint64{1, 2}, []uint64{9, 9}},
	} {
		recent, seen := nextRecent(c.recent, c.seen, c.last, c.now, 9)
		if !slices.Equal(recent, c.wantRecent) || !slices.Equal(seen, c.wantSeen) {
			t.Errorf("%s: nextRecent(%v, %v, %v, %v, 9) = %v, %v; want %v, %v", c.name, c.recent, c.seen, c.last, c.now, recent, seen, c.wantRecent, c.wantSeen)
		}
	}
}

// A repair after a flush serves first the shard that carried traffic
// before it, also when a counters reading was taken while the tables were
// gone, and when one taken during the repair found it counting less than
// another shard counted before the flush.
func TestShardOrderAfterAReadingOfNoTables(t *testing.T) {
	p := &Programmer{}
	p.cfg.Shards = 4
	read := func(now ...uint64) {
		c := &p.counters
		c.readings++
		c.shardRecent, c.shardSeen = nextRecent(c.shardRecent, c.shardSeen, c.shardNew, now, c.readings)
		c.shardNew = now
	}
	first := func(want int, when string) {
		t.Helper()
		if got := p.shardOrder(); got[0] != want {
			t.Fatalf("%s: order %v, want shard %d first", when, got, want)
		}
	}
	read(0, 0, 0, 0)
	read(0, 900, 0, 0)  // another shard's traffic, then none
	read(0, 900, 50, 0) // the canary's shard
	first(2, "the canary's traffic")
	read(0, 0, 0, 0) // the tables flushed, not repaired yet
	first(2, "after a reading of no tables")
	read(0, 0, 3, 0) // the canary's shard repaired first, the others not yet
	read(0, 0, 0, 0) // flushed again
	first(2, "after a reading during the repair")
}
