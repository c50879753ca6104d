package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSoOriginalDst = 80

// originalDst is where a redirected connection was going before the rules
// redirected it, as conntrack keeps it (SO_ORIGINAL_DST; the kernel answers
// it for the socket's own family only).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	v6 := c.LocalAddr().(*net.TCPAddr).IP.To4() == nil
	var out netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v6 {
			var sa unix.RawSockaddrInet6
			n := uint32(unsafe.Sizeof(sa))
			serr = getsockopt(fd, unix.SOL_IPV6, ip6tSoOriginalDst, unsafe.Pointer(&sa), &n)
			port := uint16(sa.Port>>8 | sa.Port<<8)
			out = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
			return
		}
		var sa unix.RawSockaddrInet4
		n := uint32(unsafe.Sizeof(sa))
		serr = getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), &n)
		port := uint16(sa.Port>>8 | sa.Port<<8)
		out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	return out, nil
}

func getsockopt(fd uintptr, level, name int, v unsafe.Pointer, n *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(name), uintptr(v), uintptr(unsafe.Pointer(n)), 0)
	if e != 0 {
		return e
	}
	return nil
}
