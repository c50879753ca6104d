package gateways

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// sim passes the views' messages by hand, so every interleaving step can
// be checked.
type sim struct {
	t     *testing.T
	now   time.Time
	views map[string]*view
	// cut[a][b]: messages from a to b are lost.
	cut map[string]map[string]bool
}

func newSim(t *testing.T, names ...string) *sim {
	s := &sim{t: t, now: time.Unix(1000, 0), views: map[string]*view{}, cut: map[string]map[string]bool{}}
	for i, n := range names {
		var peers []string
		for _, p := range names {
			if p != n {
				peers = append(peers, p)
			}
		}
		s.views[n] = newView(n, peers, uint64(i+1), 300*time.Millisecond, s.now.Add(time.Second))
		s.cut[n] = map[string]bool{}
	}
	return s
}

func addrs(n int) []netip.Addr {
	var out []netip.Addr
	for i := range n {
		out = append(out, netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", i+1)))
	}
	return out
}

// deliver sends from's state (full or heartbeat) to to, then lets to
// decide and answer; it checks the invariant after each step.
func (s *sim) deliver(from, to string, full bool) {
	s.t.Helper()
	f, t := s.views[from], s.views[to]
	if f == nil || t == nil || s.cut[from][to] {
		return
	}
	m := f.message(to, full)
	if t.receive(from, f.incarnation, m, s.now) {
		t.decide(s.now)
		s.check()
		s.deliver(to, from, true)
		return
	}
	if t.decide(s.now) {
		s.check()
		for p := range t.peers {
			s.deliver(to, p, true)
		}
	}
	s.check()
}

// round: every view sends a full state to every peer, then decides.
func (s *sim) round() {
	for n, v := range s.views {
		for p := range v.peers {
			s.deliver(n, p, true)
		}
	}
	for _, v := range s.views {
		v.decide(s.now)
		s.check()
	}
	for n, v := range s.views {
		for p := range v.peers {
			s.deliver(n, p, true)
		}
	}
}

// check: no address held by two views that hear each other.
func (s *sim) check() {
	s.t.Helper()
	holder := map[netip.Addr]string{}
	for n, v := range s.views {
		for a := range v.holds {
			if o, ok := holder[a]; ok && !s.cut[o][n] && !s.cut[n][o] {
				s.t.Fatalf("%v held by %s and %s at once", a, o, n)
			}
			holder[a] = n
		}
	}
}

func (s *sim) holders() map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	for n, v := range s.views {
		for a := range v.holds {
			out[a] = append(out[a], n)
		}
	}
	return out
}

// settle runs rounds until nothing changes.
func (s *sim) settle() {
	for range 10 {
		s.round()
	}
}

func TestOwnershipSpreadsAndIsExclusive(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	as := addrs(40)
	for _, v := range s.views {
		v.setServed(as)
	}
	s.settle()
	h := s.holders()
	count := map[string]int{}
	for _, a := range as {
		if len(h[a]) != 1 {
			t.Fatalf("%v held by %v, want exactly one", a, h[a])
		}
		count[h[a][0]]++
	}
	if count["gw-a"] < 8 || count["gw-b"] < 8 {
		t.Errorf("40 addresses spread %v: want both gateways to hold some", count)
	}
}

func TestNothingTakenBeforePeersOrStartupWait(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	a := s.views["gw-a"]
	a.setServed(addrs(4))
	if a.decide(s.now); len(a.holds) != 0 {
		t.Fatalf("held %v before hearing the peer or the startup wait", a.held())
	}
	s.now = s.now.Add(time.Second)
	if a.decide(s.now); len(a.holds) != 4 {
		t.Fatalf("after the startup wait, alone: held %v, want all 4", a.held())
	}
}

func TestDeadPeerTakenOverAfterDeadTime(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	as := addrs(20)
	for _, v := range s.views {
		v.setServed(as)
	}
	s.settle()
	b := s.views["gw-b"]
	bHeld := len(b.holds)
	// a dies: b hears nothing more.
	s.cut["gw-a"]["gw-b"], s.cut["gw-b"]["gw-a"] = true, true
	s.now = s.now.Add(290 * time.Millisecond)
	if b.decide(s.now); len(b.holds) != bHeld {
		t.Fatalf("within the dead time b took over: %d → %d", bHeld, len(b.holds))
	}
	s.now = s.now.Add(20 * time.Millisecond)
	b.decide(s.now)
	if len(b.holds) != len(as) {
		t.Fatalf("after the dead time b holds %d, want all %d", len(b.holds), len(as))
	}
	if b.takenOver != uint64(len(as)-bHeld) {
		t.Errorf("takenOver = %d, want %d", b.takenOver, len(as)-bHeld)
	}
}

func TestRestartedPeerGetsItsAddressesBackByHandover(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	as := addrs(20)
	for _, v := range s.views {
		v.setServed(as)
	}
	s.settle()
	aBefore := s.views["gw-a"].held()
	// a dies, b takes all.
	s.cut["gw-a"]["gw-b"], s.cut["gw-b"]["gw-a"] = true, true
	s.now = s.now.Add(time.Second)
	s.views["gw-b"].decide(s.now)
	// a restarts: a new incarnation, nothing held, within its startup wait.
	s.views["gw-a"] = newView("gw-a", []string{"gw-b"}, 99, 300*time.Millisecond, s.now.Add(time.Second))
	s.views["gw-a"].setServed(as)
	s.cut["gw-a"]["gw-b"], s.cut["gw-b"]["gw-a"] = false, false
	// The check in deliver proves: never two holders on the way.
	s.settle()
	if got := s.views["gw-a"].held(); fmt.Sprint(got) != fmt.Sprint(aBefore) {
		t.Fatalf("after the restart a holds %v, want its own again %v", got, aBefore)
	}
	if s.views["gw-b"].released == 0 {
		t.Errorf("b released nothing")
	}
}

func TestAddressOnlyOneServesGoesToIt(t *testing.T) {
	s := newSim(t, "gw-a", "gw-b")
	as := addrs(10)
	s.views["gw-a"].setServed(as)
	s.views["gw-b"].setServed(as[:5])
	s.settle()
	for _, a := range as[5:] {
		if h := s.holders()[a]; len(h) != 1 || h[0] != "gw-a" {
			t.Errorf("%v held by %v, want gw-a, the only one serving it", a, h)
		}
	}
	// b stops serving everything: a takes all, with b's word.
	s.views["gw-b"].setServed(nil)
	s.settle()
	if n := len(s.views["gw-a"].holds); n != 10 {
		t.Errorf("a holds %d, want 10", n)
	}
}

// Two gateways that both start serving a new address at once, each with a
// stale view of the other's served set, must not both take it.
func TestNewAddressOnBothAtOnce(t *testing.T) {
	for i := range 30 {
		s := newSim(t, "gw-a", "gw-b")
		s.settle()
		ad := netip.MustParseAddr(fmt.Sprintf("198.51.100.%d", i+1))
		for _, v := range s.views {
			v.setServed([]netip.Addr{ad})
			v.decide(s.now)
		}
		s.check()
		s.settle()
		if h := s.holders()[ad]; len(h) != 1 {
			t.Fatalf("%v held by %v, want one", ad, h)
		}
	}
}

// The cost of one decision over 10,000 addresses and three gateways: a
// full pass (something changed) and a heartbeat tick with nothing new.
func BenchmarkDecide10000(b *testing.B) {
	var as []netip.Addr
	for i := range 10000 {
		as = append(as, netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	now := time.Unix(1000, 0)
	v := newView("gw-a", []string{"gw-b", "gw-c"}, 1, 300*time.Millisecond, now)
	v.setServed(as)
	for _, p := range []string{"gw-b", "gw-c"} {
		v.receive(p, 2, stateMsg{Version: 1, AckIncarnation: 1, Ack: v.version, Serves: as, Full: true}, now)
	}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			v.dirty = true
			v.decide(now)
		}
	})
	b.Run("tick", func(b *testing.B) {
		for b.Loop() {
			v.decide(now)
		}
	})
}
