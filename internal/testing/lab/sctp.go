package lab

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP in a lab: the kernels here have SCTP conntrack and NAT but often no
// SCTP sockets (CONFIG_IP_SCTP off, and Go has no SCTP API anyway), so the
// hosts speak SCTP through raw IP sockets, one packet of one chunk at a
// time: enough to play both ends of an association through a gateway.

// SCTP chunk types (RFC 9260, section 3.2).
const (
	SCTPData       byte = 0
	SCTPInit       byte = 1
	SCTPInitAck    byte = 2
	SCTPCookieEcho byte = 10
	SCTPCookieAck  byte = 11
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SCTPPacket builds an SCTP packet with one chunk; the checksum is CRC32c,
// stored little-endian as the kernel does.
func SCTPPacket(sport, dport uint16, vtag uint32, chunkType byte, body []byte) []byte {
	b := make([]byte, 12+4+len(body), 12+4+len(body)+3)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], vtag)
	b[12] = chunkType
	binary.BigEndian.PutUint16(b[14:], uint16(4+len(body)))
	copy(b[16:], body)
	for len(b)%4 != 0 { // chunks are padded to 4 bytes
		b = append(b, 0)
	}
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// SCTPInitBody is the fixed part of an INIT or INIT-ACK chunk with
// initiate tag tag, plus params.
func SCTPInitBody(tag uint32, params ...byte) []byte {
	b := make([]byte, 16, 16+len(params))
	binary.BigEndian.PutUint32(b[0:], tag)      // initiate tag
	binary.BigEndian.PutUint32(b[4:], 65536)    // a_rwnd
	binary.BigEndian.PutUint16(b[8:], 1)        // outbound streams
	binary.BigEndian.PutUint16(b[10:], 1)       // inbound streams
	binary.BigEndian.PutUint32(b[12:], tag+100) // initial TSN
	return append(b, params...)
}

// SCTPDataBody is a DATA chunk's body: TSN tsn on stream 0, then payload.
func SCTPDataBody(tsn uint32, payload []byte) []byte {
	b := make([]byte, 12, 12+len(payload))
	binary.BigEndian.PutUint32(b[0:], tsn)
	return append(b, payload...)
}

// SCTPIn is one received SCTP packet.
type SCTPIn struct {
	Src, Dst     netip.Addr
	Sport, Dport uint16
	VTag         uint32
	Chunk        byte
	// Body is the first chunk's value, without its header.
	Body []byte
}

// InitTag is the initiate tag of an INIT or INIT-ACK.
func (in SCTPIn) InitTag() uint32 {
	if len(in.Body) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(in.Body)
}

// RawSCTP is a raw IP socket for SCTP in one host.
type RawSCTP struct {
	fd int
	v6 bool
}

// RawSCTP opens a raw SCTP socket of the family of v6 in h, with a receive
// timeout so that reads wake up to check their deadline. The caller closes
// it.
func (h *Host) RawSCTP(v6 bool) (*RawSCTP, error) {
	fam := unix.AF_INET
	if v6 {
		fam = unix.AF_INET6
	}
	fd := -1
	if err := h.Do(func() error {
		var err error
		fd, err = unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		return err
	}); err != nil {
		return nil, fmt.Errorf("lab: raw SCTP socket in %s: %w", h, err)
	}
	r := &RawSCTP{fd: fd, v6: v6}
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err == nil && v6 {
		// An IPv6 raw socket gets no IP header: the destination comes
		// as ancillary data.
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("lab: raw SCTP socket in %s: %w", h, err)
	}
	return r, nil
}

// Close closes the socket.
func (r *RawSCTP) Close() error { return unix.Close(r.fd) }

func sockaddr(a netip.Addr) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Addr: a.As16()}
}

// Bind makes a the source of what the socket sends and the only
// destination it receives.
func (r *RawSCTP) Bind(a netip.Addr) error { return unix.Bind(r.fd, sockaddr(a)) }

// Send sends pkt (an SCTP packet) to the address to.
func (r *RawSCTP) Send(to netip.Addr, pkt []byte) error {
	return unix.Sendto(r.fd, pkt, 0, sockaddr(to))
}

// Recv reads packets until one satisfies match or the deadline passes.
func (r *RawSCTP) Recv(deadline time.Time, match func(SCTPIn) bool) (SCTPIn, error) {
	buf := make([]byte, 2048)
	oob := make([]byte, 128)
	for time.Now().Before(deadline) {
		n, oobn, _, from, err := unix.Recvmsg(r.fd, buf, oob, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return SCTPIn{}, err
		}
		var in SCTPIn
		p := buf[:n]
		if r.v6 {
			if sa, ok := from.(*unix.SockaddrInet6); ok {
				in.Src = netip.AddrFrom16(sa.Addr)
			}
			cms, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, cm := range cms {
				if cm.Header.Level == unix.IPPROTO_IPV6 && cm.Header.Type == unix.IPV6_PKTINFO && len(cm.Data) >= 16 {
					in.Dst = netip.AddrFrom16([16]byte(cm.Data[:16]))
				}
			}
		} else {
			ihl := int(p[0]&0x0f) * 4
			if n < ihl {
				continue
			}
			in.Src, in.Dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
			p = p[ihl:]
		}
		if len(p) < 16 {
			continue
		}
		l := int(binary.BigEndian.Uint16(p[14:]))
		if l < 4 || 12+l > len(p) {
			continue
		}
		in.Sport, in.Dport = binary.BigEndian.Uint16(p[0:]), binary.BigEndian.Uint16(p[2:])
		in.VTag, in.Chunk = binary.BigEndian.Uint32(p[4:]), p[12]
		in.Body = append([]byte(nil), p[16:12+l]...)
		if match(in) {
			return in, nil
		}
	}
	return SCTPIn{}, fmt.Errorf("nothing matching before the deadline: %w", os.ErrDeadlineExceeded)
}
