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

// pingSocket opens a raw ICMP socket of dst's family in the namespace in
// which do runs its function (reads return the ICMP message, without the
// IP header); typ and proto are the echo request's type and the family's
// ICMP protocol number.
func pingSocket(do func(func() error) error, dst netip.Addr) (c *net.IPConn, typ icmp.Type, proto int, err error) {
	network, wildcard, typ, proto := "ip4:icmp", "0.0.0.0", icmp.Type(ipv4.ICMPTypeEcho), 1
	if dst.Is6() {
		network, wildcard, typ, proto = "ip6:ipv6-icmp", "::", ipv6.ICMPTypeEchoRequest, 58
	}
	err = do(func() error {
		pc, err := net.ListenPacket(network, wildcard)
		if err == nil {
			c = pc.(*net.IPConn)
		}
		return err
	})
	return c, typ, proto, err
}

// pingPayload is the data of every echo request sent.
var pingPayload = []byte("nftgate ping")

// Ping is Host.Ping from the namespace in which do runs its function.
func Ping(do func(func() error) error, dst netip.Addr, id, seq int, timeout time.Duration) (PingReply, error) {
	c, typ, proto, err := pingSocket(do, dst)
	if err != nil {
		return PingReply{}, err
	}
	defer c.Close()
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: pingPayload}}).Marshal(nil)
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
			if b.ID == id && b.Seq == seq && bytes.Equal(b.Data, pingPayload) {
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

// PingFlood sends n echo requests from the namespace in which do runs its
// function to dst, as fast as the socket takes them, each its own flow for
// conntrack (request i has the identifier id + i and the sequence number
// i), and counts the echo replies that come back until none came for
// quiet; sending is how long the requests took to send.
func PingFlood(do func(func() error) error, dst netip.Addr, id, n int, quiet time.Duration) (echoed int, sending time.Duration, err error) {
	c, typ, proto, err := pingSocket(do, dst)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if err := c.SetReadBuffer(8 << 20); err != nil {
		return 0, 0, err
	}
	replies := make(chan int, 1)
	go func() {
		got := 0
		buf := make([]byte, 1500)
		for {
			_ = c.SetReadDeadline(time.Now().Add(quiet))
			m, _, err := c.ReadFrom(buf)
			if err != nil { // quiet for that long, or closed
				replies <- got
				return
			}
			if msg, err := icmp.ParseMessage(proto, buf[:m]); err == nil {
				if e, ok := msg.Body.(*icmp.Echo); ok && msg.Type != typ && e.Seq < n && e.ID == (id+e.Seq)&0xffff && bytes.Equal(e.Data, pingPayload) {
					got++
				}
			}
		}
	}()
	start := time.Now()
	to := &net.IPAddr{IP: dst.AsSlice()}
	for seq := range n {
		msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: (id + seq) & 0xffff, Seq: seq, Data: pingPayload}}).Marshal(nil)
		if err == nil {
			_, err = c.WriteTo(msg, to)
		}
		if err != nil {
			c.Close()
			<-replies
			return 0, 0, fmt.Errorf("ping %s: %w", dst, err)
		}
	}
	sending = time.Since(start)
	return <-replies, sending, nil
}
