package memlimit

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
)

// TestMemoryLimitFollowsLiveData checks that the soft limit never stays
// below the live data a sync leaves, and that a full sync runs without it:
// with a floor far under this test process's own heap, the limit is raised
// to leave minHeadroom above it.
func TestMemoryLimitFollowsLiveData(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(math.MaxInt64)
	keep := make([]byte, 8<<20) // live data well above the floor
	m := New(1<<20, slog.New(slog.DiscardHandler))
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("limit before the first full sync = %d, want none", got)
	}
	gcPercent := func() int { p := debug.SetGCPercent(100); debug.SetGCPercent(p); return p }
	before := gcPercent()
	m.BeforeFull()
	if p := gcPercent(); p != before {
		t.Errorf("GOGC during the first full sync = %d, want %d as it was", p, before)
	}
	m.Synced(true)
	got := debug.SetMemoryLimit(-1)
	if got < int64(len(keep))+minHeadroom {
		t.Errorf("limit after the full sync = %d, want at least %d live bytes + %d", got, len(keep), minHeadroom)
	}
	m.BeforeFull()
	if p := gcPercent(); p != before {
		t.Errorf("GOGC during a later full sync = %d, want %d", p, before)
	}
	if during := debug.SetMemoryLimit(-1); during != math.MaxInt64 {
		t.Errorf("limit during a full sync = %d, want none", during)
	}
	m.Synced(false)
	if after := debug.SetMemoryLimit(-1); after < int64(len(keep))+minHeadroom || after > 2*got {
		t.Errorf("limit after a partial sync = %d, want about %d again", after, got)
	}
	runtime.KeepAlive(keep)
}

// TestMemoryLimitRoomGrowsWithLiveData checks that, above minHeadroom, the
// room left above the live data grows with it: a cluster ten times larger
// allocates no more per change, and the collector must then run no more
// often.
func TestMemoryLimitRoomGrowsWithLiveData(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(math.MaxInt64)
	keep := make([]byte, 2*minHeadroom*headroomDivisor) // room: more than minHeadroom
	m := New(1<<20, slog.New(slog.DiscardHandler))
	m.BeforeFull()
	m.Synced(true)
	want := int64(len(keep)) + int64(len(keep))/headroomDivisor
	if got := debug.SetMemoryLimit(-1); got < want {
		t.Errorf("limit after the full sync = %d, want at least %d live bytes + %d", got, len(keep), int64(len(keep))/headroomDivisor)
	}
	m.Synced(false)
	if got := debug.SetMemoryLimit(-1); got < want {
		t.Errorf("limit after a partial sync = %d, want at least %d again", got, want)
	}
	runtime.KeepAlive(keep)
}

// afterFirstFullSync returns a policy after its first full sync over live
// data of more than minHeadroom × headroomDivisor bytes (keep: the caller
// keeps it alive), and the limit it set.
func afterFirstFullSync(t *testing.T) (m *Policy, keep []byte, limit int64) {
	t.Setenv("GOMEMLIMIT", "")
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	keep = make([]byte, 2*minHeadroom*headroomDivisor)
	m = New(1<<20, slog.New(slog.DiscardHandler))
	m.BeforeFull()
	m.Synced(true)
	return m, keep, debug.SetMemoryLimit(-1)
}

// TestMemoryLimitRaisedWithinHalfTheRoom checks that the limit is raised
// after a partial sync once the live data comes within half the room of it
// (the first status rows, made after the first full sync, do so), not only
// once the collector is about to run without pause under it.
func TestMemoryLimitRaisedWithinHalfTheRoom(t *testing.T) {
	m, keep, before := afterFirstFullSync(t)
	r := room(liveHeap())
	more := make([]byte, r*5/8) // more than half the room, with room to spare
	runtime.GC()
	m.Synced(false)
	after := debug.SetMemoryLimit(-1)
	if live := liveHeap(); after < live+room(live)*9/10 {
		t.Errorf("limit after the live data grew by %d: %d (was %d), want about %d live bytes + %d", len(more), after, before, live, room(live))
	}
	runtime.KeepAlive(keep)
	runtime.KeepAlive(more)
}

// TestFullSyncIgnoresASmallRise checks that a full sync keeps the limit
// when its collection finds the live data grown by less than half the room
// (held for a moment beside it), and raises it for more.
func TestFullSyncIgnoresASmallRise(t *testing.T) {
	m, keep, before := afterFirstFullSync(t)
	r := room(liveHeap())
	small := make([]byte, r*3/8)
	m.BeforeFull()
	m.Synced(true)
	if after := debug.SetMemoryLimit(-1); after != before {
		t.Errorf("limit after a full sync found %d bytes more: %d, want %d as it was", len(small), after, before)
	}
	more := make([]byte, r*3/8) // with small, more than half the room
	m.BeforeFull()
	m.Synced(true)
	if after, live := debug.SetMemoryLimit(-1), liveHeap(); after < live+room(live)*9/10 {
		t.Errorf("limit after a full sync found %d bytes more: %d (was %d), want about %d live bytes + %d", len(small)+len(more), after, before, live, room(live))
	}
	runtime.KeepAlive(keep)
	runtime.KeepAlive(small)
	runtime.KeepAlive(more)
}

// TestStreamedFullSyncKeepsTheLimit checks that a full sync onto no tables,
// which holds one shard at a time, runs under the limit the last sync set,
// and that before the first sync there is none to put back.
func TestStreamedFullSyncKeepsTheLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(math.MaxInt64)
	keep := make([]byte, 8<<20)
	m := New(1<<20, slog.New(slog.DiscardHandler))
	m.BeforeFull()
	m.Streamed() // the cold start
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("limit during the first full sync = %d, want none", got)
	}
	m.Synced(true)
	set := debug.SetMemoryLimit(-1)
	m.BeforeFull()
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("limit during a full sync = %d, want none", got)
	}
	m.Streamed()
	if got := debug.SetMemoryLimit(-1); got != set {
		t.Errorf("limit during a streamed full sync = %d, want %d as the last sync set it", got, set)
	}
	runtime.KeepAlive(keep)
}

// TestColdGCPercent: the first full sync may grow the heap by a quarter of
// the live data or minHeadroom, whichever is more, and never by more than
// Go's default.
func TestColdGCPercent(t *testing.T) {
	for _, c := range []struct {
		live int64
		want int
	}{
		{0, 100},
		{16 << 20, 100},
		{minHeadroom, 100},
		{2 * minHeadroom, 50},
		{4 * minHeadroom, 25},
		{200 << 20, 25},
	} {
		if got := coldGCPercent(c.live); got != c.want {
			t.Errorf("coldGCPercent(%d) = %d, want %d", c.live, got, c.want)
		}
	}
}

// TestFirstFullSyncRunsWithColdGCPercent: with live data well above
// minHeadroom the first full sync runs with a lower GOGC, put back
// when it ends; a later full sync, or a GOGC in the environment, keeps
// GOGC as it is.
func TestFirstFullSyncRunsWithColdGCPercent(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(math.MaxInt64)
	gcPercent := func() int { p := debug.SetGCPercent(100); debug.SetGCPercent(p); return p }
	before := gcPercent()
	keep := make([]byte, 5*minHeadroom)
	runtime.GC()
	want := coldGCPercent(liveHeap())
	if want >= before {
		t.Fatalf("coldGCPercent of %d live bytes = %d, not below GOGC %d", liveHeap(), want, before)
	}
	for _, env := range []string{"", "100"} {
		t.Setenv("GOGC", env)
		m := New(1<<20, slog.New(slog.DiscardHandler))
		m.BeforeFull()
		during := gcPercent()
		m.Synced(true)
		if after := gcPercent(); after != before {
			t.Errorf("GOGC env %q: after the first full sync GOGC = %d, want %d as it was", env, after, before)
		}
		if env == "" && during != want || env != "" && during != before {
			t.Errorf("GOGC env %q: during the first full sync GOGC = %d", env, during)
		}
		m.BeforeFull()
		if p := gcPercent(); p != before {
			t.Errorf("GOGC env %q: during a later full sync GOGC = %d, want %d", env, p, before)
		}
		m.Synced(true)
	}
	runtime.KeepAlive(keep)
}

// TestFollowBetweenSyncs: live data that grows between syncs (state sync's
// flows follow the connections, not the Services) raises the limit once it
// comes within half the room of it, and the limit comes down again when
// the data is gone; never during a full sync that runs without a limit.
func TestFollowBetweenSyncs(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(math.MaxInt64)
	m := New(1<<20, slog.New(slog.DiscardHandler))
	m.follow(1 << 30)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("limit before the first sync = %d, want none", got)
	}
	m.BeforeFull()
	m.Synced(true)
	first := debug.SetMemoryLimit(-1)

	m.follow(first - minHeadroom) // more than half the room left
	if got := debug.SetMemoryLimit(-1); got != first {
		t.Errorf("limit %d after live data half the room under it, want %d as it was", got, first)
	}
	grown := first // live data reached the limit
	m.follow(grown)
	want := grown + max(minHeadroom, grown/headroomDivisor)
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Errorf("limit %d after the live data reached it, want %d", got, want)
	}

	m.BeforeFull()
	m.follow(4 * want)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("limit %d during a full sync, want none", got)
	}
	m.Synced(false)

	m.follow(256 << 20) // many flows
	if got := debug.SetMemoryLimit(-1); got != 384<<20 {
		t.Errorf("limit %d after the live data reached 256 MiB, want %d", got, 384<<20)
	}
	m.follow(8 << 20) // the flows ended
	if got := debug.SetMemoryLimit(-1); got != 8<<20+minHeadroom {
		t.Errorf("limit %d after the live data fell to 8 MiB, want %d", got, 8<<20+minHeadroom)
	}

	none := New(0, slog.New(slog.DiscardHandler))
	debug.SetMemoryLimit(math.MaxInt64)
	none.BeforeFull()
	none.Synced(true)
	none.follow(1 << 30)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("memory_limit 0: limit %d, want none", got)
	}
}
