package source

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/loop"
)

// BenchmarkManifestScan is a cold start's read of n Services, each with
// an EndpointSlice of 4 endpoints, 1,000 to a file: the strict decode of
// the JSON is most of it.
func BenchmarkManifestScan(b *testing.B) {
	const n, perFile = 10_000, 1_000
	dir := b.TempDir()
	for f := range n / perFile {
		var docs []string
		for i := f * perFile; i < (f+1)*perFile; i++ {
			docs = append(docs, fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"s%d","namespace":"bench"},"spec":{"clusterIP":"10.%d.%d.%d","ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}]}}`,
				i, 96+i/62500, i/250%250, i%250+1))
			docs = append(docs, fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"s%d-1","namespace":"bench","labels":{"kubernetes.io/service-name":"s%d"}},"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[{"addresses":["10.128.%d.1"]},{"addresses":["10.128.%d.2"]},{"addresses":["10.128.%d.3"]},{"addresses":["10.128.%d.4"]}]}`,
				i, i, i%250, i%250, i%250, i%250))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("bulk-%03d.json", f)), []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		m := &ManifestSource{Dir: dir}
		tr := loop.NewTracker()
		m.scan(tr, slog.New(slog.DiscardHandler))
		if all, _ := tr.All(); len(all) != n {
			b.Fatalf("%d Services read, want %d", len(all), n)
		}
	}
}
