package gateways

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// held records what a Set hands to OnChange.
type held struct {
	mu sync.Mutex
	v  []netip.Addr
}

func (h *held) set(v []netip.Addr) { h.mu.Lock(); h.v = v; h.mu.Unlock() }
func (h *held) get() []netip.Addr  { h.mu.Lock(); defer h.mu.Unlock(); return slices.Clone(h.v) }

// startPair starts gw-a and gw-b on loopback; b's key may differ.
func startPair(t *testing.T, bKey []byte) (a, b *Set, ha, hb *held) {
	t.Helper()
	ha, hb = &held{}, &held{}
	lnA, lnB := listen(t), listen(t)
	cfgB := Config{Name: "gw-b", Listen: lnB.Addr().String(), KeyFile: "k", Mode: ModeActiveActive, Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}}
	var err error
	b, err = New(cfgB, Options{Key: bKey, OnChange: hb.set, Listener: lnB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	cfgA := Config{Name: "gw-a", Listen: lnA.Addr().String(), KeyFile: "k", Mode: ModeActiveActive, Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{b.Addr().String()}}}}
	a, err = New(cfgA, Options{Key: testKey, OnChange: ha.set, Listener: lnA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return
}

func TestSetSharesAddressesAndTakesOverOnClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	a, b, ha, hb := startPair(t, testKey)
	as := addrs(16)
	a.Set(as)
	b.Set(as)
	// Until each has heard the other, one may hold all 16: the test waits
	// for them to be spread over both, and fails if they never are.
	wait(t, func() error {
		if err := disjointCover(as, ha.get(), hb.get()); err != nil {
			return err
		}
		if len(ha.get()) == 0 || len(hb.get()) == 0 {
			return fmt.Errorf("16 addresses all on one gateway: a %v b %v", ha.get(), hb.get())
		}
		return nil
	})
	st := a.Status()
	if len(st.Peers) != 1 || st.Peers[0].State != "alive" || len(st.Peers[0].Links) != 1 {
		t.Errorf("status of a: %+v", st.Peers)
	}
	b.Close()
	wait(t, func() error {
		return disjointCover(as, ha.get(), nil)
	})
	if got := hb.get(); len(got) != 0 {
		t.Errorf("b closed but still holds %v", got)
	}
}

// logLines keeps the messages and attributes a Set logs.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(b))
	return len(b), nil
}

func (l *logLines) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// sum adds up the count= and fromDeadPeer= attributes of the lines from
// the from-th on that hold part.
func (l *logLines) sum(from int, part string) (count, fromDeadPeer int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	attr := func(line, name string) int {
		_, v, ok := strings.Cut(line, " "+name+"=")
		if !ok {
			return 0
		}
		v, _, _ = strings.Cut(v, " ")
		n, _ := strconv.Atoi(strings.TrimSpace(v))
		return n
	}
	for _, line := range l.lines[from:] {
		if strings.Contains(line, part) {
			count += attr(line, "count")
			fromDeadPeer += attr(line, "fromDeadPeer")
		}
	}
	return count, fromDeadPeer
}

// find returns the first line with every part.
func (l *logLines) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return line
		}
	}
	return ""
}

// frozenPair starts gw-a (logging to log) and gw-b, active/active on clk,
// and waits until they share 16 addresses as. a sends its heartbeats to b
// through f, which drops b's answers once frozen.
func frozenPair(t *testing.T, clk *clocktesting.FakeClock, log *slog.Logger) (a *Set, ha, hb *held, f *freezer, as []netip.Addr) {
	t.Helper()
	lnA, lnB := listen(t), listen(t)
	f = newFreezer(t, lnB.Addr().String())
	ha, hb = &held{}, &held{}
	b, err := New(Config{Name: "gw-b", Listen: lnB.Addr().String(), KeyFile: "k", Mode: ModeActiveActive, Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}},
		Options{Key: testKey, OnChange: hb.set, Listener: lnB, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a, err = New(Config{Name: "gw-a", Listen: lnA.Addr().String(), KeyFile: "k", Mode: ModeActiveActive, Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{f.ln.Addr().String()}}}},
		Options{Key: testKey, OnChange: ha.set, Listener: lnA, Clock: clk, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	as = addrs(16)
	a.Set(as)
	b.Set(as)
	// Heartbeats go when the clock ticks. On a loaded machine a tick can
	// outrun the heartbeats it sends (a peer then looks dead for a while
	// and the other takes everything): wait until the addresses are
	// spread over both.
	wait(t, func() error {
		clk.Step(100 * time.Millisecond)
		if err := disjointCover(as, ha.get(), hb.get()); err != nil {
			return err
		}
		if len(ha.get()) == 0 || len(hb.get()) == 0 {
			return fmt.Errorf("not spread: a holds %d, b %d", len(ha.get()), len(hb.get()))
		}
		return nil
	})
	return a, ha, hb, f, as
}

func TestSetLogsAddressesTakenAndReleased(t *testing.T) {
	logs := &logLines{}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a, ha, _, f, as := frozenPair(t, clk, slog.New(slog.NewTextHandler(logs, nil)))
	// What a holds is what its logs say it took less what they say it
	// released (on a loaded machine it may take and give back some
	// before the two have heard each other: one line per change).
	wait(t, func() error {
		clk.Step(10 * time.Millisecond)
		taken, _ := logs.sum(0, `msg="gateways: addresses taken"`)
		released, _ := logs.sum(0, `msg="gateways: addresses released"`)
		if n := len(ha.get()); n == 0 || taken-released != n {
			return fmt.Errorf("a holds %d addresses, its logs say it took %d and released %d", n, taken, released)
		}
		return nil
	})
	// b falls silent: a takes over the rest, and says they came from the
	// dead peer.
	mark := logs.len()
	f.frozen.Store(true)
	wait(t, func() error {
		clk.Step(100 * time.Millisecond)
		taken, fromDead := logs.sum(mark, `msg="gateways: addresses taken"`)
		if n := len(ha.get()); n != len(as) || taken == 0 || fromDead != taken {
			return fmt.Errorf("a holds %d of %d addresses; since b fell silent its logs say it took %d, %d of them from the dead peer", n, len(as), taken, fromDead)
		}
		return nil
	})
	a.Set(as[:4])
	if line := logs.find(`msg="gateways: addresses released"`, "count=12"); line == "" || !strings.Contains(line, "and 2 more") {
		t.Errorf("release of 12 addresses logged as %q", line)
	}
}

func TestSetWrongKeyRefusedNothingChanges(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	reg := prometheus.NewRegistry()
	a, b, ha, hb := startPair(t, []byte("another key, 32 bytes long......"))
	if err := b.Register(reg); err != nil {
		t.Fatal(err)
	}
	a.Set(addrs(4))
	b.Set(addrs(4))
	wait(t, func() error {
		if n := testutil.ToFloat64(b.refusals.WithLabelValues("key")); n < 1 {
			return fmt.Errorf("b refused %v hellos for the key", n)
		}
		return nil
	})
	if p := a.Status().Peers[0]; p.State != "unknown" || len(p.Links) != 0 {
		t.Errorf("a sees b as %+v, want unknown without a link", p)
	}
	if r := b.Status().Refused; len(r) == 0 || r[0].Reason != "key" {
		t.Errorf("b's refusals: %+v", r)
	}
	if len(ha.get())+len(hb.get()) != 0 {
		// Both wait for the peer they cannot hear until the startup
		// wait ends, then each holds what it serves: the set is split,
		// as the key says it must be.
		t.Logf("after the refusal a holds %v, b holds %v", ha.get(), hb.get())
	}
}

func disjointCover(all []netip.Addr, x, y []netip.Addr) error {
	seen := map[netip.Addr]int{}
	for _, a := range append(slices.Clone(x), y...) {
		seen[a]++
	}
	for _, a := range all {
		if seen[a] != 1 {
			return fmt.Errorf("%v held %d times (a %v, b %v)", a, seen[a], x, y)
		}
	}
	return nil
}

func wait(t *testing.T, fn func() error) {
	t.Helper()
	if err := lab.EventuallyWithin(10*time.Second, fn); err != nil {
		t.Fatal(err)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// freezer forwards TCP connections to target until frozen, and from then
// on swallows what arrives (a link that carries nothing, as a cut cable
// without a reset).
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezer(t *testing.T, target string) *freezer {
	f := &freezer{ln: listen(t)}
	f.wg.Go(func() {
		for {
			c, err := f.ln.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, d)
			f.mu.Unlock()
			f.wg.Go(func() { f.pipe(d, c) })
			f.wg.Go(func() { f.pipe(c, d) })
		}
	})
	t.Cleanup(f.close)
	return f
}

func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		if !f.frozen.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
				src.Close()
				return
			}
		}
	}
}

func (f *freezer) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// With the injected clock: a peer whose heartbeats stop is alive until the
// dead time (3 × 100 ms) has passed on the clock, then dead, and its
// addresses are taken over.
func TestSetPeerDeadAfterMissedHeartbeatsOnTheClock(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a, ha, _, f, as := frozenPair(t, clk, nil)
	aHeld := ha.get()
	if len(aHeld) == 0 || len(aHeld) == len(as) {
		t.Fatalf("a holds %d of %d", len(aHeld), len(as))
	}
	// A heartbeat from b at the clock's time now, then silence.
	clk.Step(100 * time.Millisecond)
	wait(t, func() error {
		if st := a.Status(); !st.Peers[0].LastHeartbeat.Equal(clk.Now()) {
			return fmt.Errorf("b last heard at %v, now is %v", st.Peers[0].LastHeartbeat, clk.Now())
		}
		return nil
	})
	f.frozen.Store(true)
	clk.Step(250 * time.Millisecond)
	if st := a.Status(); st.Peers[0].State != "alive" {
		t.Fatalf("b is %s 250 ms after its last heartbeat", st.Peers[0].State)
	}
	if got := ha.get(); !slices.Equal(got, aHeld) {
		t.Fatalf("within the dead time a went from %v to %v", aHeld, got)
	}
	clk.Step(100 * time.Millisecond)
	wait(t, func() error {
		if got := ha.get(); len(got) != len(as) {
			clk.Step(10 * time.Millisecond)
			return fmt.Errorf("a holds %d of %d after the dead time", len(got), len(as))
		}
		return nil
	})
	if st := a.Status(); st.Peers[0].State != "dead" || st.TakenOver != uint64(len(as)-len(aHeld)) {
		t.Errorf("a's status after b's death: %+v", st)
	}
}

// Another user of the channel (the state sync) sends its own message
// types; the set's own are refused to it.
func TestSetCarriesOtherMessageTypes(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	a, b, _, _ := startPair(t, testKey)
	got := make(chan string, 1)
	if err := b.Handle(FirstUserType, func(peer string, p []byte) { got <- peer + ": " + string(p) }); err != nil {
		t.Fatal(err)
	}
	if err := b.Handle(msgState, func(string, []byte) {}); err == nil {
		t.Error("Handle took the set's own message type")
	}
	wait(t, func() error { return a.Send("gw-b", FirstUserType, []byte("entry 1")) })
	if m := <-got; m != "gw-a: entry 1" {
		t.Errorf("b received %q", m)
	}
	if err := a.Send("gw-z", FirstUserType, nil); err == nil {
		t.Error("Send to an unknown peer succeeded")
	}
}

// A peer whose configured set differs (here its timing) is refused on both
// ends with the reason "set", and shown.
func TestSetOtherViewOfTheSetRefused(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	lnA, lnB := listen(t), listen(t)
	b, err := New(Config{Name: "gw-b", Listen: lnB.Addr().String(), KeyFile: "k", DeadAfter: 4,
		Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}}, Options{Key: testKey, Listener: lnB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	a, err := New(Config{Name: "gw-a", Listen: lnA.Addr().String(), KeyFile: "k",
		Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{lnB.Addr().String()}}}}, Options{Key: testKey, Listener: lnA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	for _, s := range []*Set{a, b} {
		wait(t, func() error {
			st := s.Status()
			if len(st.Refused) == 0 || st.Refused[0].Reason != "set" || st.Peers[0].RefusedHellos == 0 {
				return fmt.Errorf("%s: refused %+v, peer %+v", st.Name, st.Refused, st.Peers[0])
			}
			if st.Peers[0].State != "unknown" {
				return fmt.Errorf("%s sees its peer %s", st.Name, st.Peers[0].State)
			}
			return nil
		})
	}
}

// OnPeer hears a peer come alive, come back with another incarnation after
// a restart within the dead time, and die.
func TestSetOnPeerReportsLivenessAndRestart(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	type ev struct {
		alive bool
		inc   uint64
	}
	var mu sync.Mutex
	var got []ev
	seen := func() []ev { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
	lnA, lnB := listen(t), listen(t)
	cfgB := Config{Name: "gw-b", KeyFile: "k", HeartbeatInterval: 50 * time.Millisecond, DeadAfter: 20,
		Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}}
	b, err := New(cfgB, Options{Key: testKey, Listener: lnB, OnPeer: func(peer string, alive bool, inc uint64) {
		mu.Lock()
		got = append(got, ev{alive, inc})
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	cfgA := Config{Name: "gw-a", KeyFile: "k", HeartbeatInterval: 50 * time.Millisecond, DeadAfter: 20,
		Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{b.Addr().String()}}}}
	a, err := New(cfgA, Options{Key: testKey, Listener: lnA})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, func() error {
		if g := seen(); len(g) != 1 || !g[0].alive || g[0].inc != a.inc {
			return fmt.Errorf("OnPeer calls %+v, want one: alive, incarnation %x", g, a.inc)
		}
		return nil
	})
	// A restart on the same address, faster than the dead time (1s).
	addr := a.Addr().String()
	a.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := New(cfgA, Options{Key: testKey, Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, func() error {
		if g := seen(); len(g) == 0 || !g[len(g)-1].alive || g[len(g)-1].inc != a2.inc {
			return fmt.Errorf("OnPeer calls %+v, want the last: alive, incarnation %x", g, a2.inc)
		}
		return nil
	})
	a2.Close()
	wait(t, func() error {
		if g := seen(); g[len(g)-1].alive {
			return fmt.Errorf("OnPeer calls %+v, want the last: dead", g)
		}
		return nil
	})
}
