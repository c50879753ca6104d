package appliance

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// fakeSource is a Source whose snapshot a test can swap.
type fakeSource struct {
	mu   sync.Mutex
	snap Snapshot
}

func (f *fakeSource) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

func (f *fakeSource) set(s Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap = s
}

func newTestServer(t *testing.T, snap Snapshot, opts Options) (*httptest.Server, *fakeSource) {
	t.Helper()
	return newTestServerWithSource(t, &fakeSource{snap: snap}, opts)
}

func newTestServerWithSource(t *testing.T, src *fakeSource, opts Options) (*httptest.Server, *fakeSource) {
	t.Helper()
	opts.Source = src
	if opts.Now == nil {
		opts.Now = func() time.Time { return fixtureNow }
	}
	ts := httptest.NewServer(NewServer(opts))
	t.Cleanup(ts.Close)
	return ts, src
}

func get(t *testing.T, url string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func getJSON(t *testing.T, url string, wantCode int, v any) {
	t.Helper()
	code, h, b := get(t, url)
	if code != wantCode {
		t.Fatalf("GET %s: status %d, want %d; body %s", url, code, wantCode, b)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("GET %s: Content-Type %q", url, ct)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v; body %s", url, err, b)
	}
}

func TestStatusAPI(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	var st StatusJSON
	getJSON(t, ts.URL+"/api/v1/status", 200, &st)
	if !st.Healthy || !st.Ready || st.Reason != "ok" {
		t.Errorf("healthy=%v ready=%v reason=%q, want healthy", st.Healthy, st.Ready, st.Reason)
	}
	if st.Identity.NodeName != "edge-1" || st.Identity.Table != "inet nftgate" || st.Identity.GoVersion == "" {
		t.Errorf("identity = %+v", st.Identity)
	}
	if st.Identity.UptimeSeconds != 26*3600 {
		t.Errorf("uptime = %v, want %v", st.Identity.UptimeSeconds, 26*3600)
	}
	if st.Sync.LastSyncAgeSeconds == nil || *st.Sync.LastSyncAgeSeconds != 3 {
		t.Errorf("lastSyncAgeSeconds = %v, want 3", st.Sync.LastSyncAgeSeconds)
	}
	if st.Sync.LastDurationSeconds != 0.00042 || st.Sync.Chains != 41 || st.Sync.Failing {
		t.Errorf("sync = %+v", st.Sync)
	}
	want := SummaryJSON{Total: 5, Rejected: 1, NoEndpoints: 2, Endpoints: 5}
	if st.Services != want {
		t.Errorf("services summary = %+v, want %+v", st.Services, want)
	}
}

// A Service rejected before it was ever programmed has no state: it is
// counted as rejected only, not as a Service without endpoints.
func TestStatusSummaryOfUnprogrammedService(t *testing.T) {
	s := healthySnapshot()
	s.Services = s.Services.With([]Service{{Namespace: "legacy", Name: "never", Error: `spec.clusterIPs[0]: invalid IP address "10.96.0.300"`}})
	got := statusJSON(s, fixtureNow, 0).Services
	want := SummaryJSON{Total: 6, Rejected: 2, NoEndpoints: 2, Endpoints: 5}
	if got != want {
		t.Errorf("services summary = %+v, want %+v", got, want)
	}
}

func TestStatusAPIRawFields(t *testing.T) {
	// Fields absent before they happen: a fresh gateway has no lastSync.
	ts, _ := newTestServer(t, Snapshot{Identity: Identity{NodeName: "n"}}, Options{})
	_, _, b := get(t, ts.URL+"/api/v1/status")
	var raw struct{ Sync map[string]any }
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"lastSync", "lastSyncAgeSeconds", "lastErrorTime"} {
		if _, ok := raw.Sync[k]; ok {
			t.Errorf("sync.%s present before any sync: %s", k, b)
		}
	}
	if raw.Sync["firstSyncDone"] != false {
		t.Errorf("firstSyncDone = %v", raw.Sync["firstSyncDone"])
	}
}

func TestServicesAPI(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	var list ServiceListJSON
	getJSON(t, ts.URL+"/api/v1/services", 200, &list)
	var keys []string
	for _, s := range list.Services {
		keys = append(keys, s.Namespace+"/"+s.Name)
	}
	if got := strings.Join(keys, " "); got != "default/docs kube-system/kube-dns legacy/broken shop/cart shop/web" {
		t.Errorf("order = %s", got)
	}
	if list.Total != 5 || list.Matched != 5 || list.Revision != 7 {
		t.Errorf("total=%d matched=%d revision=%d", list.Total, list.Matched, list.Revision)
	}
	// Empty lists are [] on the wire, not null.
	_, _, b := get(t, ts.URL+"/api/v1/services?q=docs")
	if !strings.Contains(string(b), `"clusterIPs": []`) || !strings.Contains(string(b), `"endpoints": []`) {
		t.Errorf("empty lists not []: %s", b)
	}

	cases := []struct {
		query string
		want  string
	}{
		{"q=shop", "shop/cart shop/web"},
		{"q=SHOP/WEB", "shop/web"},
		{"q=203.0.113.7", "shop/web"},
		{"q=31000", "shop/cart"},
		{"q=node-b", "kube-system/kube-dns shop/web"},
		{"q=53/udp", "kube-system/kube-dns"},
		{"namespace=shop&type=nodeport", "shop/cart"},
		{"type=ExternalName", "default/docs"},
		{"q=nothing-like-this", ""},
	}
	for _, c := range cases {
		var l ServiceListJSON
		getJSON(t, ts.URL+"/api/v1/services?"+c.query, 200, &l)
		var got []string
		for _, s := range l.Services {
			got = append(got, s.Namespace+"/"+s.Name)
		}
		if strings.Join(got, " ") != c.want || l.Matched != len(got) || l.Total != 5 {
			t.Errorf("?%s: got %q (matched %d, total %d), want %q", c.query, got, l.Matched, l.Total, c.want)
		}
	}
}

func TestServicesAPILimit(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	// The first in name order; matched and total count them all.
	for _, c := range []struct {
		query, want string
		matched     int
	}{
		{"limit=2", "default/docs kube-system/kube-dns", 5},
		{"limit=1&q=shop", "shop/cart", 2},
		{"limit=100", "default/docs kube-system/kube-dns legacy/broken shop/cart shop/web", 5},
	} {
		var l ServiceListJSON
		getJSON(t, ts.URL+"/api/v1/services?"+c.query, 200, &l)
		var got []string
		for _, s := range l.Services {
			got = append(got, s.Namespace+"/"+s.Name)
		}
		if strings.Join(got, " ") != c.want || l.Matched != c.matched || l.Total != 5 {
			t.Errorf("?%s: got %q (matched %d, total %d), want %q (matched %d)", c.query, got, l.Matched, l.Total, c.want, c.matched)
		}
	}
	for _, v := range []string{"0", "-1", "ten"} {
		var e ErrorJSON
		getJSON(t, ts.URL+"/api/v1/services?limit="+v, 400, &e)
		if e.Error != "limit: \""+v+"\" is not a positive number" {
			t.Errorf("limit=%s: error %q", v, e.Error)
		}
	}
}

func TestServicesAPILargeIsCompressed(t *testing.T) {
	snap := healthySnapshot()
	snap.Services = NewServiceList(manyServices(2000)...)
	ts, _ := newTestServer(t, snap, Options{})
	// The default transport asks for gzip and decompresses transparently.
	resp, err := http.Get(ts.URL + "/api/v1/services")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !resp.Uncompressed {
		t.Error("large service list was not gzip-compressed")
	}
	var l ServiceListJSON
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	if l.Total != 2000 || len(l.Services) != 2000 || l.Services[0].Namespace != "ns-00" {
		t.Errorf("total=%d len=%d first=%s", l.Total, len(l.Services), l.Services[0].Namespace)
	}

	// Written element by element, with or without gzip, the answer is the
	// whole list encoded in one piece.
	want := ServiceListJSON{Revision: snap.Sync.ServicesRevision, Total: 2000, Matched: 2000}
	for svc := range snap.Services.All() {
		want.Services = append(want.Services, serviceJSON(svc))
	}
	wantJSON, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, enc := range []string{"identity", "gzip"} {
		// Set by hand, the header leaves the answer as it came.
		req, _ := http.NewRequest("GET", ts.URL+"/api/v1/services", nil)
		req.Header.Set("Accept-Encoding", enc)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body io.Reader = resp.Body
		if enc == "gzip" {
			if body, err = gzip.NewReader(resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		b, err := io.ReadAll(body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", enc, resp.StatusCode, err)
		}
		sameJSON(t, enc, b, wantJSON)
	}
}

// sameJSON fails the test unless got and want hold the same JSON value.
func sameJSON(t *testing.T, what string, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v in %.200s…", what, err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s: got %.300s…\nwant %.300s…", what, got, want)
	}
}

func TestServiceAPI(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	var s ServiceJSON
	getJSON(t, ts.URL+"/api/v1/services/shop/web", 200, &s)
	if s.Type != "LoadBalancer" || s.ExternalTrafficPolicy != "Local" || s.HealthCheckNodePort != 32000 {
		t.Errorf("service = %+v", s)
	}
	if len(s.ClusterIPs) != 2 || s.ClusterIPs[1].String() != "fd00::10" || s.SourceRanges[0].String() != "198.51.100.0/24" {
		t.Errorf("addresses = %v %v", s.ClusterIPs, s.SourceRanges)
	}
	if len(s.Ports) != 2 || s.Ports[1] != (PortJSON{Name: "https", Protocol: "TCP", Port: 443, NodePort: 30443}) {
		t.Errorf("ports = %+v", s.Ports)
	}
	if len(s.Endpoints) != 3 || !s.Endpoints[0].Used || !s.Endpoints[2].Terminating || s.Endpoints[2].Used || s.Endpoints[2].Zone != "z2" {
		t.Errorf("endpoints = %+v", s.Endpoints)
	}

	var dns ServiceJSON
	getJSON(t, ts.URL+"/api/v1/services/kube-system/kube-dns", 200, &dns)
	if dns.SessionAffinity != "ClientIP" || dns.AffinityTimeoutSeconds != 10800 {
		t.Errorf("affinity = %q %v", dns.SessionAffinity, dns.AffinityTimeoutSeconds)
	}
	var broken ServiceJSON
	getJSON(t, ts.URL+"/api/v1/services/legacy/broken", 200, &broken)
	if !strings.Contains(broken.Error, "already used") {
		t.Errorf("error = %q", broken.Error)
	}

	var e ErrorJSON
	getJSON(t, ts.URL+"/api/v1/services/shop/nope", 404, &e)
	if e.Error != `service "shop/nope" not found` {
		t.Errorf("error = %q", e.Error)
	}
}

// A Source may give a Service's endpoints as a function with their
// counts: the summary counts them without making them, the API and the
// search make them.
func TestServiceEndpointsFunc(t *testing.T) {
	snap := healthySnapshot()
	made := 0
	web, _ := snap.Services.Get("shop", "web")
	svc := *web
	eps := svc.Endpoints
	svc.Endpoints = nil
	svc.EndpointCount, svc.UsedCount = len(eps), 2
	svc.EndpointsFunc = func() []Endpoint { made++; return eps }
	snap.Services = snap.Services.With([]Service{svc})
	if got, want := statusJSON(snap, fixtureNow, 0).Services, (SummaryJSON{Total: 5, Rejected: 1, NoEndpoints: 2, Endpoints: 5}); got != want {
		t.Errorf("services summary = %+v, want %+v", got, want)
	}
	if made != 0 {
		t.Errorf("the summary made the endpoints %d times, want none", made)
	}
	ts, _ := newTestServer(t, snap, Options{})
	var s ServiceJSON
	getJSON(t, ts.URL+"/api/v1/services/shop/web", 200, &s)
	if len(s.Endpoints) != 3 || !s.Endpoints[0].Used || s.Endpoints[2].Zone != "z2" {
		t.Errorf("endpoints = %+v", s.Endpoints)
	}
	var l ServiceListJSON
	getJSON(t, ts.URL+"/api/v1/services?q="+s.Endpoints[2].Addr.String(), 200, &l)
	if len(l.Services) != 1 || l.Services[0].Name != "web" {
		t.Errorf("search by an endpoint address found %+v, want shop/web", l.Services)
	}
}

func TestSyncsAPI(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	var s SyncsJSON
	getJSON(t, ts.URL+"/api/v1/syncs", 200, &s)
	if s.Syncs != 1234 || s.Failures != 1 || len(s.Samples) != 60 {
		t.Fatalf("syncs=%d failures=%d samples=%d", s.Syncs, s.Failures, len(s.Samples))
	}
	if !s.Samples[0].Time.Before(s.Samples[59].Time) {
		t.Error("samples not oldest first")
	}
	if s.Samples[0].Kind != "full" || s.Samples[0].DurationSeconds != 0.0003 || s.Samples[0].ProgrammingLatencySeconds != 0.008 {
		t.Errorf("sample 0 = %+v", s.Samples[0])
	}
	if s.Samples[55].Error != "netlink: EBUSY" {
		t.Errorf("sample 55 = %+v", s.Samples[55])
	}
}

func TestAPIErrors(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	var e ErrorJSON
	getJSON(t, ts.URL+"/api/v1/nope", 404, &e)
	if !strings.Contains(e.Error, "/api/v1/nope") {
		t.Errorf("error = %q", e.Error)
	}
	resp, err := http.Post(ts.URL+"/api/v1/status", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST status: %d, want 405", resp.StatusCode)
	}
	if code, _, _ := get(t, ts.URL+"/nope"); code != 404 {
		t.Errorf("GET /nope: %d", code)
	}
}

func TestProbes(t *testing.T) {
	healthy := healthySnapshot()
	stale := healthySnapshot()
	stale.Sync.LastSync = fixtureNow.Add(-10 * time.Minute)
	stale.Sync.LastErrorTime = fixtureNow.Add(-20 * time.Minute)
	staleFailing := healthySnapshot()
	staleFailing.Sync.LastSync = fixtureNow.Add(-10 * time.Minute)
	staleFailing.Sync.LastErrorTime = fixtureNow.Add(-time.Second)
	staleFailing.Sync.LastError = "netlink receive: no buffer space available"
	drift := healthySnapshot()
	drift.Sync.KernelMatches = false
	starting := Snapshot{}
	firstFailed := Snapshot{Sync: SyncState{LastError: "table inet nftgate: operation not permitted", LastErrorTime: fixtureNow}}

	cases := []struct {
		name          string
		snap          Snapshot
		maxAge        time.Duration
		health, ready int
		reason        string
	}{
		{"healthy", healthy, 0, 200, 200, "ok"},
		{"stale", stale, 0, 503, 200, "last successful sync was 10m0s ago (max 2m0s)"},
		{"stale but failing", staleFailing, time.Minute, 503, 200, "last successful sync was 10m0s ago (max 1m0s): netlink receive: no buffer space available"},
		{"stale, check off", stale, -1, 200, 200, "ok"},
		{"drift", drift, 0, 503, 200, "kernel ruleset differs from the desired one"},
		{"starting", starting, 0, 503, 503, "first sync not done yet"},
		{"first sync failed", firstFailed, 0, 503, 503, "first sync not done: last attempt failed: table inet nftgate: operation not permitted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := NewMetrics("test")
			ts, _ := newTestServer(t, c.snap, Options{MaxSyncAge: c.maxAge, Metrics: m})
			code, h, b := get(t, ts.URL+"/healthz")
			if code != c.health || string(b) != c.reason+"\n" {
				t.Errorf("/healthz = %d %q, want %d %q", code, b, c.health, c.reason)
			}
			if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("/healthz Content-Type %q", ct)
			}
			if code, _, _ := get(t, ts.URL+"/readyz"); code != c.ready {
				t.Errorf("/readyz = %d, want %d", code, c.ready)
			}
			if code, _, b := get(t, ts.URL+"/livez"); code != 200 || string(b) != "ok\n" {
				t.Errorf("/livez = %d %q", code, b)
			}
			_, _, metrics := get(t, ts.URL+"/metrics")
			want := `nftgate_proxy_healthz_total{code="` + httpCode(c.health) + `"} 1`
			if !strings.Contains(string(metrics), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		})
	}
}

func TestHealthTurnsWhenSourceChanges(t *testing.T) {
	ts, src := newTestServer(t, Snapshot{}, Options{})
	if code, _, _ := get(t, ts.URL+"/healthz"); code != 503 {
		t.Fatalf("before first sync: %d", code)
	}
	src.set(healthySnapshot())
	if code, _, _ := get(t, ts.URL+"/healthz"); code != 200 {
		t.Fatalf("after first sync: %d", code)
	}
}

func TestPage(t *testing.T) {
	ts, _ := newTestServer(t, healthySnapshot(), Options{Refresh: 1500 * time.Millisecond})
	code, h, b := get(t, ts.URL+"/")
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", code, h.Get("Content-Type"))
	}
	page := string(b)
	for _, want := range []string{
		"<title>nftgate · edge-1</title>", `class="state ok"`, ">Healthy<", `data-refresh-ms="1500"`,
		"inet nftgate", "6.12.1-gokrazy", `src="assets/app.js"`, `href="assets/app.css"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Nothing may come from another host: the box works offline.
	for _, bad := range []string{"http://", "https://", "//cdn", "<style", "onclick="} {
		if strings.Contains(page, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	csp := h.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP = %q", csp)
	}
	for _, asset := range []string{"/assets/app.js", "/assets/app.css"} {
		code, h, b := get(t, ts.URL+asset)
		if code != 200 || len(b) < 1000 {
			t.Errorf("GET %s: %d, %d bytes", asset, code, len(b))
		}
		if strings.Contains(string(b), "https://") {
			t.Errorf("%s refers to another host", asset)
		}
		_ = h
	}
}

func TestPageStates(t *testing.T) {
	unhealthy := healthySnapshot()
	unhealthy.Sync.KernelMatches = false
	for _, c := range []struct {
		snap  Snapshot
		class string
		word  string
	}{
		{unhealthy, `class="state bad"`, ">Unhealthy<"},
		{Snapshot{}, `class="state wait"`, ">Starting<"},
	} {
		ts, _ := newTestServer(t, c.snap, Options{})
		_, _, b := get(t, ts.URL+"/")
		if !strings.Contains(string(b), c.class) || !strings.Contains(string(b), c.word) {
			t.Errorf("page lacks %s %s", c.class, c.word)
		}
	}
}

func TestBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret pass"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := NewBasicAuth("admin", string(hash))
	if err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fileAuth, err := BasicAuthFromFile("ops", pwFile)
	if err != nil {
		t.Fatal(err)
	}
	hashFile := filepath.Join(t.TempDir(), "hash")
	if err := os.WriteFile(hashFile, append(hash, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	hashFileAuth, err := BasicAuthFromFile("admin", hashFile)
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name     string
		auth     *BasicAuth
		user, pw string
	}{
		{"bcrypt", auth, "admin", "s3cret pass"},
		{"plain file", fileAuth, "ops", "from-file"},
		{"hash file", hashFileAuth, "admin", "s3cret pass"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.auth.failureBurst = 1000 // this test is about routes, not the limit
			ts, _ := newTestServer(t, healthySnapshot(), Options{Auth: c.auth})
			do := func(path, user, pw string) int {
				req, _ := http.NewRequest("GET", ts.URL+path, nil)
				if user != "" {
					req.SetBasicAuth(user, pw)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
					t.Errorf("%s: 401 without a Basic challenge", path)
				}
				return resp.StatusCode
			}
			for _, p := range []string{"/", "/assets/app.js", "/api/v1/status", "/api/v1/services", "/api/v1/services/shop/web", "/api/v1/syncs"} {
				if code := do(p, "", ""); code != 401 {
					t.Errorf("%s without credentials: %d, want 401", p, code)
				}
				if code := do(p, c.user, c.pw+"x"); code != 401 {
					t.Errorf("%s wrong password: %d, want 401", p, code)
				}
				if code := do(p, c.user+"x", c.pw); code != 401 {
					t.Errorf("%s wrong user: %d, want 401", p, code)
				}
				// Twice: the second goes through the verified-credentials cache.
				for range 2 {
					if code := do(p, c.user, c.pw); code != 200 {
						t.Errorf("%s with credentials: %d, want 200", p, code)
					}
				}
			}
			for _, p := range []string{"/healthz", "/livez", "/readyz", "/metrics"} {
				if code := do(p, "", ""); code != 200 {
					t.Errorf("%s must stay open: %d", p, code)
				}
			}
		})
	}
}

func TestBasicAuthErrors(t *testing.T) {
	for _, c := range []struct {
		user, hash string
		want       string
	}{
		{"", "$2a$10$abcdefghijklmnopqrstuvabcdefghijklmnopqrstuvwxyzABCDEF", "status auth user: must not be empty"},
		{"a:b", "$2a$", `status auth user "a:b": must not contain ':'`},
		{"admin", "plaintext", "status auth password hash: not a bcrypt hash"},
	} {
		_, err := NewBasicAuth(c.user, c.hash)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewBasicAuth(%q, %q) = %v, want %q", c.user, c.hash, err, c.want)
		}
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := BasicAuthFromFile("admin", missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := BasicAuthFromFile("admin", empty); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty file: %v", err)
	}
}

func TestStatusLine(t *testing.T) {
	s := healthySnapshot()
	if got, want := StatusLine(s, fixtureNow), "5 services, last partial sync 3s ago took 420µs (6 changes)"; got != want {
		t.Errorf("StatusLine = %q, want %q", got, want)
	}
	s.Sync.LastErrorTime = fixtureNow
	s.Sync.KernelMatches = false
	if got := StatusLine(s, fixtureNow); !strings.HasSuffix(got, "; kernel drift; last sync failed: netlink: EBUSY") {
		t.Errorf("StatusLine = %q", got)
	}
	if got := StatusLine(Snapshot{}, fixtureNow); got != "waiting for first sync" {
		t.Errorf("StatusLine = %q", got)
	}
}

func TestNewServerNeedsSource(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "Source") {
			t.Errorf("recover() = %v", r)
		}
	}()
	NewServer(Options{})
}

// TestHostCheckWithoutAuth: without authentication, only requests naming
// the server by an IP address, localhost or an allowed name are served, so
// that a page on another site cannot read the API through a name it points
// at this server (DNS rebinding). With authentication any name is served.
func TestHostCheckWithoutAuth(t *testing.T) {
	src := &fakeSource{snap: healthySnapshot()}
	h := NewServer(Options{Source: src, AllowedHosts: []string{"gw.example.org", "Edge-1."}, Pprof: true, Now: fixtureClock})
	for _, c := range []struct {
		host string
		want int
	}{
		{"127.0.0.1:9180", 200}, {"10.0.0.1", 200}, {"[::1]:9180", 200}, {"[fe80::1%25eth0]:9180", 200},
		{"localhost:9180", 200}, {"LOCALHOST", 200}, {"gw.example.org:9180", 200}, {"GW.example.org.", 200},
		{"edge-1", 200}, {"", 200},
		{"evil.example:9180", 421}, {"gw.example.org.evil.example", 421}, {"localhost.evil.example", 421},
		{"127.0.0.1.nip.io", 421}, {"10.0.0.1.evil.example:80", 421},
	} {
		for _, path := range []string{"/api/v1/status", "/", "/metrics", "/healthz", "/debug/pprof/"} {
			req := httptest.NewRequest("GET", path, nil)
			req.Host = c.host
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.want {
				t.Errorf("Host %q %s: %d, want %d (%s)", c.host, path, rec.Code, c.want, strings.TrimSpace(rec.Body.String()))
			}
		}
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := NewBasicAuth("admin", string(hash))
	if err != nil {
		t.Fatal(err)
	}
	h = NewServer(Options{Source: src, Auth: auth})
	req := httptest.NewRequest("GET", "/api/v1/status", nil)
	req.Host = "box.example.net"
	req.SetBasicAuth("admin", "pw")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("with auth, any Host: %d, want 200", rec.Code)
	}
}

// TestPprofIsBehindAuth: /debug/pprof/ answers only with Options.Pprof,
// and then only with credentials when there is authentication.
func TestPprofIsBehindAuth(t *testing.T) {
	src := &fakeSource{snap: healthySnapshot()}
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := NewBasicAuth("admin", string(hash))
	if err != nil {
		t.Fatal(err)
	}
	get := func(h http.Handler, user string) int {
		req := httptest.NewRequest("GET", "/debug/pprof/cmdline", nil)
		req.Host = "127.0.0.1"
		if user != "" {
			req.SetBasicAuth(user, "pw")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := get(NewServer(Options{Source: src}), ""); code != 404 {
		t.Errorf("without Pprof: %d, want 404", code)
	}
	withAuth := NewServer(Options{Source: src, Auth: auth, Pprof: true})
	if code := get(withAuth, ""); code != 401 {
		t.Errorf("with auth, no credentials: %d, want 401", code)
	}
	if code := get(withAuth, "admin"); code != 200 {
		t.Errorf("with auth and credentials: %d, want 200", code)
	}
}

// TestSelfSignedCertificate: the certificate is made once, kept, and
// served; a later start with other names keeps the first.
func TestSelfSignedCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	cert, created, err := SelfSignedCertificate(dir, []string{"edge-1", "localhost", "127.0.0.1"}, fixtureNow)
	if err != nil || !created {
		t.Fatalf("first call: created %v, %v", created, err)
	}
	if st, err := os.Stat(filepath.Join(dir, SelfSignedKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v", st, err)
	}
	again, created, err := SelfSignedCertificate(dir, []string{"other"}, fixtureNow.Add(time.Hour))
	if err != nil || created {
		t.Fatalf("second call: created %v, %v", created, err)
	}
	if !bytes.Equal(cert.Certificate[0], again.Certificate[0]) {
		t.Error("the certificate changed between starts")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.VerifyHostname("edge-1"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}
	// Served over TLS, and trusted by a client that pinned it.
	ts := httptest.NewUnstartedServer(NewServer(Options{Source: &fakeSource{snap: healthySnapshot()}, Now: fixtureClock}))
	ts.TLS = TLSConfig(cert)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get(ts.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz over TLS: %d", resp.StatusCode)
	}

	// A certificate without its key is an error, never replaced.
	if err := os.Remove(filepath.Join(dir, SelfSignedKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SelfSignedCertificate(dir, nil, fixtureNow); err == nil || !strings.Contains(err.Error(), SelfSignedKeyFile) {
		t.Errorf("certificate without key: %v", err)
	}
}

func fixtureClock() time.Time { return fixtureNow }

// checkPanel checks an optional panel's endpoint: without the option path
// is 404 and the page's data-<panel> is not on; with opts path answers
// JSON that ok accepts, and the page turns the panel on.
func checkPanel(t *testing.T, path, panel string, opts Options, ok func(body []byte) bool) {
	t.Helper()
	ts, _ := newTestServer(t, healthySnapshot(), Options{})
	if code, _, _ := get(t, ts.URL+path); code != http.StatusNotFound {
		t.Errorf("%s without its option: %d, want 404", path, code)
	}
	on := `data-` + panel + `="on"`
	if _, _, page := get(t, ts.URL+"/"); strings.Contains(string(page), on) {
		t.Errorf("the %s panel is on without its option", panel)
	}
	ts, _ = newTestServer(t, healthySnapshot(), opts)
	code, hdr, body := get(t, ts.URL+path)
	if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") || !ok(body) {
		t.Errorf("%s: %d %s %s", path, code, hdr.Get("Content-Type"), body)
	}
	if _, _, page := get(t, ts.URL+"/"); !strings.Contains(string(page), on) {
		t.Errorf("the page does not know the %s panel has data", panel)
	}
}

// GET /api/v1/edge encodes what Options.Edge gives, and is 404 without it;
// the page turns its panel on only with it.
func TestAPIEdge(t *testing.T) {
	checkPanel(t, "/api/v1/edge", "edge", Options{Edge: func() any {
		return map[string]any{"bgp": []map[string]string{{"address": "198.18.6.1", "state": "established"}}}
	}}, func(body []byte) bool {
		var v struct {
			BGP []struct{ State string } `json:"bgp"`
		}
		return json.Unmarshal(body, &v) == nil && len(v.BGP) == 1 && v.BGP[0].State == "established"
	})
}

// GET /api/v1/gateways encodes what Options.Gateways gives, and is 404
// without it; the page turns its panel on only with it.
func TestAPIGateways(t *testing.T) {
	checkPanel(t, "/api/v1/gateways", "gateways", Options{Gateways: func() any {
		return map[string]any{"name": "gw-a", "peers": []map[string]string{{"name": "gw-b", "state": "alive"}}}
	}}, func(body []byte) bool {
		var v struct {
			Peers []struct{ State string } `json:"peers"`
		}
		return json.Unmarshal(body, &v) == nil && len(v.Peers) == 1 && v.Peers[0].State == "alive"
	})
}

// GET /api/v1/statesync encodes what Options.StateSync gives, and is 404
// without it; the page turns its panel on only with it.
func TestAPIStateSync(t *testing.T) {
	checkPanel(t, "/api/v1/statesync", "statesync", Options{StateSync: func() any {
		return map[string]any{"ready": true, "peers": []map[string]any{{"name": "gw-b", "up": true, "sent": 7}}}
	}}, func(body []byte) bool {
		var v struct {
			Peers []struct{ Sent int } `json:"peers"`
		}
		return json.Unmarshal(body, &v) == nil && len(v.Peers) == 1 && v.Peers[0].Sent == 7
	})
}
