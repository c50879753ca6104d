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
	h := NewServer(Options{Source: &fakeSource{snap: snap}})
	b.ReportAllocs()
	var size int
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
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
func BenchmarkPage10k(b *testing.B)     { benchmarkEndpoint(b, "/") }
