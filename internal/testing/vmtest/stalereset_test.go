//go:build customkernel

package vmtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// TestApplianceStaleResetBeforeSynAck: a backend's reset that does not
// acknowledge a new connection's SYN, arriving at the gateway before the
// backend's SYN/ACK, leaves the connection alone, and a reset that does (a
// refusal) still ends it. Such a reset is how a backend answers a late
// segment of the connection before on the same tuple (the client's ACK of
// a FIN, after nftgate's release reset the backend's TIME_WAIT), which
// conntrack has just reopened for the new SYN; the client drops it (RFC
// 9293, 3.10.7.3), and a conntrack that took it deleted the new entry, so
// the SYN/ACK behind it found none, went to the gateway's own stack, was
// answered with a reset, and the client sent its SYN again a second
// later: a stall with no conntrack drop anywhere, seen on the appliance
// with two vCPUs (docs/design/dataplane.md, "A reset for the connection
// before"). The custom kernel carries the fix
// (image/kernel/patches/0002-*).
//
// The test is the backend: the cluster namespace drops the SYNs the VM
// sends to the Service's endpoint before its own TCP sees them, reads them
// from a packet socket on its link, and answers them with segments it
// writes itself through a raw socket. The client is a real socket in the
// client namespace connecting to the Service through nftgate's DNAT and
// masquerade.
func TestApplianceStaleResetBeforeSynAck(t *testing.T) {
	vm, client, cluster := bootFlowtableOff(t, "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A real backend until the Service answers.
	backend := netip.MustParseAddrPort(net.JoinHostPort(clusterIP, flowPort))
	l, err := cluster.Listen("tcp", backend.String())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	service := net.JoinHostPort(flowServiceIP, flowPort)
	if err := waitDial(ctx, vm, client, service); err != nil {
		l.Close()
		t.Fatalf("%s from the client namespace: %v", service, err)
	}
	l.Close()

	// From here the test answers the SYNs.
	nft := exec.CommandContext(ctx, "ip", "netns", "exec", cluster.Name, "nft", "-f", "-")
	nft.Stdin = strings.NewReader("table ip stale-reset-test {\n" +
		"\tchain prerouting {\n" +
		"\t\ttype filter hook prerouting priority raw; policy accept;\n" +
		"\t\ttcp dport " + flowPort + " tcp flags & (syn | ack) == syn drop\n" +
		"\t}\n}\n")
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v\n%s", cluster.Name, err, out)
	}
	segs := readSegments(ctx, t, cluster, "vm-eth1", netip.MustParseAddr(vmClusterAddr), backend)
	send := func(dst netip.AddrPort, seq, ack uint32, flags byte) {
		t.Helper()
		if err := lab.SendTCPIn(cluster.Do, cluster.Name, backend, dst, seq, ack, flags); err != nil {
			t.Fatal(err)
		}
	}
	dial := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			dctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			c, err := client.DialContext(dctx, "tcp", service)
			if err == nil {
				c.Close()
			}
			done <- err
		}()
		return done
	}
	firstSYN := func() tcpSegment {
		t.Helper()
		for {
			select {
			case s := <-segs:
				if s.flags&(lab.TCPSyn|lab.TCPAck) == lab.TCPSyn {
					return s
				}
			case <-ctx.Done():
				t.Fatalf("no SYN from the VM to %s: %v", backend, ctx.Err())
			}
		}
	}

	// A reset that does not acknowledge the SYN (another connection's
	// sequence number, no ACK), then the SYN/ACK: the connection opens on
	// its first SYN.
	done := dial()
	syn := firstSYN()
	t.Logf("the SYN at the backend: %v", syn)
	send(syn.src, 0x5eed0001, 0, lab.TCPRst)
	send(syn.src, 0x10000000, syn.seq+1, lab.TCPSyn|lab.TCPAck)
	for waiting := true; waiting; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the connection to %s after a reset without ACK and the SYN/ACK: %v", service, err)
			}
			waiting = false
		case s := <-segs:
			switch {
			case s.src == syn.src && s.flags&lab.TCPRst != 0:
				t.Fatalf("the VM answered the SYN/ACK with a reset (%v): the reset without ACK before it had deleted the connection's conntrack entry", s)
			case s.src == syn.src && s.flags&(lab.TCPSyn|lab.TCPAck) == lab.TCPSyn:
				t.Fatalf("the client sent its SYN again (%v): its SYN/ACK never reached it", s)
			}
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}

	// A refusal (reset with the ACK of the SYN, sequence number 0, as
	// Linux answers a SYN to a closed port) still ends the connection.
	done = dial()
	syn = firstSYN()
	t.Logf("the next SYN at the backend: %v", syn)
	send(syn.src, 0, syn.seq+1, lab.TCPRst|lab.TCPAck)
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("the connection to %s after a reset acknowledging its SYN: %v, want connection refused", service, err)
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// bootFlowtableOff boots the flowtable-off image (nftgate's default
// configuration on the custom kernel) between a client and a cluster
// namespace, once root and the tools (besides QEMU and ip) are there.
func bootFlowtableOff(t *testing.T, tools ...string) (vm *VM, client, cluster *Netns) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and tap devices")
	}
	for _, tool := range append([]string{"qemu-system-x86_64", "ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (make vmtest-flowtable installs what it needs): %v", tool, err)
		}
	}
	image := os.Getenv("NFTGATE_VMTEST_FLOWTABLE_OFF")
	if image == "" {
		t.Fatal("no image: run make vmtest-flowtable, which builds the kernel and the images")
	}
	client = newNetns(t, "client")
	cluster = newNetns(t, "cluster")
	return bootVM(t, image, client, cluster), client, cluster
}

// tcpSegment is what readSegments reports of a TCP segment.
type tcpSegment struct {
	src, dst netip.AddrPort
	seq, ack uint32
	flags    byte
}

func (s tcpSegment) String() string {
	return fmt.Sprintf("%s > %s flags %#02x seq %d ack %d", s.src, s.dst, s.flags, s.seq, s.ack)
}

// readSegments reads the IPv4 TCP segments arriving on dev in ns from the
// address from to the address and port to, through a packet socket (it
// sees them before the namespace's netfilter), until the test ends.
func readSegments(ctx context.Context, t *testing.T, ns *Netns, dev string, from netip.Addr, to netip.AddrPort) <-chan tcpSegment {
	t.Helper()
	var pc *packet.Conn
	if err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		pc, err = packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, nil)
		return err
	}); err != nil {
		t.Fatalf("packet socket on %s in %s: %v", dev, ns.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	stop := context.AfterFunc(ctx, func() { pc.SetReadDeadline(time.Now()) })
	t.Cleanup(func() { stop() })
	out := make(chan tcpSegment, 64)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s, ok := parseTCPv4(buf[:n])
			if !ok || s.src.Addr() != from || s.dst != to {
				continue
			}
			select {
			case out <- s:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// parseTCPv4 reads the addresses, ports, sequence numbers and flags of an
// IPv4 packet carrying TCP.
func parseTCPv4(b []byte) (tcpSegment, bool) {
	if len(b) < 20 || b[0]>>4 != 4 || b[9] != unix.IPPROTO_TCP {
		return tcpSegment{}, false
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || len(b) < ihl+20 {
		return tcpSegment{}, false
	}
	tcp := b[ihl:]
	src, _ := netip.AddrFromSlice(b[12:16])
	dst, _ := netip.AddrFromSlice(b[16:20])
	return tcpSegment{
		src:   netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:])),
		dst:   netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:])),
		seq:   binary.BigEndian.Uint32(tcp[4:]),
		ack:   binary.BigEndian.Uint32(tcp[8:]),
		flags: tcp[13],
	}, true
}
