package e2e_test

// Packets and bytes per Service port and endpoint, both ways, counted by
// the traffic sets in the forward path and read through the binary's API
// and metrics after real transfers through the gateway.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// byteSink is a TCP server on a backend address that reads what a client
// sends until the client closes its side, then writes reply bytes back and
// closes; it counts both.
type byteSink struct {
	ln                  net.Listener
	mu                  sync.Mutex
	received, sent, got int
}

func newByteSink(t *testing.T, h *lab.Host, addr netip.AddrPort, reply int) *byteSink {
	t.Helper()
	s := &byteSink{}
	if err := h.Do(func() (err error) { s.ln, err = net.Listen("tcp", addr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { s.ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, c)
			m, _ := c.Write(make([]byte, reply))
			// Counted before the close, which ends the client's
			// transfer: a test reading the counts after it finds them.
			s.mu.Lock()
			s.received, s.sent, s.got = s.received+int(n), s.sent+m, s.got+1
			s.mu.Unlock()
			c.Close()
		}
	}()
	return s
}

func (s *byteSink) counts() (received, sent int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received, s.sent
}

// transfer sends n bytes from client to dst, closes its side and reads the
// reply to its end, returning the reply's length.
func transfer(client *lab.Host, dst netip.AddrPort, n int) (int, error) {
	var c net.Conn
	if err := client.Do(func() (err error) { c, err = net.Dial("tcp", dst.String()); return err }); err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, n)); err != nil {
		return 0, err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	m, err := io.Copy(io.Discard, c)
	return int(m), err
}

func TestTrafficBytesBothWaysPerEndpoint(t *testing.T) {
	const sent, reply, transfers = 300_000, 100_000, 4
	topo := labtest.Gateway(t)
	eps := []netip.AddrPort{netip.AddrPortFrom(topo.BackendIPv4[0], 9000), netip.AddrPortFrom(topo.BackendIPv4[1], 9000)}
	sinks := map[string]*byteSink{}
	for _, a := range eps {
		sinks[a.String()] = newByteSink(t, topo.Backend, a, reply)
	}
	g := gatewaytest.New(t, topo, append([]string{"--metrics-per-service"}, gatewaytest.VIPExternalIPs...)...)
	bulk := gatewaytest.Service("default", "bulk", "ClusterIP", []string{"198.19.0.104"}, gatewaytest.Port{Name: "data", Port: 90})
	g.Write("bulk.yaml", bulk, gatewaytest.Slice("default", "bulk-1", "bulk", "data", "", 9000,
		ep(eps[0].Addr().String(), ""), ep(eps[1].Addr().String(), "")))
	g.Start()
	dst := ap("198.19.0.104:90")
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		_, err := transfer(topo.Client, dst, 1)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	before, err := trafficOf(g, "default", "bulk", "TCP", 90)
	if err != nil {
		t.Fatal(err)
	}
	beforeEP := map[string]appliance.TrafficEndpoint{}
	for _, e := range before.Endpoints {
		beforeEP[e.Endpoint] = e
	}
	rcv0, snt0 := map[string]int{}, map[string]int{}
	for k, s := range sinks {
		rcv0[k], snt0[k] = s.counts()
	}
	for range transfers {
		got, err := transfer(topo.Client, dst, sent)
		if err != nil || got != reply {
			t.Fatalf("transfer through %s: %d bytes back, %v", dst, got, err)
		}
	}
	// What each endpoint received and sent in the transfers: the kernel
	// counted at least that much under it, the right way round, and the
	// headers and acknowledgements it adds are far less than the other
	// way's payload.
	want := map[string][2]int{}
	for k, s := range sinks {
		r, w := s.counts()
		want[k] = [2]int{r - rcv0[k], w - snt0[k]}
	}
	p := eventuallyTraffic(t, g, "default", "bulk", "TCP", 90, "the transfers counted both ways", func(p appliance.TrafficPort) bool {
		in, out := p.BytesIn-before.BytesIn, p.BytesOut-before.BytesOut
		return in >= transfers*sent && out >= transfers*reply
	})
	in, out := p.BytesIn-before.BytesIn, p.BytesOut-before.BytesOut
	if in > transfers*(sent+reply) || out > transfers*(reply+sent/2) {
		t.Errorf("bytes in %d, out %d: want about %d in and %d out, each way's own", in, out, transfers*sent, transfers*reply)
	}
	if p.PacketsIn <= before.PacketsIn || p.PacketsOut <= before.PacketsOut {
		t.Errorf("packets: %+v then %+v, want more both ways", before, p)
	}
	for _, e := range p.Endpoints {
		w, ok := want[e.Endpoint]
		if !ok {
			t.Errorf("endpoint %s is none of the Service's", e.Endpoint)
			continue
		}
		b := beforeEP[e.Endpoint]
		in, out := int(e.BytesIn-b.BytesIn), int(e.BytesOut-b.BytesOut)
		t.Logf("endpoint %s: received %d, sent %d; counted in %d, out %d", e.Endpoint, w[0], w[1], in, out)
		if in < w[0] || out < w[1] || in > w[0]+w[1] || out > w[1]+w[0]/2 {
			t.Errorf("endpoint %s counted %d bytes in and %d out, want its own %d in and %d out", e.Endpoint, in, out, w[0], w[1])
		}
		delete(want, e.Endpoint)
	}
	for k, w := range want {
		if w[0] > 0 {
			t.Errorf("endpoint %s received %d bytes and has no count", k, w[0])
		}
	}
	// The gateway's totals and the per-Service series.
	code, body, err := g.Get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("metrics: %d %v", code, err)
	}
	for _, series := range []string{`nftgate_traffic_bytes_total{direction="in"} `,
		`nftgate_service_traffic_bytes_total{direction="out",namespace="default",port="90",protocol="TCP",service="bulk"} `} {
		line := grep(body, series)
		v, perr := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, series)), 64)
		if perr != nil || v < transfers*reply {
			t.Errorf("%s: %q, want at least %d", series, line, transfers*reply)
		}
	}
}

// TestTrafficServiceMadeAgainStartsAtZero: a Service deleted and made
// again with the same ClusterIP, port and endpoints (kubectl delete, then
// apply), with no reading of the counters in between, counts only its own
// bytes: the sync that deleted it destroyed its traffic elements, and the
// reading takes the port afresh.
func TestTrafficServiceMadeAgainStartsAtZero(t *testing.T) {
	const first, second = 400_000, 2_000
	topo := labtest.Gateway(t)
	backend := netip.AddrPortFrom(topo.BackendIPv4[0], 9000)
	newByteSink(t, topo.Backend, backend, 10)
	g := gatewaytest.New(t, topo, gatewaytest.VIPExternalIPs...)
	objs := []any{gatewaytest.Service("default", "again", "ClusterIP", []string{"198.19.0.105"}, gatewaytest.Port{Name: "data", Port: 91}),
		gatewaytest.Slice("default", "again-1", "again", "data", "", 9000, ep(backend.Addr().String(), ""))}
	g.Write("again.yaml", objs...)
	g.Start()
	dst := ap("198.19.0.105:91")
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		_, err := transfer(topo.Client, dst, first)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	eventuallyTraffic(t, g, "default", "again", "TCP", 91, "the first transfer counted", func(p appliance.TrafficPort) bool {
		return p.BytesIn >= first
	})

	// Deleted: wait for its address to leave the kernel's set of
	// ClusterIPs (not for a reading of the counters), then made again.
	g.Remove("again.yaml")
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		if out := g.Nft("list", "set", "ip", "nftgate", "cluster-ips"); strings.Contains(out, "198.19.0.105") {
			return fmt.Errorf("198.19.0.105 still a ClusterIP:\n%s", out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	g.Write("again.yaml", objs...)
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		_, err := transfer(topo.Client, dst, second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A reading made after the transfer (the API serves the last one at
	// once and starts the next).
	done := time.Now()
	var p appliance.TrafficPort
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		var at time.Time
		var err error
		if p, at, err = trafficRead(g, "default", "again", "TCP", 91); err == nil && at.Before(done) {
			err = fmt.Errorf("the reading served is of %s, before the transfer", at.Format(time.StampMicro))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The second transfer, its retries' and the headers: far less than
	// the first one's bytes, which belong to the deleted Service.
	if p.BytesIn < second || p.BytesIn >= first/2 {
		t.Errorf("the Service made again counts %d bytes in, want its own %d and no more than a few KB beside: it inherited the deleted one's", p.BytesIn, second)
	}
	t.Logf("made again: %d bytes in, %d out", p.BytesIn, p.BytesOut)
}
