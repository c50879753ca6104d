package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// TestLongNamesRefusedByName: a Service whose names are longer than the
// API allows (together long enough to give a chain name over the kernel's
// limit) is refused by name, and every other Service is programmed at
// start and keeps following its changes.
func TestLongNamesRefusedByName(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	g := gatewaytest.New(t, topo)

	ns, name, port := strings.Repeat("n", 90), strings.Repeat("s", 90), strings.Repeat("p", 70)
	long := gatewaytest.Service(ns, name, "ClusterIP", []string{"198.19.0.30"}, gatewaytest.Port{Name: port, Port: 80})
	g.Write("long.yaml", long, gatewaytest.Slice(ns, "long-1", name, port, "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	web := gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80})
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080,
		gatewaytest.Endpoint{Addr: "198.18.2.10"}, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	g.Start() // ready: the first full sync went through

	wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.10:80"), 30), "198.18.2.10:8080", "198.18.2.11:8080")
	if _, err := topo.Client.Dial("tcp", ap("198.19.0.30:80"), lab.DialOpts{Timeout: 300 * time.Millisecond}); err == nil {
		t.Error("the Service with over-long names answers")
	}
	// A removed endpoint stops receiving traffic while the bad Service
	// is still there.
	g.Write("web.yaml", web, gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"}))
	if err := lab.EventuallyWithin(5*time.Second, func() error {
		seen := gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.10:80"), 10)
		if len(seen) != 1 || seen["198.18.2.11:8080"] == 0 {
			return fmt.Errorf("answers from %v", seen)
		}
		return nil
	}); err != nil {
		t.Fatalf("a change to another Service did not apply next to the bad one: %v", err)
	}
	logs := g.Logs()
	for _, want := range []string{"metadata.namespace: Invalid value", ns, "must be no more than 63 characters"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not name %s:\n%s", want, logs)
		}
	}
	if code, body, err := g.Get("/api/v1/services"); err != nil || code != 200 || !strings.Contains(body, "metadata.namespace: Invalid value") {
		t.Errorf("the status API does not tell why the Service is refused: %d %v\n%s", code, err, body)
	}
}
