package e2e_test

// Tests of nftgate as a watcher of a real kube-apiserver: slices, bursts,
// outages, restarts and drift.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/internal/testing/repo"
)

// metric returns the sum of a Prometheus series' samples on /metrics.
func metric(t *testing.T, g *gatewaytest.Gateway, name string) float64 {
	t.Helper()
	code, body, err := g.Get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.e+-]+)$`)
	total := 0.0
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		total += v
	}
	return total
}

// TestSlicesOfOneService spreads a Service over three EndpointSlices, one
// of them with another number for the named port, then deletes one slice.
func TestSlicesOfOneService(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"), ap("198.18.2.12:9090"))
	g := gatewaytest.NewWithAPI(t, topo)
	svc := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("web.yaml", svc,
		gatewaytest.Slice("default", "web-a", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}),
		gatewaytest.Slice("default", "web-b", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}),
		gatewaytest.Slice("default", "web-c", "web", "http", "", 9090, gatewaytest.Endpoint{Addr: "198.18.2.12"}))
	g.Start()
	wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.10:80"), 40),
		"198.18.2.10:8080", "198.18.2.11:8080", "198.18.2.12:9090")

	g.Write("web.yaml", svc,
		gatewaytest.Slice("default", "web-a", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}),
		gatewaytest.Slice("default", "web-c", "web", "http", "", 9090, gatewaytest.Endpoint{Addr: "198.18.2.12"}))
	err := lab.EventuallyWithin(10*time.Second, func() error {
		seen := gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.10:80"), 30)
		if len(seen) != 2 || seen["198.18.2.10:8080"] == 0 || seen["198.18.2.12:9090"] == 0 {
			return fmt.Errorf("answers from %v", seen)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("deleting one slice: %v", err)
	}
}

// TestBurstIsCoalesced creates 1,000 Services at once: all are served, in
// far fewer syncs than Services.
func TestBurstIsCoalesced(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g := gatewaytest.NewWithAPI(t, topo)
	g.Start()
	syncsBefore := metric(t, g, "nftgate_sync_proxy_rules_duration_seconds_count")

	const n = 1000
	client := g.Client()
	ctx := context.Background()
	burstStart := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			name := fmt.Sprintf("burst-%d", i)
			ip := fmt.Sprintf("198.19.%d.%d", 10+i/250, 1+i%250)
			svc := gatewaytest.Service("default", name, "ClusterIP", []string{ip}, gatewaytest.Port{Name: "http", Port: 80})
			svc.CreationTimestamp = metav1.Time{}
			if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			sl := gatewaytest.Slice("default", name, name, "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"})
			if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	burst := time.Since(burstStart)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The last Service answers once everything is programmed.
	err := lab.EventuallyWithin(30*time.Second, func() error {
		for _, dst := range []string{"198.19.10.1:80", "198.19.13.250:80"} {
			if _, err := topo.Client.Dial("tcp", ap(dst), lab.DialOpts{Timeout: 300 * time.Millisecond}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("burst not served: %v", err)
	}
	for i := 0; i < n; i += 97 {
		dst := netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("198.19.%d.%d", 10+i/250, 1+i%250)), 80)
		if _, err := topo.Client.Dial("tcp", dst, lab.DialOpts{}); err != nil {
			t.Errorf("service %d (%s): %v", i, dst, err)
		}
	}
	syncs := metric(t, g, "nftgate_sync_proxy_rules_duration_seconds_count") - syncsBefore
	t.Logf("%d Services and %d EndpointSlices arrived over %v in %.0f syncs", n, n, burst.Round(time.Millisecond), syncs)
	// Coalesced: at most one sync per min_sync_interval (50 ms by default)
	// while the burst lasts, and a few after it; without coalescing there
	// would be one per object. How long the burst lasts depends on how busy
	// the machine is, so the bound follows it.
	if limit := float64(burst/(50*time.Millisecond)) + 20; syncs > limit || syncs > n/2 {
		t.Errorf("%.0f syncs for %d Services arriving over %v (at most %.0f): changes were not coalesced", syncs, n, burst, limit)
	}

	// A restart's first sync sees every Service, and so finds nothing to
	// change in the kernel: a sync of a partial view would remove the
	// rules of the Services it had not seen yet. That holds once the
	// first process has programmed every Service with its endpoint: the
	// dials above reach a sample, and under load the last EndpointSlices
	// can still be on their way (a CI run stopped it with 24 changes left).
	err = lab.EventuallyWithin(30*time.Second, func() error {
		code, body, err := g.Get("/api/v1/services?q=burst-")
		if err != nil || code != 200 {
			return fmt.Errorf("services: %d %v", code, err)
		}
		var list appliance.ServiceListJSON
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			return err
		}
		served := 0
		for _, s := range list.Services {
			if len(s.Endpoints) > 0 {
				served++
			}
		}
		if served < n {
			return fmt.Errorf("%d of the %d Services programmed with their endpoint", served, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	g.Stop()
	g.Start()
	fulls := regexp.MustCompile(`msg="full sync" services=(\d+) changes=(\d+)`).FindAllStringSubmatch(g.Logs(), -1)
	if len(fulls) < 2 {
		t.Fatalf("no full sync after the restart in the logs:\n%s", g.Logs())
	}
	restart := fulls[len(fulls)-1]
	if services, _ := strconv.Atoi(restart[1]); services < n || restart[2] != "0" {
		t.Errorf("first sync after the restart: %s services, %s changes; want all %d and none", restart[1], restart[2], n)
	}
}

// TestAPIOutage stops kube-apiserver for 20 s while a client keeps
// connecting, then checks that a change made after it is back reaches the
// kernel, and that /healthz turned unhealthy only once the outage outlasted
// healthz_max_sync_age, and healthy again after.
func TestAPIOutage(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	config := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(config, []byte("healthz_max_sync_age = \"10s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.NewWithAPI(t, topo, "--reconcile-interval", "2s", "--config", config)
	svc := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("web.yaml", svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()

	stopped := time.Now() // the server may stop answering before StopAPIServer returns
	if err := g.API.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	n := 0
	unhealthy := ""
	// Paced at 50 connections a second: this test is about the API outage.
	// Unpaced, one client opening several hundred connections a second
	// through masquerade meets the data plane's own limit (new SYNs landing
	// on the backend's TIME_WAIT sockets for the gateway's address stall a
	// second each), and under load one connection in thousands timed out.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for time.Now().Before(deadline) {
		<-pace.C
		r, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{})
		if err != nil {
			t.Fatalf("connection %d during the API outage: %v", n, err)
		}
		if r.Backend != "198.18.2.10:8080" {
			t.Fatalf("answered by %s", r.Backend)
		}
		n++
		code, body, err := g.Get("/healthz")
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case code == 200:
		case time.Since(stopped) < 10*time.Second:
			t.Fatalf("/healthz %d after %s of outage, within healthz_max_sync_age: %s", code, time.Since(stopped), body)
		case unhealthy == "":
			unhealthy = body
		}
	}
	t.Logf("%d connections served during the outage", n)
	if !strings.Contains(unhealthy, "Kubernetes API") {
		t.Errorf("/healthz never said the API was lost during a 20 s outage (max age 10 s): %q", unhealthy)
	}
	if err := g.API.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.Write("web.yaml", svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	// client-go's informers retry with a backoff that reaches 30 s during
	// a long outage: the change applies when their next attempt succeeds.
	if err := awaitBackend(t, topo.Client, ap("198.19.0.10:80"), "198.18.2.11:8080", 90*time.Second); err != nil {
		t.Fatalf("a change after the API came back did not apply: %v", err)
	}
	if err := lab.EventuallyWithin(15*time.Second, func() error {
		code, body, err := g.Get("/healthz")
		if err != nil || code != 200 {
			return fmt.Errorf("/healthz %d %q %v", code, body, err)
		}
		return nil
	}); err != nil {
		t.Errorf("not healthy again after the API came back: %v", err)
	}
}

// TestRestartWhileAPIDown restarts nftgate while kube-apiserver is down:
// the rules already in place keep serving, nothing is changed until the
// API's complete view is known, and it syncs when the API returns.
func TestRestartWhileAPIDown(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	g := gatewaytest.NewWithAPI(t, topo)
	svc := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("web.yaml", svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()

	g.Stop()
	if err := g.API.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	g.Launch()
	var served atomic.Int64
	err := lab.EventuallyWithin(10*time.Second, func() error {
		if _, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{}); err != nil {
			t.Fatalf("the rules stopped serving while nftgate restarted without its API: %v", err)
		}
		if served.Add(1) < 20 {
			return fmt.Errorf("%d connections", served.Load())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _ := g.Get("/readyz"); code == 200 {
		t.Fatal("ready without ever having seen the API")
	}
	if err := g.API.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.WaitReady()
	g.Write("web.yaml", svc, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	if err := awaitBackend(t, topo.Client, ap("198.19.0.10:80"), "198.18.2.11:8080", 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestDriftIsRepaired deletes nftgate's table by hand: traffic comes back
// within one reconcile period, and the repair is counted.
func TestDriftIsRepaired(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g := gatewaytest.NewWithAPI(t, topo, "--reconcile-interval", "1s")
	g.Write("web.yaml", gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()
	before := metric(t, g, "nftgate_drift_repairs_total")
	// The Service's shard table carries its DNAT: without it the
	// ClusterIP does not answer until the repair.
	g.Nft("delete", "table", "ip", "nftgate")
	g.Nft("delete", "table", "ip", serviceTable(t, g, "default", "web"))
	start := time.Now()
	err := lab.EventuallyWithin(5*time.Second, func() error {
		_, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{Timeout: 200 * time.Millisecond})
		return err
	})
	if err != nil {
		t.Fatalf("traffic not restored: %v", err)
	}
	t.Logf("restored %s after the table was deleted", time.Since(start).Round(time.Millisecond))
	if after := metric(t, g, "nftgate_drift_repairs_total"); after <= before {
		t.Errorf("drift repairs went from %v to %v", before, after)
	}
	if !strings.Contains(g.Logs(), "drift") {
		t.Errorf("no log line about the repair:\n%s", g.Logs())
	}
	var status struct {
		Sync struct {
			KernelMatches bool `json:"kernelMatches"`
		} `json:"sync"`
	}
	_, body, _ := g.Get("/api/v1/status")
	if err := json.Unmarshal([]byte(body), &status); err != nil || !status.Sync.KernelMatches {
		t.Errorf("status after repair: %v %s", err, body)
	}
}

// TestLeastPrivilege runs nftgate with the ServiceAccount of
// deploy/rbac.yaml: its rights are enough to serve, and no more.
func TestLeastPrivilege(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g := gatewaytest.NewWithAPI(t, topo)
	ctx := context.Background()
	sa := leastPrivilege(t, g)
	g.Write("web.yaml", gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()
	if _, err := topo.Client.Dial("tcp", ap("198.19.0.10:80"), lab.DialOpts{}); err != nil {
		t.Fatalf("not served with the least-privilege account: %v", err)
	}
	saClient, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := saClient.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the gateway's account can list Secrets: %v", err)
	}
	if _, err := saClient.CoreV1().Services("default").Create(ctx, gatewaytest.Service("default", "x", "ClusterIP", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the gateway's account can create Services: %v", err)
	}
}

// leastPrivilege makes g run with the ServiceAccount of deploy/rbac.yaml,
// whose client configuration it returns.
func leastPrivilege(t *testing.T, g *gatewaytest.Gateway) *rest.Config {
	t.Helper()
	ctx := context.Background()
	if err := applyFile(ctx, g, repo.Path(t, "deploy", "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	sa, err := g.API.ServiceAccountConfig(ctx, "nftgate", "nftgate")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "gateway.kubeconfig")
	if err := g.API.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	for i, a := range g.Args {
		if a == "--kubeconfig" {
			g.Args[i+1] = kubeconfig
		}
	}
	return sa
}

// applyFile creates the RBAC objects of a manifest file (the token Secret
// is left out: no controller here fills it in).
func applyFile(ctx context.Context, g *gatewaytest.Gateway, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	c := g.Client()
	for _, doc := range strings.Split(string(data), "\n---") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return err
		}
		switch tm.Kind {
		case "Namespace":
			var o corev1.Namespace
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				return err
			}
			_, err = c.CoreV1().Namespaces().Create(ctx, &o, metav1.CreateOptions{})
		case "ServiceAccount":
			var o corev1.ServiceAccount
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				return err
			}
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRole":
			var o rbacv1.ClusterRole
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				return err
			}
			_, err = c.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				return err
			}
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
		case "Secret":
			continue
		default:
			return fmt.Errorf("%s: unexpected kind %q", path, tm.Kind)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %s: %w", path, tm.Kind, err)
		}
	}
	return nil
}
