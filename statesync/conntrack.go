package statesync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
)

// ConntrackOptions configure NewConntrack.
type ConntrackOptions struct {
	// NetNS is a file descriptor of the network namespace whose conntrack
	// table is used; 0 means the current one. The caller keeps it open.
	NetNS int
	// ReceiveBuffer is the event socket's receive buffer in bytes; 0 means
	// DefaultReceiveBuffer. Events that do not fit are lost (Listen's lost).
	ReceiveBuffer int
}

// DefaultReceiveBuffer holds about 40,000 events: four seconds of 10,000
// new connections a second, each a NEW and two UPDATE events, or a burst
// of that size while the reader is descheduled.
const DefaultReceiveBuffer = 32 << 20

// writeChunk is how many messages go into one sendmsg; their
// acknowledgements must fit the write socket's receive buffer.
const writeChunk = 256

// getChunk is how many reads go into one sendmsg: the kernel answers each
// in a buffer of a page (some 5 KB of the receive buffer's room).
const getChunk = 64

// Conntrack is the Kernel of a network namespace's conntrack table.
type Conntrack struct {
	opts ConntrackOptions

	mu  sync.Mutex // guards the write socket and its buffers
	w   *netlink.Conn
	raw syscall.RawConn
	enc encoder
	buf []byte

	// listening, when set, is called once Listen's socket receives events.
	listening func()
}

var _ Kernel = (*Conntrack)(nil)

// NewConntrack opens the socket that writes replicas. Listen and Dump
// open their own.
func NewConntrack(opts ConntrackOptions) (*Conntrack, error) {
	if opts.ReceiveBuffer < 0 {
		return nil, fmt.Errorf("statesync: ReceiveBuffer must not be negative, got %d", opts.ReceiveBuffer)
	}
	if opts.ReceiveBuffer == 0 {
		opts.ReceiveBuffer = DefaultReceiveBuffer
	}
	w, raw, err := dial(opts.NetNS, 1<<20)
	if err != nil {
		return nil, err
	}
	return &Conntrack{opts: opts, w: w, raw: raw, buf: make([]byte, 1<<16)}, nil
}

// Close releases the write socket.
func (c *Conntrack) Close() error { return c.w.Close() }

// dial opens a conntrack netlink socket (ctnetlink.Dial).
func dial(netNS, rcvbuf int) (*netlink.Conn, syscall.RawConn, error) {
	conn, raw, err := ctnetlink.Dial(netNS, rcvbuf)
	if err != nil {
		return nil, nil, fmt.Errorf("statesync: %w", err)
	}
	return conn, raw, nil
}

// natEventFilter is the socket filter of the event socket: the kernel
// drops events of entries without IPS_DST_NAT or IPS_SRC_NAT, and of
// replicas (ReplicaMark), before they take room in the receive buffer
// (libnetfilter_conntrack's filters work the same way). It looks up the
// top-level CTA_STATUS and CTA_MARK attributes with the kernel's netlink
// attribute extension; an event without them passes, and Listen checks
// every event again.
func natEventFilter() ([]bpf.RawInstruction, error) {
	const attrs = nlmsgHdrLen + ctnetlink.NFGenMsgLen
	return bpf.Assemble([]bpf.Instruction{
		// A = offset of CTA_STATUS, or 0.
		bpf.LoadConstant{Dst: bpf.RegA, Val: attrs},
		bpf.LoadConstant{Dst: bpf.RegX, Val: ctnetlink.Status},
		bpf.LoadExtension{Num: bpf.ExtNetlinkAttr},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 3},
		bpf.TAX{},
		bpf.LoadIndirect{Off: 4, Size: 4}, // the status value, big endian
		bpf.JumpIf{Cond: bpf.JumpBitsNotSet, Val: StatusDstNAT | StatusSrcNAT, SkipTrue: 7},
		// A = offset of CTA_MARK, or 0.
		bpf.LoadConstant{Dst: bpf.RegA, Val: attrs},
		bpf.LoadConstant{Dst: bpf.RegX, Val: ctnetlink.Mark},
		bpf.LoadExtension{Num: bpf.ExtNetlinkAttr},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 3},
		bpf.TAX{},
		bpf.LoadIndirect{Off: 4, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: ReplicaMark, SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
}

// listenBatch bounds the events handed over in one deliver call.
const listenBatch = 256

// Listen implements Kernel. It returns nil when ctx ends, and an error
// when the socket fails in any other way than an overflow.
func (c *Conntrack) Listen(ctx context.Context, deliver func([]Event), lost func(n int)) error {
	conn, raw, err := dial(c.opts.NetNS, c.opts.ReceiveBuffer)
	if err != nil {
		return err
	}
	defer conn.Close()
	if prog, err := natEventFilter(); err != nil {
		return fmt.Errorf("statesync: event filter: %w", err)
	} else if err := conn.SetBPF(prog); err != nil {
		return fmt.Errorf("statesync: attach event filter: %w", err)
	}
	for _, g := range []uint32{ctnetlink.GroupNew, ctnetlink.GroupUpdate, ctnetlink.GroupDestroy} {
		if err := conn.JoinGroup(g); err != nil {
			return fmt.Errorf("statesync: join conntrack event group %d: %w", g, err)
		}
	}
	if c.listening != nil {
		c.listening()
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	buf := make([]byte, 1<<16)
	batch := make([]Event, 0, listenBatch)
	for {
		batch = batch[:0]
		var overflow bool
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			for len(batch) < listenBatch {
				n, err := unix.Read(int(fd), buf) // the socket does not block
				switch {
				case err == unix.EAGAIN || err == unix.EINTR:
					return len(batch) > 0
				case err == unix.ENOBUFS:
					overflow = true
					return true
				case err != nil:
					rerr = err
					return true
				}
				batch = appendEvents(batch, buf[:n])
			}
			return true
		})
		if len(batch) > 0 {
			deliver(batch)
		}
		if overflow {
			lost(0)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("statesync: read conntrack events: %w", err)
		case rerr != nil:
			return fmt.Errorf("statesync: read conntrack events: %w", rerr)
		}
	}
}

// appendEvents decodes the messages of one datagram and appends the
// events of entries this gateway translates and does not hold as replicas.
func appendEvents(out []Event, b []byte) []Event {
	// A malformed message ends the datagram: the events before it count.
	_ = ctnetlink.Messages(b, func(_ uint16, msg []byte) bool {
		if ev, ok := decodeEvent(msg); ok {
			out = append(out, ev)
		}
		return true
	})
	return out
}

// syncable tells whether the sync looks at an entry at all: a translated
// flow of a protocol a Service has. An echo request the gateway answers
// for a Service address (ruleset.RedirectHere) is translated too, but its
// replica would be refused (RefusedProtocol) and it is no Service's flow
// (it would count as NotReplicatedNotService): it is left out.
func syncable(en *Entry) bool {
	return en.Status&(StatusDstNAT|StatusSrcNAT) != 0 && checkProto(en.Proto) == nil
}

// decodeEvent decodes one ctnetlink event and keeps it if it is a
// translated non-replica entry.
func decodeEvent(b []byte) (Event, bool) {
	t, en, ok := parseMessage(b)
	if !ok || t == 0 || !syncable(&en) || en.Mark&ReplicaMark != 0 {
		return Event{}, false
	}
	return Event{Type: t, Entry: en}, true
}

// Dump implements Kernel: this gateway's own entries, the replicas and
// the entries without a translated destination left out by the kernel (a
// dump filtered on the ct mark and the status).
func (c *Conntrack) Dump(fn func(Entry)) error { return c.dump(true, fn) }

// DumpAll calls fn for every translated entry, replicas included.
func (c *Conntrack) DumpAll(fn func(Entry)) error { return c.dump(false, fn) }

// dump reads one dump of both address families, entries decoded in place
// and filtered as they arrive; own leaves the replicas out, and the
// entries without a translated destination: the kernel skips them
// without writing them out (a kernel older than the status filter,
// CTA_STATUS_MASK, ignores it, and the decoder drops them).
func (c *Conntrack) dump(own bool, fn func(Entry)) error {
	var f ctnetlink.DumpFilter
	if own {
		f = ctnetlink.DumpFilter{Mark: 0, MarkMask: ReplicaMark, Status: StatusDstNAT, StatusMask: StatusDstNAT}
	}
	err := ctnetlink.Dump(c.opts.NetNS, f, func(msg []byte) {
		if _, en, ok := parseMessage(msg); ok && syncable(&en) {
			fn(en)
		}
	})
	if err != nil {
		return fmt.Errorf("statesync: %w", err)
	}
	return nil
}

// Write implements Kernel. Puts are created with their translations; one
// that exists is updated (timeout, status, TCP state, mark: the kernel
// refuses translations on an update), and if the kernel refuses its status
// (an older state than the replica's own) once more without. Deleting an
// entry that is gone already is success. The deletes go first: a flow of
// dels must not also be in puts.
func (c *Conntrack) Write(puts, dels []Entry) []error {
	res := make([]error, len(puts)+len(dels))
	todo := make([]int, 0, len(puts))
	for i := range puts {
		if err := checkEntry(&puts[i]); err != nil {
			res[i] = fmt.Errorf("statesync: write replica: %w", err)
			continue
		}
		if puts[i].Reply.Src == puts[i].Orig.Dst && puts[i].Reply.Dst == puts[i].Orig.Src {
			res[i] = fmt.Errorf("statesync: write replica %s -> %s: %w", puts[i].Orig.Src, puts[i].Orig.Dst, errNotNAT)
			continue
		}
		todo = append(todo, i)
	}
	deleting := make([]int, 0, len(dels))
	for i := range dels {
		if err := checkOrig(&dels[i]); err != nil {
			res[len(puts)+i] = fmt.Errorf("statesync: delete replica: %w", err)
			continue
		}
		deleting = append(deleting, len(puts)+i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The deletes first: a flow that ended frees its reply tuple, which
	// the origin's kernel may have given to a new flow of the same batch
	// (a masquerade port of a closed flow).
	gone := c.run(kindDelete, deleting, func(i int) *Entry { return &dels[i-len(puts)] }, res, unix.ENOENT)
	for _, i := range gone {
		res[i] = nil
	}
	c.put(todo, nil, func(i int) *Entry { return &puts[i] }, res)
	return res
}

// Update implements Kernel: each of puts is updated as a replica that
// exists, and created if it is gone (expired) after all. An update sets
// up no translation: the kernel's cost of a create, most of it, is spent
// only on a replica that is missing, where Write would spend it on every
// put to find it exists.
func (c *Conntrack) Update(puts []Entry) []error {
	res, todo := checked(len(puts), "update replica", func(i int) error { return checkEntry(&puts[i]) })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(nil, todo, func(i int) *Entry { return &puts[i] }, res)
	return res
}

// put writes replicas: those at fresh by a create (an update if it
// exists), those at known by an update (a create if it is gone). c.mu is
// held.
func (c *Conntrack) put(fresh, known []int, at func(int) *Entry, res []error) {
	var busy []int
	for _, i := range c.run(kindUpdate, known, at, res, unix.EBUSY, unix.ENOENT) {
		if errors.Is(res[i], unix.ENOENT) {
			fresh = append(fresh, i)
		} else {
			busy = append(busy, i)
		}
	}
	exist := c.run(kindCreate, fresh, at, res, unix.EEXIST)
	busy = append(busy, c.run(kindUpdate, exist, at, res, unix.EBUSY)...)
	c.run(kindUpdateNoState, busy, at, res)
}

// checked checks n entries: res holds check's error for each that fails
// (as "statesync: what: ..."), todo the indexes of those that pass.
func checked(n int, what string, check func(int) error) (res []error, todo []int) {
	res = make([]error, n)
	todo = make([]int, 0, n)
	for i := range n {
		if err := check(i); err != nil {
			res[i] = fmt.Errorf("statesync: %s: %w", what, err)
			continue
		}
		todo = append(todo, i)
	}
	return res, todo
}

// Adopt implements Kernel.
func (c *Conntrack) Adopt(entries []Entry) []error {
	res, todo := checked(len(entries), "adopt replica", func(i int) error { return checkOrig(&entries[i]) })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.run(kindAdopt, todo, func(i int) *Entry { return &entries[i] }, res)
	return res
}

// Get implements Kernel: a read of each entry by its original tuple,
// getChunk to a sendmsg.
func (c *Conntrack) Get(entries []Entry, fn func(Entry)) error {
	_, todo := checked(len(entries), "read entry", func(i int) error { return checkOrig(&entries[i]) })
	c.mu.Lock()
	defer c.mu.Unlock()
	var first error
	c.exchangeChunks(kindGet, todo, getChunk, func(i int) *Entry { return &entries[i] }, func(i int, msg []byte, err error) {
		switch {
		case err == nil:
			if _, en, ok := parseMessage(msg); ok && syncable(&en) {
				fn(en)
			}
		case errors.Is(err, unix.ENOENT): // gone
		case first == nil:
			e := &entries[i]
			first = fmt.Errorf("statesync: read entry %s %s -> %s: %w", protoName(e.Proto), e.Orig.Src, e.Orig.Dst, err)
		}
	}, func(_ []int, err error) {
		if first == nil {
			first = fmt.Errorf("statesync: read entries: %w", err)
		}
	})
	return first
}

// CreateOrigins creates entries as the kernel's own translated flows
// (both translations, no ReplicaMark), as a flow's first packet would:
// their NEW events are what the sync of this namespace reads for a real
// connection. It is the state-sync load generator's stand-in for
// connections, which lets it reach rates the handshakes of real ones do
// not on a small machine. An entry that exists is an error (EEXIST).
func (c *Conntrack) CreateOrigins(entries []Entry) []error {
	res, todo := checked(len(entries), "create entry", func(i int) error { return checkEntry(&entries[i]) })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.run(kindCreateOrigin, todo, func(i int) *Entry { return &entries[i] }, res)
	return res
}

// run sends the messages of kind k for the entries at idx, writeChunk per
// sendmsg, and stores each acknowledgement's error in res. The indices
// whose error is one of next are returned too, for the next step (which
// sets their res again).
func (c *Conntrack) run(k msgKind, idx []int, at func(int) *Entry, res []error, next ...unix.Errno) []int {
	var again []int
	c.exchangeChunks(k, idx, writeChunk, at, func(i int, _ []byte, err error) {
		switch {
		case err == nil:
			res[i] = nil
		case isErrno(err, next):
			res[i] = err
			again = append(again, i)
		case k == kindUpdate && errors.Is(err, unix.ENOENT):
			// The create found its reply tuple, not its original one.
			e := at(i)
			res[i] = fmt.Errorf("statesync: create replica %s %s -> %s: its reply tuple %s -> %s belongs to another entry: %w",
				protoName(e.Proto), e.Orig.Src, e.Orig.Dst, e.Reply.Src, e.Reply.Dst, unix.EEXIST)
		default:
			res[i] = fmt.Errorf("statesync: %s %s %s -> %s: %w", k, protoName(at(i).Proto), at(i).Orig.Src, at(i).Orig.Dst, err)
		}
	}, func(chunk []int, err error) {
		for _, i := range chunk {
			if res[i] == nil {
				res[i] = fmt.Errorf("statesync: %s: %w", k, err)
			}
		}
	})
	return again
}

// exchangeChunks sends the messages of kind k for the entries at idx,
// size to a sendmsg, and calls answer with each one's index, the message
// it is answered with (nil for an acknowledgement) and its error. When a
// chunk's answers cannot all be read, failed gets the chunk and why, and
// the next chunk goes on.
func (c *Conntrack) exchangeChunks(k msgKind, idx []int, size int, at func(int) *Entry, answer func(i int, msg []byte, err error), failed func(chunk []int, err error)) {
	for len(idx) > 0 {
		chunk := idx[:min(len(idx), size)]
		idx = idx[len(chunk):]
		c.enc.reset()
		first := c.enc.seq + 1
		for _, i := range chunk {
			c.enc.message(k, at(i))
		}
		if err := c.exchange(first, len(chunk), func(n int, msg []byte, err error) { answer(chunk[n], msg, err) }); err != nil {
			failed(chunk, err)
		}
	}
}

// exchange sends the encoded messages (sequence numbers first to
// first+n-1) in one sendmsg and reads their n answers: each an
// acknowledgement (msg nil) or the message the request is answered with.
func (c *Conntrack) exchange(first uint32, n int, ack func(n int, msg []byte, err error)) error {
	var serr error
	if err := c.raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), c.enc.b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("send: %w", serr)
	}
	// Each answer is a datagram of its own: they are read as they come,
	// as many as are there at each wakeup, and parsed in place (no
	// allocation per answer).
	got := 0
	var rerr, perr error
	parse := func(seq uint32, msg []byte, err error) {
		if d := seq - first; d < uint32(n) {
			got++
			ack(int(d), msg, err)
		}
	}
	if err := c.raw.Read(func(fd uintptr) bool {
		for got < n {
			// read(2), not recvfrom: the sender's address, which only
			// the kernel can be, is not made into a value each time.
			m, err := unix.Read(int(fd), c.buf)
			switch {
			case err == unix.EAGAIN:
				return false // wait for more
			case err == unix.EINTR:
				continue
			case err != nil:
				rerr = err
				return true
			}
			if perr = parseReplies(c.buf[:m], parse); perr != nil {
				return true
			}
		}
		return true
	}); err != nil {
		return err
	}
	if rerr != nil {
		// ENOBUFS: acknowledgements were dropped; which ones is unknown.
		return fmt.Errorf("read acknowledgements (%d of %d): %w", got, n, rerr)
	}
	if perr != nil {
		return perr
	}
	return nil
}

func (k msgKind) String() string {
	switch k {
	case kindCreate:
		return "create replica"
	case kindCreateOrigin:
		return "create entry"
	case kindUpdate, kindUpdateNoState:
		return "update replica"
	case kindDelete:
		return "delete replica"
	case kindAdopt:
		return "adopt replica"
	}
	return "unknown"
}

func isErrno(err error, errnos []unix.Errno) bool {
	for _, e := range errnos {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func protoName(p Proto) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprintf("protocol %d", p)
}
