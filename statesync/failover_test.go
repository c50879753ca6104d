package statesync

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// failoverLab: a client and an endpoint host, each linked to gateway A and
// to standby gateway B, which has A's addresses on its own links. Both
// gateways DNAT the service to an endpoint and masquerade; B's rule picks
// the other endpoint (as a gateway whose endpoint choice differs would),
// so a flow that reaches B without A's entry goes elsewhere and breaks.
type failoverLab struct {
	fam                       string // nft family keyword
	client, a, b, endpoint    *lab.Host
	service                   netip.Addr
	gw, cli, ep1, ep2, gwBack netip.Addr
	bits                      int
}

func newFailoverLab(t *testing.T, v6 bool) *failoverLab {
	t.Helper()
	l := labtest.New(t)
	f := &failoverLab{fam: "ip", bits: 24,
		service: mustAddr("10.96.0.10"), cli: mustAddr("10.88.1.2"), gw: mustAddr("10.88.1.1"),
		gwBack: mustAddr("10.88.2.1"), ep1: mustAddr("10.88.2.10"), ep2: mustAddr("10.88.2.11")}
	if v6 {
		f = &failoverLab{fam: "ip6", bits: 64,
			service: mustAddr("fd96::10"), cli: mustAddr("fd88:1::2"), gw: mustAddr("fd88:1::1"),
			gwBack: mustAddr("fd88:2::1"), ep1: mustAddr("fd88:2::10"), ep2: mustAddr("fd88:2::11")}
	}
	host := func(name string) *lab.Host {
		h, err := l.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	f.client, f.a, f.b, f.endpoint = host("client"), host("a"), host("b"), host("endpoint")
	p := func(as ...netip.Addr) []netip.Prefix {
		var out []netip.Prefix
		for _, a := range as {
			out = append(out, netip.PrefixFrom(a, f.bits))
		}
		return out
	}
	for _, gw := range []*lab.Host{f.a, f.b} {
		if _, err := l.Link(f.client, p(f.cli), gw, p(f.gw)); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Link(f.endpoint, p(f.ep1, f.ep2), gw, p(f.gwBack)); err != nil {
			t.Fatal(err)
		}
		key := "net.ipv4.ip_forward"
		if v6 {
			key = "net.ipv6.conf.all.forwarding"
		}
		if err := gw.Sysctl(key, "1"); err != nil {
			t.Fatal(err)
		}
	}
	f.routeService(t)
	f.nat(t, f.a, f.ep1)
	f.nat(t, f.b, f.ep2)
	f.serve(t, f.ep1)
	f.serve(t, f.ep2)
	return f
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func (f *failoverLab) routeService(t *testing.T) {
	t.Helper()
	if err := f.client.AddRoute(netip.PrefixFrom(f.service, f.bits), f.gw); err != nil {
		t.Fatal(err)
	}
}

func bracket(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

func (f *failoverLab) nat(t *testing.T, gw *lab.Host, endpoint netip.Addr) {
	t.Helper()
	script := fmt.Sprintf(`table %[1]s nat {
	chain pre {
		type nat hook prerouting priority dstnat;
		%[1]s daddr %[2]s tcp dport 80 dnat to %[3]s:8080
		%[1]s daddr %[2]s udp dport 53 dnat to %[3]s:5353
	}
	chain post {
		type nat hook postrouting priority srcnat;
		oifname "endpoint" masquerade
	}
}
`, f.fam, f.service, bracket(endpoint))
	cmd := gw.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s", gw, err, out)
	}
}

// serve answers every line (TCP) or datagram (UDP) with the endpoint's
// address and the line, so the client sees which endpoint answered.
func (f *failoverLab) serve(t *testing.T, ep netip.Addr) {
	t.Helper()
	tcp := netip.AddrPortFrom(ep, 8080).String()
	ln, err := f.endpoint.Listen("tcp", tcp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lab.ServeConns(ln, func(c net.Conn) {
		r := bufio.NewScanner(c)
		for r.Scan() {
			if _, err := fmt.Fprintf(c, "%s %s\n", tcp, r.Text()); err != nil {
				return
			}
		}
	})
	udp := netip.AddrPortFrom(ep, 5353).String()
	pc, err := f.endpoint.ListenPacket("udp", udp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	lab.ServeDatagrams(pc, func(req []byte) []byte { return []byte(udp + " " + string(req)) })
}

// exchange sends line and returns the answer.
func exchange(c net.Conn, r *bufio.Reader, line string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	s, err := r.ReadString('\n')
	return strings.TrimSpace(s), err
}

func exchangeUDP(c net.Conn, line string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// cutA takes gateway A out: its links go down on the client's and the
// endpoint's side, and the client's route to the service points at the
// same gateway address, now answered by B.
func (f *failoverLab) cutA(t *testing.T) {
	t.Helper()
	for _, h := range []*lab.Host{f.client, f.endpoint} {
		l, err := h.Netlink().LinkByName("a")
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Netlink().LinkSetDown(l); err != nil {
			t.Fatal(err)
		}
	}
	f.routeService(t)
}

// TestFailover moves a live TCP connection and a UDP flow from gateway A
// to gateway B: with the replicas that A's events become written into B
// they carry on to the same endpoint byte for byte; without them they
// break (B's own choice takes them elsewhere).
func TestFailover(t *testing.T) {
	requireRoot(t)
	for _, v6 := range []bool{false, true} {
		for _, sync := range []bool{true, false} {
			t.Run(fmt.Sprintf("ipv6=%v/replicas=%v", v6, sync), func(t *testing.T) {
				testFailover(t, v6, sync)
			})
		}
	}
}

func testFailover(t *testing.T, v6, sync bool) {
	f := newFailoverLab(t, v6)
	ka := newKernel(t, netns.NsHandle(f.a.FD()), ConntrackOptions{})
	kb := newKernel(t, netns.NsHandle(f.b.FD()), ConntrackOptions{})
	events := listen(t, ka, nil)

	tcpConn, err := f.client.DialContext(context.Background(), "tcp", netip.AddrPortFrom(f.service, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcpConn.Close()
	udpConn, err := f.client.DialContext(context.Background(), "udp", netip.AddrPortFrom(f.service, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	defer udpConn.Close()
	r := bufio.NewReader(tcpConn)
	ep1TCP := netip.AddrPortFrom(f.ep1, 8080).String()
	ep1UDP := netip.AddrPortFrom(f.ep1, 5353).String()
	for i := range 3 {
		line := fmt.Sprintf("before %d", i)
		if got, err := exchange(tcpConn, r, line); err != nil || got != ep1TCP+" "+line {
			t.Fatalf("tcp through A: %q, %v", got, err)
		}
		if got, err := exchangeUDP(udpConn, line); err != nil || got != ep1UDP+" "+line {
			t.Fatalf("udp through A: %q, %v", got, err)
		}
	}

	// A's events: the latest state of each flow, with both translations.
	latest := map[Tuple]Entry{}
	sawNew := false
	events.waitFor(t, "established TCP and answered UDP events", func(evs []Event, _ int) bool {
		for _, ev := range evs {
			latest[ev.Entry.Orig] = ev.Entry
			sawNew = sawNew || ev.Type == EventNew
		}
		var tcpOK, udpOK bool
		for _, e := range latest {
			tcpOK = tcpOK || e.Proto == unix.IPPROTO_TCP && e.TCP.State == tcpEstablished
			udpOK = udpOK || e.Proto == unix.IPPROTO_UDP && e.Status&StatusSeenReply != 0
		}
		return tcpOK && udpOK
	})
	if !sawNew {
		t.Error("no NEW event")
	}
	var puts []Entry
	for _, e := range latest {
		if e.Reply.Src.Addr() != f.ep1 || e.Reply.Dst.Addr() != f.gwBack || e.Status&(StatusDstNAT|StatusSrcNAT) != StatusDstNAT|StatusSrcNAT {
			t.Errorf("event entry %+v: want DNAT to %s and masquerade to %s", e, f.ep1, f.gwBack)
		}
		puts = append(puts, e)
	}
	if len(puts) != 2 {
		t.Fatalf("entries %+v, want one TCP and one UDP", puts)
	}

	if sync {
		noErrors(t, "write into B", kb.Write(puts, nil))
		got := dumpAll(t, kb)
		for _, want := range puts {
			e := got[want.Orig]
			if e.Reply != want.Reply || e.Mark != want.Mark|ReplicaMark || e.Timeout == 0 ||
				e.Status&(StatusDstNAT|StatusSrcNAT) != StatusDstNAT|StatusSrcNAT ||
				(want.Proto == unix.IPPROTO_TCP && e.TCP.State != tcpEstablished) {
				t.Errorf("replica in B %+v, want %+v with ReplicaMark", e, want)
			}
		}
		out := conntrackL(t, netns.NsHandle(f.b.FD()), "-p", "tcp")
		for _, w := range []string{"ESTABLISHED", "dst=" + f.service.String() + " sport=", "src=" + f.ep1.String() + " dst=" + f.gwBack.String() + " sport=8080", "mark="} {
			if !strings.Contains(out, w) {
				t.Errorf("conntrack -L in B lacks %q:\n%s", w, out)
			}
		}
	}

	f.cutA(t)

	var tcpErr, udpErr error
	for i := range 3 {
		line := fmt.Sprintf("after %d", i)
		if got, err := exchange(tcpConn, r, line); err != nil || got != ep1TCP+" "+line {
			tcpErr = fmt.Errorf("tcp after the move: %q, %v", got, err)
			break
		}
	}
	for i := range 3 {
		line := fmt.Sprintf("after %d", i)
		if got, err := exchangeUDP(udpConn, line); err != nil || got != ep1UDP+" "+line {
			udpErr = fmt.Errorf("udp after the move: %q, %v", got, err)
			break
		}
	}
	if sync {
		if tcpErr != nil || udpErr != nil {
			t.Fatalf("with replicas in B: %v; %v", tcpErr, udpErr)
		}
		// B carried them: its replicas are still there and saw traffic.
		if n := len(dumpAll(t, kb)); n != 2 {
			t.Errorf("B holds %d entries, want the 2 replicas", n)
		}
		return
	}
	if tcpErr == nil || udpErr == nil {
		t.Fatalf("without replicas the flows should break, got tcp %v, udp %v", tcpErr, udpErr)
	}
	t.Logf("without replicas, as expected: %v; %v", tcpErr, udpErr)
}
