package e2e_test

// End-to-end tests of the PROXY protocol proxy: Services annotated
// nftgate.io/proxy-protocol have their TCP connections from outside the
// cluster passed through nftgate's proxy, which tells the backend the
// client's address and port in a PROXY protocol header; every other Service
// keeps the kernel path.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/model"
)

// ppReport is what the PROXY protocol backend tells a client: the header
// it read (Version 0: none), the peer it saw, its own address, and how many
// bytes of data came before the client's end of stream.
type ppReport struct {
	Version int    `json:"version"`
	Src     string `json:"src,omitempty"`
	Dst     string `json:"dst,omitempty"`
	Peer    string `json:"peer"`
	Local   string `json:"local"`
	Bytes   int    `json:"bytes"`
}

// servePROXY starts a backend on addr in h that parses an optional PROXY
// protocol header with go-proxyproto, reads the data until the client's
// half-close, and answers with a ppReport; closed when the test ends.
func servePROXY(t *testing.T, h *lab.Host, addr netip.AddrPort) {
	serveEach(t, h, addr, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(c)
		rep := ppReport{Peer: c.RemoteAddr().String(), Local: c.LocalAddr().String()}
		hdr, err := proxyproto.Read(r)
		switch {
		case err == nil:
			rep.Version, rep.Src, rep.Dst = int(hdr.Version), hdr.SourceAddr.String(), hdr.DestinationAddr.String()
		case !errors.Is(err, proxyproto.ErrNoProxyProtocol):
			fmt.Fprintf(c, "bad header: %v\n", err)
			return
		}
		n, _ := io.Copy(io.Discard, r)
		rep.Bytes = int(n)
		_ = json.NewEncoder(c).Encode(rep)
	})
}

// serveEach listens on addr in h and hands every connection to handle in a
// goroutine of its own, which closes it after; everything is closed and
// waited for when the test ends.
func serveEach(tb testing.TB, h *lab.Host, addr netip.AddrPort, handle func(net.Conn)) {
	tb.Helper()
	ln, err := h.Listen("tcp", addr.String())
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
}

// ppDial connects from src (any port) in the client to dst, sends payload,
// half-closes, and reads the backend's report; it returns the client's own
// address too.
func ppDial(client *lab.Host, src netip.Addr, dst netip.AddrPort, payload string) (ppReport, netip.AddrPort, error) {
	var rep ppReport
	var c net.Conn
	err := client.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		var err error
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil {
		return rep, netip.AddrPort{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if _, err := io.WriteString(c, payload); err != nil {
		return rep, local, err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return rep, local, err
	}
	line, err := io.ReadAll(c)
	if err != nil {
		return rep, local, err
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, local, fmt.Errorf("backend said %q: %w", line, err)
	}
	return rep, local, nil
}

// eventuallyPP dials until check accepts the report, and returns it.
func eventuallyPP(t *testing.T, client *lab.Host, src netip.Addr, dst netip.AddrPort, check func(ppReport, netip.AddrPort) error) ppReport {
	t.Helper()
	var rep ppReport
	err := lab.EventuallyWithin(15*time.Second, func() error {
		var local netip.AddrPort
		var err error
		if rep, local, err = ppDial(client, src, dst, "hello, backend\n"); err != nil {
			return err
		}
		return check(rep, local)
	})
	if err != nil {
		t.Fatalf("%s from %s: %v (last report %+v)", dst, src, err, rep)
	}
	return rep
}

// wantHeader checks that the backend read a header of version v naming the
// client's own address and port and the destination it dialled.
func wantHeader(v int, dst netip.AddrPort) func(ppReport, netip.AddrPort) error {
	return func(r ppReport, local netip.AddrPort) error {
		if r.Version != v || r.Src != local.String() || r.Dst != dst.String() {
			return fmt.Errorf("header v%d %s -> %s, want v%d %s -> %s", r.Version, r.Src, r.Dst, v, local, dst)
		}
		if r.Bytes != len("hello, backend\n") {
			return fmt.Errorf("backend read %d bytes of data, want %d", r.Bytes, len("hello, backend\n"))
		}
		return nil
	}
}

// noHeader checks that the connection took the kernel path: no header,
// and the client masqueraded to the gateway's address on the backend side.
func noHeader(gw netip.Addr) func(ppReport, netip.AddrPort) error {
	return func(r ppReport, _ netip.AddrPort) error {
		if r.Version != 0 {
			return fmt.Errorf("header v%d %s -> %s, want none", r.Version, r.Src, r.Dst)
		}
		if peer := netip.MustParseAddrPort(r.Peer); peer.Addr() != gw {
			return fmt.Errorf("backend's peer %s, want the gateway's %s (masquerade)", peer, gw)
		}
		return nil
	}
}

func TestProxyProtocol(t *testing.T) {
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo, gatewaytest.VIPExternalIPs...)
	for _, a := range []netip.AddrPort{ap("198.18.2.10:8080"), ap("198.18.2.11:8080"), ap("198.18.2.12:8080"), ap("[fd42:2::10]:8080")} {
		servePROXY(t, topo.Backend, a)
	}
	annotated := func(svc *corev1.Service, v string) *corev1.Service {
		svc.Annotations = map[string]string{model.AnnotationProxyProtocol: v}
		return svc
	}
	v1 := gatewaytest.Service("default", "pp-v1", "LoadBalancer", []string{"198.19.0.101"}, gatewaytest.Port{Name: "http", Port: 80, NodePort: 30101})
	v1.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.101"}}
	v1Slice := gatewaytest.Slice("default", "pp-v1-1", "pp-v1", "http", "", 8080, ep("198.18.2.10", ""), ep("198.18.2.12", ""))
	v2 := gatewaytest.Service("default", "pp-v2", "LoadBalancer", []string{"fd42:ff::102"}, gatewaytest.Port{Name: "http", Port: 443})
	v2.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	v2.Spec.ExternalIPs = []string{"fd42:ff::1:102"}
	v2.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd42:ff::2:102"}}
	plain := gatewaytest.Service("default", "plain", "LoadBalancer", []string{"198.19.0.103"}, gatewaytest.Port{Name: "http", Port: 80})
	plain.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.103"}}
	g.Write("pp.yaml",
		annotated(v1, "v1"), v1Slice,
		annotated(v2, "v2"), gatewaytest.Slice("default", "pp-v2-1", "pp-v2", "http", "", 8080, ep("fd42:2::10", "")),
		plain, gatewaytest.Slice("default", "plain-1", "plain", "http", "", 8080, ep("198.18.2.11", "")))
	g.Start()
	client4, client6 := topo.ClientIPv4[1], topo.ClientIPv6[1]

	t.Run("v1 to a LoadBalancer IP and a node port", func(t *testing.T) {
		lb := ap("198.19.2.101:80")
		eventuallyPP(t, topo.Client, client4, lb, wantHeader(1, lb))
		np := netip.AddrPortFrom(topo.GatewayClientIPv4, 30101)
		eventuallyPP(t, topo.Client, client4, np, wantHeader(1, np))
	})
	t.Run("v2 over IPv6 to an externalIP and a LoadBalancer IP", func(t *testing.T) {
		for _, dst := range []netip.AddrPort{ap("[fd42:ff::1:102]:443"), ap("[fd42:ff::2:102]:443")} {
			eventuallyPP(t, topo.Client, client6, dst, wantHeader(2, dst))
		}
	})
	t.Run("unannotated Service keeps the kernel path", func(t *testing.T) {
		eventuallyPP(t, topo.Client, client4, ap("198.19.2.103:80"), noHeader(topo.GatewayBackendIPv4))
		table := serviceTable(t, g, "default", "plain")
		rules := g.Nft("list", "chain", "ip", table, chainOf(t, g, table, "198.19.2.103 . tcp . 80"))
		if strings.Contains(rules, "redirect") {
			t.Errorf("the unannotated Service's rules redirect:\n%s", rules)
		}
	})
	t.Run("the ClusterIP keeps the kernel path", func(t *testing.T) {
		eventuallyPP(t, topo.Client, client4, ap("198.19.0.101:80"), noHeader(topo.GatewayBackendIPv4))
	})
	t.Run("a removed endpoint gets no new connection", func(t *testing.T) {
		lb := ap("198.19.2.101:80")
		seen := map[string]int{}
		for range 10 {
			r := eventuallyPP(t, topo.Client, client4, lb, wantHeader(1, lb))
			seen[r.Local]++
		}
		if len(seen) != 2 {
			t.Fatalf("10 connections reached %v, want both endpoints", seen)
		}
		g.Write("pp.yaml",
			annotated(v1, "v1"), gatewaytest.Slice("default", "pp-v1-1", "pp-v1", "http", "", 8080, ep("198.18.2.10", "")),
			annotated(v2, "v2"), gatewaytest.Slice("default", "pp-v2-1", "pp-v2", "http", "", 8080, ep("fd42:2::10", "")),
			plain, gatewaytest.Slice("default", "plain-1", "plain", "http", "", 8080, ep("198.18.2.11", "")))
		// Round robin over two endpoints: ten in a row to one of them
		// only once the other is gone from the proxy's table.
		err := lab.EventuallyWithin(10*time.Second, func() error {
			for i := range 10 {
				r, _, err := ppDial(topo.Client, client4, lb, "hello, backend\n")
				if err != nil {
					return err
				}
				if r.Local != "198.18.2.10:8080" {
					return fmt.Errorf("connection %d reached %s, which was removed", i, r.Local)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an invalid value is a warning and the kernel path", func(t *testing.T) {
		g.Write("pp.yaml",
			annotated(v1, "v3"), gatewaytest.Slice("default", "pp-v1-1", "pp-v1", "http", "", 8080, ep("198.18.2.10", "")),
			plain, gatewaytest.Slice("default", "plain-1", "plain", "http", "", 8080, ep("198.18.2.11", "")))
		awaitWarnings(t, g, "default", "pp-v1", `annotation nftgate.io/proxy-protocol: invalid value "v3"`)
		eventuallyPP(t, topo.Client, client4, ap("198.19.2.101:80"), noHeader(topo.GatewayBackendIPv4))
	})
	t.Run("removing the annotation returns to the kernel path", func(t *testing.T) {
		g.Write("pp.yaml",
			annotated(v1, "v1"), gatewaytest.Slice("default", "pp-v1-1", "pp-v1", "http", "", 8080, ep("198.18.2.10", "")))
		lb := ap("198.19.2.101:80")
		eventuallyPP(t, topo.Client, client4, lb, wantHeader(1, lb))
		v1.Annotations = nil
		g.Write("pp.yaml", v1, gatewaytest.Slice("default", "pp-v1-1", "pp-v1", "http", "", 8080, ep("198.18.2.10", "")))
		eventuallyPP(t, topo.Client, client4, lb, noHeader(topo.GatewayBackendIPv4))
		awaitWarnings(t, g, "default", "pp-v1")
	})
}
