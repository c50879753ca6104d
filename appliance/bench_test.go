package appliance

import (
	"net/http/httptest"
	"testing"
)

// The page polls /api/v1/status every refresh and /api/v1/services only when
// the list changed; both must stay cheap at 10,000 Services.
func benchmarkEndpoint(b *testing.B, path string) {
	snap := healthySnapshot()
	snap.Services = NewServiceList(manyServices(10000)...)
	tr := &fakeTraffic{at: fixtureNow}
	for i, svc := range manyServices(10000) {
		tr.ports = append(tr.ports, TrafficPort{Namespace: svc.Namespace, Name: svc.Name, Protocol: "TCP", Port: 80,
			NewConnections: uint64(i * 7 % 1000), ActiveFlows: i % 13, Endpoints: []TrafficEndpoint{{Endpoint: "10.244.0.1:8080", ActiveFlows: i % 13}}})
	}
	h := NewServer(Options{Source: &fakeSource{snap: snap}, Traffic: tr})
	b.ReportAllocs()
	var size int
	for b.Loop() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "http://127.0.0.1"+path, nil)
		r.Header.Set("Accept-Encoding", "gzip") // as a browser asks
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatalf("%s: %d", path, w.Code)
		}
		size = w.Body.Len()
	}
	b.ReportMetric(float64(size), "bytes/response")
}

func BenchmarkStatus10k(b *testing.B)   { benchmarkEndpoint(b, "/api/v1/status") }
func BenchmarkServices10k(b *testing.B) { benchmarkEndpoint(b, "/api/v1/services") }
func BenchmarkSearch10k(b *testing.B)   { benchmarkEndpoint(b, "/api/v1/services?q=svc-0999") }

// The page's first load asks for the first rows beside the whole list.
func BenchmarkServicesHead10k(b *testing.B) { benchmarkEndpoint(b, "/api/v1/services?limit=100") }
func BenchmarkPage10k(b *testing.B)         { benchmarkEndpoint(b, "/") }

// The page asks for the counters of every Service port each refresh, in
// name order.
func BenchmarkTraffic10k(b *testing.B) { benchmarkEndpoint(b, "/api/v1/traffic?sort=name") }
