package e2e_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/model"
)

// BenchmarkProxyProtocol measures what the PROXY protocol proxy costs
// against the kernel path, through the binary in a lab: new connections per
// second (8 parallel clients: connect, send a line, half-close, read the
// answer, close) and a bulk copy of 256 MiB, to a proxied and to an
// unannotated LoadBalancer IP, each with its own client addresses and its
// own backend, so that one path's TIME_WAIT sockets never meet the other's.
//
//	go test -run '^$' -bench ProxyProtocol -benchtime 5s ./e2e
func BenchmarkProxyProtocol(b *testing.B) {
	topo := labtest.Gateway(b)
	g := gatewaytest.New(b, topo)
	for _, a := range []netip.AddrPort{ap("198.18.2.20:8080"), ap("198.18.2.21:8080")} {
		serveSink(b, topo.Backend, a)
	}
	proxied := gatewaytest.Service("default", "bench-pp", "LoadBalancer", []string{"198.19.0.201"}, gatewaytest.Port{Name: "tcp", Port: 80})
	proxied.Annotations = map[string]string{model.AnnotationProxyProtocol: "v2"}
	proxied.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.201"}}
	kernel := gatewaytest.Service("default", "bench-kernel", "LoadBalancer", []string{"198.19.0.202"}, gatewaytest.Port{Name: "tcp", Port: 80})
	kernel.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.202"}}
	g.Write("bench.yaml",
		proxied, gatewaytest.Slice("default", "bench-pp-1", "bench-pp", "tcp", "", 8080, ep("198.18.2.20", "")),
		kernel, gatewaytest.Slice("default", "bench-kernel-1", "bench-kernel", "tcp", "", 8080, ep("198.18.2.21", "")))
	g.Start()
	paths := []struct {
		name    string
		dst     netip.AddrPort
		clients []netip.Addr
	}{
		{"kernel", ap("198.19.2.202:80"), topo.ClientIPv4[0:4]},
		{"proxy", ap("198.19.2.201:80"), topo.ClientIPv4[4:8]},
	}
	for _, p := range paths {
		if err := lab.EventuallyWithin(15*time.Second, func() error { return exchange(topo.Client, p.clients[0], p.dst, 2) }); err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
	}
	for _, p := range paths {
		b.Run("connections/"+p.name, func(b *testing.B) {
			var next atomic.Int64
			var failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := range 8 {
				wg.Go(func() {
					src := p.clients[w%len(p.clients)]
					for next.Add(1) <= int64(b.N) {
						if exchange(topo.Client, src, p.dst, 2) != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conn/s")
			b.ReportMetric(float64(failed.Load()), "failed")
		})
	}
	for _, p := range paths {
		b.Run("bulk256MiB/"+p.name, func(b *testing.B) {
			b.SetBytes(256 << 20)
			for b.Loop() {
				if err := exchange(topo.Client, p.clients[0], p.dst, 256<<20); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// exchange connects from src to dst, sends n bytes, half-closes and reads
// the backend's answer to the end.
func exchange(client *lab.Host, src netip.Addr, dst netip.AddrPort, n int64) error {
	var c net.Conn
	err := client.Do(func() error {
		d := net.Dialer{Timeout: time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		var err error
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.CopyN(c, zeros{}, n); err != nil {
		return err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	got, err := io.ReadAll(c)
	if err == nil && len(got) == 0 {
		err = errors.New("no answer")
	}
	return err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// serveSink starts a backend that skips a PROXY protocol header if there is
// one, discards the data until the client's half-close and answers "ok".
func serveSink(b *testing.B, h *lab.Host, addr netip.AddrPort) {
	serveEach(b, h, addr, func(c net.Conn) {
		r := bufio.NewReaderSize(c, 64<<10)
		if _, err := proxyproto.Read(r); err != nil && !errors.Is(err, proxyproto.ErrNoProxyProtocol) {
			return
		}
		_, _ = io.Copy(io.Discard, r)
		_, _ = io.WriteString(c, "ok\n")
	})
}
