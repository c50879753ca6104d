package appliance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// artifactDir is where the browser test keeps its screenshots:
// $NFTGATE_TEST_ARTIFACTS/appliance, or build/test-artifacts/appliance in the
// repository.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("..", "build", "test-artifacts", "appliance")
	if d := os.Getenv("NFTGATE_TEST_ARTIFACTS"); d != "" {
		dir = filepath.Join(d, "appliance")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// chromiumPath finds Debian's chromium, installed by `make appliance-deps`.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Geteuid() != 0 && os.Getenv("CI") != "true" {
		t.Skip("chromium is not installed and installing it needs root: run `make appliance-deps` as root")
	}
	t.Fatal("chromium is not installed: run `make appliance-deps` (the appliance test target depends on it)")
	return ""
}

// browserLog collects what the page must not produce: console errors,
// uncaught exceptions, browser log errors (CSP violations, failed loads) and
// requests to any host but the test server.
type browserLog struct {
	mu       sync.Mutex
	host     string
	problems []string
	requests int
}

func (b *browserLog) event(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning || e.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			b.problems = append(b.problems, fmt.Sprintf("console.%s: %s", e.Type, strings.Join(args, " ")))
		}
	case *runtime.EventExceptionThrown:
		d := e.ExceptionDetails
		text := d.Text
		if d.Exception != nil {
			text += " " + d.Exception.Description
		}
		b.problems = append(b.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, text))
	case *log.EventEntryAdded:
		if e.Entry.Level == log.EntryLevelError || e.Entry.Level == log.EntryLevelWarning {
			b.problems = append(b.problems, fmt.Sprintf("browser log %s (%s): %s %s", e.Entry.Level, e.Entry.Source, e.Entry.Text, e.Entry.URL))
		}
	case *network.EventRequestWillBeSent:
		b.requests++
		u, err := url.Parse(e.Request.URL)
		if err != nil || (u.Scheme != "data" && u.Host != b.host) {
			b.problems = append(b.problems, "request to another host: "+e.Request.URL)
		}
	}
}

func (b *browserLog) check(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		t.Error(p)
	}
	b.problems = nil
}

// browserSnapshot is the healthy fixture with enough Services to fill a page.
func browserSnapshot() Snapshot {
	s := healthySnapshot()
	more := manyServices(14)
	for i := range more {
		more[i].Namespace = []string{"payments", "search", "monitoring"}[i%3]
		more[i].Name = []string{"api", "worker", "grafana", "indexer", "gateway", "ledger", "query"}[i%7] + fmt.Sprintf("-%d", i)
		if i%4 == 1 {
			more[i].Endpoints = append(more[i].Endpoints, Endpoint{PortName: "http", Addr: more[i].Endpoints[0].Addr.Next(),
				Port: 8080, Ready: true, Serving: true, Node: "node-b", Used: true})
		}
	}
	s.Services = append(s.Services, more...)
	return s
}

func TestStatusPageInBrowser(t *testing.T) {
	exe := chromiumPath(t)
	if out, err := exec.Command(exe, "--version").CombinedOutput(); err == nil {
		t.Logf("browser: %s", strings.TrimSpace(string(out)))
	}

	src := &fakeSource{snap: browserSnapshot()}
	// The page computes ages from the server's clock; keep it pinned to the
	// fixture so the page reads "3s ago" as the fixture meant.
	ts, _ := newTestServerWithSource(t, src, Options{Refresh: 300 * time.Millisecond})
	base, err := url.Parse(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	if base.Hostname() != "127.0.0.1" {
		t.Fatalf("test server on %s, want 127.0.0.1", base.Host)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true),
		// Resolve no name at all: the page must need nothing but 127.0.0.1.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)

	blog := &browserLog{host: base.Host}
	if err := chromedp.Listen(bctx, blog.event); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
			t.Fatalf("waiting for %s (%s): %v", what, expr, err)
		}
	}
	rows := func() []string {
		t.Helper()
		keys, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](
			`Array.from(document.querySelectorAll('#svc-body tr[data-key]'), r => r.dataset.key)`))
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	// waitRows waits until the table lists exactly want, in order.
	waitRows := func(what string, want ...string) {
		t.Helper()
		js, _ := json.Marshal(append([]string{}, want...))
		expr := `JSON.stringify(Array.from(document.querySelectorAll('#svc-body tr[data-key]'), r => r.dataset.key)) === ` + strconv.Quote(string(js))
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
			t.Fatalf("%s: table rows %v, want %v: %v", what, rows(), want, err)
		}
	}
	search := func(q string) {
		t.Helper()
		// Select what is in the field, as a person would, and type over it.
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`document.getElementById('search').select()`)); err != nil {
			t.Fatal(err)
		}
		keys := q
		if q == "" {
			keys = kb.Backspace
		}
		do("search "+q, chromedp.SendKeys(chromedp.CSS("#search"), keys))
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(artifactDir(t), name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}

	do("load the page", chromedp.Navigate(ts.URL+"/"))
	poll("first refresh", `document.body.dataset.loaded === 'true'`)
	// A marker that a full reload would wipe.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.__noReload = true`)); err != nil {
		t.Fatal(err)
	}

	if got := text("#state-word"); got != "Healthy" {
		t.Errorf("state = %q, want Healthy", got)
	}
	if got := text("#f-last-sync"); got != "3s ago" {
		t.Errorf("last sync = %q, want 3s ago", got)
	}
	want := make([]string, 0, len(src.snap.Services))
	for _, s := range src.snap.Services {
		want = append(want, s.Key())
	}
	slices.Sort(want)
	if got := rows(); !slices.Equal(got, want) {
		t.Errorf("table rows = %v\nwant %v", got, want)
	}
	if got := text("#svc-count"); got != fmt.Sprintf("%d services", len(want)) {
		t.Errorf("count = %q", got)
	}
	bars, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#chart-duration rect.bar').length`))
	if err != nil || bars != 60 {
		t.Errorf("duration chart bars = %d (%v), want 60", bars, err)
	}
	if failed, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#chart-duration rect.bar.failed').length`)); failed != 1 {
		t.Errorf("failed bars = %d, want 1", failed)
	}
	if pts, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#chart-latency circle').length`)); pts != 60 {
		t.Errorf("latency points = %d, want 60", pts)
	}
	shot("status.png")

	// The search filters as one types.
	search("kube-dns")
	waitRows("search kube-dns", "kube-system/kube-dns")
	search("203.0.113.7")
	waitRows("search by address", "shop/web")
	search("node-b")
	waitRows("search by node", "kube-system/kube-dns", "monitoring/ledger-5", "payments/grafana-9", "search/query-13", "search/worker-1", "shop/web")
	search("no-such-service")
	waitRows("search without match")
	if got := text("#svc-body tr.empty"); got != "No services match the filter." {
		t.Errorf("empty row = %q", got)
	}
	// Problems only: the rejected Service and the one without endpoints.
	search("shop")
	waitRows("search shop", "shop/cart", "shop/web")
	search("")
	waitRows("cleared search", want...)
	do("problems only", chromedp.Click(chromedp.CSS("#problems")))
	waitRows("problems only", "legacy/broken", "shop/cart")
	shot("status-filtered.png")
	do("all services", chromedp.Click(chromedp.CSS("#problems")))

	// The page follows the gateway without reloading: a new Service shows up,
	// and a drift turns the state red.
	next := browserSnapshot()
	next.Services = append(next.Services, Service{Namespace: "zeta", Name: "late-arrival", Type: "ClusterIP",
		ClusterIPs: addrs("10.96.200.1"), Ports: []ServicePort{{Protocol: "TCP", Port: 80}}})
	next.Sync.ServicesRevision++
	next.Sync.KernelMatches = false
	src.set(next)
	poll("new service row", `document.querySelector('#svc-body tr[data-key="zeta/late-arrival"]') !== null`)
	poll("unhealthy state", `document.getElementById('state').className === 'state bad'`)
	if got := text("#state-reason"); got != "kernel ruleset differs from the desired one" {
		t.Errorf("reason = %q", got)
	}
	shot("status-unhealthy.png")
	if kept, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.__noReload === true`)); err != nil || !kept {
		t.Errorf("page reloaded instead of updating in place (%v)", err)
	}

	blog.mu.Lock()
	if blog.requests < 4 {
		t.Errorf("saw %d requests; the network listener is not working", blog.requests)
	}
	blog.mu.Unlock()
	blog.check(t)
}
