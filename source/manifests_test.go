package source

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/loop"
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
	web := model.NewServiceKey("shop", "web")
	write("web.yaml", manifestWeb)
	write("bad.yaml", "kind: Service\n")
	m := &ManifestSource{Dir: dir}
	tr := loop.NewTracker()

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

	// A rescan reads no file whose stamp is as it was: neither web.yaml
	// nor bad.yaml, whose problem stays.
	reads := m.reads
	m.scan(tr, log)
	if m.reads != reads {
		t.Errorf("rescan of unchanged files read %d files, want none", m.reads-reads)
	}
	if p := m.Problems(); len(p) != 1 {
		t.Errorf("rescan without reading: problems = %q, want bad.yaml's still", p)
	}
	// Content of the same size, written over the file: its times change,
	// and it is read.
	write("web.yaml", strings.Replace(manifestWeb, "10.1.0.1", "10.1.0.2", 1))
	m.scan(tr, log)
	dirty, _ = tr.TakeDirty()
	if o := dirty[web]; len(o.Slices) != 1 || endpointOf(t, o) != "10.1.0.2:8080" || m.reads != reads+1 {
		t.Errorf("after a rewrite of the same size: changed = %v, %d files read; want shop/web's new endpoint, one file", dirty, m.reads-reads)
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
func zoneOf(t *testing.T, o loop.Objects) string {
	t.Helper()
	m, err := model.Build(o.Service, o.Slices, model.Options{})
	if err != nil || len(m.Ports) == 0 || len(m.Ports[0].Endpoints) == 0 {
		t.Fatalf("model of %v: %+v, %v", o, m, err)
	}
	return m.Ports[0].Endpoints[0].Place.Zone()
}

// TestManifestSourceChangedFiles: after a file event only the files named
// are read; a file whose objects keep their names replaces just those, and
// anything else (objects added or removed, files removed) is a full scan.
// Temporary files are ignored, and an object defined again in a later file
// stays that file's.
func TestManifestSourceChangedFiles(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(path(name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	web := model.NewServiceKey("shop", "web")
	api := model.NewServiceKey("shop", "api")
	apiManifest := strings.NewReplacer("name: web", "name: api", "service-name: web", "service-name: api",
		"10.96.0.10", "10.96.0.11").Replace(manifestWeb)
	write("a.yaml", manifestWeb)
	write("b.yaml", apiManifest)
	m := &ManifestSource{Dir: dir}
	tr := loop.NewTracker()
	m.scan(tr, log)
	tr.TakeDirty()
	changed := func(step string, names ...string) map[model.ServiceKey]loop.Objects {
		t.Helper()
		paths := map[string]bool{}
		for _, n := range names {
			paths[path(n)] = true
		}
		m.scanFiles(tr, log, paths)
		dirty, _ := tr.TakeDirty()
		return dirty
	}

	write("a.yaml", strings.Replace(manifestWeb, "10.1.0.1", "10.1.0.2", 1))
	write("b.yaml", "kind: Service\n") // no event names it: not read
	if d := changed("edit", "a.yaml"); len(d) != 1 || d[web].Service == nil || endpointOf(t, d[web]) != "10.1.0.2:8080" {
		t.Errorf("after editing a.yaml: changed %v, want shop/web with endpoint 10.1.0.2:8080", d)
	}
	if p := m.Problems(); len(p) != 0 {
		t.Errorf("problems %q: a file no event named was read", p)
	}
	write("b.yaml", apiManifest)
	write("b.yaml.tmp", "not: [a manifest")
	if d := changed("temporary file", "b.yaml.tmp"); len(d) != 0 {
		t.Errorf("after a temporary file: changed %v, want nothing", d)
	}
	if p := m.Problems(); len(p) != 0 {
		t.Errorf("problems %q after a temporary file, want none", p)
	}
	write("a.yaml", manifestWeb+"---\n"+strings.Replace(apiManifest, "name: api-1", "name: api-2", 1))
	if d := changed("object added", "a.yaml"); len(d) != 2 || len(d[api].Slices) != 2 {
		t.Errorf("after adding a slice of api to a.yaml: changed %v, want web and api with two slices", d)
	}
	write("c.yaml", strings.Replace(manifestWeb, "10.1.0.1", "10.1.0.9", 1))
	if d := changed("later file", "c.yaml"); len(d) != 1 || endpointOf(t, d[web]) != "10.1.0.9:8080" {
		t.Errorf("after c.yaml defines web again: changed %v, want web from c.yaml", d)
	}
	write("a.yaml", strings.Replace(manifestWeb+"---\n"+strings.Replace(apiManifest, "name: api-1", "name: api-2", 1), "10.1.0.1", "10.1.0.3", 1))
	if d := changed("edit of a file that lost web", "a.yaml"); len(d) != 0 {
		t.Errorf("after editing web in a.yaml, which c.yaml overrides: changed %v, want nothing", d)
	}
	write("c.yaml", strings.Replace(manifestWeb, "10.1.0.1", "10.1.0.8", 1))
	if d := changed("edit of the file that holds web", "c.yaml"); len(d) != 1 || endpointOf(t, d[web]) != "10.1.0.8:8080" {
		t.Errorf("after editing web in c.yaml, which overrides a.yaml: changed %v, want web from c.yaml", d)
	}
	if err := os.Remove(path("b.yaml")); err != nil {
		t.Fatal(err)
	}
	if d := changed("removed", "b.yaml"); len(d) != 1 || len(d[api].Slices) != 1 || d[api].Service == nil {
		t.Errorf("after removing b.yaml: changed %v, want api with the slice a.yaml still defines", d)
	}
}

// endpointOf builds the model of a Service and returns its only endpoint.
func endpointOf(t *testing.T, o loop.Objects) string {
	t.Helper()
	m, err := model.Build(o.Service, o.Slices, model.Options{})
	if err != nil || len(m.Ports) != 1 || len(m.Ports[0].Endpoints) != 1 {
		t.Fatalf("model of %v: %+v, %v", o, m, err)
	}
	return m.Ports[0].Endpoints[0].AddrPort().String()
}

// An invalid Service or EndpointSlice read from a manifest file is reported
// with the file's name, the field and the value.
func TestManifestErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	bad := strings.Replace(manifestWeb, "- {name: http, port: 80, targetPort: 8080}", "- {name: http, port: 70000, targetPort: 8080}", 1)
	bad = strings.Replace(bad, "name: web-1", "name: Web_1", 1)
	path := filepath.Join(dir, "web.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &ManifestSource{Dir: dir}
	tr := loop.NewTracker()
	m.scan(tr, slog.New(slog.DiscardHandler))
	dirty, _ := tr.TakeDirty()
	o := dirty[model.NewServiceKey("shop", "web")]
	if o.Service == nil {
		t.Fatalf("changed = %v, want shop/web", dirty)
	}
	_, err := model.Build(o.Service, nil, model.Options{})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "spec.ports[0].port") || !strings.Contains(err.Error(), "70000") {
		t.Errorf("service error %v, want one naming %s, spec.ports[0].port and 70000", err, path)
	}
	fixed := strings.Replace(manifestWeb, "name: web-1", "name: Web_1", 1)
	if err := os.WriteFile(path, []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	m.scan(tr, slog.New(slog.DiscardHandler))
	dirty, _ = tr.TakeDirty()
	o = dirty[model.NewServiceKey("shop", "web")]
	_, err = model.Build(o.Service, o.Slices, model.Options{})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "Web_1") {
		t.Errorf("slice error %v, want one naming %s and Web_1", err, path)
	}
}

// stage is a ServiceStage that records what it is given.
type stage struct {
	*loop.Tracker
	services map[model.ServiceKey]string // key -> file
	objects  int
}

func (s *stage) SetService(svc *corev1.Service, file string) {
	s.services[model.NewServiceKey(svc.Namespace, svc.Name)] = file
}

func (s *stage) SetServiceObject(o *model.ServiceObject) {
	s.objects++
	s.Tracker.SetServiceObject(o)
}

// A ServiceStage gets the Services in their API form, with their file,
// and never as model objects from the source; slices and deletions go to
// it as to any Sink.
func TestManifestSourceFeedsAServiceStage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yaml")
	if err := os.WriteFile(path, []byte(manifestWeb), 0o644); err != nil {
		t.Fatal(err)
	}
	st := &stage{Tracker: loop.NewTracker(), services: map[model.ServiceKey]string{}}
	m := &ManifestSource{Dir: dir}
	m.staged = true
	m.scan(st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	web := model.NewServiceKey("shop", "web")
	if st.services[web] != path || st.objects != 0 {
		t.Fatalf("stage got services %v and %d model objects; want web from %s and none", st.services, st.objects, path)
	}
	dirty, _ := st.TakeDirty()
	if len(dirty[web].Slices) != 1 {
		t.Fatalf("the slice did not reach the sink: %+v", dirty[web])
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	m.scan(st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if dirty, _ := st.TakeDirty(); len(dirty) != 1 {
		t.Fatalf("the deletion did not reach the sink: %v", dirty)
	}
}

// TestManifestSourceReadsARenameAtOnce: a file renamed over a manifest is
// whole, and is read at once; a file written in place is read only once
// its writes have settled (here never: the wait is an hour).
func TestManifestSourceReadsARenameAtOnce(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	writeFile(t, path("web.yaml"), manifestWeb)
	writeFile(t, path("api.yaml"), manifestAPI)
	m := &ManifestSource{Dir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), settleQuiet: time.Hour, settleMax: time.Hour}
	tr := loop.NewTracker()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, tr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !tr.Synced() {
		if time.Now().After(deadline) {
			t.Fatal("the first scan did not end within 10 s")
		}
		<-tr.Changed()
	}
	tr.TakeDirty()

	// Written in place (the event comes first), then a file renamed over
	// web.yaml: web changes, api waits for its writes to settle.
	writeFile(t, path("api.yaml"), strings.Replace(manifestAPI, "10.1.0.1", "10.1.0.5", 1))
	writeFile(t, path(".web.yaml.tmp"), strings.Replace(manifestWeb, "10.1.0.1", "10.1.0.2", 1))
	if err := os.Rename(path(".web.yaml.tmp"), path("web.yaml")); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case <-tr.Changed():
		case <-timeout:
			t.Fatal("web.yaml renamed over was not read within 10 s")
		}
		dirty, _ := tr.TakeDirty()
		if _, ok := dirty[keyAPI]; ok {
			t.Fatalf("api.yaml written in place was read before its writes settled: %v", dirty)
		}
		if o, ok := dirty[keyWeb]; ok {
			if got := endpointOf(t, o); got != "10.1.0.2:8080" {
				t.Fatalf("web after the rename: endpoint %s, want 10.1.0.2:8080", got)
			}
			return
		}
	}
}

// An object defined twice is logged with the file that defined it first
// and the one that wins, also when the later file defines it twice.
func TestManifestObjectDefinedTwiceNamesBothFiles(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"a.yaml": manifestWeb, "b.yaml": manifestWeb + "---\n" + manifestWeb} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logged strings.Builder
	m := &ManifestSource{Dir: dir}
	m.scan(loop.NewTracker(), slog.New(slog.NewTextHandler(&logged, nil)))
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		_, after, _ := strings.Cut(l, "object=")
		lines = append(lines, strings.ReplaceAll(after, dir+"/", ""))
	}
	want := []string{
		`"Service shop/web" first=a.yaml second=b.yaml`,
		`"EndpointSlice shop/web-1" first=a.yaml second=b.yaml`,
		`"Service shop/web" first=b.yaml second=b.yaml`,
		`"EndpointSlice shop/web-1" first=b.yaml second=b.yaml`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// The first scan tells the tracker each file's objects as it takes the
// file: an object defined again in a later file is the later one's, as a
// later scan's merge makes it, also for a slice that names another Service
// in between.
func TestManifestFirstScanLaterFileWins(t *testing.T) {
	dir := t.TempDir()
	slice := func(name, service, addr string) string {
		return "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: " + name + "\n  namespace: shop\n" +
			"  labels: {kubernetes.io/service-name: " + service + "}\naddressType: IPv4\nports:\n- {name: http, port: 8080}\n" +
			"endpoints:\n- addresses: [" + addr + "]\n"
	}
	api := "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec:\n  clusterIP: 10.96.0.11\n  ports:\n  - {name: http, port: 80}\n"
	files := map[string]string{
		"a.yaml": manifestWeb, // web, its slice web-1 at 10.1.0.1
		"b.yaml": api + "---\n" + slice("api-1", "api", "10.1.0.2") + "---\n" + slice("web-1", "api", "10.1.0.3"),
		"c.yaml": slice("web-1", "web", "10.1.0.9"),
	}
	for i := range 40 { // enough files that several are decoded at once
		files["d"+strconv.Itoa(100+i)+".yaml"] = strings.ReplaceAll(manifestWeb, "web", "w"+strconv.Itoa(i))
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr := loop.NewTracker()
	m := &ManifestSource{Dir: dir}
	m.scan(tr, slog.New(slog.DiscardHandler))
	all, _ := tr.All()
	if len(all) != 42 {
		t.Fatalf("%d Services, want 42", len(all))
	}
	if got := endpointOf(t, all[model.NewServiceKey("shop", "web")]); got != "10.1.0.9:8080" {
		t.Errorf("web's endpoint %s, want c.yaml's 10.1.0.9:8080", got)
	}
	if got := endpointOf(t, all[model.NewServiceKey("shop", "api")]); got != "10.1.0.2:8080" {
		t.Errorf("api's endpoint %s, want its own slice's 10.1.0.2:8080 alone", got)
	}
}
