package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

type udpClient struct {
	t    *testing.T
	conn *net.UDPConn
	seq  int
}

// dialUDP opens a client socket in the client namespace with a fixed source
// port, so every datagram belongs to the same conntrack flow.
func dialUDP(t *testing.T, ns netns.NsHandle, from netip.AddrPort, to netip.AddrPort) *udpClient {
	t.Helper()
	var c *net.UDPConn
	inNS(t, ns, func() (err error) {
		c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(from), net.UDPAddrFromAddrPort(to))
		return err
	})
	t.Cleanup(func() { c.Close() })
	return &udpClient{t: t, conn: c}
}

// once sends one datagram and returns the name of the backend that answered
// it, or "" when no answer arrives in time. Late answers to earlier
// datagrams are skipped.
func (u *udpClient) once(wait time.Duration) string {
	u.t.Helper()
	u.seq++
	req := fmt.Sprintf("ping-%d", u.seq)
	if _, err := u.conn.Write([]byte(req)); err != nil {
		u.t.Fatalf("send: %v", err)
	}
	buf := make([]byte, 64)
	u.conn.SetReadDeadline(time.Now().Add(wait))
	for {
		n, err := u.conn.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return ""
			}
			u.t.Fatalf("receive: %v", err)
		}
		if name, got, ok := strings.Cut(string(buf[:n]), " "); ok && got == req {
			return name
		}
	}
}

// first waits until the path answers at all (neighbour resolution on a fresh
// lab may drop the first datagram), with a deadline.
func (u *udpClient) first() string {
	u.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if s := u.once(200 * time.Millisecond); s != "" {
			return s
		}
	}
	u.t.Fatalf("no answer from %s within 5s", u.conn.RemoteAddr())
	return ""
}

const (
	svcPort    = 53
	nodePort   = 30053
	targetPort = 5353
	clientPort = 40000
)

func TestCleanLab(t *testing.T) {
	requireRoot(t)
	for _, a := range []labAddrs{lab4, lab6} {
		t.Run(a.family, func(t *testing.T) { testCleanLab(t, a) })
	}
}

func testCleanLab(t *testing.T, a labAddrs) {
	l := newLab(t, a)
	epA := netip.AddrPortFrom(a.backendA, targetPort)
	epB := netip.AddrPortFrom(a.backendB, targetPort)
	udpEcho(t, l.backnd, epA, "A")
	udpEcho(t, l.backnd, epB, "B")
	tcpEcho(t, l.backnd, netip.AddrPortFrom(a.backendA, 8080))

	// Every service starts with backend A only; vipOther is an unrelated
	// service whose flow must survive all cleaning.
	f := a.family
	rules := func(svcTarget, nodeTarget string, zeroEndpoints bool) string {
		s := "table inet ctlab\ndelete table inet ctlab\ntable inet ctlab {\n" +
			"  chain pre { type nat hook prerouting priority dstnat; policy accept;\n" +
			"    " + f + " daddr " + a.vip.String() + " udp dport 53 dnat " + f + " to " + svcTarget + "\n" +
			"    fib daddr type local udp dport 30053 dnat " + f + " to " + nodeTarget + "\n" +
			"    " + f + " daddr " + a.vipTCP.String() + " tcp dport 80 dnat " + f + " to " + bracket(a.backendA) + ":8080\n" +
			"    " + f + " daddr " + a.vipOther.String() + " udp dport 53 dnat " + f + " to " + bracket(a.backendA) + ":5353\n"
		if !zeroEndpoints {
			s += "    " + f + " daddr " + a.vipZero.String() + " udp dport 53 dnat " + f + " to " + bracket(a.backendA) + ":5353\n"
		}
		return s + "  }\n}\n"
	}
	toA := bracket(a.backendA) + ":5353"
	toB := bracket(a.backendB) + ":5353"
	l.nft(t, rules(toA, toA, false))
	t.Cleanup(func() { l.nft(t, "table inet ctlab\ndelete table inet ctlab\n") })

	vip := netip.AddrPortFrom(a.vip, svcPort)
	node := netip.AddrPortFrom(a.gwClient, nodePort)
	zero := netip.AddrPortFrom(a.vipZero, svcPort)
	other := netip.AddrPortFrom(a.vipOther, svcPort)
	svcClient := dialUDP(t, l.client, netip.AddrPortFrom(a.client, clientPort), vip)
	nodeClient := dialUDP(t, l.client, netip.AddrPortFrom(a.client, clientPort+1), node)
	zeroClient := dialUDP(t, l.client, netip.AddrPortFrom(a.client, clientPort+2), zero)
	otherClient := dialUDP(t, l.client, netip.AddrPortFrom(a.client, clientPort+3), other)
	for name, c := range map[string]*udpClient{"service": svcClient, "node port": nodeClient, "scaled-to-zero service": zeroClient, "unrelated service": otherClient} {
		if got := c.first(); got != "A" {
			t.Fatalf("%s: first answer from %q, want A", name, got)
		}
	}

	var tcp net.Conn
	inNS(t, l.client, func() (err error) {
		tcp, err = net.DialTimeout("tcp", netip.AddrPortFrom(a.vipTCP, 80).String(), 5*time.Second)
		return err
	})
	t.Cleanup(func() { tcp.Close() })
	tcpRoundTrip(t, tcp, "before")

	otherFlows := l.flowsTo(t, 17, other)
	tcpFlows := l.flowsTo(t, 6, netip.AddrPortFrom(a.vipTCP, 80))
	if len(otherFlows) != 1 || len(tcpFlows) != 1 {
		t.Fatalf("want one unrelated UDP flow and one TCP flow, got %d and %d", len(otherFlows), len(tcpFlows))
	}

	// The sync replaces A by B and scales vipZero to zero. Without cleaning
	// the kernel keeps using the old translation: that is the bug.
	l.nft(t, rules(toB, toB, true))
	if got := svcClient.once(2 * time.Second); got != "A" {
		t.Fatalf("service: before cleaning the stale flow should still reach A, got %q", got)
	}
	if got := nodeClient.once(2 * time.Second); got != "A" {
		t.Fatalf("node port: before cleaning the stale flow should still reach A, got %q", got)
	}
	if n := len(l.flowsTo(t, 17, zero)); n != 1 {
		t.Fatalf("scaled-to-zero service: want its flow still present before cleaning, got %d", n)
	}

	c := l.cleaner(t)
	res, err := c.Clean(context.Background(),
		[]StaleEndpoint{
			{Protocol: UDP, VIP: a.vip, Port: svcPort, Endpoint: epA},
			{Protocol: UDP, NodePort: true, Port: nodePort, Endpoint: epA},
			// Same addresses as the TCP service, but UDP: must not touch TCP.
			{Protocol: UDP, VIP: a.vipTCP, Port: 80, Endpoint: netip.AddrPortFrom(a.backendA, 8080)},
		},
		[]StaleService{{Protocol: UDP, VIP: a.vipZero, Port: svcPort}},
	)
	if err != nil {
		t.Fatalf("Clean: %v", err)
	}
	t.Logf("Clean: %+v", res)
	if res.Deleted != 3 || res.Failed != 0 {
		t.Errorf("Clean deleted %d entries (%d failed), want 3 (service, node port, scaled to zero)", res.Deleted, res.Failed)
	}

	if got := svcClient.once(2 * time.Second); got != "B" {
		t.Errorf("service: after cleaning the next datagram should reach B, got %q", got)
	}
	if got := nodeClient.once(2 * time.Second); got != "B" {
		t.Errorf("node port: after cleaning the next datagram should reach B, got %q", got)
	}
	if n := len(l.flowsTo(t, 17, zero)); n != 0 {
		t.Errorf("scaled-to-zero service: %d flows left after cleaning, want 0", n)
	}
	if got := otherClient.once(2 * time.Second); got != "A" {
		t.Errorf("unrelated service: answer from %q, want A", got)
	}
	if after := l.flowsTo(t, 17, other); len(after) != 1 || after[0].ID != otherFlows[0].ID {
		t.Errorf("unrelated UDP flow was replaced or deleted: before %v, after %v", otherFlows, after)
	}
	tcpRoundTrip(t, tcp, "after")
	if after := l.flowsTo(t, 6, netip.AddrPortFrom(a.vipTCP, 80)); len(after) != 1 || after[0].ID != tcpFlows[0].ID {
		t.Errorf("TCP flow was replaced or deleted: before %v, after %v", tcpFlows, after)
	}

	// A second clean of the same input finds nothing: the flows to B are
	// not stale.
	res, err = c.Clean(context.Background(), []StaleEndpoint{{Protocol: UDP, VIP: a.vip, Port: svcPort, Endpoint: epA}}, nil)
	if err != nil || res.Deleted != 0 {
		t.Errorf("second Clean: deleted %d, err %v; want 0, nil", res.Deleted, err)
	}
}

func tcpRoundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("tcp write %s: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := readFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("tcp echo %s: got %q, %v", msg, buf, err)
	}
}

func readFull(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
