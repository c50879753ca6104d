package appliance

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/browsertest"
)

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
	s.Services = s.Services.With(more)
	return s
}

func TestStatusPageInBrowser(t *testing.T) {
	browsertest.Chromium(t)
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
	b := browsertest.Start(t, browsertest.Options{Host: base.Host})
	artifacts := browsertest.ArtifactDir(t, "appliance")

	b.Navigate(ts.URL + "/")
	b.Poll("first refresh", `document.body.dataset.loaded === 'true'`)
	// A marker that a full reload would wipe.
	browsertest.Eval[bool](b, `window.__noReload = true`)

	if got := b.Text("#state-word"); got != "Healthy" {
		t.Errorf("state = %q, want Healthy", got)
	}
	if got := b.Text("#f-last-sync"); got != "3s ago" {
		t.Errorf("last sync = %q, want 3s ago", got)
	}
	want := make([]string, 0, src.snap.Services.Len())
	for s := range src.snap.Services.All() {
		want = append(want, s.Key())
	}
	slices.Sort(want)
	if got := b.Rows(); !slices.Equal(got, want) {
		t.Errorf("table rows = %v\nwant %v", got, want)
	}
	if got := b.Text("#svc-count"); got != fmt.Sprintf("%d services", len(want)) {
		t.Errorf("count = %q", got)
	}
	if bars := browsertest.Eval[int](b, `document.querySelectorAll('#chart-duration rect.bar').length`); bars != 60 {
		t.Errorf("duration chart bars = %d, want 60", bars)
	}
	if failed := browsertest.Eval[int](b, `document.querySelectorAll('#chart-duration rect.bar.failed').length`); failed != 1 {
		t.Errorf("failed bars = %d, want 1", failed)
	}
	if pts := browsertest.Eval[int](b, `document.querySelectorAll('#chart-latency circle').length`); pts != 60 {
		t.Errorf("latency points = %d, want 60", pts)
	}
	b.Screenshot(artifacts, "status.png")

	// The search filters as one types.
	b.Search("kube-dns")
	b.WaitRows("search kube-dns", "kube-system/kube-dns")
	b.Search("203.0.113.7")
	b.WaitRows("search by address", "shop/web")
	b.Search("node-b")
	b.WaitRows("search by node", "kube-system/kube-dns", "monitoring/ledger-5", "payments/grafana-9", "search/query-13", "search/worker-1", "shop/web")
	b.Search("no-such-service")
	b.WaitRows("search without match")
	if got := b.Text("#svc-body tr.empty"); got != "No services match the filter." {
		t.Errorf("empty row = %q", got)
	}
	// Problems only: the rejected Service and the one without endpoints.
	b.Search("shop")
	b.WaitRows("search shop", "shop/cart", "shop/web")
	b.Search("")
	b.WaitRows("cleared search", want...)
	b.Click("#problems")
	b.WaitRows("problems only", "legacy/broken", "shop/cart")
	b.Screenshot(artifacts, "status-filtered.png")
	b.Click("#problems")

	// The page follows the gateway without reloading: a new Service shows up,
	// and a drift turns the state red.
	next := browserSnapshot()
	next.Services = next.Services.With([]Service{{Namespace: "zeta", Name: "late-arrival", Type: "ClusterIP",
		ClusterIPs: addrs("10.96.200.1"), Ports: []ServicePort{{Protocol: "TCP", Port: 80}}}})
	next.Sync.ServicesRevision++
	next.Sync.KernelMatches = false
	src.set(next)
	b.Poll("new service row", `document.querySelector('#svc-body tr[data-key="zeta/late-arrival"]') !== null`)
	b.Poll("unhealthy state", `document.getElementById('state').className === 'state bad'`)
	if got := b.Text("#state-reason"); got != "kernel ruleset differs from the desired one" {
		t.Errorf("reason = %q", got)
	}
	b.Screenshot(artifacts, "status-unhealthy.png")
	if !browsertest.Eval[bool](b, `window.__noReload === true`) {
		t.Errorf("page reloaded instead of updating in place")
	}

	if n := b.Requests(); n < 4 {
		t.Errorf("saw %d requests; the network listener is not working", n)
	}
	b.Check()
}

// problemsSnapshot is browserSnapshot with files the source refused, a
// Service whose rules the kernel refused and one served with warnings;
// the texts hold markup, which the page must show as text.
func problemsSnapshot() Snapshot {
	s := browserSnapshot()
	s.SourceProblems = []string{
		"/etc/nftgate/manifests/f.yaml: a FIFO, not a regular file; not read",
		`/etc/nftgate/manifests/<b>z</b>.yaml: a character device (through the symlink to /dev/zero), not a regular file; not read`,
	}
	rows := s.Services.copyRows()
	for i := range rows {
		switch rows[i].Key() {
		case "shop/web":
			rows[i].KernelError = `netlink: chain <b>x</b> add: file name too long`
		case "kube-system/kube-dns":
			rows[i].Warnings = []string{
				"externalIP 192.0.2.9 is outside external_ip_cidrs: not served",
				`<img src=x onerror="window.__xss=1">`,
			}
		}
	}
	s.Services = NewServiceList(rows...)
	return s
}

// dnsWarnings are the warnings problemsSnapshot gives kube-system/kube-dns.
func dnsWarnings() []string {
	svc, _ := problemsSnapshot().Services.Get("kube-system", "kube-dns")
	return svc.Warnings
}

// TestStatusPageShowsProblems: files the source refused, Services the
// kernel refused and Services with warnings show on the page, in the
// counts, the list and the detail view, escaped.
func TestStatusPageShowsProblems(t *testing.T) {
	browsertest.Chromium(t)
	src := &fakeSource{snap: problemsSnapshot()}
	ts, _ := newTestServerWithSource(t, src, Options{Refresh: 300 * time.Millisecond})
	base, err := url.Parse(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	b := browsertest.Start(t, browsertest.Options{Host: base.Host})
	artifacts := browsertest.ArtifactDir(t, "appliance")

	b.Navigate(ts.URL + "/")
	// As the server renders it, before the script has run.
	if got := b.Text("#c-rejected"); got != "2 files, 1 Service" {
		t.Errorf("rejected as rendered = %q, want 2 files, 1 Service", got)
	}
	b.Poll("first refresh", `document.body.dataset.loaded === 'true'`)
	for sel, want := range map[string]string{
		"#c-rejected": "2 files, 1 Service", "#c-kernel-refused": "1", "#c-warnings": "1",
	} {
		if got := b.Text(sel); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	if cls := browsertest.Eval[string](b, `document.getElementById('c-rejected').className`); cls != "bad" {
		t.Errorf("rejected count class %q, want bad", cls)
	}
	if hidden := browsertest.Eval[bool](b, `document.getElementById('source-problems').hidden`); hidden {
		t.Error("the source problems are hidden")
	}
	if got := browsertest.Eval[[]string](b, `Array.from(document.querySelectorAll('#source-problems-list li'), e => e.textContent)`); !slices.Equal(got, src.snap.SourceProblems) {
		t.Errorf("source problems shown %q, want %q", got, src.snap.SourceProblems)
	}

	// The list.
	if got := b.Text(`tr[data-key="shop/web"] .svc-kerr`); got != "kernel refused, last good state kept: netlink: chain <b>x</b> add: file name too long" {
		t.Errorf("kernel error in the list = %q", got)
	}
	if got := browsertest.Eval[[]string](b, `Array.from(document.querySelectorAll('tr[data-key="kube-system/kube-dns"] .svc-warn li'), e => e.textContent)`); !slices.Equal(got, dnsWarnings()) {
		t.Errorf("warnings in the list = %q", got)
	}
	b.Click("#problems")
	b.WaitRows("problems only", "kube-system/kube-dns", "legacy/broken", "shop/cart", "shop/web")
	b.Click("#problems")

	// The detail view.
	b.Click(`tr[data-key="shop/web"] .svc-open`)
	b.Poll("detail of shop/web", `document.querySelector('tr.detail[data-detail-key="shop/web"]') !== null`)
	if got := b.Text(`tr.detail[data-detail-key="shop/web"] .d-kernel`); !strings.Contains(got, "netlink: chain <b>x</b> add: file name too long") {
		t.Errorf("kernel error in the detail view = %q", got)
	}
	b.Click(`tr[data-key="kube-system/kube-dns"] .svc-open`)
	b.Poll("detail of kube-dns", `document.querySelector('tr.detail[data-detail-key="kube-system/kube-dns"]') !== null`)
	if n := browsertest.Eval[int](b, `document.querySelectorAll('tr.detail').length`); n != 1 {
		t.Errorf("%d detail views open, want 1", n)
	}
	if got := browsertest.Eval[[]string](b, `Array.from(document.querySelectorAll('tr.detail .d-warnings li'), e => e.textContent)`); !slices.Equal(got, dnsWarnings()) {
		t.Errorf("warnings in the detail view = %q", got)
	}
	b.Screenshot(artifacts, "status-problems.png")
	if browsertest.Eval[bool](b, `document.querySelector('#source-problems b, #svc-body b, #svc-body img') !== null || window.__xss !== undefined`) {
		t.Error("markup in a problem was rendered as HTML")
	}

	// The problems go: the page follows without a reload.
	next := browserSnapshot()
	next.Sync.ServicesRevision++
	src.set(next)
	b.Poll("source problems hidden", `document.getElementById('source-problems').hidden`)
	b.Poll("kernel error gone", `document.querySelector('.svc-kerr') === null`)
	if got := b.Text("#c-rejected"); got != "1" {
		t.Errorf("rejected after the files went = %q, want 1", got)
	}
	if got := b.Text("#c-kernel-refused"); got != "0" {
		t.Errorf("kernel refused after = %q, want 0", got)
	}
	b.Check()
}
