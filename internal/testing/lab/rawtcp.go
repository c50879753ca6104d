package lab

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// TCPSeqs are a TCP socket's sequence numbers: Next, the next one it sends
// (its FIN, once it closes, takes Next and the segments after it Next+1),
// and Acked, the next one it expects from its peer.
type TCPSeqs struct{ Next, Acked uint32 }

// The queues of TCP_REPAIR_QUEUE (linux/tcp.h).
const (
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// tcpSeqs reads c's sequence numbers through TCP_REPAIR (CAP_NET_ADMIN),
// leaving repair mode without the window probe that leaving it otherwise
// sends.
func tcpSeqs(c *net.TCPConn) (TCPSeqs, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return TCPSeqs{}, err
	}
	var s TCPSeqs
	var serr error
	err = raw.Control(func(fd uintptr) {
		f := int(fd)
		read := func(queue int) uint32 {
			if serr != nil {
				return 0
			}
			if serr = unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, queue); serr != nil {
				return 0
			}
			v, err := unix.GetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
			serr = err
			return uint32(v)
		}
		if serr = unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_ON); serr != nil {
			return
		}
		s.Next = read(tcpSendQueue)
		s.Acked = read(tcpRecvQueue)
		if err := unix.SetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF_NO_WP); serr == nil {
			serr = err
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return TCPSeqs{}, fmt.Errorf("TCP_REPAIR: %w", err)
	}
	return s, nil
}

// TCP header flags.
const (
	TCPFin byte = 0x01
	TCPSyn byte = 0x02
	TCPRst byte = 0x04
	TCPAck byte = 0x10
)

// SendTCP sends one TCP segment without payload from src to dst through a
// raw socket in h, as if a socket bound to src had sent it: what a host
// sends for a connection it has already closed (a late ACK, a FIN sent
// again), which no socket API makes.
func (h *Host) SendTCP(src, dst netip.AddrPort, seq, ack uint32, flags byte) error {
	return SendTCPIn(h.Do, h.String(), src, dst, seq, ack, flags)
}

// SendTCPIn is SendTCP for any namespace: do runs a function inside it
// (the raw socket is made there), where names it in errors.
func SendTCPIn(do func(func() error) error, where string, src, dst netip.AddrPort, seq, ack uint32, flags byte) error {
	if src.Addr().Is4() != dst.Addr().Is4() {
		return fmt.Errorf("lab: TCP segment from %s to %s: families differ", src, dst)
	}
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], src.Port())
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], seq)
	binary.BigEndian.PutUint32(seg[8:], ack)
	seg[12] = 5 << 4
	seg[13] = flags
	binary.BigEndian.PutUint16(seg[14:], 64240)
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src.Addr(), dst.Addr(), seg))

	fam := unix.AF_INET6
	if src.Addr().Is4() {
		fam = unix.AF_INET
	}
	return do(func() error {
		fd, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("lab: raw TCP socket in %s: %w", where, err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, sockaddr(src.Addr())); err != nil {
			return fmt.Errorf("lab: raw TCP socket in %s, bind %s: %w", where, src.Addr(), err)
		}
		if err := unix.Sendto(fd, seg, 0, sockaddr(dst.Addr())); err != nil {
			return fmt.Errorf("lab: TCP segment %s -> %s from %s: %w", src, dst, where, err)
		}
		return nil
	})
}

// tcpChecksum is the Internet checksum of seg with the pseudo-header of
// src and dst (RFC 9293, 3.1; RFC 8200, 8.1).
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	sum += unix.IPPROTO_TCP + uint32(len(seg))
	add(seg)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
