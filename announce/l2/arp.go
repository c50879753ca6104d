package l2

import (
	"bytes"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// listenARP opens a packet socket for ARP frames on ifi. (arp.Client would
// insist on an IPv4 address on the interface, which an edge interface
// carrying only Service addresses need not have.)
func listenARP(ifi *net.Interface) (*packet.Conn, error) {
	return packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, nil)
}

// serveARP answers the ARP requests for announced addresses on ifc until
// its socket is closed.
func (a *Announcer) serveARP(ifc *iface) {
	buf := make([]byte, ifc.ifi.MTU+14)
	for {
		n, _, err := ifc.arp.ReadFrom(buf)
		if err != nil {
			if a.readFailed(ifc, "arp", err) {
				return
			}
			continue
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil {
			continue
		}
		var req arp.Packet
		if req.UnmarshalBinary(f.Payload) != nil || req.Operation != arp.OperationRequest {
			continue
		}
		// Our own gratuitous requests come back on the packet socket;
		// another host's announcement (sender = target) asks nothing.
		if bytes.Equal(req.SenderHardwareAddr, ifc.ifi.HardwareAddr) || req.SenderIP == req.TargetIP {
			continue
		}
		if !a.announced(req.TargetIP) {
			continue
		}
		reply, err := arp.NewPacket(arp.OperationReply, ifc.ifi.HardwareAddr, req.TargetIP, req.SenderHardwareAddr, req.SenderIP)
		if err == nil {
			err = ifc.writeARP(reply, f.Source)
		}
		if err != nil {
			a.log.Warn("l2: ARP reply", "interface", ifc.ifi.Name, "address", req.TargetIP, "to", req.SenderIP, "error", err)
			continue
		}
		a.answered.WithLabelValues(ifc.ifi.Name, "ipv4").Inc()
	}
}

// gratuitousARP broadcasts an ARP announcement (RFC 5227: a request whose
// sender and target are ad), which updates the neighbour caches of the
// segment that hold ad.
func (ifc *iface) gratuitousARP(ad netip.Addr) error {
	p, err := arp.NewPacket(arp.OperationRequest, ifc.ifi.HardwareAddr, ad, make(net.HardwareAddr, 6), ad)
	if err != nil {
		return err
	}
	return ifc.writeARP(p, ethernet.Broadcast)
}

func (ifc *iface) writeARP(p *arp.Packet, dst net.HardwareAddr) error {
	pb, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	f := ethernet.Frame{Destination: dst, Source: ifc.ifi.HardwareAddr, EtherType: ethernet.EtherTypeARP, Payload: pb}
	fb, err := f.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = ifc.arp.WriteTo(fb, &packet.Addr{HardwareAddr: dst})
	return err
}
