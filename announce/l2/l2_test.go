package l2

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

var (
	vip4 = netip.MustParseAddr("198.18.0.100")
	vip6 = netip.MustParseAddr("2001:db8::100")
)

const echoPort = 7

// segment is a client and a gateway on one Linux bridge (in a namespace of
// its own). The Service addresses are on the gateway's loopback, with
// arp_ignore/arp_announce set so that its kernel does not answer ARP for
// them (nor, being on another interface, neighbour solicitations): only
// the announcer makes them reachable.
type segment struct {
	client, gateway *lab.Host
	clientIf        string // the client's interface on the segment
	gatewayIf       string
	gatewayMAC      net.HardwareAddr
}

func newSegment(t *testing.T) *segment {
	t.Helper()
	l := labtest.New(t)
	client, err := l.AddHost("client")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := l.AddHost("gateway")
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	_, ifaces, err := l.Segment("bridge", []*lab.Host{client, gw},
		[][]netip.Prefix{{p("198.18.0.1/24"), p("2001:db8::1/64")}, {p("198.18.0.2/24"), p("2001:db8::2/64")}})
	if err != nil {
		t.Fatal(err)
	}
	clientIf, gatewayIf := ifaces[0], ifaces[1]
	for _, kv := range [][2]string{
		{"net.ipv4.conf.all.arp_ignore", "1"},
		{"net.ipv4.conf.all.arp_announce", "2"},
		{"net/ipv4/conf/" + gatewayIf + "/arp_ignore", "1"},
		{"net/ipv4/conf/" + gatewayIf + "/arp_announce", "2"},
	} {
		if err := gw.Sysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := gw.AddAddress("lo", netip.PrefixFrom(vip4, 32), netip.PrefixFrom(vip6, 128)); err != nil {
		t.Fatal(err)
	}
	for _, v := range []netip.Addr{vip4, vip6} {
		c, err := gw.ServeEcho("tcp", netip.AddrPortFrom(v, echoPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	link, err := gw.Netlink().LinkByName(gatewayIf)
	if err != nil {
		t.Fatal(err)
	}
	s := &segment{client: client, gateway: gw, clientIf: clientIf, gatewayIf: gatewayIf, gatewayMAC: link.Attrs().HardwareAddr}
	// The bridge forwards between the two: the gateway's own address
	// answers (its kernel resolves it, and refuses the connection).
	err = lab.EventuallyWithin(5*time.Second, func() error {
		if err := s.ping(netip.MustParseAddr("198.18.0.2")); !lab.IsRefused(err) {
			return fmt.Errorf("want refused, got %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("segment does not forward: %v", err)
	}
	return s
}

// announcer starts an Announcer in the gateway's namespace, closed at the
// end of the test.
func (s *segment) announcer(t *testing.T, cfg Config) *Announcer {
	t.Helper()
	if cfg.Interfaces == nil {
		cfg.Interfaces = []string{s.gatewayIf}
	}
	var a *Announcer
	err := s.gateway.Do(func() (err error) {
		a, err = New(cfg, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// ping dials the TCP echo on addr from the client.
func (s *segment) ping(addr netip.Addr) error {
	_, err := s.client.Dial("tcp", netip.AddrPortFrom(addr, echoPort), lab.DialOpts{Timeout: time.Second})
	return err
}

// neigh returns the client's neighbour entry for addr (nil: none).
func (s *segment) neigh(t *testing.T, addr netip.Addr) *netlink.Neigh {
	t.Helper()
	link, err := s.client.Netlink().LinkByName(s.clientIf)
	if err != nil {
		t.Fatal(err)
	}
	fam := netlink.FAMILY_V4
	if addr.Is6() {
		fam = netlink.FAMILY_V6
	}
	ns, err := s.client.Netlink().NeighList(link.Attrs().Index, fam)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == addr {
			return &n
		}
	}
	return nil
}

// forget removes the client's neighbour entry for addr, so that the next
// packet resolves it afresh.
func (s *segment) forget(t *testing.T, addr netip.Addr) {
	t.Helper()
	if n := s.neigh(t, addr); n != nil {
		if err := s.client.Netlink().NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			t.Fatal(err)
		}
	}
}

// unreachable checks that the client cannot resolve addr: a fresh
// connection attempt fails and its neighbour entry ends FAILED (or is
// still INCOMPLETE) without the gateway's MAC.
func (s *segment) unreachable(t *testing.T, addr netip.Addr) {
	t.Helper()
	s.forget(t, addr)
	if err := s.ping(addr); err == nil {
		t.Fatalf("%s: reached without an announcer", addr)
	}
	n := s.neigh(t, addr)
	if n != nil && n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) == 0 {
		t.Fatalf("%s: client's neighbour entry is %s (%s), want failed", addr, neighState(n.State), n.HardwareAddr)
	}
}

func neighState(s int) string {
	for _, st := range []struct {
		bit  int
		name string
	}{{netlink.NUD_INCOMPLETE, "incomplete"}, {netlink.NUD_REACHABLE, "reachable"}, {netlink.NUD_STALE, "stale"}, {netlink.NUD_DELAY, "delay"}, {netlink.NUD_PROBE, "probe"}, {netlink.NUD_FAILED, "failed"}, {netlink.NUD_PERMANENT, "permanent"}} {
		if s&st.bit != 0 {
			return st.name
		}
	}
	return fmt.Sprintf("0x%x", s)
}

// The kernel of the gateway does not answer for the Service addresses on
// its own: without an announcer the client gets no answer. With one, the
// client resolves both to the gateway's MAC and connects; the requests
// answered are counted.
func TestClientReachesAddressByARPAndNDP(t *testing.T) {
	s := newSegment(t)
	for _, v := range []netip.Addr{vip4, vip6} {
		s.unreachable(t, v)
	}

	a := s.announcer(t, Config{})
	reg := prometheus.NewPedanticRegistry()
	if err := a.Register(reg); err != nil {
		t.Fatal(err)
	}
	a.Set([]netip.Addr{vip4, vip6})
	for _, v := range []netip.Addr{vip4, vip6} {
		s.forget(t, v) // a failed entry would hold back the next attempt
		if err := lab.EventuallyWithin(5*time.Second, func() error { return s.ping(v) }); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if n := s.neigh(t, v); n == nil || !bytes.Equal(n.HardwareAddr, s.gatewayMAC) {
			t.Fatalf("%s: client's neighbour entry %v, want the gateway's MAC %s", v, n, s.gatewayMAC)
		}
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		// The answer is counted after it is sent: the client may have
		// connected before the count.
		if err := lab.EventuallyWithin(5*time.Second, func() error {
			if n := testutil.ToFloat64(a.answered.WithLabelValues(s.gatewayIf, fam)); n < 1 {
				return fmt.Errorf("%s requests answered: %v", fam, n)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	want := `
# HELP nftgate_l2_announced_addresses Addresses this gateway answers ARP or neighbour solicitations for.
# TYPE nftgate_l2_announced_addresses gauge
nftgate_l2_announced_addresses{family="ipv4"} 1
nftgate_l2_announced_addresses{family="ipv6"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "nftgate_l2_announced_addresses"); err != nil {
		t.Fatal(err)
	}
	st := a.Status()
	if len(st) != 2 || st[0].Address != vip4 || st[1].Address != vip6 || st[1].Interfaces[0] != s.gatewayIf || st[0].Since.IsZero() || st[0].LastGratuitous.IsZero() {
		t.Fatalf("status %+v", st)
	}
}

// An address removed from the set is answered for no more: the client's
// resolution fails.
func TestRemovedAddressGetsNoAnswer(t *testing.T) {
	s := newSegment(t)
	a := s.announcer(t, Config{})
	a.Set([]netip.Addr{vip4, vip6})
	for _, v := range []netip.Addr{vip4, vip6} {
		if err := lab.EventuallyWithin(5*time.Second, func() error { return s.ping(v) }); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}
	a.Set([]netip.Addr{vip6})
	s.unreachable(t, vip4)
	if err := s.ping(vip6); err != nil {
		t.Fatalf("%s, still in the set: %v", vip6, err)
	}
	a.Set(nil)
	s.unreachable(t, vip6)
	if st := a.Status(); len(st) != 0 {
		t.Fatalf("status after Set(nil): %+v", st)
	}
}

// A client re-checks a cached IPv6 neighbour with unicast solicitations
// addressed to the Service address itself (neighbour unreachability
// detection); they are answered, so the entry becomes reachable again
// instead of failing.
func TestUnicastSolicitationAnswered(t *testing.T) {
	s := newSegment(t)
	a := s.announcer(t, Config{})
	a.Set([]netip.Addr{vip6})
	// No TCP before: its replies would confirm the entry without any
	// solicitation. Probe at once when a stale entry is used.
	if err := s.client.Sysctl("net/ipv6/neigh/"+s.clientIf+"/delay_first_probe_time", "0"); err != nil {
		t.Fatal(err)
	}
	link, err := s.client.Netlink().LinkByName(s.clientIf)
	if err != nil {
		t.Fatal(err)
	}
	stale := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_STALE, IP: vip6.AsSlice(), HardwareAddr: s.gatewayMAC}
	if err := s.client.Netlink().NeighSet(stale); err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(a.answered.WithLabelValues(s.gatewayIf, "ipv6"))
	// A UDP datagram uses the entry without confirming it (TCP would
	// confirm it from the replies it gets).
	conn, err := s.client.DialContext(t.Context(), "udp", netip.AddrPortFrom(vip6, 9).String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("probe")); err != nil {
		t.Fatal(err)
	}
	err = lab.EventuallyWithin(5*time.Second, func() error {
		n := s.neigh(t, vip6)
		if n == nil || n.State&netlink.NUD_REACHABLE == 0 {
			st := "none"
			if n != nil {
				st = neighState(n.State)
			}
			return fmt.Errorf("client's entry for %s is %s", vip6, st)
		}
		// Counted just after the answer went out.
		if after := testutil.ToFloat64(a.answered.WithLabelValues(s.gatewayIf, "ipv6")); after <= before {
			return fmt.Errorf("no solicitation answered (%v before, %v after)", before, after)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// capture records, in the client's namespace, the gratuitous ARP and the
// unsolicited neighbour advertisements that arrive on its interface.
type capture struct {
	mu    sync.Mutex
	seen  []string
	conns []*packet.Conn
}

func (s *segment) capture(t *testing.T) *capture {
	t.Helper()
	c := &capture{}
	err := s.client.Do(func() error {
		ifi, err := net.InterfaceByName(s.clientIf)
		if err != nil {
			return err
		}
		for _, proto := range []int{unix.ETH_P_ARP, unix.ETH_P_IPV6} {
			conn, err := packet.Listen(ifi, packet.Raw, proto, nil)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, conn)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, conn := range c.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 2048)
			for {
				n, _, err := conn.ReadFrom(buf)
				if err != nil {
					return
				}
				if g := gratuitous(buf[:n]); g != "" {
					c.mu.Lock()
					c.seen = append(c.seen, g)
					c.mu.Unlock()
				}
			}
		}()
	}
	t.Cleanup(func() {
		for _, conn := range c.conns {
			conn.Close()
		}
		wg.Wait()
	})
	return c
}

// gratuitous describes frame b if it is a gratuitous ARP or an unsolicited
// neighbour advertisement: "arp <address> <mac>", "na <address> <mac>
// flags".
func gratuitous(b []byte) string {
	var f ethernet.Frame
	if f.UnmarshalBinary(b) != nil {
		return ""
	}
	switch f.EtherType {
	case ethernet.EtherTypeARP:
		var p arp.Packet
		if p.UnmarshalBinary(f.Payload) != nil || p.SenderIP != p.TargetIP || !bytes.Equal(f.Destination, ethernet.Broadcast) {
			return ""
		}
		return fmt.Sprintf("arp %s %s", p.SenderIP, p.SenderHardwareAddr)
	case ethernet.EtherTypeIPv6:
		h, err := ipv6.ParseHeader(f.Payload)
		if err != nil || h.NextHeader != unix.IPPROTO_ICMPV6 || len(f.Payload) < ip6HeaderLen+h.PayloadLen {
			return ""
		}
		m, err := ndp.ParseMessage(f.Payload[ip6HeaderLen : ip6HeaderLen+h.PayloadLen])
		if err != nil {
			return ""
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || !h.Dst.Equal(net.IPv6linklocalallnodes) || h.HopLimit != 255 {
			return ""
		}
		var mac net.HardwareAddr
		for _, o := range na.Options {
			if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Target {
				mac = l.Addr
			}
		}
		return fmt.Sprintf("na %s %s router=%t solicited=%t override=%t", na.TargetAddress, mac, na.Router, na.Solicited, na.Override)
	}
	return ""
}

// wait returns once every one of want was seen.
func (c *capture) wait(t *testing.T, want ...string) {
	t.Helper()
	err := lab.EventuallyWithin(5*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, w := range want {
			found := false
			for _, s := range c.seen {
				found = found || s == w
			}
			if !found {
				return fmt.Errorf("not seen %q; seen %q", w, c.seen)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (c *capture) reset() {
	c.mu.Lock()
	c.seen = nil
	c.mu.Unlock()
}

// Gratuitous ARP and unsolicited neighbour advertisements (override set,
// solicited and router not, the gateway's MAC as target link-layer
// address) reach the client when an address starts being announced, and
// again from a new announcer after a restart; the client's cache follows.
func TestGratuitousOnStartAndRestart(t *testing.T) {
	s := newSegment(t)
	c := s.capture(t)
	want := []string{
		fmt.Sprintf("arp %s %s", vip4, s.gatewayMAC),
		fmt.Sprintf("na %s %s router=false solicited=false override=true", vip6, s.gatewayMAC),
	}
	cfg := Config{GratuitousCount: 1}
	a := s.announcer(t, cfg)
	a.Set([]netip.Addr{vip4, vip6})
	c.wait(t, want...)

	// A stale entry pointing elsewhere is corrected by the restarted
	// gateway's gratuitous messages, without the client asking.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	link, err := s.client.Netlink().LinkByName(s.clientIf)
	if err != nil {
		t.Fatal(err)
	}
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	for _, v := range []netip.Addr{vip4, vip6} {
		fam := netlink.FAMILY_V4
		if v.Is6() {
			fam = netlink.FAMILY_V6
		}
		if err := s.client.Netlink().NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: fam, State: netlink.NUD_STALE, IP: v.AsSlice(), HardwareAddr: other}); err != nil {
			t.Fatal(err)
		}
	}
	c.reset()
	a = s.announcer(t, cfg)
	a.Set([]netip.Addr{vip4, vip6})
	c.wait(t, want...)
	for _, v := range []netip.Addr{vip4, vip6} {
		err := lab.EventuallyWithin(5*time.Second, func() error {
			if n := s.neigh(t, v); n == nil || !bytes.Equal(n.HardwareAddr, s.gatewayMAC) {
				return fmt.Errorf("client's entry for %s: %v", v, n)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := testutil.ToFloat64(a.gratuitous.WithLabelValues(s.gatewayIf, "ipv4")); n != 1 {
		t.Fatalf("gratuitous ARP counted %v, want 1", n)
	}
}
