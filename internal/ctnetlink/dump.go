package ctnetlink

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Dial opens a conntrack netlink socket in the network namespace netNS (a
// file descriptor; 0: the current one) with a receive buffer of rcvbuf
// bytes: SO_RCVBUFFORCE, which passes net.core.rmem_max (CAP_NET_ADMIN),
// or without the capability the plain option, which gives what the limit
// allows.
func Dial(netNS, rcvbuf int) (*netlink.Conn, syscall.RawConn, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netNS})
	if err != nil {
		return nil, nil, fmt.Errorf("open conntrack netlink socket: %w", err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("conntrack netlink socket: %w", err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf)
		if serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
		}
	}); err == nil && serr != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("receive buffer of %d bytes: %w", rcvbuf, serr)
	}
	return conn, raw, nil
}

// DumpFilter is what a dump asks the kernel to leave out: an entry is
// written only if its mark & MarkMask is Mark and its status & StatusMask
// is Status (a zero mask: no such filter). A kernel older than the status
// filter (CTA_STATUS_MASK) ignores it: callers check what they need.
type DumpFilter struct {
	Mark, MarkMask     uint32
	Status, StatusMask uint32
}

// dumpBuffer holds the largest datagram of a dump (the kernel's are at
// most 32 KiB) several times over.
const dumpBuffer = 1 << 17

// Dump reads the conntrack table of the network namespace netNS (0: the
// current one), both address families, and calls fn with each entry's
// message (from its netlink header on; valid during the call only), as
// the kernel writes them: nothing is decoded or allocated per entry.
func Dump(netNS int, f DumpFilter, fn func(msg []byte)) error {
	conn, raw, err := Dial(netNS, 4<<20)
	if err != nil {
		return err
	}
	defer conn.Close()
	req := dumpRequest(f)
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil || serr != nil {
		return fmt.Errorf("dump conntrack: %w", errors.Join(err, serr))
	}
	buf := make([]byte, dumpBuffer)
	for {
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf) // the socket does not block
			return rerr != unix.EAGAIN
		}); err != nil {
			return fmt.Errorf("dump conntrack: %w", err)
		}
		if rerr != nil {
			return fmt.Errorf("dump conntrack: %w", rerr)
		}
		done, err := dumpMessages(buf[:n], fn)
		if err != nil {
			return fmt.Errorf("dump conntrack: %w", err)
		}
		if done {
			return nil
		}
	}
}

// dumpRequest is the dump's one message: IPCTNL_MSG_CT_GET with NLM_F_DUMP,
// family AF_UNSPEC, and the filter's attributes.
func dumpRequest(f DumpFilter) []byte {
	b := make([]byte, 0, 64)
	b = binary.NativeEndian.AppendUint32(b, 0) // length, below
	b = binary.NativeEndian.AppendUint16(b, Subsys<<8|MsgGet)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	b = binary.NativeEndian.AppendUint32(b, 1) // sequence
	b = binary.NativeEndian.AppendUint32(b, 0) // port: the kernel's
	b = append(b, unix.AF_UNSPEC, NFNetlinkV0, 0, 0)
	attr := func(typ uint16, v uint32) {
		b = binary.NativeEndian.AppendUint16(b, 8)
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.BigEndian.AppendUint32(b, v)
	}
	if f.MarkMask != 0 {
		attr(Mark, f.Mark)
		attr(MarkMask, f.MarkMask)
	}
	if f.StatusMask != 0 {
		attr(Status, f.Status)
		attr(StatusMask, f.StatusMask)
	}
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	return b
}

// NlmsgHdrLen is sizeof(struct nlmsghdr).
const NlmsgHdrLen = 16

// Messages calls fn with the type and the bytes (from the header on) of
// each netlink message of the datagram b, until fn returns false. A
// message whose length does not fit ends the walk with an error: what
// came before it was handed over.
func Messages(b []byte, fn func(typ uint16, msg []byte) (more bool)) error {
	for len(b) >= NlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < NlmsgHdrLen || l > len(b) {
			return fmt.Errorf("malformed netlink message (length %d, %d bytes left)", l, len(b))
		}
		if !fn(binary.NativeEndian.Uint16(b[4:6]), b[:l]) {
			return nil
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return nil
}

// dumpMessages hands fn the messages of one datagram of a dump; done at
// its end (NLMSG_DONE), an error for an NLMSG_ERROR that is not 0.
func dumpMessages(b []byte, fn func(msg []byte)) (done bool, err error) {
	werr := Messages(b, func(typ uint16, msg []byte) bool {
		switch typ {
		case unix.NLMSG_DONE:
			done = true
		case unix.NLMSG_ERROR:
			if len(msg) >= NlmsgHdrLen+4 {
				if code := int32(binary.NativeEndian.Uint32(msg[NlmsgHdrLen:])); code != 0 {
					done, err = true, unix.Errno(-code)
				}
			}
		default:
			fn(msg)
		}
		return !done
	})
	return done, cmp.Or(err, werr)
}
