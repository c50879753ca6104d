package lab

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
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

// pingSocket opens a raw ICMP socket of dst's family, bound to src when it
// is valid, in the namespace in which do runs its function (reads return
// the ICMP message, without the IP header); typ and proto are the echo
// request's type and the family's ICMP protocol number.
func pingSocket(do func(func() error) error, src, dst netip.Addr) (c *net.IPConn, typ icmp.Type, proto int, err error) {
	network, local, typ, proto := "ip4:icmp", "0.0.0.0", icmp.Type(ipv4.ICMPTypeEcho), 1
	if dst.Is6() {
		network, local, typ, proto = "ip6:ipv6-icmp", "::", ipv6.ICMPTypeEchoRequest, 58
	}
	if src.IsValid() {
		local = src.String()
	}
	err = do(func() error {
		pc, err := net.ListenPacket(network, local)
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
	c, typ, proto, err := pingSocket(do, netip.Addr{}, dst)
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

// PingFlood is a flood of echo requests under way (StartPingFlood).
type PingFlood struct {
	c       *net.IPConn
	n       int
	sent    atomic.Int64
	stop    chan struct{}
	over    chan struct{} // closed when the sender ended
	replies chan int      // the reader's count
	err     error         // the sender's, written before over is closed
	sending time.Duration // likewise
	ended   time.Time     // likewise
}

// StartPingFlood sends echo requests from src (when valid: an address of
// the namespace; else the kernel's choice) to dst, in the namespace in
// which do runs its function, as fast as the socket takes them, each its
// own flow for conntrack (request i has the identifier id + i and the
// sequence number i, both modulo 2^16), until n were sent or, with n 0,
// until Wait; and counts the echo replies that come back until none came
// for quiet after the sending.
func StartPingFlood(do func(func() error) error, src, dst netip.Addr, id, n int, quiet time.Duration) (*PingFlood, error) {
	c, typ, proto, err := pingSocket(do, src, dst)
	if err != nil {
		return nil, err
	}
	if err := c.SetReadBuffer(8 << 20); err != nil {
		c.Close()
		return nil, err
	}
	f := &PingFlood{c: c, n: n, stop: make(chan struct{}), over: make(chan struct{}), replies: make(chan int, 1)}
	go f.count(typ, proto, id, quiet)
	go f.send(typ, dst, id, n)
	return f, nil
}

// count counts the flood's echo replies until none came for quiet after
// the sender ended (or the socket is closed).
func (f *PingFlood) count(typ icmp.Type, proto, id int, quiet time.Duration) {
	got := 0
	buf := make([]byte, 1500)
	for {
		over, wait := f.sendingOver(), quiet
		if !over {
			wait = 100 * time.Millisecond // look at the sender again then
		}
		_ = f.c.SetReadDeadline(time.Now().Add(wait))
		m, _, err := f.c.ReadFrom(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) && !over {
			continue
		}
		if err != nil {
			f.replies <- got
			return
		}
		if msg, err := icmp.ParseMessage(proto, buf[:m]); err == nil {
			if e, ok := msg.Body.(*icmp.Echo); ok && msg.Type != typ && e.ID == (id+e.Seq)&0xffff && bytes.Equal(e.Data, pingPayload) {
				got++
			}
		}
	}
}

// send sends the requests.
func (f *PingFlood) send(typ icmp.Type, dst netip.Addr, id, n int) {
	start := time.Now()
	to := &net.IPAddr{IP: dst.AsSlice()}
sending:
	for seq := 0; n == 0 || seq < n; seq++ {
		select {
		case <-f.stop:
			break sending
		default:
		}
		msg, merr := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: (id + seq) & 0xffff, Seq: seq & 0xffff, Data: pingPayload}}).Marshal(nil)
		if merr == nil {
			_, merr = f.c.WriteTo(msg, to)
		}
		if merr != nil {
			f.err = fmt.Errorf("ping %s: %w", dst, merr)
			break sending
		}
		f.sent.Add(1)
	}
	f.ended = time.Now()
	f.sending = f.ended.Sub(start)
	close(f.over)
}

// Sending is closed when the flood sent its last request.
func (f *PingFlood) Sending() <-chan struct{} { return f.over }

func (f *PingFlood) sendingOver() bool {
	select {
	case <-f.over:
		return true
	default:
		return false
	}
}

// Ended is when the last request was sent (after Wait).
func (f *PingFlood) Ended() time.Time { return f.ended }

// Sent is how many requests were sent so far.
func (f *PingFlood) Sent() int { return int(f.sent.Load()) }

// Wait stops the sending (with n 0), waits for its end and for the count
// of the replies; sending is how long the requests took to send. It is
// called once.
func (f *PingFlood) Wait() (echoed, sent int, sending time.Duration, err error) {
	if f.n == 0 {
		close(f.stop)
	}
	<-f.over
	if f.err != nil {
		f.c.Close()
	}
	echoed = <-f.replies
	f.c.Close()
	return echoed, f.Sent(), f.sending, f.err
}
