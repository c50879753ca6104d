package e2e_test

// The status page of a running gateway, driven in headless Chromium: the real
// nftgate binary serves it from the gateway namespace, fed by its own sync
// loop on a manifests directory, and Chromium runs inside that namespace.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// pageRow is what one row of the Services table shows.
type pageRow struct {
	Key      string   `json:"key"`
	Rejected bool     `json:"rejected"`
	Error    string   `json:"error"`
	Type     string   `json:"type"`
	Addrs    []string `json:"addrs"`
	Ports    []string `json:"ports"`
	Policy   string   `json:"policy"`
	Used     []string `json:"used"`     // endpoint chips shown in use
	Unused   []string `json:"unused"`   // endpoint chips shown not in use, with their state class
	NoneText string   `json:"noneText"` // "no endpoints" / "none usable"
}

// pageRowsExpr reads the Services table as []pageRow.
const pageRowsExpr = `Array.from(document.querySelectorAll('#svc-body tr[data-key]'), tr => {
  const td = tr.querySelectorAll('td');
  const txt = e => e ? e.textContent.trim() : '';
  const chip = c => c.firstChild.textContent + (c.querySelector('.node') ? '@' + c.querySelector('.node').textContent : '');
  return {
    key: tr.dataset.key,
    rejected: tr.classList.contains('rejected'),
    error: txt(td[0].querySelector('.svc-err')),
    type: txt(td[1]),
    addrs: Array.from(td[2].querySelectorAll('.addr'), txt),
    ports: Array.from(td[2].querySelectorAll('.port'), txt),
    policy: txt(td[3]),
    used: Array.from(td[4].querySelectorAll('.ep.used'), chip),
    unused: Array.from(td[4].querySelectorAll('.ep:not(.used)'), c => c.className.replace('ep', '').trim() + ' ' + chip(c)),
    noneText: txt(td[4].querySelector('.none')),
  };
})`

func TestPageOfRunningGateway(t *testing.T) {
	topo := labtest.Gateway(t)
	browsertest.Chromium(t) // fail or skip before the gateway starts
	g := gatewaytest.New(t, topo, gatewaytest.VIPExternalIPs...)

	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"},
		gatewaytest.Port{Name: "http", Port: 80}, gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
	webHTTP := gatewaytest.Slice("default", "web-http", "web", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.10", NodeName: "node-a"}, gatewaytest.Endpoint{Addr: "198.18.2.11", NodeName: "node-b"},
		gatewaytest.Endpoint{Addr: "198.18.2.12", NodeName: "node-b", NotReady: true},
		gatewaytest.Endpoint{Addr: "198.18.2.19", NodeName: "node-b", Terminating: true})
	webDNS := gatewaytest.Slice("default", "web-dns", "web", "dns", corev1.ProtocolUDP, 5353,
		gatewaytest.Endpoint{Addr: "198.18.2.10", NodeName: "node-a"}, gatewaytest.Endpoint{Addr: "198.18.2.11", NodeName: "node-b"})
	np := gatewaytest.Service("default", "np", "NodePort", []string{"198.19.0.11"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30080})
	npSlice := gatewaytest.Slice("default", "np-1", "np", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.13", NodeName: "node-a"})
	lb := gatewaytest.Service("shop", "lb", "LoadBalancer", []string{"198.19.0.13"}, gatewaytest.Port{Name: "https", Port: 443, NodePort: 30443})
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = 32100
	lb.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	lb.Spec.LoadBalancerSourceRanges = []string{"198.18.1.0/24"}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.1.1"}}
	lbSlice := gatewaytest.Slice("shop", "lb-1", "lb", "https", "", 8443,
		gatewaytest.Endpoint{Addr: "198.18.2.14", NodeName: "gateway"}, gatewaytest.Endpoint{Addr: "198.18.2.15", NodeName: "node-b"})
	ext := gatewaytest.Service("shop", "cart", "ClusterIP", []string{"198.19.0.12"}, gatewaytest.Port{Name: "http", Port: 80})
	ext.Spec.ExternalIPs = []string{"198.19.1.2"}
	extSlice := gatewaytest.Slice("shop", "cart-1", "cart", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.16", NodeName: "node-a"})
	// Two problems: a Service without endpoints, and one with an impossible
	// address that the gateway refuses.
	empty := gatewaytest.Service("default", "empty", "ClusterIP", []string{"198.19.0.15"}, gatewaytest.Port{Name: "http", Port: 80})
	broken := gatewaytest.Service("legacy", "broken", "ClusterIP", []string{"198.19.0.300"}, gatewaytest.Port{Name: "http", Port: 80})
	brokenSlice := gatewaytest.Slice("legacy", "broken-1", "broken", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.17"})

	g.Write("web.yaml", web, webHTTP, webDNS)
	g.Write("np.yaml", np, npSlice)
	g.Write("shop.yaml", lb, lbSlice, ext, extSlice)
	g.Write("problems.yaml", empty, broken, brokenSlice)
	g.Start()

	// What the page must call "in use" is what the rules do: only the ready
	// endpoints of web answer, not the one serving but not ready, nor the
	// terminating one while ready ones exist.
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"), ap("198.18.2.12:8080"), ap("198.18.2.19:8080"))
	wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.10:80"), 30), "198.18.2.10:8080", "198.18.2.11:8080")

	// nftgate listens on 127.0.0.1:9180 in the gateway namespace; Chromium
	// runs there too and may talk to nothing else.
	const host = "127.0.0.1:9180"
	b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateway.Name()})
	artifacts := browsertest.ArtifactDir(t, "nftgate")

	want := []string{"default/empty", "default/np", "default/web", "legacy/broken", "shop/cart", "shop/lb"}
	b.Navigate("http://" + host + "/")
	b.Poll("first refresh", `document.body.dataset.loaded === 'true'`)
	browsertest.Eval[bool](b, `window.__noReload = true`)
	// The gateway publishes its Services table shortly after the sync that
	// made it ready; the page picks it up on a later refresh.
	b.WaitRows("all Services listed", want...)

	if got := b.Text("#state-word"); got != "Healthy" {
		t.Errorf("state = %q (%s), want Healthy", got, b.Text("#state-reason"))
	}
	if got := browsertest.Eval[string](b, `document.getElementById('state').className`); got != "state ok" {
		t.Errorf("state class = %q, want %q (green)", got, "state ok")
	}
	for sel, want := range map[string]string{
		"#f-services":     "6",
		"#f-kernel-match": "in sync",
		"#c-endpoints":    "10",
		"#c-noeps":        "1",
		"#c-rejected":     "1",
		"#c-source":       "manifests:" + g.Dir,
		"#c-api":          "not used",
		"#node-name":      "gateway",
		"#svc-count":      "6 services",
	} {
		if got := b.Text(sel); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	for _, sel := range []string{"#c-table", "#c-uname", "#c-duration", "#c-kind", "#c-chains", "#c-rules", "#c-elements"} {
		if got := b.Text(sel); got == "" || got == "–" || got == "0" {
			t.Errorf("%s = %q, want a value from the running gateway", sel, got)
		}
	}
	if bars := browsertest.Eval[int](b, `document.querySelectorAll('#chart-duration rect.bar').length`); bars < 1 {
		t.Errorf("duration chart has %d bars, want the syncs done so far", bars)
	}

	rows := map[string]pageRow{}
	for _, r := range browsertest.Eval[[]pageRow](b, pageRowsExpr) {
		rows[r.Key] = r
	}
	check := func(key string, ok func(r pageRow) error) {
		t.Helper()
		r, found := rows[key]
		if !found {
			t.Errorf("%s: no row", key)
			return
		}
		if err := ok(r); err != nil {
			js, _ := json.Marshal(r)
			t.Errorf("%s: %v\nrow: %s", key, err, js)
		}
	}
	same := func(what string, got []string, want ...string) error {
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s = %q, want %q", what, got, want)
		}
		return nil
	}
	check("default/web", func(r pageRow) error {
		return errors.Join(same("type", []string{r.Type}, "ClusterIP"),
			same("addresses", r.Addrs, "cluster198.19.0.10"),
			same("ports", r.Ports, "http 80/TCP", "dns 53/UDP"),
			same("endpoints in use", r.Used, "198.18.2.10:8080,5353@node-a", "198.18.2.11:8080,5353@node-b"),
			// Serving but not ready: listed, not used. Terminating while
			// ready ones exist: listed, not used either.
			same("endpoints not in use", r.Unused, " 198.18.2.12:8080@node-b", "term 198.18.2.19:8080@node-b"),
			same("problem", []string{r.Error, r.NoneText}, "", ""))
	})
	check("default/np", func(r pageRow) error {
		return errors.Join(same("type", []string{r.Type}, "NodePort"),
			same("ports", r.Ports, "http 80/TCP · node 30080"),
			same("endpoints in use", r.Used, "198.18.2.13:8080@node-a"))
	})
	check("shop/lb", func(r pageRow) error {
		return errors.Join(same("type", []string{r.Type}, "LoadBalancer"),
			same("addresses", r.Addrs, "cluster198.19.0.13", "lb198.19.1.1"),
			same("ports", r.Ports, "https 443/TCP · node 30443"),
			same("policy", []string{r.Policy}, "ext Local · int Clusteraffinity ClientIP 3h 0mfrom 198.18.1.0/24health :32100"),
			same("endpoints in use", r.Used, "198.18.2.14:8443@gateway", "198.18.2.15:8443@node-b"))
	})
	check("shop/cart", func(r pageRow) error {
		return errors.Join(same("addresses", r.Addrs, "cluster198.19.0.12", "external198.19.1.2"),
			same("endpoints in use", r.Used, "198.18.2.16:8080@node-a"))
	})
	check("default/empty", func(r pageRow) error {
		return errors.Join(same("no endpoints", []string{r.NoneText}, "no endpoints"),
			same("chips", append(r.Used, r.Unused...)))
	})
	check("legacy/broken", func(r pageRow) error {
		if !r.Rejected || !strings.Contains(r.Error, "spec.clusterIPs[0]") || !strings.Contains(r.Error, "198.19.0.300") {
			return fmt.Errorf("not shown as rejected with the field and value named")
		}
		// Never programmed: no state to show, and no claim about endpoints.
		return errors.Join(same("type, policy, endpoints", []string{r.Type, r.Policy, r.NoneText}, "–", "not programmed", ""),
			same("addresses", r.Addrs))
	})
	b.Screenshot(artifacts, "page.png")

	// The search filters as one types: by address, NodePort, node, name.
	b.Search("198.19.1.1")
	b.WaitRows("search by load-balancer IP", "shop/lb")
	b.Search("30080")
	b.WaitRows("search by NodePort", "default/np")
	b.Search("node-b")
	b.WaitRows("search by endpoint node", "default/web", "shop/lb")
	b.Search("shop/")
	b.WaitRows("search by namespace", "shop/cart", "shop/lb")
	if got := b.Text("#svc-count"); got != "2 of 6 services" {
		t.Errorf("count while filtered = %q", got)
	}
	b.Search("nothing-like-this")
	b.WaitRows("search without match")
	b.Search("")
	b.WaitRows("cleared search", want...)
	b.Click("#problems")
	b.WaitRows("problems only", "default/empty", "legacy/broken")
	b.Screenshot(artifacts, "page-problems.png")
	b.Click("#problems")
	b.WaitRows("all again", want...)

	// The page follows the gateway in place: a Service written now shows up
	// without a reload, and the one without endpoints gains them.
	late := gatewaytest.Service("zeta", "late", "ClusterIP", []string{"198.19.0.20"}, gatewaytest.Port{Name: "http", Port: 80})
	emptySlice := gatewaytest.Slice("default", "empty-1", "empty", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.18"})
	// As the EndpointSlice controller stamps it: the programming latency
	// chart measures from here.
	emptySlice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
	g.Write("late.yaml", late)
	g.Write("problems.yaml", empty, emptySlice, broken, brokenSlice)
	b.WaitRows("new Service listed", append(slices.Clone(want), "zeta/late")...)
	b.Click("#problems")
	b.WaitRows("problems after the change", "legacy/broken", "zeta/late")
	b.Click("#problems")
	b.Poll("a programming latency point", `document.querySelectorAll('#chart-latency circle').length > 0`)
	b.Screenshot(artifacts, "page-after-change.png")
	if !browsertest.Eval[bool](b, `window.__noReload === true`) {
		t.Errorf("page reloaded instead of updating in place")
	}
	if got := b.Text("#state-word"); got != "Healthy" {
		t.Errorf("state after the change = %q (%s), want Healthy", got, b.Text("#state-reason"))
	}

	if n := b.Requests(); n < 4 {
		t.Errorf("saw %d requests; the network listener is not working", n)
	}
	b.Check()
}
