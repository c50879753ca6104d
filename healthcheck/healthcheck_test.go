package healthcheck_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftgate/nftgate/appliance/httpserver"
	"github.com/nftgate/nftgate/appliance/httpserver/httpservertest"
	"github.com/nftgate/nftgate/healthcheck"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lockedbuf"
	"github.com/nftgate/nftgate/model"
)

func svc(ns, name string, port uint16, eps ...model.Endpoint) *model.Service {
	return &model.Service{
		Key: model.NewServiceKey(ns, name), Type: model.TypeLoadBalancer, ExternalLocal: true, HealthCheckNodePort: port,
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps},
			{Name: "https", Protocol: model.TCP, Port: 443, Endpoints: eps},
		},
	}
}

func ep(a, node string, ready bool) model.Endpoint {
	return model.Endpoint{Port: 8080, Place: model.On(node), Ready: ready, Serving: true, Terminating: !ready}.WithAddr(netip.MustParseAddr(a))
}

func TestWanted(t *testing.T) {
	for _, tc := range []struct {
		name           string
		svc            *model.Service
		port           uint16
		local4, local6 int
	}{
		{"nil", nil, 0, 0, 0},
		{"local ready endpoints counted once per address over all ports",
			svc("a", "b", 31000, ep("10.0.0.1", "gw", true), ep("10.0.0.2", "gw", true), ep("10.0.0.3", "other", true)), 31000, 2, 0},
		{"families apart",
			svc("a", "b", 31000, ep("10.0.0.1", "gw", true), ep("fd00::1", "gw", true), ep("fd00::2", "gw", true)), 31000, 1, 2},
		{"terminating local endpoints do not count",
			svc("a", "b", 31000, ep("10.0.0.1", "gw", false), ep("10.0.0.3", "other", true)), 31000, 0, 0},
		{"no port", svc("a", "b", 0, ep("10.0.0.1", "gw", true)), 0, 0, 0},
		{"policy Cluster has none", func() *model.Service {
			s := svc("a", "b", 31000, ep("10.0.0.1", "gw", true))
			s.ExternalLocal = false
			return s
		}(), 0, 0, 0},
		{"only LoadBalancer Services have one", func() *model.Service {
			s := svc("a", "b", 31000, ep("10.0.0.1", "gw", true))
			s.Type = model.TypeNodePort
			return s
		}(), 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, n4, n6 := healthcheck.Wanted(tc.svc, "gw")
			if port != tc.port || n4 != tc.local4 || n6 != tc.local6 {
				t.Errorf("got port %d, %d+%d endpoints; want %d, %d+%d", port, n4, n6, tc.port, tc.local4, tc.local6)
			}
		})
	}
	if _, n, _ := healthcheck.Wanted(svc("a", "b", 31000, ep("10.0.0.1", "", true)), ""); n != 0 {
		t.Errorf("a gateway without a node name has no local endpoints, got %d", n)
	}
}

// The body kube-proxy writes (pkg/proxy/healthcheck, dedented template).
func TestBody(t *testing.T) {
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"cart\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	if got := healthcheck.Body(model.NewServiceKey("shop", "cart"), 2, true); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// freePort finds a loopback port nobody listens on.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func get(port uint16) (int, string, http.Header, error) {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

func wantAnswer(t *testing.T, port uint16, code, endpoints int) {
	t.Helper()
	err := lab.EventuallyWithin(5*time.Second, func() error {
		got, body, h, err := get(port)
		if err != nil {
			return err
		}
		if got != code || h.Get("X-Load-Balancing-Endpoint-Weight") != fmt.Sprint(endpoints) ||
			!strings.Contains(body, fmt.Sprintf(`"localEndpoints": %d,`, endpoints)) {
			return fmt.Errorf("got %d, weight %q, body %s", got, h.Get("X-Load-Balancing-Endpoint-Weight"), body)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("port %d: want %d with %d local endpoints: %v", port, code, endpoints, err)
	}
}

// TestServer runs the servers on loopback: answers follow the endpoints,
// servers close with their Service, and a busy port is retried without
// holding up Update.
func TestServer(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	var logs lockedbuf.Buffer
	s := &healthcheck.Server{
		NodeName: "gw", Healthy: healthy.Load, RetryInterval: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&logs, nil)),
		// Loopback only: the test must not listen on the machine's other
		// addresses.
		Listen: func(network, address string) (net.Listener, error) {
			_, port, _ := net.SplitHostPort(address)
			return net.Listen(network, "127.0.0.1:"+port)
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	p1, p2 := freePort(t), freePort(t)
	key := model.NewServiceKey("shop", "cart")
	s.Update(map[model.ServiceKey]*model.Service{key: svc("shop", "cart", p1, ep("10.0.0.1", "gw", true), ep("10.0.0.2", "other", true))})
	wantAnswer(t, p1, 200, 1)
	_, body, _, _ := get(p1)
	if want := healthcheck.Body(key, 1, true); body != want {
		t.Errorf("body %q, want %q", body, want)
	}

	healthy.Store(false)
	wantAnswer(t, p1, 503, 1)
	healthy.Store(true)

	s.Update(map[model.ServiceKey]*model.Service{key: svc("shop", "cart", p1, ep("10.0.0.2", "other", true))})
	wantAnswer(t, p1, 503, 0)

	// A busy port: Update returns at once, the failure is logged, and the
	// server opens once the port is free.
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p2))
	if err != nil {
		t.Fatal(err)
	}
	other := model.NewServiceKey("shop", "other")
	start := time.Now()
	s.Update(map[model.ServiceKey]*model.Service{other: svc("shop", "other", p2, ep("10.0.0.3", "gw", true))})
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Update took %s", d)
	}
	if err := lab.EventuallyWithin(5*time.Second, func() error {
		if !strings.Contains(logs.String(), "cannot be opened") {
			return fmt.Errorf("no log line yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	busy.Close()
	wantAnswer(t, p2, 200, 1)

	// The Service goes away: its port closes.
	s.Update(map[model.ServiceKey]*model.Service{key: nil})
	if err := lab.EventuallyWithin(5*time.Second, func() error {
		if _, _, _, err := get(p1); err == nil {
			return fmt.Errorf("port %d still answers", p1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, p2, 200, 1)

	// A new port for a Service moves its server.
	p3 := freePort(t)
	s.Update(map[model.ServiceKey]*model.Service{other: svc("shop", "other", p3, ep("10.0.0.3", "gw", true))})
	wantAnswer(t, p3, 200, 1)
	if _, _, _, err := get(p2); err == nil {
		t.Errorf("old port %d still answers", p2)
	}
}

// TestServerLimits: a health check port closes idle keep-alive connections
// and cuts off a client that never finishes its request header, so that
// clients cannot hold the gateway's descriptors.
func TestServerLimits(t *testing.T) {
	s := &healthcheck.Server{
		NodeName: "gw", Log: slog.New(slog.DiscardHandler),
		Limits: httpserver.Limits{ReadHeaderTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond},
		Listen: func(network, address string) (net.Listener, error) {
			_, port, _ := net.SplitHostPort(address)
			return net.Listen(network, "127.0.0.1:"+port)
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	p := freePort(t)
	s.Update(map[model.ServiceKey]*model.Service{model.NewServiceKey("shop", "cart"): svc("shop", "cart", p, ep("10.0.0.1", "gw", true))})
	wantAnswer(t, p, 200, 1)
	addr := fmt.Sprintf("127.0.0.1:%d", p)
	if err := httpservertest.IdleIsClosed(addr, "/"); err != nil {
		t.Error("idle connection:", err)
	}
	if err := httpservertest.SlowHeaderIsCut(addr, 20*time.Millisecond); err != nil {
		t.Error("slow header:", err)
	}
	if err := httpservertest.LargeHeaderIsRefused(addr, httpserver.Default.MaxHeaderBytes); err != nil {
		t.Error(err)
	}
}
