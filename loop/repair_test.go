package loop

import (
	"testing"
	"time"
)

// A repair request starts a full sync at once, long before the reconcile;
// the next one waits for MinRepairInterval, and requests meanwhile are
// carried by the one waiting.
func TestLoopRepairsAtOnceAndBounded(t *testing.T) {
	h := startLoopWith(t, func(s *Syncer) { s.MinRepairInterval = time.Second }, 0, 10*time.Minute, "a")
	h.expect(true, 0, "a")

	h.timers(1) // the reconcile ticker
	h.s.RequestRepair("nft deleted table ip nftgate")
	if ev := h.expect(true, 0, "a"); ev.Repair != "nft deleted table ip nftgate" {
		t.Fatalf("repair's event says %q", ev.Repair)
	}

	h.timers(1)
	for range 3 {
		h.s.RequestRepair("nft flush ruleset")
	}
	h.timers(2) // the reconcile and the repair's wait
	h.clk.Step(999 * time.Millisecond)
	h.timers(2)
	select {
	case c := <-h.prog.calls:
		t.Fatalf("sync %+v before MinRepairInterval passed", c)
	default:
	}
	h.clk.Step(time.Millisecond)
	if ev := h.expect(true, time.Second, "a"); ev.Repair != "nft flush ruleset" {
		t.Fatalf("repair's event says %q", ev.Repair)
	}
	if req, delayed := h.s.RepairCounts(); req != 4 || delayed != 1 {
		t.Fatalf("RepairCounts %d requested, %d delayed; want 4, 1", req, delayed)
	}

	// Changes go on as partial syncs between repairs.
	h.timers(1)
	h.tr.SetService(service("b", "http"))
	h.expect(false, time.Second, "b")
}
