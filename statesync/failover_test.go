package statesync

import (
	"bufio"
	"bytes"
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
		%[1]s daddr %[2]s sctp dport 3868 dnat to %[3]s:3869
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

// sctpAssoc is an SCTP association between the client and endpoint ep1
// through the service, both ends played on raw sockets (lab.RawSCTP): the
// kernels here track and translate SCTP without speaking it.
type sctpAssoc struct {
	f                *failoverLab
	client, endpoint *lab.RawSCTP
	cport            uint16
	ctag, etag       uint32         // the tags the client's and the endpoint's packets carry
	peer             netip.AddrPort // the endpoint's view of the client: the masquerade address
	tsn              uint32
}

const (
	sctpServicePort, sctpEndpointPort = 3868, 3869
	sctpEstablished                   = 4 // SCTP_CONNTRACK_ESTABLISHED
)

// sctpDeadline bounds one packet's way; a packet that does not arrive
// (the failure the test looks for) costs that long.
const sctpDeadline = 5 * time.Second

// associate sets up the association with the four-way handshake (INIT,
// INIT-ACK, COOKIE-ECHO, COOKIE-ACK), after which conntrack holds it
// ESTABLISHED with both verification tags.
func (f *failoverLab) associate(t *testing.T) *sctpAssoc {
	t.Helper()
	v6 := f.service.Is6()
	c, err := f.client.RawSCTP(v6)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e, err := f.endpoint.RawSCTP(v6)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.Bind(f.ep1); err != nil {
		t.Fatal(err)
	}
	s := &sctpAssoc{f: f, client: c, endpoint: e, cport: 40000, ctag: 0x5678ef01, etag: 0x1234abcd}
	deadline := time.Now().Add(sctpDeadline)
	// The INIT carries the tag the endpoint's packets will carry (the
	// client's initiate tag), the INIT-ACK the client's.
	if err := c.Send(f.service, lab.SCTPPacket(s.cport, sctpServicePort, 0, lab.SCTPInit, lab.SCTPInitBody(s.etag))); err != nil {
		t.Fatal(err)
	}
	in, err := e.Recv(deadline, s.atEndpoint(lab.SCTPInit, 0))
	if err != nil {
		t.Fatalf("the endpoint got no INIT: %v", err)
	}
	s.peer = netip.AddrPortFrom(in.Src, in.Sport)
	cookie := []byte{0, 7, 0, 8, 'c', 'o', 'o', 'k'} // State Cookie parameter
	s.toClient(t, lab.SCTPInitAck, lab.SCTPInitBody(s.ctag, cookie...), deadline)
	if err := c.Send(f.service, lab.SCTPPacket(s.cport, sctpServicePort, s.ctag, lab.SCTPCookieEcho, []byte("cook"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Recv(deadline, s.atEndpoint(lab.SCTPCookieEcho, s.ctag)); err != nil {
		t.Fatalf("the endpoint got no COOKIE-ECHO: %v", err)
	}
	s.toClient(t, lab.SCTPCookieAck, nil, deadline)
	return s
}

// atEndpoint matches a packet of chunk type chunk with tag vtag at ep1.
func (s *sctpAssoc) atEndpoint(chunk byte, vtag uint32) func(lab.SCTPIn) bool {
	return func(in lab.SCTPIn) bool {
		return in.Dst == s.f.ep1 && in.Dport == sctpEndpointPort && in.Chunk == chunk && in.VTag == vtag
	}
}

// toClient sends a chunk from the endpoint and waits for it at the
// client, from the service.
func (s *sctpAssoc) toClient(t *testing.T, chunk byte, body []byte, deadline time.Time) {
	t.Helper()
	if err := s.endpoint.Send(s.peer.Addr(), lab.SCTPPacket(sctpEndpointPort, s.peer.Port(), s.etag, chunk, body)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Recv(deadline, func(in lab.SCTPIn) bool {
		return in.Src == s.f.service && in.Sport == sctpServicePort && in.Dport == s.cport && in.Chunk == chunk && in.VTag == s.etag
	}); err != nil {
		t.Fatalf("the client got no chunk %d from the service: %v", chunk, err)
	}
}

// data sends a DATA chunk with line each way and checks that it arrives
// unchanged, at ep1 from the masquerade address and port of the
// association and back at the client from the service.
func (s *sctpAssoc) data(line string) error {
	deadline := time.Now().Add(sctpDeadline)
	s.tsn++
	body := lab.SCTPDataBody(s.ctag+100+s.tsn, []byte(line))
	if err := s.client.Send(s.f.service, lab.SCTPPacket(s.cport, sctpServicePort, s.ctag, lab.SCTPData, body)); err != nil {
		return err
	}
	in, err := s.endpoint.Recv(deadline, s.atEndpoint(lab.SCTPData, s.ctag))
	if err != nil {
		return fmt.Errorf("sctp %q: nothing at %s: %w", line, s.f.ep1, err)
	}
	if from := netip.AddrPortFrom(in.Src, in.Sport); from != s.peer || !bytes.Equal(in.Body, body) {
		return fmt.Errorf("sctp %q: %q from %s at the endpoint, want it from %s", line, in.Body, from, s.peer)
	}
	body = lab.SCTPDataBody(s.etag+100+s.tsn, []byte(line))
	if err := s.endpoint.Send(s.peer.Addr(), lab.SCTPPacket(sctpEndpointPort, s.peer.Port(), s.etag, lab.SCTPData, body)); err != nil {
		return err
	}
	if _, err := s.client.Recv(deadline, func(in lab.SCTPIn) bool {
		return in.Src == s.f.service && in.Sport == sctpServicePort && in.Dport == s.cport &&
			in.Chunk == lab.SCTPData && in.VTag == s.etag && bytes.Equal(in.Body, body)
	}); err != nil {
		return fmt.Errorf("sctp %q: no answer at the client from the service: %w", line, err)
	}
	return nil
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

// TestFailover moves a live TCP connection, a UDP flow and an SCTP
// association from gateway A to gateway B: with the replicas that A's
// events become written into B they carry on to the same endpoint byte for
// byte; without them they break (B's own choice takes them elsewhere). The
// SCTP replica carries the association's state and verification tags,
// without which B's conntrack takes its packets for invalid.
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
	sa := f.associate(t)
	for i := range 3 {
		line := fmt.Sprintf("before %d", i)
		if err := sa.data(line); err != nil {
			t.Fatalf("through A: %v", err)
		}
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
	events.waitFor(t, "established TCP and SCTP and answered UDP events", func(evs []Event, _ int) bool {
		for _, ev := range evs {
			latest[ev.Entry.Orig] = ev.Entry
			sawNew = sawNew || ev.Type == EventNew
		}
		var tcpOK, udpOK, sctpOK bool
		for _, e := range latest {
			tcpOK = tcpOK || e.Proto == unix.IPPROTO_TCP && e.TCP.State == tcpEstablished
			udpOK = udpOK || e.Proto == unix.IPPROTO_UDP && e.Status&StatusSeenReply != 0
			sctpOK = sctpOK || e.Proto == unix.IPPROTO_SCTP && e.SCTP.State == sctpEstablished
		}
		return tcpOK && udpOK && sctpOK
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
	if len(puts) != 3 {
		t.Fatalf("entries %+v, want one TCP, one UDP and one SCTP", puts)
	}

	if sync {
		noErrors(t, "write into B", kb.Write(puts, nil))
		got := dumpAll(t, kb)
		for _, want := range puts {
			e := got[want.Orig]
			if e.Reply != want.Reply || e.Mark != want.Mark|ReplicaMark || e.Timeout == 0 ||
				e.Status&(StatusDstNAT|StatusSrcNAT) != StatusDstNAT|StatusSrcNAT ||
				(want.Proto == unix.IPPROTO_TCP && e.TCP.State != tcpEstablished) ||
				(want.Proto == unix.IPPROTO_SCTP && e.SCTP != SCTPInfo{State: sctpEstablished, VTagOrig: sa.ctag, VTagReply: sa.etag}) {
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
	sctpErr := sa.data("after")
	if sync {
		if tcpErr != nil || udpErr != nil || sctpErr != nil {
			t.Fatalf("with replicas in B: %v; %v; %v", tcpErr, udpErr, sctpErr)
		}
		// B carried them: its replicas are still there and saw traffic.
		if n := len(dumpAll(t, kb)); n != 3 {
			t.Errorf("B holds %d entries, want the 3 replicas", n)
		}
		return
	}
	if tcpErr == nil || udpErr == nil || sctpErr == nil {
		t.Fatalf("without replicas the flows should break, got tcp %v, udp %v, sctp %v", tcpErr, udpErr, sctpErr)
	}
	t.Logf("without replicas, as expected: %v; %v; %v", tcpErr, udpErr, sctpErr)
}
