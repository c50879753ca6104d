// Package browsertest drives the appliance status page in headless Chromium
// (Debian's chromium package) for tests: it starts the browser, collects what
// the page must never produce (console errors, exceptions, failed loads,
// requests to another host), and offers the few steps the page tests need:
// wait for a condition, read text, type into the search box, read the
// Services table, keep a screenshot.
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/nftgate/nftgate/internal/testing/repo"
)

// PollTimeout bounds every wait for a condition in the page.
const PollTimeout = 15 * time.Second

// ArtifactDir is where a test keeps its screenshots:
// $NFTGATE_TEST_ARTIFACTS/sub, or build/test-artifacts/sub in the repository.
// It is created if missing.
func ArtifactDir(t testing.TB, sub string) string {
	t.Helper()
	var dir string
	if d := os.Getenv("NFTGATE_TEST_ARTIFACTS"); d != "" {
		dir = filepath.Join(d, sub)
	} else {
		dir = repo.Path(t, "build", "test-artifacts", sub)
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

// Chromium finds Debian's chromium, installed by `make appliance-deps`. It
// skips the test when chromium is missing and installing it would need root
// (never under CI=true), and fails it otherwise.
func Chromium(t testing.TB) string {
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

// Options configure Start.
type Options struct {
	// Host is the host:port of the server under test. A request to any other
	// host is reported as a problem.
	Host string
	// Netns, when set, runs Chromium inside this named network namespace
	// (through `ip netns exec`), so it reaches servers on that namespace's
	// loopback. DevTools talks over a pipe, so no port is opened anywhere.
	Netns string
	// Width and Height of the window; zero means 1440×1000.
	Width, Height int
	// Timeout bounds the whole browser session; zero means two minutes.
	Timeout time.Duration
}

// Browser is one headless Chromium with one tab, closed by t.Cleanup.
type Browser struct {
	t   testing.TB
	ctx context.Context
	log *eventLog
}

// Start launches Chromium with a fresh profile and no network but the
// server's: no background networking, component updates, sync or first-run
// pages, and every host name but 127.0.0.1 left unresolved.
func Start(t testing.TB, opts Options) *Browser {
	t.Helper()
	exe := Chromium(t)
	if out, err := exec.Command(exe, "--version").Output(); err == nil {
		t.Logf("browser: %s", strings.TrimSpace(string(out)))
	}
	if opts.Width == 0 || opts.Height == 0 {
		opts.Width, opts.Height = 1440, 1000
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Minute
	}

	// The profile and TMPDIR in a short directory of their own: Chromium's
	// singleton socket goes there, and a Unix socket's path (108 bytes)
	// would not fit under a long test name's t.TempDir().
	dir, err := os.MkdirTemp("", "chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	profile, tmp := filepath.Join(dir, "profile"), filepath.Join(dir, "tmp")
	for _, d := range []string{profile, tmp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	t.Cleanup(cancel)
	allocOpts := []chromedp.ExecAllocatorOption{
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
		chromedp.UserDataDir(profile),
		// Chromium makes its singleton lock's directory in TMPDIR and
		// leaves it there when killed: the test's own.
		chromedp.Env("TMPDIR=" + tmp),
		chromedp.WindowSize(opts.Width, opts.Height),
	}
	if opts.Netns != "" {
		ip, err := exec.LookPath("ip")
		if err != nil {
			t.Fatalf("running chromium in namespace %s needs iproute2's ip: %v", opts.Netns, err)
		}
		allocOpts = append(allocOpts, chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
			// ip netns exec replaces itself with the browser, which keeps the
			// DevTools pipe on descriptors 3 and 4.
			cmd.Args = append([]string{"ip", "netns", "exec", opts.Netns, cmd.Path}, cmd.Args[1:]...)
			cmd.Path = ip
			// As chromedp's own default: the browser dies with the test.
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		}))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, allocOpts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)

	b := &Browser{t: t, ctx: bctx, log: &eventLog{host: opts.Host}}
	if err := chromedp.Listen(bctx, b.log.event); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// Context is the tab's context, for chromedp actions the helpers lack.
func (b *Browser) Context() context.Context { return b.ctx }

// Do runs steps, failing the test with what on error.
func (b *Browser) Do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// Navigate loads url and waits for its load event.
func (b *Browser) Navigate(url string) {
	b.t.Helper()
	b.Do("load "+url, chromedp.Navigate(url))
}

// Eval evaluates a JavaScript expression in the page.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// Poll waits until expr is true in the page, at most PollTimeout.
func (b *Browser) Poll(what, expr string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(PollTimeout))); err != nil {
		b.t.Fatalf("waiting for %s (%s): %v", what, expr, err)
	}
}

// Text is the trimmed text content of the first element matching the CSS
// selector sel.
//
// It waits until an element matches and reads it in one step in the page:
// a page that redraws the element between the two steps of chromedp's
// TextContent (find the node, then read it) made that fail with "No node
// with given id found".
func (b *Browser) Text(sel string) string {
	b.t.Helper()
	q := strconv.Quote(sel)
	b.Poll("an element "+sel, `document.querySelector(`+q+`) !== null`)
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`(document.querySelector(`+q+`) || {textContent: ""}).textContent`))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// Click clicks the first element matching the CSS selector sel.
func (b *Browser) Click(sel string) {
	b.t.Helper()
	b.Do("click "+sel, chromedp.Click(chromedp.CSS(sel)))
}

// rowsExpr lists the keys (namespace/name) of the Services table's rows.
const rowsExpr = `Array.from(document.querySelectorAll('#svc-body tr[data-key]'), r => r.dataset.key)`

// Rows lists the Services table's rows as namespace/name, in page order.
func (b *Browser) Rows() []string {
	b.t.Helper()
	return Eval[[]string](b, rowsExpr)
}

// WaitRows waits until the Services table lists exactly want, in order.
func (b *Browser) WaitRows(what string, want ...string) {
	b.t.Helper()
	js, _ := json.Marshal(append([]string{}, want...))
	expr := `JSON.stringify(` + rowsExpr + `) === ` + strconv.Quote(string(js))
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(PollTimeout))); err != nil {
		b.t.Fatalf("%s: table rows %v, want %v: %v", what, b.Rows(), want, err)
	}
}

// Search types q into the search box over what it holds, as a person would
// (select all, type); an empty q clears it.
func (b *Browser) Search(q string) {
	b.t.Helper()
	Eval[chromedp.Void](b, `document.getElementById('search').select()`)
	keys := q
	if q == "" {
		keys = kb.Backspace
	}
	b.Do("search "+q, chromedp.SendKeys(chromedp.CSS("#search"), keys))
}

// Screenshot saves a full-page PNG as dir/name and returns its path.
func (b *Browser) Screenshot(dir, name string) string {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
	return path
}

// Requests counts the requests the page sent so far; a test checks it to
// prove the network listener works, so that Check's silence means something.
func (b *Browser) Requests() int {
	b.log.mu.Lock()
	defer b.log.mu.Unlock()
	return b.log.requests
}

// Check fails the test with every problem seen since the last Check:
// console errors and warnings, uncaught exceptions, browser log errors and
// warnings (CSP violations, failed loads) and requests to another host.
func (b *Browser) Check() {
	b.t.Helper()
	b.log.mu.Lock()
	defer b.log.mu.Unlock()
	for _, p := range b.log.problems {
		b.t.Error(p)
	}
	b.log.problems = nil
}

// eventLog collects what the page must not produce.
type eventLog struct {
	mu       sync.Mutex
	host     string
	problems []string
	requests int
}

func (l *eventLog) event(ev any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e := ev.(type) {
	case *cdpruntime.EventConsoleAPICalled:
		if e.Type == cdpruntime.ConsoleAPICalledTypeError || e.Type == cdpruntime.ConsoleAPICalledTypeWarning || e.Type == cdpruntime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			l.problems = append(l.problems, fmt.Sprintf("console.%s: %s", e.Type, strings.Join(args, " ")))
		}
	case *cdpruntime.EventExceptionThrown:
		d := e.ExceptionDetails
		text := d.Text
		if d.Exception != nil {
			text += " " + d.Exception.Description
		}
		l.problems = append(l.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, text))
	case *log.EventEntryAdded:
		if e.Entry.Level == log.EntryLevelError || e.Entry.Level == log.EntryLevelWarning {
			l.problems = append(l.problems, fmt.Sprintf("browser log %s (%s): %s %s", e.Entry.Level, e.Entry.Source, e.Entry.Text, e.Entry.URL))
		}
	case *network.EventRequestWillBeSent:
		l.requests++
		u, err := url.Parse(e.Request.URL)
		if err != nil || (u.Scheme != "data" && u.Host != l.host) {
			l.problems = append(l.problems, "request to another host: "+e.Request.URL)
		}
	}
}
