package appliance

import (
	"testing"
	"time"
)

func TestHistoryKeepsBusyPortsBounded(t *testing.T) {
	h := NewHistory(time.Second, 3, 1)
	t0 := time.Unix(1000, 0)
	port := func(name string, n uint64, flows int) TrafficPort {
		return TrafficPort{Namespace: "ns", Name: name, Protocol: "TCP", Port: 80, NewConnections: n, ActiveFlows: flows}
	}
	h.Sample([]TrafficPort{port("a", 0, 0), port("b", 0, 0)}, t0)
	h.Sample([]TrafficPort{port("a", 10, 2), port("b", 5, 0)}, t0.Add(2*time.Second))
	j := h.JSON("", "")
	if len(j.Ports) != 1 || j.Untracked != 1 {
		t.Fatalf("ports %+v untracked %d, want one port kept and one left out for the bound", j.Ports, j.Untracked)
	}
	if p := j.Ports[0]; p.Name != "a" || p.NewPerSecond[0] != 5 || p.Flows[0] != 2 {
		t.Errorf("point %+v, want a at 5/s with 2 flows", p)
	}
	// Idle for as many points as are kept: it leaves.
	for i := 3; i <= 5; i++ {
		h.Sample([]TrafficPort{port("a", 10, 0)}, t0.Add(time.Duration(i)*time.Second))
	}
	if j := h.JSON("", ""); len(j.Ports) != 0 || len(j.Times) != 3 {
		t.Errorf("after idle points: %d ports, %d times; want 0 and 3", len(j.Ports), len(j.Times))
	}
}

func TestEventsRingKeepsTheNewest(t *testing.T) {
	e := NewEvents(2)
	for _, m := range []string{"one", "two", "three"} {
		e.Add(Event{Kind: EventSync, Message: m})
	}
	list, total := e.List()
	if total != 3 || len(list) != 2 || list[0].Message != "three" || list[1].Message != "two" {
		t.Errorf("list %+v total %d, want three, two of 3", list, total)
	}
}
