// Package memlimit keeps the Go runtime's soft memory limit just above the
// gateway's live data, and out of the way of full syncs.
package memlimit

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Policy makes memory_limit the floor of the Go runtime's soft memory
// limit: in a small cluster the collector then runs before the heap grows
// past it, instead of letting it reach twice the live data, and returns
// freed memory to the kernel sooner. The limit follows the cluster: after
// every sync it leaves room above the live data for minHeadroom or
// live/headroomDivisor, whichever is more, so that in a larger cluster the
// collector runs no more often per change than in a small one (past the
// limit it costs up to half the CPU).
//
// A full sync that reads every table back (a reconcile after another
// program's transaction), or replaces tables in place in one batch (a
// restart), holds for a moment several times the data of the steady state:
// the whole ruleset read or rendered. Under the limit the collector would
// run almost without pause through it (a cold start of 1 s took 4.5 s at
// 10,000 Services under a 128 MiB limit, when it rendered the whole
// ruleset at once), so the limit is lifted while a full sync runs, and
// after it the memory it used is handed back to the kernel at once. A
// GOMEMLIMIT in the environment wins, as the runtime documents.
//
// The first full sync onto no tables holds one shard at a time; it ran
// with GOGC 400 while it held the whole ruleset, then with Go's default
// (peak 616-625 -> 470-478 MiB at 100,000 Services). It grows the live
// data by the claim book and the tables' state, and at Go's default the
// heap doubled what was live: so the heap may grow by a quarter of the
// live data the sync starts from, or by minHeadroom, whichever is more
// (coldGCPercent). At 100,000 Services (nftgate alone on the bench's
// files, three runs each) the peak went 453-474 -> 342-370 MiB for 0.6 s
// more of the sync's own CPU (1.5-1.9 -> 2.3 s beside the kernel's 7-8 s);
// at 10,000 the live data before the sync is below minHeadroom, and GOGC
// stays as it was (a quarter cost the sync 0.1 s there for 15 MiB).
// Unless GOGC is set in the environment.
type Policy struct {
	floor int64
	log   *slog.Logger
	// mu guards what follows: Follow runs beside the sync loop.
	mu   sync.Mutex
	last int64 // the limit set last (by a sync or Follow); 0 before the first sync
	// lifted is set while a full sync runs without a limit.
	lifted bool
	// firstDone is set once the first full sync is over.
	firstDone bool
	// cold is set while the first full sync runs with coldGCPercent;
	// gcPercent is GOGC as it was before.
	cold      bool
	gcPercent int
}

// coldGCPercent is GOGC for the first full sync, from the live data
// before it: the heap may grow by live/coldRoomDivisor over it, or by
// minHeadroom, whichever is more (Go's default, 100, lets it double).
func coldGCPercent(live int64) int {
	if live <= 0 {
		return 100
	}
	return int(min(100, 100*max(minHeadroom, live/coldRoomDivisor)/live))
}

const coldRoomDivisor = 4

// headroomDivisor sets the room the memory limit leaves above the live data
// of a larger cluster: live/headroomDivisor (or minHeadroom, whichever is
// more). Under churn every change allocates about the same whatever the
// cluster's size, and each collection scans the whole live heap: the
// collector's CPU per change goes as live / room × bytes per change, so a
// room in proportion to the live data keeps it from growing with the
// Services, at the price of that much more resident memory. At a hundred
// thousand Services (about 260 MB live), over two minutes with a reconcile
// and a traffic history sample each minute: half the live data (2) held
// the resident memory at 394 MiB on average (370 median) for 3.3 s of CPU,
// all of it (1) at 447 MiB for 1.9 s, a quarter (4) at 361 MiB for 4.3 s;
// the changes themselves ran no collection with any of them.
const headroomDivisor = 2

// minHeadroom is the least room the memory limit leaves above the live
// data: more than a partial sync allocates at ten thousand Services, so
// that the collector runs less than once per sync. At ten thousand
// Services (about 30 MB live) it is the room: with 15 MB the bench's CPU
// per endpoint change went 5-7 to 8-22 ms, with the latency alike.
const minHeadroom = 32 << 20

// New returns the policy for a floor of limit bytes (0: no limit, only the
// first full sync's GOGC).
func New(limit int64, log *slog.Logger) *Policy {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		log.Info("memory limit from GOMEMLIMIT; memory_limit is not used", "GOMEMLIMIT", env)
		limit = 0
	}
	return &Policy{floor: limit, log: log}
}

// BeforeFull lifts the limit for a full sync. Only the sync loop's
// goroutine calls BeforeFull and Synced.
func (m *Policy) BeforeFull() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.firstDone && !m.cold && m.floor > 0 && os.Getenv("GOGC") == "" {
		m.cold = true
		m.gcPercent = debug.SetGCPercent(coldGCPercent(liveHeap()))
	}
	if m.floor > 0 {
		debug.SetMemoryLimit(math.MaxInt64)
		m.lifted = true
	}
}

// Streamed puts back, during a full sync, the limit BeforeFull lifted: the
// sync holds one shard's rules at a time, not the whole ruleset (a full
// sync onto no tables, as after nft flush ruleset). Before the first sync
// there is no limit to put back.
func (m *Policy) Streamed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.floor > 0 && m.last > 0 {
		debug.SetMemoryLimit(m.last)
		m.lifted = false
	}
}

// Synced sets the limit from the live data a sync left. After a full sync
// a collection first measures that data exactly (the last automatic one
// ran in the middle of the sync) and returns what the sync used; a rise of
// less than half the room is not followed, as partial syncs do not. After a
// partial sync the last collection's figure may include what was in use at
// that moment (a status page rebuilt, a manifest decoded): the limit is
// only raised, after a collection measures exactly, when that figure
// comes within half the room of it, as when the cluster grows between two
// full syncs, or the first status rows are made after the first.
func (m *Policy) Synced(full bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lifted = false
	if m.cold {
		debug.SetGCPercent(m.gcPercent)
		m.cold = false
	}
	if full && !m.firstDone {
		m.firstDone = true
		if m.floor <= 0 {
			debug.FreeOSMemory()
		}
	}
	if m.floor <= 0 {
		return
	}
	if full {
		debug.FreeOSMemory()
	} else if live := liveHeap(); m.last > 0 && live+room(live)/2 < m.last {
		debug.SetMemoryLimit(m.last) // as it was
		return
	} else {
		runtime.GC()
	}
	live := liveHeap()
	limit := max(m.floor, live+room(live))
	if full && m.last > 0 && limit > m.last && live+room(live)/2 < m.last {
		// More than the limit left room for, by less than half the
		// room: what something beside the collection held for a moment
		// (16 MB at 100,000 Services, allocated while it ran) is not
		// data to make room for. The limit stays; a partial sync raises
		// it if the live data comes that close to it. (In the bench at
		// 100,000, one repair in four measured so and raised the limit
		// 215 -> 240 MB, and resident memory 186 -> 207 MiB.)
		limit = m.last
	}
	debug.SetMemoryLimit(limit)
	if limit > m.floor && (m.last < limit*9/10 || m.last > limit*11/10) {
		m.log.Info("memory limit follows the live data", "memory_limit_bytes", limit)
	}
	m.last = limit
}

// FollowInterval is how often Follow looks at the live data.
const FollowInterval = time.Second

// Follow keeps the limit in step with live data that changes between
// syncs. The limit follows the Services (Synced), but state sync's flows
// and replicas, and the traffic view's reading of the conntrack table,
// follow the connections: with 100,000 replicated flows and no change of
// Service, the live data stood above a limit set for the Services, and the
// collector ran back to back, every 30 ms (18-37 s of CPU a minute on an
// idle gateway, bench --statesync-runs table). Every interval, when the
// last collection found the live data within half the room of the limit,
// the limit is raised to leave the room above it; when the limit stands
// more than twice the room above the live data (the connections ended), it
// comes down to that room (never below the floor). Not before the first
// sync, nor while a full sync runs without a limit. It returns when ctx
// ends.
func (m *Policy) Follow(ctx context.Context, every time.Duration) {
	if m.floor <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.follow(liveHeap())
		}
	}
}

// follow is one look of Follow at live bytes of live data.
func (m *Policy) follow(live int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.floor <= 0 || m.last == 0 || m.lifted || live <= 0 {
		return
	}
	limit := max(m.floor, live+room(live))
	if live+room(live)/2 <= m.last && m.last <= limit+room(live) {
		return // within the bounds
	}
	debug.SetMemoryLimit(limit)
	m.log.Info("memory limit follows the live data between syncs", "memory_limit_bytes", limit, "live_bytes", live)
	m.last = limit
}

// Collect runs a collection now. It is for one-off work after the first
// full sync that leaves garbage the size of the cluster (the status page's
// rows made anew, 24 MB at 100,000 Services): collected at once, the
// collector does not run again until the changes that follow have
// allocated the room the limit leaves, where its next cycle otherwise fell
// among the first changes, costing them 100 ms of CPU at 100,000 Services.
// It touches nothing of the policy: any goroutine may call it.
func (m *Policy) Collect() { runtime.GC() }

// room is the room the limit leaves above live bytes of live data.
func room(live int64) int64 { return max(minHeadroom, live/headroomDivisor) }

// liveHeap is the heap the last collection found in use.
func liveHeap() int64 {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(sample[0].Value.Uint64())
}
