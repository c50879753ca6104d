package e2e_test

// The page's traffic views on a running gateway: real connections through
// it move the counters and the charts, a removed endpoint's flows drain on
// the detail view, and the timeline shows syncs and refused input. And
// the page's timings with 10,000 Services.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// holder accepts connections on a backend address and keeps them open
// until closed: flows that stay in conntrack as long as the test wants.
type holder struct {
	ln       net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	received atomic.Int64 // bytes read from all connections
}

// counter counts what is written to it.
type counter struct{ n *atomic.Int64 }

func (c counter) Write(b []byte) (int, error) { c.n.Add(int64(len(b))); return len(b), nil }

func hold(t *testing.T, h *lab.Host, addr string) *holder {
	t.Helper()
	ln, err := h.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	o := &holder{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.mu.Lock()
			o.conns = append(o.conns, c)
			o.mu.Unlock()
			go func() {
				_, _ = io.Copy(counter{&o.received}, c) // until the client closes
				o.mu.Lock()
				defer o.mu.Unlock()
				o.conns = slices.DeleteFunc(o.conns, func(x net.Conn) bool { return x == c })
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); o.closeAll() })
	return o
}

// closeAll closes the connections held so far: their flows leave the open
// states.
func (o *holder) closeAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.conns {
		c.Close()
	}
	o.conns = nil
}

func (o *holder) held() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.conns)
}

func TestPageTraffic(t *testing.T) {
	topo := labtest.Gateway(t)
	browsertest.Chromium(t)
	// Flows carry their age and bytes when the kernel stamps and counts them.
	for _, k := range []string{"net.netfilter.nf_conntrack_timestamp", "net.netfilter.nf_conntrack_acct"} {
		if err := topo.Gateway.Sysctl(k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	g := gatewaytest.New(t, topo, append([]string{"--counters", "--traffic-history-step=1s"}, gatewaytest.VIPExternalIPs...)...)
	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	both := gatewaytest.Slice("default", "web-1", "web", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.10", NodeName: "node-a"}, gatewaytest.Endpoint{Addr: "198.18.2.11", NodeName: "node-b"})
	quiet := gatewaytest.Service("default", "quiet", "ClusterIP", []string{"198.19.0.11"}, gatewaytest.Port{Name: "http", Port: 80})
	quietSlice := gatewaytest.Slice("default", "quiet-1", "quiet", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.12", NodeName: "node-a"})
	g.Write("web.yaml", web, both)
	g.Write("quiet.yaml", quiet, quietSlice)
	g.Start()
	a, b := hold(t, topo.Backend, "198.18.2.10:8080"), hold(t, topo.Backend, "198.18.2.11:8080")

	const host = "127.0.0.1:9180"
	br := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateway.Name(), Timeout: 4 * time.Minute})
	artifacts := browsertest.ArtifactDir(t, "nftgate")
	br.Navigate("http://" + host + "/")
	br.Poll("first refresh", `document.body.dataset.loaded === 'true'`)
	br.WaitRows("Services by name", "default/quiet", "default/web")

	// Real connections through the gateway: 30 opened and closed, then 8
	// kept open.
	dial := func() net.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := topo.Client.DialContext(ctx, "tcp", "198.19.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for range 30 {
		dial().Close()
	}
	var open []net.Conn
	for range 8 {
		open = append(open, dial())
	}
	t.Cleanup(func() {
		for _, c := range open {
			c.Close()
		}
	})
	web1 := `document.querySelector('#svc-body tr[data-key="default/web"] td.traffic')`
	br.Poll("the counters on the page", web1+`.querySelector('.t-new')?.textContent === '38 new' && `+web1+`.querySelector('.t-flows')?.textContent === '8 flows'`)
	// The chart: a point with new connections, and the flows.
	br.Poll("the chart", web1+`.querySelector('svg.spark title') && !/up to 0\/s new/.test(`+web1+`.querySelector('svg.spark title').textContent) && /8 flows/.test(`+web1+`.querySelector('svg.spark title').textContent)`)
	// By traffic, the busy Service comes first.
	br.Do("sort by new connections", chromedp.SetValue(chromedp.CSS("#sort"), "new"))
	browsertest.Eval[bool](br, `document.getElementById('sort').dispatchEvent(new Event('change')), true`)
	br.WaitRows("Services by new connections", "default/web", "default/quiet")
	if got := br.Text(`#svc-body tr[data-key="default/quiet"] td.traffic .t-new`); got != "0 new" {
		t.Errorf("quiet Service shows %q, want 0 new", got)
	}

	// Bytes through the Services: 2 MiB to web in 16 connections, spread
	// over its endpoints by the hash, 1 KiB to quiet. The bytes column
	// shows them, and "Most traffic" puts web first.
	q := hold(t, topo.Backend, "198.18.2.12:8080")
	send := func(dst string, conns, size int) {
		t.Helper()
		for range conns {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := topo.Client.DialContext(ctx, "tcp", dst)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(make([]byte, size)); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
	}
	const webBytes = 2 << 20
	send("198.19.0.10:80", 16, webBytes/16)
	send("198.19.0.11:80", 1, 1024)
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if n := a.received.Load() + b.received.Load(); n != webBytes {
			return fmt.Errorf("web's endpoints received %d bytes of %d", n, webBytes)
		}
		if n := q.received.Load(); n != 1024 {
			return fmt.Errorf("quiet's endpoint received %d bytes of 1024", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	bytesOf := func(key string) string {
		return `(document.querySelector('#svc-body tr[data-key="` + key + `"] td.traffic .t-bytes') || {}).textContent`
	}
	// In: the 2 MiB and the headers of the packets that carried them (and
	// of the connections before); out: acknowledgements, a few KiB.
	br.Poll("web's bytes in the column", `/^↓2\.[0-2] MiB ↑\d+(\.\d)? KiB$/.test(`+bytesOf("default/web")+`)`)
	br.Poll("quiet's bytes in the column", `/^↓[1-9](\.\d)? KiB ↑/.test(`+bytesOf("default/quiet")+`)`)
	br.Do("sort by name", chromedp.SetValue(chromedp.CSS("#sort"), "name"))
	browsertest.Eval[bool](br, `document.getElementById('sort').dispatchEvent(new Event('change')), true`)
	br.WaitRows("Services by name", "default/quiet", "default/web")
	br.Do("sort by most traffic", chromedp.SetValue(chromedp.CSS("#sort"), "traffic"))
	browsertest.Eval[bool](br, `document.getElementById('sort').dispatchEvent(new Event('change')), true`)
	br.WaitRows("Services by most traffic", "default/web", "default/quiet")
	t.Logf("bytes column: web %q, quiet %q", br.Text(`#svc-body tr[data-key="default/web"] td.traffic .t-bytes`),
		br.Text(`#svc-body tr[data-key="default/quiet"] td.traffic .t-bytes`))
	br.Screenshot(artifacts, "page-traffic-bytes.png")

	// The detail view: each endpoint's share of the 8 open flows, the top
	// client, the live flows and their search.
	br.Click(`#svc-body tr[data-key="default/web"] .svc-open`)
	shares := `Array.from(document.querySelectorAll('.d-shares li[data-endpoint]'), l => l.dataset.endpoint + '=' + l.dataset.flows + (l.classList.contains('gone') ? ' gone' : ''))`
	br.Poll("endpoints' shares", `(s => s.length === 2 && s.reduce((n, x) => n + Number(x.split('=')[1].split(' ')[0]), 0) === 8)(`+shares+`)`)
	if n := a.held() + b.held(); n != 8 {
		t.Errorf("the backends hold %d connections, want 8", n)
	}
	// Each endpoint's share of the bytes: what its backend received (the
	// headers and acknowledgements on top stay under a fifth more), its
	// percentage within one of the backends' own.
	recv := map[string]int64{"198.18.2.10:8080": a.received.Load(), "198.18.2.11:8080": b.received.Load()}
	for ep, n := range recv {
		li := `document.querySelector('.d-shares li[data-endpoint="` + ep + `"]')`
		br.Poll("bytes share of "+ep, fmt.Sprintf(`(l => l && Number(l.dataset.bytes) >= %d && Number(l.dataset.bytes) <= %d && (m => m && Math.abs(Number(m[1]) - %d) <= 1)(l.textContent.match(/(\d+)%% of bytes$/)))(%s)`,
			n, n+n/5+64<<10, (100*n+webBytes/2)/webBytes, li))
		t.Logf("endpoint %s received %d bytes; the detail view: %q", ep, n, br.Text(`.d-shares li[data-endpoint="`+ep+`"]`))
	}
	br.Poll("top client", `document.querySelector('.d-clients li .mono') && document.querySelector('.d-clients li .mono').textContent === '`+topo.ClientIPv4[0].String()+`'`)
	br.Poll("live flows", `document.querySelectorAll('.d-flows tbody tr').length >= 8`)
	br.Do("search flows", chromedp.SendKeys(chromedp.CSS(".d-flow-search"), "198.18.2.11"))
	want11 := b.held()
	br.Poll("flows of one endpoint", fmt.Sprintf(`(r => r.length >= %d && r.every(tr => tr.children[1].textContent.startsWith('198.18.2.11:')))(Array.from(document.querySelectorAll('.d-flows tbody tr')))`, want11))
	if age := br.Text(".d-flows tbody tr td:nth-child(5)"); age == "–" {
		t.Errorf("flow age %q with nf_conntrack_timestamp = 1", age)
	}
	br.Screenshot(artifacts, "page-traffic.png")

	// The endpoint 198.18.2.11 goes: its open flows stay, shown as
	// draining, and leave the view as they end.
	if want11 == 0 {
		t.Fatal("no connection went to 198.18.2.11")
	}
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10", NodeName: "node-a"}))
	br.Poll("removed endpoint draining", `(s => s.includes('198.18.2.11:8080=`+fmt.Sprint(want11)+` gone'))(`+shares+`)`)
	br.Screenshot(artifacts, "page-draining.png")
	b.closeAll()
	br.Poll("removed endpoint drained", `(s => s.length === 1 && s[0].startsWith('198.18.2.10:8080='))(`+shares+`)`)
	br.Screenshot(artifacts, "page-drained.png")

	// The timeline: the syncs so far, and input refused.
	g.Write("broken.yaml", gatewaytest.Service("legacy", "broken", "ClusterIP", []string{"198.19.0.300"}, gatewaytest.Port{Name: "http", Port: 80}))
	br.Poll("a sync event", `document.querySelectorAll('#events-body li.ev.sync').length > 0`)
	br.Poll("a refused event", `document.querySelectorAll('#events-body li.ev.refused').length > 0`)
	if msg := br.Text("#events-body li.ev.refused .attrs"); !strings.Contains(msg, "198.19.0.300") {
		t.Errorf("refused event %q does not name the value", msg)
	}
	browsertest.Eval[bool](br, `document.getElementById('events').scrollIntoView(), true`)
	br.Screenshot(artifacts, "page-events.png")
	br.Check()
}

// The page with 10,000 Services: first paint, the Services table's first
// drawing and a filter, as the browser times them (performance entries).
func TestPageTimings10000(t *testing.T) {
	topo := labtest.Gateway(t)
	browsertest.Chromium(t)
	g := gatewaytest.New(t, topo, gatewaytest.VIPExternalIPs...)
	const n = 10000
	objs := make([]any, 0, 2*n)
	for i := range n {
		name := fmt.Sprintf("svc-%05d", i)
		ns := fmt.Sprintf("ns-%02d", i%40)
		objs = append(objs, gatewaytest.Service(ns, name, "ClusterIP", []string{fmt.Sprintf("198.19.%d.%d", 100+i/250, i%250+1)}, gatewaytest.Port{Name: "http", Port: 80}),
			gatewaytest.Slice(ns, name+"-1", name, "http", "", 8080, gatewaytest.Endpoint{Addr: fmt.Sprintf("198.18.%d.%d", 100+i/250, i%250+1), NodeName: "node-a"}))
	}
	g.Write("many.yaml", objs...)
	g.Start()
	// The page of a running gateway: its Service list published, not the
	// seconds after the start when it is still being built.
	deadline := time.Now().Add(time.Minute)
	for {
		_, body, err := g.Get("/api/v1/services?limit=1")
		var l struct{ Total int }
		if err == nil && json.Unmarshal([]byte(body), &l) == nil && l.Total == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API does not list %d Services after a minute: %v %.200s", n, err, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	const host = "127.0.0.1:9180"
	br := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateway.Name(), Timeout: 4 * time.Minute})
	artifacts := browsertest.ArtifactDir(t, "nftgate")
	br.Navigate("http://" + host + "/")
	br.Poll("10,000 Services listed", `document.getElementById('svc-count').textContent === '10,000 services'`)
	// The first 100 rows by name, drawn from the small first answer or the
	// whole list, whichever came first.
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns-%02d/svc-%05d", i%40, i)
	}
	slices.Sort(keys)
	br.WaitRows("the first rows by name", keys[:100]...)
	br.Poll("the whole list", `performance.getEntriesByName('nftgate:services-json').length > 0`)
	type timings struct {
		FCP, Services, Whole, DOMContentLoaded float64
	}
	tm := browsertest.Eval[timings](br, `({
  fcp: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || -1,
  services: (performance.getEntriesByName('nftgate:services')[0] || {}).startTime || -1,
  whole: (performance.getEntriesByName('nftgate:services-json')[0] || {}).startTime || -1,
  domContentLoaded: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd,
})`)
	t.Logf("10,000 Services: first contentful paint %.0f ms, DOMContentLoaded %.0f ms, Services table drawn %.0f ms, the whole list (for filters) in %.0f ms after the navigation started",
		tm.FCP, tm.DOMContentLoaded, tm.Services, tm.Whole)
	if tm.FCP <= 0 || tm.Services <= 0 || tm.Whole <= 0 {
		t.Errorf("timings missing: %+v", tm)
	}
	// Where the time went: each API request (sent, first byte, last byte,
	// size on the wire and decoded) and the page's own marks.
	steps := browsertest.Eval[[]string](br, `[].concat(
  performance.getEntriesByType('resource').filter(r => r.name.includes('/api/')).map(r =>
    new URL(r.name).pathname + new URL(r.name).search + ': sent ' + r.startTime.toFixed(0) + ', first byte ' + r.responseStart.toFixed(0) +
    ', done ' + r.responseEnd.toFixed(0) + ' ms, ' + (r.encodedBodySize / 1024).toFixed(0) + ' / ' + (r.decodedBodySize / 1024).toFixed(0) + ' KiB'),
  performance.getEntriesByType('mark').filter(m => m.name.startsWith('nftgate:')).map(m => m.name + ' ' + m.startTime.toFixed(0) + ' ms'))`)
	for _, s := range steps {
		t.Logf("  %s", s)
	}
	br.Screenshot(artifacts, "page-10000.png")

	br.Search("svc-0424")
	br.WaitRows("filtered", "ns-00/svc-04240", "ns-01/svc-04241", "ns-02/svc-04242", "ns-03/svc-04243", "ns-04/svc-04244",
		"ns-05/svc-04245", "ns-06/svc-04246", "ns-07/svc-04247", "ns-08/svc-04248", "ns-09/svc-04249")
	br.Poll("filter timed", `performance.getEntriesByName('nftgate:filter').length > 0`)
	filters := browsertest.Eval[[]float64](br, `performance.getEntriesByName('nftgate:filter').map(m => Math.round(m.duration))`)
	renders := browsertest.Eval[[]float64](br, `performance.getEntriesByName('nftgate:filter-render').map(m => Math.round(m.duration))`)
	worst := 0.0
	for _, d := range filters {
		worst = max(worst, d)
	}
	t.Logf("10,000 Services: %d filter redraws while typing, keystroke to painted in %.0f ms at worst (%v ms; of which the script %v ms)", len(filters), worst, filters, renders)
	br.Search("")
	br.Poll("cleared", `document.getElementById('svc-count').textContent === '10,000 services'`)
	br.Check()
}
