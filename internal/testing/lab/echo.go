package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The echo protocol: a client sends one line (anything, ending in '\n'); the
// server answers with one line, "<identity> <observed-remote-addr:port>\n",
// and closes (TCP). identity is the address:port the server listens on, so a
// test sees which backend answered and, from the second field, whether the
// client's source address was rewritten on the way. A TCP client that sends
// an HTTP request line instead gets the same line as an HTTP/1.0 response
// body, so curl works against the same servers.

// probeLine is what Dial sends; any line will do.
const probeLine = "nftgate-lab\n"

// echoReadTimeout bounds how long a server waits for a client's line.
const echoReadTimeout = 10 * time.Second

const maxLine = 8 << 10

// ServeEcho starts an echo server for proto ("tcp" or "udp") bound to addr
// inside the namespace. The address must be assigned to the host. The server
// runs until the returned Closer is closed or the lab is closed. Each server
// costs one socket and one goroutine while idle.
func (h *Host) ServeEcho(proto string, addr netip.AddrPort) (io.Closer, error) {
	if !addr.IsValid() {
		return nil, fmt.Errorf("lab: %s: echo server address %s is not valid", h.short, addr)
	}
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	identity := addr.String()
	var s io.Closer
	switch proto {
	case "tcp":
		ln, err := h.Listen("tcp", identity)
		if err != nil {
			return nil, fmt.Errorf("lab: %s: echo server tcp %s: %w", h.short, addr, err)
		}
		ts := &tcpEcho{ln: ln, identity: identity, conns: map[net.Conn]struct{}{}}
		ts.wg.Add(1)
		go ts.serve()
		s = ts
	case "udp":
		pc, err := h.ListenPacket("udp", identity)
		if err != nil {
			return nil, fmt.Errorf("lab: %s: echo server udp %s: %w", h.short, addr, err)
		}
		us := &udpEcho{pc: pc.(*net.UDPConn), identity: identity}
		us.wg.Add(1)
		go us.serve()
		s = us
	default:
		return nil, fmt.Errorf("lab: echo server protocol %q: want \"tcp\" or \"udp\"", proto)
	}
	if h.lab != nil && !h.lab.track(s) {
		s.Close()
		return nil, fmt.Errorf("lab %s: closed", h.lab.name)
	}
	return s, nil
}

type tcpEcho struct {
	ln       net.Listener
	identity string
	wg       sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	once   sync.Once
}

func (s *tcpEcho) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient accept errors (EMFILE, aborted handshakes): go on.
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handle(c)
	}
}

func (s *tcpEcho) handle(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(echoReadTimeout))
	r := bufio.NewReaderSize(c, 1024)
	// A client that half-closes without a newline still gets its answer.
	first, err := readLine(r)
	if err != nil && !errors.Is(err, io.EOF) {
		return
	}
	reply := s.identity + " " + addrPortOf(c.RemoteAddr()).String() + "\n"
	if isHTTPRequestLine(first) {
		// Skip the headers so that closing does not reset the connection.
		for {
			line, err := readLine(r)
			if err != nil || line == "" {
				break
			}
		}
		_, _ = fmt.Fprintf(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(reply), reply)
		return
	}
	_, _ = io.WriteString(c, reply)
}

// readLine returns one line without its "\n" or "\r\n".
func readLine(r *bufio.Reader) (string, error) {
	var buf []byte
	for {
		chunk, err := r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > maxLine {
			return "", fmt.Errorf("line longer than %d bytes", maxLine)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return strings.TrimRight(string(buf), "\r\n"), err
	}
}

func isHTTPRequestLine(line string) bool {
	f := strings.Fields(line)
	return len(f) == 3 && strings.HasPrefix(f[2], "HTTP/1.")
}

func (s *tcpEcho) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		err = s.ln.Close()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return err
}

type udpEcho struct {
	pc       *net.UDPConn
	identity string
	wg       sync.WaitGroup
	once     sync.Once
}

func (s *udpEcho) serve() {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := s.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// ICMP errors for earlier replies surface here: ignore them.
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		reply := s.identity + " " + from.String() + "\n"
		_, _ = s.pc.WriteToUDPAddrPort([]byte(reply), from)
	}
}

func (s *udpEcho) Close() error {
	var err error
	s.once.Do(func() {
		err = s.pc.Close()
		s.wg.Wait()
	})
	return err
}

// DialOpts tune Host.Dial.
type DialOpts struct {
	// Source, when valid, is the local address to send from; a zero port
	// lets the kernel pick one. The address must be assigned to the host.
	Source netip.AddrPort
	// Timeout bounds the whole exchange; zero means DefaultDialTimeout.
	Timeout time.Duration
	// PinCPU sends the connection's first packet from CPU: it then
	// crosses the hosts on the way on that CPU too (veth hands a packet
	// to the receiving namespace on the sending CPU).
	PinCPU bool
	CPU    int
	// Seqs, when not nil, receives a TCP connection's sequence numbers
	// once the server's reply and close have arrived, before the client
	// closes (TCP_REPAIR: CAP_NET_ADMIN).
	Seqs *TCPSeqs
}

// DefaultDialTimeout is the Dial timeout when DialOpts.Timeout is zero.
const DefaultDialTimeout = 2 * time.Second

// Reply is what an echo server told a client.
type Reply struct {
	// Backend is the identity of the server that answered: the
	// address:port it listens on, e.g. "198.18.2.10:8080" or
	// "[fd42:2::10]:8080" (netip.AddrPort.String form).
	Backend string
	// ObservedSource is the client address and port as the server saw it.
	ObservedSource netip.AddrPort
	// Local is the client socket's own address and port, to compare with
	// ObservedSource: they differ when the flow was masqueraded.
	Local netip.AddrPort
	// SYNRetransmits is how many times a TCP client sent its SYN again
	// before the connection was established (TCP_INFO's total_retrans
	// right after connect).
	SYNRetransmits int
}

// BackendAddrPort parses Backend.
func (r Reply) BackendAddrPort() (netip.AddrPort, error) {
	return netip.ParseAddrPort(r.Backend)
}

// Masqueraded reports whether the server saw a different source address
// than the client sent from.
func (r Reply) Masqueraded() bool {
	return r.ObservedSource.Addr() != r.Local.Addr()
}

// Dial sends one echo probe over proto ("tcp" or "udp") from inside the
// namespace to dst and returns the server's reply. Errors keep the
// underlying system error: use IsRefused and IsTimeout to tell a rejected
// flow from a dropped one. UDP uses a connected socket, so an ICMP
// unreachable for the probe surfaces as ECONNREFUSED (or EHOSTUNREACH).
func (h *Host) Dial(proto string, dst netip.AddrPort, opts DialOpts) (Reply, error) {
	if proto != "tcp" && proto != "udp" {
		return Reply{}, fmt.Errorf("lab: dial protocol %q: want \"tcp\" or \"udp\"", proto)
	}
	if !dst.IsValid() {
		return Reply{}, fmt.Errorf("lab: dial destination %s is not valid", dst)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline, Control: clientControl}
	if opts.Source.IsValid() {
		ip := opts.Source.Addr().Unmap().AsSlice()
		port := int(opts.Source.Port())
		if proto == "tcp" {
			d.LocalAddr = &net.TCPAddr{IP: ip, Port: port}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: ip, Port: port}
		}
	}
	fail := func(err error) (Reply, error) {
		return Reply{}, fmt.Errorf("lab: %s %s -> %s from %s: %w", proto, sourceText(opts.Source), dst, h.short, err)
	}
	var c net.Conn
	err := h.Do(func() (err error) {
		if opts.PinCPU {
			restore, perr := pinThread(opts.CPU)
			if perr != nil {
				return perr
			}
			defer func() { err = errors.Join(err, restore()) }()
		}
		c, err = d.Dial(proto, dst.String())
		return err
	})
	if err != nil {
		if c != nil {
			c.Close()
		}
		return fail(err)
	}
	defer c.Close()
	local := addrPortOf(c.LocalAddr())
	synRetrans := 0
	if tc, ok := c.(*net.TCPConn); ok {
		if synRetrans, err = totalRetrans(tc); err != nil {
			return fail(err)
		}
	}
	if err := c.SetDeadline(deadline); err != nil {
		return fail(err)
	}
	if _, err := io.WriteString(c, probeLine); err != nil {
		return fail(err)
	}
	var data []byte
	if proto == "tcp" {
		data, err = io.ReadAll(io.LimitReader(c, maxLine))
		if err != nil && len(data) == 0 {
			return fail(err)
		}
		if len(data) == 0 {
			return fail(io.ErrUnexpectedEOF)
		}
	} else {
		buf := make([]byte, maxLine)
		n, err := c.Read(buf)
		if err != nil {
			return fail(err)
		}
		data = buf[:n]
	}
	if tc, ok := c.(*net.TCPConn); ok && opts.Seqs != nil {
		if *opts.Seqs, err = tcpSeqs(tc); err != nil {
			return fail(err)
		}
	}
	rep, err := parseReply(data)
	if err != nil {
		return fail(err)
	}
	rep.Local = local
	rep.SYNRetransmits = synRetrans
	return rep, nil
}

func sourceText(s netip.AddrPort) string {
	if !s.IsValid() {
		return "(any)"
	}
	return s.String()
}

func parseReply(data []byte) (Reply, error) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) != 2 {
		return Reply{}, fmt.Errorf("malformed echo reply %q", data)
	}
	src, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Reply{}, fmt.Errorf("malformed echo reply %q: %w", data, err)
	}
	return Reply{Backend: f[0], ObservedSource: src}, nil
}

// reuseAddr lets a fixed client port be bound again right after an earlier
// exchange on it.
func reuseAddr(network, address string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// clientControl also asks for every ICMP error on the socket (IP_RECVERR).
// Without it a connected UDP socket only reports "hard" errors such as port
// unreachable, so network and host unreachable (a router without a route)
// would pass unseen and look like a drop. For TCP it matters for IPv6: an
// ICMPv6 error that comes back while connect still holds the socket (as it
// does between namespaces on one machine) is only kept as a soft error until
// the SYN is resent a second later; with the error queued the pending
// connect wakes at once and reads it.
func clientControl(network, address string, rc syscall.RawConn) error {
	if err := reuseAddr(network, address, rc); err != nil {
		return err
	}
	var serr error
	err := rc.Control(func(fd uintptr) {
		if strings.HasSuffix(network, "6") {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_RECVERR, 1)
		} else {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

func addrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// IsRefused reports whether err says the flow was rejected: a TCP reset or
// an ICMP/ICMPv6 unreachable (port, host, network, or administratively
// prohibited), as nftables "reject" and routers without a route produce.
func IsRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, syscall.EACCES) // ICMPv6 administratively prohibited
}

// IsTimeout reports whether err says nothing came back before the deadline,
// as when the flow was dropped.
func IsTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// pinThread runs the calling OS thread (locked to its goroutine) on cpu
// only, until the returned function puts its former CPUs back.
func pinThread(cpu int) (restore func() error, err error) {
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return nil, fmt.Errorf("CPUs of the thread: %w", err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return nil, fmt.Errorf("pin the thread to CPU %d: %w", cpu, err)
	}
	return func() error {
		if err := unix.SchedSetaffinity(0, &old); err != nil {
			return fmt.Errorf("unpin the thread from CPU %d: %w", cpu, err)
		}
		return nil
	}, nil
}

// totalRetrans reads a TCP socket's count of retransmitted segments.
func totalRetrans(c *net.TCPConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return 0, err
	}
	if ierr != nil {
		return 0, fmt.Errorf("TCP_INFO: %w", ierr)
	}
	return int(info.Total_retrans), nil
}
