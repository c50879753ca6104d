package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/ruleset"
)

// The kernel multicasts every committed nf_tables transaction to the
// NFNLGRP_NFTABLES group: one message per object it created or deleted,
// then NFT_MSG_NEWGEN with the new generation. Each message's header
// carries the netlink port of the socket that sent the batch, so nftgate's
// own transactions are told apart by its batch socket's port. The messages
// are read here with mdlayher/netlink and only their headers and table
// names are looked at: google/nftables' Monitor decodes every rule and
// element, which a cold sync's hundreds of thousands of messages would
// pay for, and it stops for good at the first lost message (ENOBUFS),
// which a large sync's own messages cause.

// watchBuffer is the receive buffer of the notification socket. A
// transaction of another program is a handful of messages; nftgate's own
// cold sync overflows any buffer, which is reported as lost messages.
const watchBuffer = 8 << 20

// Drift is what another program did to nftgate's tables in one
// transaction, as the kernel announced it, or the news that announcements
// were lost (Lost): then what happened is unknown.
type Drift struct {
	Generation uint32
	// Writer is the program that committed the transaction ("nft",
	// pid 1234), as the kernel names it.
	Writer string
	// Changes describe the transaction's changes to nftgate's tables
	// ("deleted table ip nftgate"), the first few of them; More counts
	// the others.
	Changes []string
	More    int
	Lost    bool
	// tables are those the changes were to; structural says whether any
	// change was to more than map elements.
	tables     map[tableRef]bool
	structural bool
}

// maxDriftChanges is how many changes a Drift describes.
const maxDriftChanges = 4

func (d Drift) String() string {
	if d.Lost {
		return "kernel notifications lost (receive buffer overflowed); the tables are read back"
	}
	s := strings.Join(d.Changes, "; ")
	if d.More > 0 {
		s += fmt.Sprintf("; and %d more", d.More)
	}
	return fmt.Sprintf("%s changed nftgate's tables (generation %d): %s", d.Writer, d.Generation, s)
}

// add notes one change; a table's come first, as they say the most.
func (d *Drift) add(what string, table bool) {
	if len(d.Changes) == maxDriftChanges {
		if !table {
			d.More++
			return
		}
		d.Changes = d.Changes[:len(d.Changes)-1]
		d.More++
	}
	if table {
		d.Changes = slices.Insert(d.Changes, 0, what)
		return
	}
	d.Changes = append(d.Changes, what)
}

// watchState is what the notifications have told so far, shared between
// the watching goroutine and full syncs.
type watchState struct {
	mu      sync.Mutex
	running bool
	gen     uint32 // the last generation announced
	genSeen bool
	// drifts counts Drifts: another program's changes to nftgate's
	// tables, and losses. A full sync that finds it unchanged since the
	// last read-back, with every transaction up to the kernel's
	// generation announced, need not read the tables back.
	drifts uint64
	// changed is closed, and replaced, whenever the state changes.
	changed chan struct{}
	// conn is the notification socket and report Watch's callback,
	// while Watch runs: mute takes the socket out of the group for
	// nftgate's own large batches.
	conn   *netlink.Conn
	report func(Drift)
	// touched are nftgate's tables another program changed since the
	// last read-back, as announced; whole says that something went
	// unannounced since (notifications lost, or not yet listened to), so
	// every table must be read.
	touched map[tableRef]bool
	whole   bool
	// structural says that those changes were to more than map
	// elements.
	structural bool
	// received counts the notifications the socket received.
	received atomic.Uint64
}

func newWatchState() *watchState { return &watchState{changed: make(chan struct{})} }

func (w *watchState) update(f func()) {
	w.mu.Lock()
	f()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// readBack notes a read-back starting now: it returns the number of
// drifts so far and, with targeted, the tables another program changed
// since the last read-back when the notifications named them all (nil:
// read every table).
// elems tells whether those changes were to map elements and nothing
// else.
func (w *watchState) readBack(targeted bool) (drifts uint64, only map[tableRef]bool, elems bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	only = w.touched
	if !targeted || w.whole || len(only) == 0 {
		only = nil
	}
	elems = only != nil && !w.structural
	w.touched, w.whole, w.structural = nil, false, false
	return w.drifts, only, elems
}

// settle notes that the kernel held nftgate's tables as nftgate believes
// at generation gen, with no other program's transaction since the last
// read-back: what was noted of transactions up to gen (changes, or a loss
// whose overflow was received late) needs no read-back. When something
// of a later transaction was noted, nothing is forgotten.
func (w *watchState) settle(gen uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.genSeen && int32(w.gen-gen) <= 0 {
		w.touched, w.whole, w.structural = nil, false, false
	}
}

// lost notes a drift whose changes are unknown.
func (w *watchState) lost() {
	w.drifts++
	w.whole = true
}

// snapshot returns the number of drifts so far.
func (w *watchState) snapshot() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drifts
}

// quietSince tells whether no drift was announced since the count was
// since, and every transaction up to generation gen has been announced.
// It waits up to wait for the announcements to catch up with gen.
func (w *watchState) quietSince(since uint64, gen uint32, wait time.Duration) bool {
	return w.caughtUp(gen, wait, &since)
}

// caughtUp tells whether every transaction up to generation gen has been
// announced, waiting up to wait for it; with since, also whether no drift
// was announced since that count.
func (w *watchState) caughtUp(gen uint32, wait time.Duration, since *uint64) bool {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		running, drifts, caughtUp, changed := w.running, w.drifts, w.genSeen && int32(w.gen-gen) >= 0, w.changed
		w.mu.Unlock()
		switch {
		case !running || (since != nil && drifts != *since):
			return false
		case caughtUp:
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

// seen notes that every transaction up to generation gen was announced
// (or is accounted for otherwise); the generation only moves forward.
func (w *watchState) seen(gen uint32) {
	if !w.genSeen || int32(gen-w.gen) > 0 {
		w.gen, w.genSeen = gen, true
	}
}

// muteAbove is the number of notifications above which one of nftgate's
// own batches is sent with the notification socket out of the group. The
// kernel builds a notification for each message of a batch, and for each
// map element of a message that holds many, only while someone listens:
// for a cold sync that is a large part of the kernel's time (at 100,000
// Services, 600,000 elements in 4,000 messages: 1.1 of 2.4 s), and
// overflows the socket anyway.
const muteAbove = 2000

// mute takes the notification socket out of the group before one of
// nftgate's own batches, once every transaction up to the kernel's
// generation gen (read before the batch) has been announced. It tells
// whether it did; unmute must then follow the batch.
func (p *Programmer) mute(gen uint32) bool {
	w := p.watch
	w.mu.Lock()
	conn := w.conn
	w.mu.Unlock()
	if conn == nil || !w.caughtUp(gen, watchCatchUp, nil) {
		return false
	}
	return conn.LeaveGroup(unix.NFNLGRP_NFTABLES) == nil
}

// unmute puts the notification socket back in the group after a batch
// sent muted. ownOnly tells whether the kernel's generation shows that
// nftgate's batch was all that was committed meanwhile (the generation
// now is after); otherwise another program's transaction went
// unannounced, which counts as notifications lost, as an overflow does.
// When the socket cannot join again it is closed: Watch then returns its
// error, and full syncs read the tables back as without notifications.
func (p *Programmer) unmute(after uint32, ownOnly bool) {
	w := p.watch
	w.mu.Lock()
	conn, report := w.conn, w.report
	w.mu.Unlock()
	if conn == nil {
		return
	}
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		conn.Close()
		return
	}
	if ownOnly {
		w.update(func() { w.seen(after) })
		return
	}
	w.update(w.lost)
	report(Drift{Lost: true})
}

// watchCatchUp bounds how long a full sync waits for the notifications of
// the transactions committed before it.
const watchCatchUp = time.Second

// Watch listens to the kernel's nf_tables notifications until ctx ends,
// and calls report, from its own goroutine, for every transaction of
// another program that changed nftgate's tables and whenever notifications
// were lost. While it runs, a full sync reads the tables back only when
// something was reported since the last read-back; otherwise it syncs
// only what changed, as a partial sync does. It returns an error when the
// notifications cannot be received.
func (p *Programmer) Watch(ctx context.Context, report func(Drift)) error {
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: p.netnsFD})
	if err != nil {
		return fmt.Errorf("open nf_tables notification socket: %w", err)
	}
	defer nl.Close()
	if err := nl.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("join the nf_tables notification group: %w", err)
	}
	if err := forceBuffer(nl, unix.SO_RCVBUFFORCE, watchBuffer); err != nil {
		return err
	}
	own := p.batch.nl.PID()
	if err := nl.SetBPF(ownNotificationsFilter(own)); err != nil {
		return fmt.Errorf("filter nf_tables notifications: %w", err)
	}
	// What was committed before this point was not announced here: it
	// counts as a drift, so the next full sync reads the tables back.
	// The kernel's generation now is where the announcements start.
	gen, err := currentGeneration(p.netnsFD)
	if err != nil {
		return err
	}
	p.watch.update(func() {
		p.watch.running = true
		p.watch.lost()
		p.watch.seen(gen)
		p.watch.conn, p.watch.report = nl, report
	})
	defer p.watch.update(func() { p.watch.running, p.watch.conn, p.watch.report = false, nil, nil })

	stop := context.AfterFunc(ctx, func() { nl.Close() })
	defer stop()
	var cur Drift
	// stale is the generation up to which, after a loss, announcements
	// are of transactions the read-back accounts for.
	var stale uint32
	var staleSet bool
	for {
		if p.beforeReceive != nil {
			p.beforeReceive()
		}
		msgs, err := nl.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return errors.New("nf_tables notifications: the socket could not join the group again after a batch")
			}
			if errors.Is(err, syscall.ENOBUFS) {
				cur = Drift{}
				// What was lost is unknown: every table is read back.
				// What is still queued is of the transactions before
				// now, whose announcements are incomplete (the last
				// ones, or a transaction's NEWGEN, may be among those
				// lost): it is dropped unread, and the transactions up
				// to the generation after that are accounted for by
				// the read-back, announced or not, so nobody waits for
				// their announcements, and what still arrives of them
				// is not taken for a later transaction's changes.
				p.watch.received.Add(drainQueued(nl))
				gen, gerr := currentGeneration(p.netnsFD)
				p.watch.update(func() {
					p.watch.lost()
					if gerr == nil {
						p.watch.seen(gen)
					}
				})
				stale, staleSet = gen, gerr == nil
				report(Drift{Lost: true})
				continue
			}
			return fmt.Errorf("receive nf_tables notifications: %w", err)
		}
		p.watch.received.Add(uint64(len(msgs)))
		for _, m := range msgs {
			if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
				continue
			}
			typ := int(m.Header.Type & 0xff)
			if typ == unix.NFT_MSG_NEWGEN {
				gen, writer := decodeGen(m.Data[4:])
				d := cur
				cur = Drift{}
				if staleSet && int32(gen-stale) <= 0 {
					continue // read back already
				}
				p.watch.update(func() {
					p.watch.seen(gen)
					if len(d.Changes) > 0 && m.Header.PID != own {
						p.watch.drifts++
						if p.watch.touched == nil {
							p.watch.touched = map[tableRef]bool{}
						}
						for t := range d.tables {
							p.watch.touched[t] = true
						}
						p.watch.structural = p.watch.structural || d.structural
					}
				})
				if len(d.Changes) > 0 && m.Header.PID != own {
					d.Generation, d.Writer = gen, writer
					report(d)
				}
				continue
			}
			if m.Header.PID == own {
				continue
			}
			what, t, ok := p.describeNotification(typ, ruleset.Family(m.Data[0]), m.Data[4:])
			if !ok {
				continue
			}
			cur.add(what, typ == unix.NFT_MSG_DELTABLE || typ == unix.NFT_MSG_NEWTABLE)
			if cur.tables == nil {
				cur.tables = map[tableRef]bool{}
			}
			cur.tables[t] = true
			cur.structural = cur.structural || (typ != unix.NFT_MSG_NEWSETELEM && typ != unix.NFT_MSG_DELSETELEM)
		}
	}
}

// drainQueued drops what the socket has queued, without waiting for more,
// and returns the number of datagrams dropped. It reads at most twice the
// socket's buffer, so that another program committing without pause
// cannot keep it here.
func drainQueued(nl *netlink.Conn) uint64 {
	rc, err := nl.SyscallConn()
	if err != nil {
		return 0
	}
	var n uint64
	buf := make([]byte, 64<<10)
	read := 0
	rc.Read(func(fd uintptr) bool {
		for read < 2*watchBuffer {
			m, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			switch {
			case err == unix.EINTR, err == unix.ENOBUFS:
				continue // ENOBUFS: overflowed again meanwhile
			case err != nil:
				return true // EAGAIN: nothing left
			}
			read += m
			n++
		}
		return true
	})
	return n
}

// ownNotificationsFilter keeps the kernel from queueing the notifications
// of nftgate's own transactions (those of the batch socket's port own) to
// the notification socket, all but their NFT_MSG_NEWGEN: that one says the
// transaction was announced, and nothing else of it is looked at. Under
// churn they were most of what the socket received, each datagram a
// buffer allocated. The kernel sends a transaction's NEWGEN in a datagram
// of its own, after the others, which it packs together: the first
// message's header tells of the whole datagram.
func ownNotificationsFilter(own uint32) []bpf.RawInstruction {
	// A filter loads words and halves in network byte order; netlink
	// headers are in the host's.
	host32 := func(v uint32) uint32 {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], v)
		return binary.BigEndian.Uint32(b[:])
	}
	host16 := func(v uint16) uint32 {
		var b [2]byte
		binary.NativeEndian.PutUint16(b[:], v)
		return uint32(binary.BigEndian.Uint16(b[:]))
	}
	const keep, drop = 0xffffffff, 0
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 12, Size: 4}, // nlmsg_pid
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: host32(own), SkipFalse: 3},
		bpf.LoadAbsolute{Off: 4, Size: 2}, // nlmsg_type
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: host16(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN), SkipFalse: 1},
		bpf.RetConstant{Val: drop},
		bpf.RetConstant{Val: keep},
	})
	if err != nil {
		panic(err) // the program is fixed: only its constants vary
	}
	return prog
}

// notificationVerbs name what each notification announces, with the
// attribute that holds the object's name (0: a table, named by attribute
// 1). Attribute 1 is the table's name in every one of them.
var notificationVerbs = map[int]struct {
	verb     string
	nameAttr uint16
}{
	unix.NFT_MSG_NEWTABLE:     {"added or changed table", 0},
	unix.NFT_MSG_DELTABLE:     {"deleted table", 0},
	unix.NFT_MSG_NEWCHAIN:     {"added or changed chain", unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_DELCHAIN:     {"deleted chain", unix.NFTA_CHAIN_NAME},
	unix.NFT_MSG_NEWRULE:      {"added a rule to chain", unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_DELRULE:      {"deleted a rule of chain", unix.NFTA_RULE_CHAIN},
	unix.NFT_MSG_NEWSET:       {"added set", unix.NFTA_SET_NAME},
	unix.NFT_MSG_DELSET:       {"deleted set", unix.NFTA_SET_NAME},
	unix.NFT_MSG_NEWSETELEM:   {"added elements to set", unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_DELSETELEM:   {"deleted elements of set", unix.NFTA_SET_ELEM_LIST_SET},
	unix.NFT_MSG_NEWOBJ:       {"added object", unix.NFTA_OBJ_NAME},
	unix.NFT_MSG_DELOBJ:       {"deleted object", unix.NFTA_OBJ_NAME},
	unix.NFT_MSG_NEWFLOWTABLE: {"added flowtable", nftaFlowtableName},
	unix.NFT_MSG_DELFLOWTABLE: {"deleted flowtable", nftaFlowtableName},
}

// describeNotification describes a change a notification announces, when
// it is of one of nftgate's tables.
func (p *Programmer) describeNotification(typ int, f ruleset.Family, attrs []byte) (string, tableRef, bool) {
	v, ok := notificationVerbs[typ]
	if !ok {
		return "", tableRef{}, false
	}
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return "", tableRef{}, false
	}
	var table, name string
	for ad.Next() {
		switch ad.Type() {
		case 1:
			table = ad.String()
		case v.nameAttr:
			if v.nameAttr != 0 {
				name = ad.String()
			}
		}
	}
	t := tableRef{f, table}
	if !p.ownTables[t] {
		return "", t, false
	}
	if v.nameAttr == 0 {
		return fmt.Sprintf("%s %s %s", v.verb, f, table), t, true
	}
	return fmt.Sprintf("%s %s of table %s %s", v.verb, name, f, table), t, true
}

type tableRef struct {
	family ruleset.Family
	name   string
}

// decodeGen reads a NEWGEN notification: the generation and who
// committed it.
func decodeGen(attrs []byte) (gen uint32, writer string) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return 0, "a program"
	}
	ad.ByteOrder = binary.BigEndian
	var pid uint32
	var name string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_GEN_ID:
			gen = ad.Uint32()
		case unix.NFTA_GEN_PROC_PID:
			pid = ad.Uint32()
		case unix.NFTA_GEN_PROC_NAME:
			name = ad.String()
		}
	}
	if name == "" {
		return gen, "a program"
	}
	return gen, fmt.Sprintf("%s (pid %d)", name, pid)
}

// nftaFlowtableName is NFTA_FLOWTABLE_NAME, which x/sys/unix lacks.
const nftaFlowtableName = 2

// watchRunning tells whether Watch has joined the notifications.
func (p *Programmer) watchRunning() bool {
	p.watch.mu.Lock()
	defer p.watch.mu.Unlock()
	return p.watch.running
}

// currentGeneration reads the kernel's ruleset generation through a socket
// of its own.
func currentGeneration(netnsFD int) (uint32, error) {
	b, err := dialBatch(netnsFD)
	if err != nil {
		return 0, err
	}
	defer b.Close()
	return b.generation()
}
