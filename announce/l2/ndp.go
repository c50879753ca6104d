package l2

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// Offsets in an Ethernet frame carrying IPv6.
const (
	ethHeaderLen  = 14
	ip6HeaderLen  = 40
	offNextHeader = ethHeaderLen + 6
	offICMPType   = ethHeaderLen + ip6HeaderLen
)

// nsFilter keeps, in the kernel, only the IPv6 frames whose next header is
// ICMPv6 and whose ICMPv6 type is neighbour solicitation: the packet
// socket sees no other traffic.
var nsFilter = func() []bpf.RawInstruction {
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: offNextHeader, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6, SkipTrue: 3},
		bpf.LoadAbsolute{Off: offICMPType, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(ipv6.ICMPTypeNeighborSolicitation), SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		panic(err)
	}
	return raw
}()

// listenNDP opens the two IPv6 sockets of ifi: an ICMPv6 socket bound to
// its link-local address that sends the advertisements (with hop limit
// 255, checksummed by the kernel) and holds the solicited-node group
// memberships, and a packet socket that receives the solicitations.
//
// Solicitations are read from the packet socket, not the ICMPv6 socket:
// the ICMPv6 socket only sees packets the kernel delivers locally, and a
// unicast solicitation (neighbour unreachability detection: a client
// re-checking an address it has cached) is addressed to the Service
// address itself, which the kernel forwards or drops. Answering only the
// multicast ones makes clients fail NUD and lose the address until their
// next multicast solicitation.
func listenNDP(ifi *net.Interface) (*ndp.Conn, *packet.Conn, error) {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, nil, err
	}
	// Nothing is read from the ICMPv6 socket: let nothing queue there.
	var f ipv6.ICMPFilter
	f.SetAll(true)
	if err := c.SetICMPFilter(&f); err != nil {
		c.Close()
		return nil, nil, err
	}
	p, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_IPV6, &packet.Config{Filter: nsFilter})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, p, nil
}

// serveNDP answers the neighbour solicitations for announced addresses on
// ifc until its socket is closed.
func (a *Announcer) serveNDP(ifc *iface) {
	buf := make([]byte, ifc.ifi.MTU+ethHeaderLen)
	for {
		n, _, err := ifc.ns.ReadFrom(buf)
		if err != nil {
			if a.readFailed(ifc, "ndp", err) {
				return
			}
			continue
		}
		src, ns, ok := parseSolicitation(buf[:n], ifc.ifi.HardwareAddr)
		if !ok || !a.announced(ns.TargetAddress) {
			continue
		}
		if err := ifc.solicitedNA(src, ns.TargetAddress); err != nil {
			a.log.Warn("l2: neighbour advertisement", "interface", ifc.ifi.Name, "address", ns.TargetAddress, "to", src, "error", err)
			continue
		}
		a.answered.WithLabelValues(ifc.ifi.Name, "ipv6").Inc()
	}
}

// parseSolicitation returns the source address and the message of a valid
// neighbour solicitation (RFC 4861 7.1.1) in the Ethernet frame b, which
// did not come from own (the packet socket also sees what this host
// sends).
func parseSolicitation(b []byte, own net.HardwareAddr) (netip.Addr, *ndp.NeighborSolicitation, bool) {
	if len(b) < offICMPType || bytes.Equal(b[6:12], own) {
		return netip.Addr{}, nil, false
	}
	h, err := ipv6.ParseHeader(b[ethHeaderLen:])
	if err != nil || h.NextHeader != unix.IPPROTO_ICMPV6 || h.HopLimit != ndp.HopLimit {
		return netip.Addr{}, nil, false
	}
	end := offICMPType + h.PayloadLen
	if end > len(b) {
		return netip.Addr{}, nil, false
	}
	m, err := ndp.ParseMessage(b[offICMPType:end])
	if err != nil {
		return netip.Addr{}, nil, false
	}
	ns, ok := m.(*ndp.NeighborSolicitation)
	if !ok {
		return netip.Addr{}, nil, false
	}
	src, _ := netip.AddrFromSlice(h.Src)
	dst, _ := netip.AddrFromSlice(h.Dst)
	if src.IsUnspecified() {
		// Duplicate address detection: sent to the solicited-node group,
		// with no source link-layer address option.
		snm, _ := ndp.SolicitedNodeMulticast(ns.TargetAddress)
		if dst != snm {
			return netip.Addr{}, nil, false
		}
		for _, o := range ns.Options {
			if _, ok := o.(*ndp.LinkLayerAddress); ok {
				return netip.Addr{}, nil, false
			}
		}
	}
	return src, ns, true
}

// solicitedNA answers a solicitation from src for target: to src with the
// solicited flag, or, for duplicate address detection (src ::), to all
// nodes without it (RFC 4861 7.2.4). Override is set (this gateway is the
// address's owner), router is not (a Service address is no router), and
// the target link-layer address option carries the interface's MAC.
func (ifc *iface) solicitedNA(src, target netip.Addr) error {
	if src.IsUnspecified() {
		return ifc.writeNA(target, netip.IPv6LinkLocalAllNodes(), false)
	}
	return ifc.writeNA(target, src, true)
}

// unsolicitedNA tells all nodes of the segment that ad is at this
// interface's MAC (override set, so their caches take it).
func (ifc *iface) unsolicitedNA(ad netip.Addr) error {
	return ifc.writeNA(ad, netip.IPv6LinkLocalAllNodes(), false)
}

func (ifc *iface) writeNA(target, dst netip.Addr, solicited bool) error {
	na := &ndp.NeighborAdvertisement{
		Router:        false,
		Solicited:     solicited,
		Override:      true,
		TargetAddress: target,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Target,
			Addr:      ifc.ifi.HardwareAddr,
		}},
	}
	if err := ifc.ndp.WriteTo(na, nil, dst); err != nil {
		return fmt.Errorf("to %s: %w", dst, err)
	}
	return nil
}
