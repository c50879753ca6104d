package nft

import (
	"slices"
	"testing"
)

// What a shard counted recently survives a reading that finds its table
// gone or just programmed anew (a count gone down to zero), and follows
// every reading that tells something: an increase, or a count since the
// table was programmed anew.
func TestNextRecent(t *testing.T) {
	for _, c := range []struct {
		name                    string
		recent, last, now, want []uint64
	}{
		{"the first reading: all it counted", nil, nil, []uint64{5, 0, 2}, []uint64{5, 0, 2}},
		{"counts grew", []uint64{1, 1, 1}, []uint64{10, 4, 7}, []uint64{30, 4, 8}, []uint64{20, 0, 1}},
		{"read while the tables were gone", []uint64{20, 0, 1}, []uint64{30, 4, 8}, []uint64{0, 0, 0}, []uint64{20, 0, 1}},
		{"read after a repair, traffic since", []uint64{20, 0, 1}, []uint64{30, 4, 8}, []uint64{6, 0, 0}, []uint64{6, 0, 1}},
		{"after zeros, counting again", []uint64{20, 0, 1}, []uint64{0, 0, 0}, []uint64{9, 0, 0}, []uint64{9, 0, 0}},
		{"another layout", []uint64{20, 0, 1}, []uint64{30, 4, 8}, []uint64{1, 2}, []uint64{1, 2}},
	} {
		if got := nextRecent(c.recent, c.last, c.now); !slices.Equal(got, c.want) {
			t.Errorf("%s: nextRecent(%v, %v, %v) = %v, want %v", c.name, c.recent, c.last, c.now, got, c.want)
		}
	}
}

// A repair after a flush serves first the shard that carried traffic
// before it, also when a counters reading was taken while the tables were
// gone.
func TestShardOrderAfterAReadingOfNoTables(t *testing.T) {
	p := &Programmer{}
	p.cfg.Shards = 4
	read := func(now ...uint64) {
		c := &p.counters
		c.shardRecent, c.shardNew = nextRecent(c.shardRecent, c.shardNew, now), now
	}
	read(0, 0, 0, 0)
	read(0, 0, 50, 0) // the canary's shard
	if got := p.shardOrder(); got[0] != 2 {
		t.Fatalf("order %v: want shard 2 first", got)
	}
	read(0, 0, 0, 0) // the tables flushed, not repaired yet
	if got := p.shardOrder(); got[0] != 2 {
		t.Fatalf("after a reading of no tables, order %v: want shard 2 first", got)
	}
}
