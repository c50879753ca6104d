package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batchConn sends nf_tables batches over a netlink socket of its own.
//
// The messages are built in wire.go and encode.go; nftgate sends them itself
// because google/nftables asks the kernel for an acknowledgement and an echo
// of every message, and reads them back one receive at a time: at the size of a cold
// start (hundreds of thousands of messages) the acknowledgements alone
// overflow any receive buffer (ENOBUFS, google/nftables #103, #350) and the
// reads dominate the sync. Here only the last message asks for an
// acknowledgement; the kernel reports every failing message regardless, and
// processes the whole batch inside the one sendmsg call, so by the time the
// last acknowledgement arrives every error is already queued before it.
type batchConn struct {
	nl      *netlink.Conn
	sndbuf  int
	timeout time.Duration
	seq     uint32 // last sequence number used
}

func dialBatch(netnsFD int) (*batchConn, error) {
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("open nf_tables netlink socket: %w", err)
	}
	// Error messages carry the kernel's explanation when it has one.
	_ = nl.SetOption(netlink.ExtendedAcknowledge, true)
	b := &batchConn{nl: nl, timeout: 30 * time.Second}
	if err := forceBuffer(nl, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		nl.Close()
		return nil, err
	}
	return b, nil
}

func (b *batchConn) Close() error { return b.nl.Close() }

// write sends the buffers as one datagram to the kernel. The kernel
// processes a batch inside this call.
func (b *batchConn) write(bufs [][]byte) error {
	rc, err := b.nl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), bufs, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// forceBuffer sets a socket's send or receive buffer (SO_SNDBUFFORCE,
// SO_RCVBUFFORCE) beyond the system's limit.
func forceBuffer(nl *netlink.Conn, opt, size int) error {
	rc, err := nl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, size)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set netlink socket buffer to %d bytes: %w", size, serr)
	}
	return nil
}

// BatchError is a batch the kernel refused; nothing of it was applied.
type BatchError struct {
	Failures []string // "what the message did: kernel error"
	// refused describes the refused messages, where the batch could say.
	refused []note
	// errs are the kernel's errors, one per failure.
	errs []error
}

func (e *BatchError) Error() string {
	const show = 5
	msg := strings.Join(e.Failures[:min(show, len(e.Failures))], "; ")
	if len(e.Failures) > show {
		msg += fmt.Sprintf("; and %d more", len(e.Failures)-show)
	}
	return "nf_tables refused the batch, nothing was changed: " + msg
}

// send transmits a batch and waits for the kernel's verdict. describe,
// called only when the kernel refused messages, returns a note on each
// message of the batch, for the error.
func (b *batchConn) send(bt *batch, describe func() []note) error {
	count := bt.count()
	if count == 0 {
		return nil
	}
	// Sequence numbers only tell this batch's answers from those of an
	// earlier one that timed out.
	first, last, bufs := bt.seal(b.seq+1, b.nl.PID())
	b.seq = last + 1
	// The whole batch is one datagram, which the socket's send buffer
	// must hold.
	size := bt.size()
	if want := size + 64<<10; want > b.sndbuf {
		if err := forceBuffer(b.nl, unix.SO_SNDBUFFORCE, want); err != nil {
			return err
		}
		b.sndbuf = want
	}
	if err := b.write(bufs); err != nil {
		return fmt.Errorf("send nf_tables batch of %d messages (%d bytes): %w", count, size, err)
	}
	var what []note
	described := false
	var refused []note
	name := func(seq uint32) string {
		if !described && describe != nil {
			described = true
			if what = describe(); len(what) != count {
				what = nil // descriptions are a courtesy; never mislabel a failure
			}
		}
		if i := int(seq - first); what != nil && i >= 0 && i < len(what) {
			refused = append(refused, what[i])
			return what[i].String()
		}
		return fmt.Sprintf("message %d", seq-first)
	}

	if err := b.nl.SetReadDeadline(time.Now().Add(b.timeout)); err != nil {
		return err
	}
	var failures []string
	var errs []error
	for {
		replies, err := b.nl.Receive()
		var oe *netlink.OpError
		if errors.As(err, &oe) && oe.Sequence != 0 {
			if oe.Sequence-first > last-first {
				continue // left over from an earlier batch that timed out
			}
			reason := oe.Err.Error()
			if oe.Message != "" {
				reason += " (" + oe.Message + ")"
			}
			failures = append(failures, name(oe.Sequence)+": "+reason)
			errs = append(errs, oe.Err)
			if oe.Sequence == last {
				break
			}
			continue
		}
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) {
				return fmt.Errorf("nf_tables batch of %d messages: kernel replies overflowed the socket: %w", count, err)
			}
			return fmt.Errorf("nf_tables batch of %d messages: waiting for the kernel's answer: %w", count, err)
		}
		done := false
		for _, r := range replies {
			if r.Header.Type == netlink.Error && r.Header.Sequence == last {
				done = true
			}
		}
		if done {
			break
		}
	}
	if len(failures) > 0 {
		return &BatchError{Failures: failures, refused: refused, errs: errs}
	}
	return nil
}

// generation asks the kernel for the generation of its ruleset: a number
// that every committed transaction, by any program, increases by one.
func (b *batchConn) generation() (uint32, error) {
	b.seq++
	req := netlink.Message{
		Header: netlink.Header{
			Type:     netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags:    netlink.Request,
			Sequence: b.seq,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}
	if err := b.nl.SetReadDeadline(time.Now().Add(b.timeout)); err != nil {
		return 0, err
	}
	msgs, err := b.nl.Execute(req)
	if err != nil {
		return 0, fmt.Errorf("nf_tables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("nf_tables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("nf_tables generation: no NFTA_GEN_ID in the answer")
}

// batch is a batch being built: its first part holds its beginning, the
// tables and their new sets; then one part per table, encoded in parallel.
// It is sent as one datagram.
type batch struct {
	parts []*wire
	arena []byte // mapped memory the parts are in, if any
}

// arenaThreshold is the size of a batch above which its parts are placed
// in memory mapped for it rather than on the Go heap. A cold sync's batch is
// tens of megabytes of bytes for the kernel: on the heap it would bring the
// next collection forward, which then scans everything the sync holds, for
// memory that holds no pointers and is freed right after sending.
const arenaThreshold = 4 << 20

func newArena(size int) []byte {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil // the parts go on the heap
	}
	return b
}

// release returns the batch's mapped memory; the batch must not be used
// afterwards.
func (bt *batch) release() {
	if bt.arena != nil {
		_ = unix.Munmap(bt.arena)
		bt.arena, bt.parts = nil, nil
	}
}

func (bt *batch) count() int {
	n := 0
	for _, w := range bt.parts {
		n += w.count
	}
	return n
}

// announced is how many notifications the kernel builds for the batch
// while someone listens: one per message, and one per map element.
func (bt *batch) announced() int {
	n := 0
	for _, w := range bt.parts {
		n += w.count + w.elements
	}
	return n
}

func (bt *batch) size() int {
	n := 0
	for _, w := range bt.parts {
		n += len(w.b)
	}
	return n
}

// notes describe the batch's messages in order, when it was encoded with
// describe.
func (bt *batch) notes() []note {
	var out []note
	for _, w := range bt.parts {
		out = append(out, w.notes...)
	}
	return out
}

// seal ends the batch: the last message asks for the acknowledgement, and
// every message gets its sequence number, from first on, and the port ID.
// It returns the sequence numbers of the first and the last message after
// the batch's beginning, and the parts to send.
func (bt *batch) seal(first, pid uint32) (uint32, uint32, [][]byte) {
	for i := len(bt.parts) - 1; i >= 0; i-- {
		if w := bt.parts[i]; w.last >= 0 {
			flags := binary.NativeEndian.Uint16(w.b[w.last+6:])
			binary.NativeEndian.PutUint16(w.b[w.last+6:], flags|uint16(netlink.Acknowledge))
			break
		}
	}
	tail := bt.parts[len(bt.parts)-1]
	tail.marker(unix.NFNL_MSG_BATCH_END)
	seq := first - 1 // the batch's beginning
	bufs := make([][]byte, 0, len(bt.parts))
	for _, w := range bt.parts {
		for off := 0; off < len(w.b); {
			binary.NativeEndian.PutUint32(w.b[off+8:], seq)
			binary.NativeEndian.PutUint32(w.b[off+12:], pid)
			seq++
			off += int(binary.NativeEndian.Uint32(w.b[off:]))
		}
		bufs = append(bufs, w.b)
	}
	return first, first + uint32(bt.count()) - 1, bufs
}
