package lab

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// The gateway topology's address plan. Everything lies in 198.18.0.0/15
// (reserved for benchmarking) and fd42::/16 (unique local), so lab traffic
// can never be mistaken for traffic to a real network.
var (
	ClientNet4  = netip.MustParsePrefix("198.18.1.0/24")
	ClientNet6  = netip.MustParsePrefix("fd42:1::/64")
	BackendNet4 = netip.MustParsePrefix("198.18.2.0/24")
	BackendNet6 = netip.MustParsePrefix("fd42:2::/64")
	// VIPNet4 and VIPNet6 hold service addresses (ClusterIPs, external and
	// load-balancer IPs). They are assigned nowhere; the client routes them
	// to the gateway.
	VIPNet4 = netip.MustParsePrefix("198.19.0.0/16")
	VIPNet6 = netip.MustParsePrefix("fd42:ff::/64")
	// HostNet4 is the optional link between the machine and the gateway.
	HostNet4 = netip.MustParsePrefix("198.18.0.0/30")
)

// GatewayOptions tune NewGateway.
type GatewayOptions struct {
	// HostLink adds a veth between the machine's root namespace
	// (198.18.0.1/30) and the gateway (198.18.0.2/30). Only one lab on a
	// machine should use it at a time; tests should not need it.
	HostLink bool
}

// Topology is a client, a gateway and a backend host:
//
//	client ──── gateway ──── backend
//	198.18.1.2-.9   .1 │ .1   198.18.2.10-.29
//	fd42:1::2-::9 ::1 │ ::1  fd42:2::10-::29
//	                  │ (HostLink) 198.18.0.2/30 ── machine 198.18.0.1/30
//
// The client and backend route everything (including the VIP ranges) via
// the gateway, which forwards IPv4 and IPv6. The gateway routes the VIP
// ranges into a sink interface ("vips"), standing in for an upstream router
// that knows nothing of them: a VIP flow that no rule translates or rejects
// is silently lost (IsTimeout), never answered by the lab itself, so a
// rejection a test sees always comes from the rules under test. Because the
// route exists, forwarded VIP traffic passes the forward hook (where
// no-endpoint rejects live) and traffic the gateway itself sends to a VIP
// passes the output hook, as on a node with a default route.
//
// Other unrouted destinations (e.g. 198.18.3.0/24) get ICMP network
// unreachable from the gateway; for IPv4 the kernel limits those errors per
// source address (a burst of 5, then 1 per second) with a limiter outside
// the namespaces' reach.
//
// IPv6 addresses mirror the IPv4 ones digit for digit: 198.18.2.N pairs with
// fd42:2::N (N written in decimal digits, so fd42:2::10 .. fd42:2::29).
type Topology struct {
	*Lab
	Client, Gateway, Backend *Host

	// ClientIPv4[i] is 198.18.1.(2+i) and ClientIPv6[i] fd42:1::(2+i), i < 8.
	ClientIPv4, ClientIPv6 []netip.Addr
	// The gateway's addresses on the client and backend networks.
	GatewayClientIPv4, GatewayClientIPv6   netip.Addr
	GatewayBackendIPv4, GatewayBackendIPv6 netip.Addr
	// BackendIPv4[i] is 198.18.2.(10+i) and BackendIPv6[i] fd42:2::(10+i), i < 20.
	BackendIPv4, BackendIPv6 []netip.Addr
	// With HostLink: the machine's (198.18.0.1) and the gateway's
	// (198.18.0.2) addresses on the host link; invalid otherwise.
	HostIPv4, GatewayHostIPv4 netip.Addr

	// Interface names. In the client and backend the interface towards the
	// gateway is "gateway"; in the gateway they are "client", "backend",
	// "vips" (the sink the VIP ranges are routed into) and, with HostLink,
	// "host". HostIface is the root-namespace end.
	ClientIface, GatewayClientIface   string
	GatewayBackendIface, BackendIface string
	GatewayVIPIface                   string
	HostIface, GatewayHostIface       string
}

// NewGateway builds the gateway topology in a new lab named name. On error
// everything made so far is removed.
func NewGateway(name string, opts GatewayOptions) (*Topology, error) {
	l, err := New(name)
	if err != nil {
		return nil, err
	}
	t, err := buildGateway(l, opts)
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return t, nil
}

func buildGateway(l *Lab, opts GatewayOptions) (*Topology, error) {
	t := &Topology{
		Lab:                l,
		GatewayClientIPv4:  netip.MustParseAddr("198.18.1.1"),
		GatewayClientIPv6:  netip.MustParseAddr("fd42:1::1"),
		GatewayBackendIPv4: netip.MustParseAddr("198.18.2.1"),
		GatewayBackendIPv6: netip.MustParseAddr("fd42:2::1"),
	}
	for i := 2; i <= 9; i++ {
		t.ClientIPv4 = append(t.ClientIPv4, netip.MustParseAddr(fmt.Sprintf("198.18.1.%d", i)))
		t.ClientIPv6 = append(t.ClientIPv6, netip.MustParseAddr(fmt.Sprintf("fd42:1::%d", i)))
	}
	for i := 10; i <= 29; i++ {
		t.BackendIPv4 = append(t.BackendIPv4, netip.MustParseAddr(fmt.Sprintf("198.18.2.%d", i)))
		t.BackendIPv6 = append(t.BackendIPv6, netip.MustParseAddr(fmt.Sprintf("fd42:2::%d", i)))
	}

	var err error
	if t.Client, err = l.AddHost("client"); err != nil {
		return nil, err
	}
	if t.Gateway, err = l.AddHost("gateway"); err != nil {
		return nil, err
	}
	if t.Backend, err = l.AddHost("backend"); err != nil {
		return nil, err
	}
	if err := t.Gateway.Do(func() error {
		for _, kv := range [][2]string{
			{"net.ipv4.ip_forward", "1"},
			{"net.ipv6.conf.all.forwarding", "1"},
		} {
			if err := writeSysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}

	v, err := l.Link(t.Client, prefixes(append(t.ClientIPv4, t.ClientIPv6...), ClientNet4, ClientNet6),
		t.Gateway, prefixes([]netip.Addr{t.GatewayClientIPv4, t.GatewayClientIPv6}, ClientNet4, ClientNet6))
	if err != nil {
		return nil, err
	}
	t.ClientIface, t.GatewayClientIface = v.A, v.B

	v, err = l.Link(t.Gateway, prefixes([]netip.Addr{t.GatewayBackendIPv4, t.GatewayBackendIPv6}, BackendNet4, BackendNet6),
		t.Backend, prefixes(append(t.BackendIPv4, t.BackendIPv6...), BackendNet4, BackendNet6))
	if err != nil {
		return nil, err
	}
	t.GatewayBackendIface, t.BackendIface = v.A, v.B

	for _, r := range []struct {
		h   *Host
		dst netip.Prefix
		via netip.Addr
	}{
		{t.Client, netip.MustParsePrefix("0.0.0.0/0"), t.GatewayClientIPv4},
		{t.Client, netip.MustParsePrefix("::/0"), t.GatewayClientIPv6},
		{t.Backend, netip.MustParsePrefix("0.0.0.0/0"), t.GatewayBackendIPv4},
		{t.Backend, netip.MustParsePrefix("::/0"), t.GatewayBackendIPv6},
	} {
		if err := r.h.AddRoute(r.dst, r.via); err != nil {
			return nil, err
		}
	}

	if t.GatewayVIPIface, err = addVIPSink(t.Gateway); err != nil {
		return nil, err
	}

	if opts.HostLink {
		t.HostIPv4 = netip.MustParseAddr("198.18.0.1")
		t.GatewayHostIPv4 = netip.MustParseAddr("198.18.0.2")
		v, err := l.LinkRoot([]netip.Prefix{netip.PrefixFrom(t.HostIPv4, HostNet4.Bits())},
			t.Gateway, []netip.Prefix{netip.PrefixFrom(t.GatewayHostIPv4, HostNet4.Bits())})
		if err != nil {
			return nil, err
		}
		t.HostIface, t.GatewayHostIface = v.A, v.B
	}
	return t, nil
}

// prefixes gives each address the length of the network (v4 or v6) it is in.
func prefixes(addrs []netip.Addr, net4, net6 netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		bits := net6.Bits()
		if a.Is4() {
			bits = net4.Bits()
		}
		out = append(out, netip.PrefixFrom(a, bits))
	}
	return out
}

// addVIPSink routes the VIP ranges on h into an interface that silently
// loses whatever reaches it: one end of a veth pair whose other end stays
// down, so it has no carrier and its queue discards packets. ARP is off on
// it so that no neighbour lookup can time out into an ICMP error. (A dummy
// device would do the same, but not every kernel has one.)
func addVIPSink(h *Host) (string, error) {
	name := h.reserveIface("vips")
	peer := h.reserveIface("vips-off")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
	if err := h.nl.LinkAdd(veth); err != nil {
		return "", fmt.Errorf("lab: %s: veth %s: %w", h.short, name, err)
	}
	link, err := h.nl.LinkByName(name)
	if err != nil {
		return "", fmt.Errorf("lab: %s: find %s: %w", h.short, name, err)
	}
	if err := h.nl.LinkSetARPOff(link); err != nil {
		return "", fmt.Errorf("lab: %s: arp off on %s: %w", h.short, name, err)
	}
	if err := h.nl.LinkSetUp(link); err != nil {
		return "", fmt.Errorf("lab: %s: set %s up: %w", h.short, name, err)
	}
	for _, p := range []netip.Prefix{VIPNet4, VIPNet6} {
		r := &netlink.Route{Dst: prefixToIPNet(p), LinkIndex: link.Attrs().Index}
		if err := h.nl.RouteAdd(r); err != nil {
			return "", fmt.Errorf("lab: %s: route %s dev %s: %w", h.short, p, name, err)
		}
	}
	return name, nil
}
