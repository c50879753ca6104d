package statesync

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and conntrack entries")
	}
}

func newKernel(t testing.TB, ns netns.NsHandle, opts ConntrackOptions) *Conntrack {
	t.Helper()
	opts.NetNS = int(ns)
	k, err := NewConntrack(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// natEntry is a flow client → service translated to endpoint and
// masqueraded to masq, as a gateway's kernel holds it.
func natEntry(proto Proto, client, service, endpoint, masq string) Entry {
	e := Entry{
		Proto:   proto,
		Orig:    Tuple{Src: ap(client), Dst: ap(service)},
		Reply:   Tuple{Src: ap(endpoint), Dst: ap(masq)},
		Status:  StatusSeenReply | StatusAssured | StatusConfirmed | StatusDstNAT | StatusSrcNAT,
		Timeout: 300,
		Mark:    0x42,
	}
	if proto == unix.IPPROTO_TCP {
		e.TCP = TCPInfo{State: tcpEstablished, WScaleOrig: 7, WScaleReply: 9,
			FlagsOrig: tcpFlagWindowScale | tcpFlagSACKPerm, FlagsReply: tcpFlagWindowScale | tcpFlagSACKPerm}
	}
	return e
}

const tcpEstablished = 3 // TCP_CONNTRACK_ESTABLISHED

func dumpAll(t testing.TB, k *Conntrack) map[Tuple]Entry {
	t.Helper()
	got := map[Tuple]Entry{}
	if err := k.DumpAll(func(e Entry) { got[e.Orig] = e }); err != nil {
		t.Fatal(err)
	}
	return got
}

func noErrors(t testing.TB, what string, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// conntrackL lists the namespace's table with the conntrack tool.
func conntrackL(t testing.TB, ns netns.NsHandle, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("conntrack")
	if err != nil {
		t.Fatalf("needs the conntrack tool (Debian package conntrack; make deps): %v", err)
	}
	var out []byte
	if err := netnstest.Do(ns, func() (err error) {
		out, err = exec.Command(path, append([]string{"-L"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("conntrack -L: %v: %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestWriteReplicas writes replicas of both families and all three
// protocols, reads them back with Dump and with conntrack -L, updates
// them, adopts one and deletes them.
// A batch that deletes a flow and creates another with the same reply
// tuple (the origin's kernel gave the masquerade port of a closed flow to
// a new one) writes both: the delete goes first.
func TestWriteReplicasDeleteFreesReplyTuple(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	old := natEntry(unix.IPPROTO_TCP, "10.1.0.2:1165", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1165")
	noErrors(t, "write", k.Write([]Entry{old}, nil))
	reused := natEntry(unix.IPPROTO_TCP, "10.1.0.3:1232", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1165")
	noErrors(t, "write the new flow and delete the old", k.Write([]Entry{reused}, []Entry{old}))
	got := dumpAll(t, k)
	if _, ok := got[old.Orig]; ok {
		t.Errorf("the old flow's replica %v is still there", old.Orig)
	}
	if e, ok := got[reused.Orig]; !ok || e.Reply != reused.Reply {
		t.Errorf("the new flow's replica %v: %v (present %v), want reply %v", reused.Orig, e.Reply, ok, reused.Reply)
	}
}

// A replica of an entry its origin holds in SYN_SENT is written in
// SYN_RECV (replicaTCPState), in the kernel; the other states as they are.
func TestWriteReplicaOfSynSentInSynRecv(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	syn := natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:40000")
	syn.Status, syn.TCP.State = StatusConfirmed|StatusDstNAT|StatusSrcNAT, tcpStateSynSent
	est := natEntry(unix.IPPROTO_TCP, "10.1.0.2:40001", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:40001")
	noErrors(t, "write", k.Write([]Entry{syn, est}, nil))
	got := dumpAll(t, k)
	if s := got[syn.Orig].TCP.State; s != tcpStateSynRecv {
		t.Errorf("the replica of a SYN_SENT entry is in state %d, want SYN_RECV (%d)", s, tcpStateSynRecv)
	}
	if s := got[est.Orig].TCP.State; s != tcpEstablished {
		t.Errorf("the replica of an ESTABLISHED entry is in state %d, want %d", s, tcpEstablished)
	}
}

func TestWriteReplicas(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	puts := []Entry{
		natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:40000"),
		natEntry(unix.IPPROTO_UDP, "10.1.0.2:40001", "10.96.0.10:53", "10.2.0.11:5353", "10.2.0.1:1024"),
		natEntry(unix.IPPROTO_SCTP, "10.1.0.2:40002", "10.96.0.10:9", "10.2.0.12:9999", "10.2.0.1:40002"),
		natEntry(unix.IPPROTO_TCP, "[fd01::2]:40000", "[fd96::10]:80", "[fd02::10]:8080", "[fd02::1]:40000"),
		natEntry(unix.IPPROTO_UDP, "[fd01::2]:40001", "[fd96::10]:53", "[fd02::11]:5353", "[fd01::2]:40001"), // DNAT only
	}
	noErrors(t, "write", k.Write(puts, nil))

	got := dumpAll(t, k)
	for _, want := range puts {
		e, ok := got[want.Orig]
		if !ok {
			t.Fatalf("replica %v not in the dump %v", want.Orig, got)
		}
		if e.Reply != want.Reply {
			t.Errorf("%v: reply tuple %v, want %v (the translations)", want.Orig, e.Reply, want.Reply)
		}
		wantNAT := StatusDstNAT
		if want.Reply.Dst != want.Orig.Src {
			wantNAT |= StatusSrcNAT
		}
		if e.Status&(StatusDstNAT|StatusSrcNAT) != wantNAT || e.Status&(StatusSeenReply|StatusAssured) != StatusSeenReply|StatusAssured {
			t.Errorf("%v: status %#x, want NAT bits %#x and SEEN_REPLY|ASSURED", want.Orig, e.Status, wantNAT)
		}
		if e.Mark != want.Mark|ReplicaMark {
			t.Errorf("%v: mark %#x, want %#x", want.Orig, e.Mark, want.Mark|ReplicaMark)
		}
		if e.Timeout < want.Timeout-5 || e.Timeout > want.Timeout {
			t.Errorf("%v: timeout %d, want about %d", want.Orig, e.Timeout, want.Timeout)
		}
		if want.Proto == unix.IPPROTO_TCP {
			if e.TCP.State != tcpEstablished || e.TCP.WScaleOrig != 7 || e.TCP.WScaleReply != 9 {
				t.Errorf("%v: TCP %+v, want ESTABLISHED with window scales 7 and 9", want.Orig, e.TCP)
			}
			if e.TCP.FlagsOrig&tcpFlagBeLiberal == 0 || e.TCP.FlagsReply&tcpFlagBeLiberal == 0 {
				t.Errorf("%v: TCP flags %#x/%#x without BE_LIBERAL", want.Orig, e.TCP.FlagsOrig, e.TCP.FlagsReply)
			}
		}
	}
	out := conntrackL(t, ns, "-f", "ipv4", "-p", "tcp")
	for _, w := range []string{"ESTABLISHED", "src=10.1.0.2 dst=10.96.0.10 sport=40000 dport=80",
		"src=10.2.0.10 dst=10.2.0.1 sport=8080 dport=40000", "[ASSURED]", "mark=2147483714"} {
		if !strings.Contains(out, w) {
			t.Errorf("conntrack -L lacks %q:\n%s", w, out)
		}
	}

	// Writing again updates: a later state and a longer timeout.
	upd := puts[0]
	upd.TCP.State = 5 // TCP_CONNTRACK_CLOSE_WAIT
	upd.Timeout = 1000
	older := puts[1]
	older.Status &^= StatusAssured // an update older than the replica
	noErrors(t, "update", k.Write([]Entry{upd, older}, nil))
	got = dumpAll(t, k)
	if e := got[upd.Orig]; e.TCP.State != 5 || e.Timeout < 990 {
		t.Errorf("updated replica: state %d timeout %d, want 5 and about 1000", e.TCP.State, e.Timeout)
	}
	if e := got[older.Orig]; e.Status&StatusAssured == 0 {
		t.Errorf("an older update cleared ASSURED: status %#x", e.Status)
	}

	// An adoption needs only the protocol and the original tuple (what
	// the sync keeps of the replicas it holds for a peer).
	noErrors(t, "adopt", k.Adopt([]Entry{{Proto: puts[0].Proto, Orig: puts[0].Orig}}))
	if e := dumpAll(t, k)[puts[0].Orig]; e.Mark != puts[0].Mark {
		t.Errorf("adopted entry has mark %#x, want %#x", e.Mark, puts[0].Mark)
	}

	// A replica whose reply tuple another entry holds is refused by name.
	clash := puts[1]
	clash.Orig.Src = ap("10.1.0.3:40001")
	if err := k.Write([]Entry{clash}, nil)[0]; err == nil || !strings.Contains(err.Error(), "belongs to another entry") {
		t.Errorf("replica with a reply tuple in use: %v", err)
	}

	// Deleting twice is fine; bad input is refused by name, the rest goes on.
	bad := puts[0]
	bad.Proto = 1
	errs := k.Write([]Entry{bad}, append(puts, puts[0]))
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "protocol 1") {
		t.Errorf("ICMP entry: %v, want a refusal naming protocol 1", errs[0])
	}
	noErrors(t, "delete", errs[1:])
	if got := dumpAll(t, k); len(got) != 0 {
		t.Errorf("after delete: %v", got)
	}
}

// listener runs Listen in the background and collects its events.
type listener struct {
	mu     sync.Mutex
	events []Event
	lost   int
	cancel context.CancelFunc
	done   chan error
}

func listen(t testing.TB, k *Conntrack, hold <-chan struct{}) *listener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{cancel: cancel, done: make(chan error, 1)}
	started := make(chan struct{})
	k.listening = func() { close(started) }
	go func() {
		l.done <- k.Listen(ctx, func(evs []Event) {
			l.mu.Lock()
			l.events = append(l.events, evs...)
			l.mu.Unlock()
			if hold != nil {
				<-hold
			}
		}, func(int) {
			l.mu.Lock()
			l.lost++
			l.mu.Unlock()
		})
	}()
	select {
	case <-started:
	case err := <-l.done:
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-l.done; err != nil {
			t.Errorf("Listen: %v", err)
		}
	})
	return l
}

func (l *listener) snapshot() ([]Event, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...), l.lost
}

// waitFor waits until cond holds for the listener's events.
func (l *listener) waitFor(t testing.TB, what string, cond func([]Event, int) bool) {
	t.Helper()
	err := lab.EventuallyWithin(10*time.Second, func() error {
		if evs, lost := l.snapshot(); !cond(evs, lost) {
			return fmt.Errorf("%d events, %d losses so far", len(evs), lost)
		}
		return nil
	})
	if err != nil {
		evs, lost := l.snapshot()
		t.Fatalf("waiting for %s: %v; events %+v, lost %d", what, err, evs, lost)
	}
}

// TestListenSkipsReplicas: a replica's own events never come back, the
// same entry adopted does; both are read from one socket in order, so once
// the adoption's event is there, a replica event would have been too.
func TestListenSkipsReplicas(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	l := listen(t, k, nil)
	puts := []Entry{
		natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:40000"),
		natEntry(unix.IPPROTO_UDP, "[fd01::2]:40001", "[fd96::10]:53", "[fd02::11]:5353", "[fd02::1]:40001"),
	}
	noErrors(t, "write", k.Write(puts, nil))
	noErrors(t, "update", k.Write(puts, nil))
	noErrors(t, "adopt", k.Adopt(puts[1:]))
	l.waitFor(t, "the adopted entry's event", func(evs []Event, _ int) bool { return len(evs) > 0 })
	evs, _ := l.snapshot()
	if len(evs) != 1 || evs[0].Type != EventUpdate || evs[0].Entry.Orig != puts[1].Orig {
		t.Fatalf("events %+v, want one UPDATE of the adopted %v", evs, puts[1].Orig)
	}
	if e := evs[0].Entry; e.Reply != puts[1].Reply || e.Mark != puts[1].Mark {
		t.Errorf("adopted entry's event: %+v", e)
	}
	noErrors(t, "delete", k.Write(nil, puts))
	l.waitFor(t, "the adopted entry's DESTROY", func(evs []Event, _ int) bool { return len(evs) == 2 })
	if evs, _ := l.snapshot(); evs[1].Type != EventDestroy || evs[1].Entry.Orig != puts[1].Orig {
		t.Errorf("second event %+v, want the DESTROY of %v only", evs[1], puts[1].Orig)
	}
}

// TestSyncLeavesEchoOut: an echo request the gateway answers for a
// Service address is translated (redirected) in conntrack like a Service
// flow, but no Service has ICMP: neither Listen nor Dump hands it to the
// sync (its replica would be refused, and it would count as a flow not
// replicated). Both read one socket in order, so once the TCP entry's event
// is there, the echo's, created first, would have been too.
func TestSyncLeavesEchoOut(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	l := listen(t, k, nil)
	conntrack(t, ns, "-I", "-s", "203.0.113.5", "-d", "198.51.100.1", "-p", "icmp", "--icmp-type", "8", "--icmp-code", "0",
		"--icmp-id", "77", "--dst-nat", "10.2.0.1", "-t", "30")
	if out := conntrackL(t, ns, "-p", "icmp"); !strings.Contains(out, "id=77") {
		t.Fatalf("the echo's entry is not in the table: %s", out)
	}
	flow := natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1024")
	noErrors(t, "create", k.CreateOrigins([]Entry{flow}))
	t.Cleanup(func() { k.Write(nil, []Entry{flow}) })
	l.waitFor(t, "the TCP entry's event", func(evs []Event, _ int) bool {
		return slices.ContainsFunc(evs, func(e Event) bool { return e.Entry.Orig == flow.Orig })
	})
	evs, _ := l.snapshot()
	for _, e := range evs {
		if e.Entry.Proto != unix.IPPROTO_TCP {
			t.Errorf("Listen handed over %+v", e)
		}
	}
	var got []Entry
	if err := k.Dump(func(e Entry) { got = append(got, e) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Orig != flow.Orig {
		t.Errorf("Dump: %+v, want only the TCP entry", got)
	}
}

// conntrack runs the conntrack tool in the namespace.
func conntrack(t testing.TB, ns netns.NsHandle, args ...string) {
	t.Helper()
	if err := netnstest.Do(ns, func() error {
		if out, err := exec.Command("conntrack", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("conntrack %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestListenOverflow: a reader that falls behind a burst loses events; it
// is told (lost) and carries on.
func TestListenOverflow(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{ReceiveBuffer: 4096})
	hold := make(chan struct{})
	l := listen(t, k, hold)
	burst := make([]Entry, 500)
	for i := range burst {
		burst[i] = natEntry(unix.IPPROTO_UDP, fmt.Sprintf("10.1.%d.%d:40000", i/250, i%250+1), "10.96.0.10:53", "10.2.0.11:5353", fmt.Sprintf("10.2.0.1:%d", 1024+i))
		burst[i].Mark = 0
	}
	t.Cleanup(func() { k.Write(nil, burst) })
	// The first adopted entry's event blocks the reader in deliver.
	noErrors(t, "write", k.Write(burst, nil))
	noErrors(t, "adopt", k.Adopt(burst[:1]))
	l.waitFor(t, "the first event", func(evs []Event, _ int) bool { return len(evs) > 0 })
	// Events of adopted entries pass the socket filter: they fill it.
	noErrors(t, "adopt the rest", k.Adopt(burst[1:]))
	close(hold)
	l.waitFor(t, "the loss", func(_ []Event, lost int) bool { return lost > 0 })
	evs, _ := l.snapshot()
	if len(evs) >= len(burst) {
		t.Fatalf("%d events of %d adoptions with a 4 KiB buffer: nothing was lost, the test proves nothing", len(evs), len(burst))
	}
	// Still listening: the next event arrives.
	before := len(evs)
	noErrors(t, "delete", k.Write(nil, burst[:1]))
	l.waitFor(t, "an event after the loss", func(evs []Event, _ int) bool { return len(evs) > before })
	t.Logf("%d of %d events delivered, loss reported", before, len(burst))
}

// TestCheckConntrackKernel: this kernel has events and marks; a namespace
// with events switched off is named as the problem.
func TestCheckConntrackKernel(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	if err := CheckConntrackKernel(int(ns)); err != nil {
		t.Fatalf("on this kernel: %v", err)
	}
	if err := netnstest.Do(ns, func() error { return os.WriteFile(eventsSysctl, []byte("0"), 0) }); err != nil {
		t.Fatal(err)
	}
	err := CheckConntrackKernel(int(ns))
	if err == nil || !strings.Contains(err.Error(), "nf_conntrack_events") {
		t.Fatalf("with events off: %v, want an error naming nf_conntrack_events", err)
	}
	t.Log(err)
	k := newKernel(t, ns, ConntrackOptions{})
	if got := dumpAll(t, k); len(got) != 0 {
		t.Errorf("the check left entries behind: %v", got)
	}
}

// TestCreateOrigins: an entry created as the namespace's own translated
// flow gives the NEW event a real flow gives (both translations, the mark
// without ReplicaMark), which Listen delivers; a second create of it is
// refused.
func TestCreateOrigins(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	l := listen(t, k, nil)
	e := natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1024")
	t.Cleanup(func() { k.Write(nil, []Entry{e}) })
	noErrors(t, "create", k.CreateOrigins([]Entry{e}))
	l.waitFor(t, "the NEW event", func(evs []Event, _ int) bool { return len(evs) > 0 })
	evs, _ := l.snapshot()
	got := evs[0].Entry
	if evs[0].Type != EventNew || got.Orig != e.Orig || got.Reply != e.Reply || got.Mark != e.Mark ||
		got.Status&(StatusDstNAT|StatusSrcNAT) != StatusDstNAT|StatusSrcNAT || got.TCP.State != tcpEstablished {
		t.Fatalf("event %+v, want the NEW of %+v", evs[0], e)
	}
	if errs := k.CreateOrigins([]Entry{e}); !errors.Is(errs[0], unix.EEXIST) {
		t.Errorf("second create: %v, want EEXIST", errs[0])
	}
}

// TestParseMessageMatchesTiMo: the in-place decoder reads the kernel's
// dumped entries and events of both families and all three protocols as
// ti-mo/conntrack's complete decoder does.
func TestParseMessageMatchesTiMo(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	k := newKernel(t, ns, ConntrackOptions{})
	conn, _, err := dial(int(ns), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, g := range []uint32{ctnetlink.GroupNew, ctnetlink.GroupUpdate, ctnetlink.GroupDestroy} {
		if err := conn.JoinGroup(g); err != nil {
			t.Fatal(err)
		}
	}
	es := []Entry{
		natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:40000"),
		natEntry(unix.IPPROTO_UDP, "10.1.0.2:40001", "10.96.0.10:53", "10.2.0.11:5353", "10.2.0.1:1024"),
		natEntry(unix.IPPROTO_SCTP, "10.1.0.2:40002", "10.96.0.10:9", "10.2.0.12:9999", "10.2.0.1:40002"),
		natEntry(unix.IPPROTO_TCP, "[fd01::2]:40000", "[fd96::10]:80", "[fd02::10]:8080", "[fd02::1]:40000"),
	}
	es[2].SCTP = SCTPInfo{State: 3, VTagOrig: 0x01020304, VTagReply: 0x0a0b0c0d}
	noErrors(t, "create", k.CreateOrigins(es))
	noErrors(t, "update", k.Write(es, nil)) // an UPDATE event each (mark)
	noErrors(t, "delete", k.Write(nil, es))
	noErrors(t, "write", k.Write(es, nil))
	t.Cleanup(func() { k.Write(nil, es) })

	compare := func(what string, m netlink.Message) {
		t.Helper()
		raw, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var ev ct.Event
		if err := ev.Unmarshal(m); err != nil || ev.Flow == nil {
			t.Fatalf("%s: ti-mo: %v", what, err)
		}
		typ, got, ok := parseMessage(raw)
		if !ok {
			t.Fatalf("%s: parseMessage refused %x", what, raw)
		}
		if want := tiMoEntry(ev.Flow); got != want {
			t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
		}
		if got.ID == 0 {
			t.Errorf("%s: no id read: %+v", what, got)
		}
		var wantType EventType
		switch {
		case what == "dump":
		case ev.Type == ct.EventNew:
			wantType = EventNew
		case ev.Type == ct.EventUpdate:
			wantType = EventUpdate
		case ev.Type == ct.EventDestroy:
			wantType = EventDestroy
		}
		if typ != wantType {
			t.Errorf("%s: type %d, want %d (ti-mo %v)", what, typ, wantType, ev.Type)
		}
	}
	// Each entry: NEW, UPDATE, DESTROY, then NEW of the replica.
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 4*len(es); {
		msgs, err := conn.Receive()
		if err != nil {
			t.Fatalf("after %d events: %v", n, err)
		}
		for _, m := range msgs {
			compare("event", m)
			n++
		}
	}
	dumped := 0
	if err := k.DumpAll(func(Entry) { dumped++ }); err != nil || dumped != len(es) {
		t.Fatalf("dump: %d entries, %v; want %d", dumped, err, len(es))
	}
	d, _, err := dial(int(ns), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	msgs, err := d.Execute(netlink.Message{
		Header: netlink.Header{Type: ctnetlink.Subsys<<8 | ctnetlink.MsgGet, Flags: netlink.Request | netlink.Dump},
		Data:   []byte{unix.AF_UNSPEC, ctnetlink.NFNetlinkV0, 0, 0},
	})
	if err != nil || len(msgs) != len(es) {
		t.Fatalf("dump through mdlayher/netlink: %d messages, %v", len(msgs), err)
	}
	for _, m := range msgs {
		compare("dump", m)
	}
}

// tiMoEntry is an Entry from ti-mo/conntrack's decoding of a flow.
func tiMoEntry(f *ct.Flow) Entry {
	ap := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a.Unmap(), port) }
	en := Entry{Proto: f.TupleOrig.Proto.Protocol, Status: uint32(f.Status.Value), Timeout: f.Timeout, Mark: f.Mark, ID: f.ID,
		Orig:  Tuple{ap(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort), ap(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort)},
		Reply: Tuple{ap(f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort), ap(f.TupleReply.IP.DestinationAddress, f.TupleReply.Proto.DestinationPort)}}
	if t := f.ProtoInfo.TCP; t != nil {
		// ti-mo reads the kernel's {flags, mask} pair as one big-endian
		// uint16: the flags are its high byte.
		en.TCP = TCPInfo{State: t.State, WScaleOrig: t.OriginalWindowScale, WScaleReply: t.ReplyWindowScale,
			FlagsOrig: uint8(t.OriginalFlags >> 8), FlagsReply: uint8(t.ReplyFlags >> 8)}
	}
	if s := f.ProtoInfo.SCTP; s != nil {
		en.SCTP = SCTPInfo{State: s.State, VTagOrig: s.VTagOriginal, VTagReply: s.VTagReply}
	}
	return en
}

// TestDumpLeavesReplicasOut: Dump (the sync's) has the kernel leave out
// the replicas and the entries without a translated destination (here one
// masqueraded only, which Dump's own decoder would keep); DumpAll has them.
func TestDumpLeavesReplicasOut(t *testing.T) {
	requireRoot(t)
	k := newKernel(t, netnstest.Temp(t), ConntrackOptions{})
	own := natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1024")
	replica := natEntry(unix.IPPROTO_TCP, "10.1.0.3:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1025")
	masqueraded := natEntry(unix.IPPROTO_TCP, "10.1.0.4:40000", "10.2.0.10:8080", "10.2.0.10:8080", "10.2.0.1:1026")
	noErrors(t, "create", k.CreateOrigins([]Entry{own, masqueraded}))
	noErrors(t, "write", k.Write([]Entry{replica}, nil))
	t.Cleanup(func() { k.Write(nil, []Entry{own, replica, masqueraded}) })
	var got []Tuple
	if err := k.Dump(func(e Entry) { got = append(got, e.Orig) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != own.Orig {
		t.Errorf("Dump: %v, want only the own entry %v", got, own.Orig)
	}
	if all := dumpAll(t, k); len(all) != 3 {
		t.Errorf("DumpAll: %v, want all three", all)
	}
}

// TestGet: Get reads the entries asked for by original tuple, many to a
// sendmsg, the own ones and the replicas (marked), with their state and
// translations, and leaves out those the table does not hold.
func TestGet(t *testing.T) {
	requireRoot(t)
	k := newKernel(t, netnstest.Temp(t), ConntrackOptions{})
	own := benchEntries(getChunk*2 + 10)
	for i := range own {
		own[i].Timeout = 100 + uint32(i)
	}
	replica := natEntry(unix.IPPROTO_UDP, "10.1.200.3:40000", "10.96.0.10:53", "10.2.0.10:5353", "10.2.0.1:1025")
	replica.TCP, replica.Timeout = TCPInfo{}, 30
	gone := natEntry(unix.IPPROTO_TCP, "10.1.201.1:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1026")
	noErrors(t, "create", k.CreateOrigins(own))
	noErrors(t, "write", k.Write([]Entry{replica}, nil))
	t.Cleanup(func() { k.Write(nil, append(own, replica)) })

	ask := append([]Entry{gone, replica}, own...)
	got := map[Tuple]Entry{}
	if err := k.Get(ask, func(e Entry) { got[e.Orig] = e }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(own)+1 {
		t.Errorf("%d entries read, want %d (the own ones and the replica)", len(got), len(own)+1)
	}
	if _, ok := got[gone.Orig]; ok {
		t.Errorf("%v read, which the table does not hold", gone.Orig)
	}
	for _, want := range append([]Entry{replica}, own...) {
		e, ok := got[want.Orig]
		switch {
		case !ok:
			t.Errorf("%v not read", want.Orig)
		case e.Reply != want.Reply || e.Proto != want.Proto || e.TCP.State != want.TCP.State ||
			e.Timeout > want.Timeout || e.Timeout+5 < want.Timeout || e.Status&(StatusDstNAT|StatusSrcNAT) != StatusDstNAT|StatusSrcNAT:
			t.Errorf("read %+v, want %+v", e, want)
		case (e.Mark&ReplicaMark != 0) != (want.Orig == replica.Orig):
			t.Errorf("%v: mark %#x", want.Orig, e.Mark)
		}
	}
}

// TestUpdateReplicas: Update changes a replica that exists, and creates,
// with its translations, one that is gone.
func TestUpdateReplicas(t *testing.T) {
	requireRoot(t)
	k := newKernel(t, netnstest.Temp(t), ConntrackOptions{})
	e := natEntry(unix.IPPROTO_TCP, "10.1.0.2:40000", "10.96.0.10:80", "10.2.0.10:8080", "10.2.0.1:1024")
	t.Cleanup(func() { k.Write(nil, []Entry{e}) })
	noErrors(t, "write", k.Write([]Entry{e}, nil))
	e.Timeout = 1000
	noErrors(t, "update", k.Update([]Entry{e}))
	if got := dumpAll(t, k)[e.Orig]; got.Timeout < 990 || got.Reply != e.Reply {
		t.Errorf("after the update: %+v, want timeout about 1000 and reply %v", got, e.Reply)
	}
	noErrors(t, "delete", k.Write(nil, []Entry{e}))
	noErrors(t, "update of a replica that is gone", k.Update([]Entry{e}))
	got, ok := dumpAll(t, k)[e.Orig]
	if !ok || got.Reply != e.Reply || got.Status&(StatusDstNAT|StatusSrcNAT) != StatusDstNAT|StatusSrcNAT || got.Mark&ReplicaMark == 0 {
		t.Errorf("after an update of a replica that was gone: %+v (present %v), want it created with both translations", got, ok)
	}
}
