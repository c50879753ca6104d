package e2e_test

// Stale conntrack cleanup end to end: UDP clients that keep one source port,
// so that every datagram belongs to one conntrack entry, follow endpoint
// changes at once; TCP connections are left alone.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// conntrackMetric reads one unlabelled sample from the gateway's /metrics.
func conntrackMetric(t *testing.T, g *gatewaytest.Gateway, name string) float64 {
	t.Helper()
	code, body, err := g.Get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", name, line, err)
			}
			return f
		}
	}
	t.Fatalf("metric %s missing from /metrics", name)
	return 0
}

const (
	metricDeleted  = "nftgate_conntrack_reconciler_deleted_entries_total"
	metricCleanups = "nftgate_conntrack_reconciler_sync_duration_seconds_count"
	metricErrors   = "nftgate_conntrack_reconciler_errors_total"
)

// waitDeleted waits until the gateway reports at least want more deleted
// flows than it did at from.
func waitDeleted(t *testing.T, g *gatewaytest.Gateway, from, want float64) {
	t.Helper()
	err := lab.EventuallyWithin(5*time.Second, func() error {
		if got := conntrackMetric(t, g, metricDeleted) - from; got < want {
			return fmt.Errorf("%v flows deleted, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("stale flows were not deleted: %v", err)
	}
}

// udpFlow is one client flow: a fixed source address and port towards one
// service destination.
type udpFlow struct {
	name     string
	src, dst netip.AddrPort
}

func (f udpFlow) send(client *lab.Host) (lab.Reply, error) {
	return client.Dial("udp", f.dst, lab.DialOpts{Source: f.src, Timeout: 500 * time.Millisecond})
}

// TestConntrackStaleUDPFlows keeps UDP flows to a dual-stack Service's
// ClusterIPs and NodePort, each from one fixed source port, while its only
// endpoint is replaced, the Service is scaled to zero, and back up. Without
// the cleanup each flow would stay on its old endpoint (still answering
// here) for as long as the client keeps sending.
func TestConntrackStaleUDPFlows(t *testing.T) {
	topo := labtest.Gateway(t)
	backends := []struct{ v4, v6 string }{
		{"198.18.2.10", "fd42:2::10"}, {"198.18.2.11", "fd42:2::11"}, {"198.18.2.12", "fd42:2::12"},
	}
	for _, b := range backends {
		gatewaytest.Serve(t, topo.Backend, "udp", ap(b.v4+":5353"), netip.AddrPortFrom(netip.MustParseAddr(b.v6), 5353))
	}
	g := gatewaytest.New(t, topo)
	svc := gatewaytest.Service("dns", "resolver", "NodePort", []string{"198.19.0.53", "fd42:ff::53"},
		gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053})
	write := func(i int) {
		var v4, v6 []gatewaytest.Endpoint
		if i >= 0 {
			v4 = []gatewaytest.Endpoint{{Addr: backends[i].v4}}
			v6 = []gatewaytest.Endpoint{{Addr: backends[i].v6}}
		}
		s4 := gatewaytest.Slice("dns", "resolver-v4", "resolver", "dns", corev1.ProtocolUDP, 5353, v4...)
		s6 := gatewaytest.Slice("dns", "resolver-v6", "resolver", "dns", corev1.ProtocolUDP, 5353, v6...)
		s6.AddressType = "IPv6"
		g.Write("resolver.yaml", svc, s4, s6)
	}
	write(0)
	g.Start()

	// Each flow from its own client address: the kernel limits ICMP
	// errors per peer, and the scale-to-zero step expects rejects.
	flows := []udpFlow{
		{"ClusterIP v4", netip.AddrPortFrom(topo.ClientIPv4[0], 40053), ap("198.19.0.53:53")},
		{"ClusterIP v6", netip.AddrPortFrom(topo.ClientIPv6[0], 40053), ap("[fd42:ff::53]:53")},
		{"NodePort v4", netip.AddrPortFrom(topo.ClientIPv4[1], 40053), netip.AddrPortFrom(topo.GatewayClientIPv4, 30053)},
		{"NodePort v6", netip.AddrPortFrom(topo.ClientIPv6[1], 40053), netip.AddrPortFrom(topo.GatewayClientIPv6, 30053)},
	}
	// wantBackend checks that the next datagram of every flow reaches
	// backend i.
	wantBackend := func(t *testing.T, i int) {
		t.Helper()
		for _, f := range flows {
			want := backends[i].v4 + ":5353"
			if f.dst.Addr().Is6() {
				want = netip.AddrPortFrom(netip.MustParseAddr(backends[i].v6), 5353).String()
			}
			r, err := f.send(topo.Client)
			if err != nil {
				t.Errorf("%s: %v", f.name, err)
				continue
			}
			if r.Backend != want {
				t.Errorf("%s: answered by %s, want %s", f.name, r.Backend, want)
			}
		}
	}
	wantBackend(t, 0)

	t.Run("only endpoint replaced", func(t *testing.T) {
		before := conntrackMetric(t, g, metricDeleted)
		write(1)
		// One entry per flow goes, and nothing else does.
		waitDeleted(t, g, before, float64(len(flows)))
		wantBackend(t, 1)
		if got := conntrackMetric(t, g, metricDeleted) - before; got != float64(len(flows)) {
			t.Errorf("%v flows deleted, want %d", got, len(flows))
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("scaled to zero", func(t *testing.T) {
		before := conntrackMetric(t, g, metricDeleted)
		write(-1)
		waitDeleted(t, g, before, float64(len(flows)))
		for _, f := range flows {
			start := time.Now()
			r, err := f.send(topo.Client)
			if !lab.IsRefused(err) {
				t.Errorf("%s: got %+v, %v; want a reject, the old flow gone", f.name, r, err)
			} else if d := time.Since(start); d > 400*time.Millisecond {
				t.Errorf("%s: reject took %s", f.name, d)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("back up", func(t *testing.T) {
		write(2)
		// Rejected datagrams leave no entry: the first datagram after the
		// sync reaches the new endpoint.
		err := lab.EventuallyWithin(5*time.Second, func() error {
			for _, f := range flows {
				if _, err := f.send(topo.Client); err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		wantBackend(t, 2)
	})

	if n := conntrackMetric(t, g, metricErrors); n != 0 {
		t.Errorf("%s = %v, want 0", metricErrors, n)
	}
	if n := conntrackMetric(t, g, metricCleanups); n < 2 {
		t.Errorf("%s = %v, want a cleanup per change", metricCleanups, n)
	}
}

// TestConntrackLeavesTCPAlone opens a TCP connection through a Service, then
// replaces the Service's endpoints, UDP and TCP alike, which makes the
// cleaner delete the UDP flow. The established TCP connection still reaches
// its original endpoint: TCP flows are never deleted (a deleted entry would
// send the connection's next segment to the new endpoint, which resets it).
func TestConntrackLeavesTCPAlone(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("198.18.2.11:8080"))
	gatewaytest.Serve(t, topo.Backend, "udp", ap("198.18.2.10:5353"), ap("198.18.2.11:5353"))
	g := gatewaytest.New(t, topo)
	svc := gatewaytest.Service("shop", "web", "ClusterIP", []string{"198.19.0.80"},
		gatewaytest.Port{Name: "http", Port: 80}, gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
	write := func(addr string) {
		g.Write("web.yaml", svc,
			gatewaytest.Slice("shop", "web-http", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: addr}),
			gatewaytest.Slice("shop", "web-dns", "web", "dns", corev1.ProtocolUDP, 5353, gatewaytest.Endpoint{Addr: addr}))
	}
	write("198.18.2.10")
	g.Start()

	udp := udpFlow{"ClusterIP udp", netip.AddrPortFrom(topo.ClientIPv4[0], 40053), ap("198.19.0.80:53")}
	if r, err := udp.send(topo.Client); err != nil || r.Backend != "198.18.2.10:5353" {
		t.Fatalf("udp before the change: %+v %v", r, err)
	}
	// The echo server answers the first line it reads and waits for it up
	// to 10 s: connect now, talk after the change.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := topo.Client.DialContext(ctx, "tcp", "198.19.0.80:80")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	before := conntrackMetric(t, g, metricDeleted)
	write("198.18.2.11")
	waitDeleted(t, g, before, 1)
	if r, err := udp.send(topo.Client); err != nil || r.Backend != "198.18.2.11:5353" {
		t.Fatalf("udp after the change: %+v %v, want the new endpoint", r, err)
	}
	if r, err := topo.Client.Dial("tcp", ap("198.19.0.80:80"), lab.DialOpts{}); err != nil || r.Backend != "198.18.2.11:8080" {
		t.Fatalf("new tcp connection after the change: %+v %v, want the new endpoint", r, err)
	}

	if err := conn.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "still there?\n"); err != nil {
		t.Fatalf("write on the established connection: %v", err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("the established TCP connection broke after the change: %v", err)
	}
	if backend, _, _ := strings.Cut(line, " "); backend != "198.18.2.10:8080" {
		t.Fatalf("the established connection answered from %q, want its original endpoint 198.18.2.10:8080", line)
	}
}

// TestConntrackNewServiceTakesOverUntranslatedFlows has clients send to a
// service address and a node port before any Service has them: the gateway
// forwards the first flow untranslated (into the lab's sink) and answers
// the second itself with port unreachable, and conntrack remembers both
// flows as untranslated. Once the Service exists, each flow's next datagram
// must be translated to the endpoint, not follow the old entry for as long
// as the client keeps sending.
func TestConntrackNewServiceTakesOverUntranslatedFlows(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "udp", ap("198.18.2.10:5353"))
	g := gatewaytest.New(t, topo)
	g.Write("other.yaml", gatewaytest.Service("dns", "other", "ClusterIP", []string{"198.19.0.99"},
		gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}))
	g.Start()

	vip := udpFlow{"ClusterIP", netip.AddrPortFrom(topo.ClientIPv4[0], 40053), ap("198.19.0.54:53")}
	if r, err := vip.send(topo.Client); !lab.IsTimeout(err) {
		t.Fatalf("%s before the Service exists: got %+v %v, want no answer", vip.name, r, err)
	}
	nodePort := udpFlow{"NodePort", netip.AddrPortFrom(topo.ClientIPv4[1], 40053), netip.AddrPortFrom(topo.GatewayClientIPv4, 30054)}
	if r, err := nodePort.send(topo.Client); !lab.IsRefused(err) {
		t.Fatalf("%s before the Service exists: got %+v %v, want port unreachable", nodePort.name, r, err)
	}
	before := conntrackMetric(t, g, metricDeleted)
	g.Write("resolver.yaml", gatewaytest.Service("dns", "resolver", "NodePort", []string{"198.19.0.54"},
		gatewaytest.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30054}),
		gatewaytest.Slice("dns", "resolver-1", "resolver", "dns", corev1.ProtocolUDP, 5353, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	waitDeleted(t, g, before, 2)
	for _, f := range []udpFlow{vip, nodePort} {
		if r, err := f.send(topo.Client); err != nil || r.Backend != "198.18.2.10:5353" {
			t.Errorf("%s after the Service appeared: got %+v %v, want an answer from 198.18.2.10:5353", f.name, r, err)
		}
	}
}
