package lab

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// PingReply is what came back for one echo request: an echo reply, or an
// ICMP error about the request (destination unreachable, time exceeded).
type PingReply struct {
	From netip.Addr
	Type icmp.Type
	Code int
}

// Echoed tells whether the answer is an echo reply.
func (r PingReply) Echoed() bool {
	return r.Type == ipv4.ICMPTypeEchoReply || r.Type == ipv6.ICMPTypeEchoReply
}

func (r PingReply) String() string { return fmt.Sprintf("%v code %d from %s", r.Type, r.Code, r.From) }

// Ping sends one ICMP echo request (id, seq) from inside the namespace to
// dst on a raw socket and returns the first answer about it, or an error
// when none came within timeout.
func (h *Host) Ping(dst netip.Addr, id, seq int, timeout time.Duration) (PingReply, error) {
	return Ping(h.Do, dst, id, seq, timeout)
}

// Ping is Host.Ping from the namespace in which do runs its function.
func Ping(do func(func() error) error, dst netip.Addr, id, seq int, timeout time.Duration) (PingReply, error) {
	network, wildcard, typ, proto := "ip4:icmp", "0.0.0.0", icmp.Type(ipv4.ICMPTypeEcho), 1
	if dst.Is6() {
		network, wildcard, typ, proto = "ip6:ipv6-icmp", "::", ipv6.ICMPTypeEchoRequest, 58
	}
	var c *icmp.PacketConn
	if err := do(func() (err error) {
		c, err = icmp.ListenPacket(network, wildcard)
		return err
	}); err != nil {
		return PingReply{}, err
	}
	defer c.Close()
	payload := []byte("nftgate ping")
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}).Marshal(nil)
	if err != nil {
		return PingReply{}, err
	}
	if _, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return PingReply{}, fmt.Errorf("ping %s: %w", dst, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return PingReply{}, err
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return PingReply{}, fmt.Errorf("ping %s: no answer in %v", dst, timeout)
		}
		if err != nil {
			return PingReply{}, fmt.Errorf("ping %s: %w", dst, err)
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		reply := PingReply{From: src.Unmap(), Type: m.Type, Code: m.Code}
		var inner []byte // the request's header and start, quoted in an error
		switch b := m.Body.(type) {
		case *icmp.Echo:
			if b.ID == id && b.Seq == seq && bytes.Equal(b.Data, payload) {
				return reply, nil
			}
			continue
		case *icmp.DstUnreach:
			inner = b.Data
		case *icmp.TimeExceeded:
			inner = b.Data
		default:
			continue
		}
		if quotesRequest(inner, dst, id, seq) {
			return reply, nil
		}
	}
}

// quotesRequest tells whether an ICMP error's quoted packet is the echo
// request (id, seq) to dst.
func quotesRequest(b []byte, dst netip.Addr, id, seq int) bool {
	var hdr int
	var to netip.Addr
	switch {
	case dst.Is4() && len(b) >= 20:
		hdr = int(b[0]&0x0f) * 4
		to, _ = netip.AddrFromSlice(b[16:20])
	case dst.Is6() && len(b) >= 40:
		hdr = 40
		to, _ = netip.AddrFromSlice(b[24:40])
	default:
		return false
	}
	if to != dst || len(b) < hdr+8 {
		return false
	}
	echo := b[hdr:]
	return int(echo[4])<<8|int(echo[5]) == id && int(echo[6])<<8|int(echo[7]) == seq
}
