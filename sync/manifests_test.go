package sync

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/nftgate/nftgate/model"
)

const manifestWeb = `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels: {app: web}
  annotations: {note: "not read by the gateway"}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web, app: web}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- addresses: [10.1.0.1]
  nodeName: node-a
  targetRef: {kind: Pod, namespace: shop, name: web-abc}
`

func TestManifestSourceRescan(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	web := model.ServiceKey{Namespace: "shop", Name: "web"}
	write("web.yaml", manifestWeb)
	write("bad.yaml", "kind: Service\n")
	m := &ManifestSource{Dir: dir}
	tr := NewTracker()

	m.scan(tr, log)
	dirty, _ := tr.TakeDirty()
	o, ok := dirty[web]
	if !ok || o.Service == nil || len(o.Slices) != 1 {
		t.Fatalf("first scan: changed = %v, want shop/web with one slice", dirty)
	}
	if p := m.Problems(); len(p) != 1 {
		t.Errorf("problems = %q, want one for bad.yaml", p)
	}

	// Nothing changed: nothing to sync, and the bad file is still reported.
	m.scan(tr, log)
	if dirty, _ := tr.TakeDirty(); len(dirty) != 0 {
		t.Errorf("rescan of unchanged files: changed = %v, want nothing", dirty)
	}
	if p := m.Problems(); len(p) != 1 {
		t.Errorf("rescan: problems = %q, want bad.yaml's still", p)
	}

	// A changed file is read again; fixing the bad one clears its problem.
	write("web.yaml", manifestWeb+"  zone: zone-1\n")
	write("bad.yaml", "")
	m.scan(tr, log)
	dirty, _ = tr.TakeDirty()
	if o := dirty[web]; len(o.Slices) != 1 || zoneOf(t, o) != "zone-1" {
		t.Errorf("after the edit: changed = %v, want shop/web with its endpoint in zone-1", dirty)
	}
	if p := m.Problems(); len(p) != 0 {
		t.Errorf("after the fix: problems = %q, want none", p)
	}

	// A removed file's objects go.
	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	m.scan(tr, log)
	if all, _ := tr.All(); len(all) != 0 {
		t.Errorf("after removing the file: services = %v, want none", all)
	}
}

// zoneOf builds the model of a Service and returns its first endpoint's
// zone.
func zoneOf(t *testing.T, o Objects) string {
	t.Helper()
	m, err := model.Build(o.Service, o.Slices, model.Options{})
	if err != nil || len(m.Ports) == 0 || len(m.Ports[0].Endpoints) == 0 {
		t.Fatalf("model of %v: %+v, %v", o, m, err)
	}
	return m.Ports[0].Endpoints[0].Zone
}
