package appliance

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// trafficPorts are n Service ports with counters, as a reading lists them.
func trafficPorts(n int) []TrafficPort {
	ports := make([]TrafficPort, n)
	for i := range ports {
		ports[i] = TrafficPort{Namespace: "bench", Name: fmt.Sprintf("svc-%06d", i), Protocol: "TCP", Port: 80, NewConnections: uint64(i)}
	}
	return ports
}

// BenchmarkTrafficKept reports what the rates of the traffic API and the
// traffic history keep of 100,000 ports (B/kept) once a minute of
// readings is in, the page asking every 5 s; ns/op is one reading's fill.
func BenchmarkTrafficKept(b *testing.B) {
	ports := trafficPorts(100_000)
	var kept float64
	at := time.Unix(0, 0)
	for range b.N {
		var r rates
		h := NewHistory(0, 0, 0)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 13 {
			at = at.Add(rateStep)
			r.fill(ports, at)
			h.Sample(ports, at)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept = float64(after.HeapAlloc) - float64(before.HeapAlloc)
		runtime.KeepAlive(&r)
		runtime.KeepAlive(h)
	}
	b.ReportMetric(kept, "B/kept")
}
