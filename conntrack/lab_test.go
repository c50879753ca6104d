package conntrack

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	mdnetlink "github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	testlab "github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

// The lab: client -- gateway -- backends. The gateway DNATs service
// addresses to backend A or B, both on one veth of the backend namespace.
type labAddrs struct {
	family                string // "ip" or "ip6", the nft keyword
	bits                  int
	client, gwClient, gwB netip.Addr
	backendA, backendB    netip.Addr
	vip, vipZero, vipTCP  netip.Addr
	vipOther              netip.Addr
}

var lab4 = labAddrs{
	family: "ip", bits: 24,
	client: mustAddr("10.77.1.2"), gwClient: mustAddr("10.77.1.1"), gwB: mustAddr("10.77.2.1"),
	backendA: mustAddr("10.77.2.10"), backendB: mustAddr("10.77.2.11"),
	vip: mustAddr("10.96.0.10"), vipZero: mustAddr("10.96.0.11"), vipTCP: mustAddr("10.96.0.12"),
	vipOther: mustAddr("10.96.0.13"),
}

var lab6 = labAddrs{
	family: "ip6", bits: 64,
	client: mustAddr("fd77:1::2"), gwClient: mustAddr("fd77:1::1"), gwB: mustAddr("fd77:2::1"),
	backendA: mustAddr("fd77:2::10"), backendB: mustAddr("fd77:2::11"),
	vip: mustAddr("fd96::10"), vipZero: mustAddr("fd96::11"), vipTCP: mustAddr("fd96::12"),
	vipOther: mustAddr("fd96::13"),
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, nftables rules and conntrack entries")
	}
}

// newNetNS creates an unnamed network namespace; it disappears when the
// handle and every socket in it are closed, so there is nothing on disk to
// leak between test processes.
func newNetNS(t testing.TB) netns.NsHandle {
	t.Helper()
	return netnstest.Temp(t)
}

// inNS runs fn on a thread switched into ns. Sockets and processes created
// by fn stay in ns.
func inNS(t testing.TB, ns netns.NsHandle, fn func() error) {
	t.Helper()
	if err := netnstest.Do(ns, fn); err != nil {
		t.Fatal(err)
	}
}

func nlHandle(t testing.TB, ns netns.NsHandle) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func linkUp(t testing.TB, h *netlink.Handle, name string, addrs ...netip.Prefix) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("find %s: %v", name, err)
	}
	for _, p := range addrs {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			// Without DAD the address is usable at once: no waiting.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatalf("add %s to %s: %v", p, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatalf("set %s up: %v", name, err)
	}
}

func addDefaultRoute(t testing.TB, h *netlink.Handle, dev string, via netip.Addr) {
	t.Helper()
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: via.AsSlice()}
	if via.Is6() {
		r.Family = netlink.FAMILY_V6
	}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("default route via %s: %v", via, err)
	}
}

func vethPair(t testing.TB, a netns.NsHandle, aName string, b netns.NsHandle, bName string) {
	t.Helper()
	h := nlHandle(t, a)
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName, PeerNamespace: netlink.NsFd(b)}
	if err := h.LinkAdd(v); err != nil {
		t.Fatalf("create veth %s/%s: %v", aName, bName, err)
	}
}

type lab struct {
	a                  labAddrs
	client, gw, backnd netns.NsHandle
}

// newLab wires the three namespaces. Loopback is brought up everywhere
// because nft's fib lookups and local delivery need it.
func newLab(t *testing.T, a labAddrs) *lab {
	t.Helper()
	l := &lab{a: a, client: newNetNS(t), gw: newNetNS(t), backnd: newNetNS(t)}
	vethPair(t, l.gw, "gc", l.client, "c0")
	vethPair(t, l.gw, "gb", l.backnd, "b0")
	pfx := func(ad netip.Addr) netip.Prefix { return netip.PrefixFrom(ad, a.bits) }

	hc, hg, hb := nlHandle(t, l.client), nlHandle(t, l.gw), nlHandle(t, l.backnd)
	linkUp(t, hc, "lo")
	linkUp(t, hg, "lo")
	linkUp(t, hb, "lo")
	linkUp(t, hc, "c0", pfx(a.client))
	linkUp(t, hg, "gc", pfx(a.gwClient))
	linkUp(t, hg, "gb", pfx(a.gwB))
	linkUp(t, hb, "b0", pfx(a.backendA), pfx(a.backendB))
	addDefaultRoute(t, hc, "c0", a.gwClient)
	addDefaultRoute(t, hb, "b0", a.gwB)
	inNS(t, l.gw, func() error {
		if a.family == "ip6" {
			return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0)
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)
	})
	return l
}

// nft runs the nft CLI in the gateway namespace. Tests only: the product
// programs nftables over netlink.
func (l *lab) nft(t *testing.T, script string) {
	t.Helper()
	nftPath, err := exec.LookPath("nft")
	if err != nil {
		t.Fatalf("the lab needs the nft CLI (Debian package nftables; make conntrack-deps): %v", err)
	}
	inNS(t, l.gw, func() error {
		cmd := exec.Command(nftPath, "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft: %v: %s\n%s", err, out, script)
		}
		return nil
	})
}

// bracket formats an address for nft's addr:port syntax.
func bracket(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

// udpEcho answers every datagram with name and the request, from the
// address it is bound to.
func udpEcho(t *testing.T, ns netns.NsHandle, at netip.AddrPort, name string) {
	t.Helper()
	var pc net.PacketConn
	inNS(t, ns, func() (err error) {
		pc, err = net.ListenPacket("udp", at.String())
		return err
	})
	t.Cleanup(func() { pc.Close() })
	// The request is echoed so that a client can tell the answer to this
	// datagram from a late answer to an earlier one.
	testlab.ServeDatagrams(pc, func(req []byte) []byte { return append([]byte(name+" "), req...) })
}

// tcpEcho echoes lines on every accepted connection.
func tcpEcho(t *testing.T, ns netns.NsHandle, at netip.AddrPort) {
	t.Helper()
	var ln net.Listener
	inNS(t, ns, func() (err error) {
		ln, err = net.Listen("tcp", at.String())
		return err
	})
	t.Cleanup(func() { ln.Close() })
	testlab.ServeConns(ln, func(c net.Conn) { _, _ = io.Copy(c, c) })

}

// ctDump lists the gateway's conntrack table (small in these tests).
func (l *lab) ctDump(t *testing.T) []ct.Flow {
	t.Helper()
	c, err := ct.Dial(&mdnetlink.Config{NetNS: int(l.gw)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		t.Fatalf("dump conntrack: %v", err)
	}
	return flows
}

// flowsTo returns the gateway's flows of proto whose original destination
// is dst.
func (l *lab) flowsTo(t *testing.T, proto uint8, dst netip.AddrPort) []ct.Flow {
	t.Helper()
	var out []ct.Flow
	for _, f := range l.ctDump(t) {
		if f.TupleOrig.Proto.Protocol == proto &&
			f.TupleOrig.IP.DestinationAddress == dst.Addr() &&
			f.TupleOrig.Proto.DestinationPort == dst.Port() {
			out = append(out, f)
		}
	}
	return out
}

func (l *lab) cleaner(t *testing.T, opts ...Option) *Cleaner {
	t.Helper()
	c, err := New(append([]Option{WithNetNS(int(l.gw))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
