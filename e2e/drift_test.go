package e2e_test

// Drift under traffic: another program flushes the ruleset, deletes a
// shard table, deletes a dispatch element, while a client connects to a
// Service every 10 ms. reconcile_interval is 10 minutes, so only the
// kernel's notifications can bring the traffic back in time.

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/ruleset"
)

// probe is one connection attempt of the prober.
type probe struct {
	start time.Time
	ok    bool
}

// prober connects to dst every 10 ms from the client until stopped, and
// keeps every attempt.
type prober struct {
	mu     sync.Mutex
	probes []probe
	last   error // of the last failed attempt
	stop   chan struct{}
	done   chan struct{}
}

func startProber(client *lab.Host, dst netip.AddrPort) *prober {
	p := &prober{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			start := time.Now()
			_, err := client.Dial("tcp", dst, lab.DialOpts{Timeout: 100 * time.Millisecond})
			p.mu.Lock()
			p.probes = append(p.probes, probe{start, err == nil})
			if err != nil {
				p.last = err
			}
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *prober) close() { close(p.stop); <-p.done }

// answeredSince returns the start of the first answered attempt that
// started after t, and how many attempts since t were not answered.
func (p *prober) answeredSince(t time.Time) (time.Time, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	failed := 0
	for _, pr := range p.probes {
		if pr.start.Before(t) {
			continue
		}
		if pr.ok {
			return pr.start, failed, true
		}
		failed++
	}
	return time.Time{}, failed, false
}

func (p *prober) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// repairBound is how long traffic may take to come back: far below the
// test's reconcile_interval of 10 minutes, far above a repair's time on a
// loaded machine. The measured gap is logged.
const repairBound = 30 * time.Second

func TestDriftRepairedUnderTraffic(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	conf := filepath.Join(t.TempDir(), "nftgate.toml")
	if err := os.WriteFile(conf, []byte("reconcile_interval = \"10m\"\nhealthz_max_sync_age = \"0s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, topo, "--config", conf)
	g.Write("web.yaml",
		gatewaytest.Service("drift", "web", "ClusterIP", []string{"198.19.0.80"},
			gatewaytest.Port{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}),
		gatewaytest.Slice("drift", "web-1", "web", "http", corev1.ProtocolTCP, 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()
	dst := ap("198.19.0.80:80")
	pr := startProber(topo.Client, dst)
	defer pr.close()

	table := serviceTable(t, g, "drift", "web")
	for _, c := range []struct {
		name  string
		drift []string // nft arguments
	}{
		{"nft flush ruleset", []string{"flush", "ruleset"}},
		{"nft delete table of the Service's shard", []string{"delete", "table", "ip", table}},
		{"nft delete element of the Service", []string{"delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.80 . tcp . 80 }"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			since := time.Now()
			if err := lab.EventuallyWithin(10*time.Second, func() error {
				if _, _, ok := pr.answeredSince(since); !ok {
					return fmt.Errorf("%s not answered: %v", dst, pr.lastErr())
				}
				return nil
			}); err != nil {
				t.Fatalf("before the drift: %v", err)
			}
			before := conntrackMetric(t, g, `nftgate_drift_detected_total{cause="changed"}`)
			g.Nft(c.drift...)
			// The kernel committed the change before nft exits: attempts
			// from here on either fail or were repaired.
			at := time.Now()
			var back time.Time
			var failed int
			err := lab.EventuallyWithin(repairBound, func() error {
				var ok bool
				if back, failed, ok = pr.answeredSince(at); !ok {
					return fmt.Errorf("%s not answered since %s (%d attempts failed; %v)", dst, c.name, failed, pr.lastErr())
				}
				return nil
			})
			if err != nil {
				t.Fatalf("traffic did not come back within %v, with reconcile_interval 10m: %v", repairBound, err)
			}
			t.Logf("%s: first answered attempt %v after it (%d attempts failed meanwhile)", c.name, back.Sub(at).Round(time.Millisecond), failed)
			if got := conntrackMetric(t, g, `nftgate_drift_detected_total{cause="changed"}`); got <= before {
				t.Fatalf("drift_detected_total{cause=changed} %v, was %v: the change was not noticed", got, before)
			}
			if !strings.Contains(g.Logs(), "another program changed nftgate's tables") {
				t.Fatal("the repair was not logged")
			}
		})
	}
}
