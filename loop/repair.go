package loop

import (
	"sync"
	"time"
)

// repairs carries requests for a full sync because another program changed
// the kernel's tables (RequestRepair), to Run.
type repairs struct {
	once sync.Once
	ch   chan string
	mu   sync.Mutex
	// requested counts requests; delayed those that waited for
	// MinRepairInterval.
	requested, delayed uint64
}

func (r *repairs) c() chan string {
	r.once.Do(func() { r.ch = make(chan string, 1) })
	return r.ch
}

// RequestRepair asks for a full sync at once, not at the next reconcile:
// another program changed or deleted the tables (why says what it did).
// Requests that come while one waits are carried by it. A full sync
// follows the one before it by MinRepairInterval at least, so a program
// that rewrites the tables in a loop does not keep nftgate syncing.
func (s *Syncer) RequestRepair(why string) {
	s.repair.mu.Lock()
	s.repair.requested++
	s.repair.mu.Unlock()
	select {
	case s.repair.c() <- why:
	default: // one is pending: it repairs this too
	}
}

// RepairCounts returns how many repairs were requested, and how many of
// them waited for MinRepairInterval.
func (s *Syncer) RepairCounts() (requested, delayed uint64) {
	s.repair.mu.Lock()
	defer s.repair.mu.Unlock()
	return s.repair.requested, s.repair.delayed
}

// repairAt is when a repair requested now may run: at once, or
// MinRepairInterval after the last repair, counted as delayed.
func (s *Syncer) repairAt(now, lastRepair time.Time) time.Time {
	at := lastRepair.Add(s.MinRepairInterval)
	if lastRepair.IsZero() || !at.After(now) {
		return now
	}
	s.repair.mu.Lock()
	s.repair.delayed++
	s.repair.mu.Unlock()
	return at
}
