package gateways

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"slices"
	"time"
)

// Ownership of the floating addresses, as a state machine without I/O (the
// Set feeds it messages and the time, and sends what it answers).
//
// Each gateway tells its peers, in a state message, the addresses it
// serves and the addresses it holds (answers for), with a version that
// grows with every change, and the version of the receiver's state it has
// seen (its ack), and whether it is ready (Options.Ready). The owner of an
// address is chosen among its candidates: the live gateways that serve it
// and are ready or hold it already (when none is, every live gateway that
// serves it), so a gateway that starts or returns takes nothing from a
// ready peer before it holds the flows' state, and one that holds an
// address keeps it while it gets ready. A gateway that drains (leaving, in
// its state) is no candidate while another live gateway serves the
// address, so it hands everything over and keeps only what no one else
// can hold; one with a tracked link down (faulty) is none while a fit
// one serves it, so it hands over what a fit peer can hold and takes it
// back once fit again. Among the candidates the owner is,
// in active-active mode, the address's home gateway (the masquerade
// addresses of each), else the one with the highest rendezvous score of
// (address, name), spread across them; in active-backup mode the first in
// name order, so one gateway holds every address. The same on every
// gateway that sees the same peers. A gateway
//   - releases an address as soon as it is no longer its owner (or it no
//     longer serves it), and only then tells its peers;
//   - takes an address it owns only when no live peer holds it, and every
//     live peer has acked a state of this gateway in which it served the
//     address and was as ready and as fit as now (so no peer decided on
//     a stale view of what it serves or whether it is ready or fit).
// So while two gateways hear each other, an address passes from one to the
// other through the old owner's release (the handover message) and the new
// owner's ack: never two holders. A peer not heard from for the dead time
// is left out: what it held is taken over without its word.

// score is the rendezvous weight of a gateway for an address.
func score(a netip.Addr, name string) uint64 {
	h := sha256.New()
	b, _ := a.Unmap().MarshalBinary()
	h.Write(b)
	h.Write([]byte{0})
	h.Write([]byte(name))
	var sum [32]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// stateMsg is a gateway's state as sent to one peer.
type stateMsg struct {
	Version uint64 `json:"v"`
	// Ack is the version of the receiver's state the sender has seen,
	// with the receiver's incarnation.
	AckIncarnation uint64       `json:"ai"`
	Ack            uint64       `json:"a"`
	Serves         []netip.Addr `json:"s,omitempty"`
	Holds          []netip.Addr `json:"h,omitempty"`
	// Ready: the sender holds its peers' flow state (Options.Ready).
	Ready bool `json:"r,omitempty"`
	// Leaving: the sender drains (Set.Leave): it is a candidate for an
	// address only while no other live gateway serves it.
	Leaving bool `json:"l,omitempty"`
	// Faulty: a link the sender tracks is down (Set.SetFault): it is a
	// candidate for an address only while no fit live gateway serves it.
	Faulty bool `json:"x,omitempty"`
	// Full: Serves and Holds are present (a heartbeat carries only the
	// version and the ack).
	Full bool `json:"f,omitempty"`
}

// peerView is what this gateway knows of one peer.
type peerView struct {
	incarnation uint64
	known       bool // a full state arrived from this incarnation
	version     uint64
	serves      map[netip.Addr]bool
	holds       map[netip.Addr]bool
	ready       bool
	leaving     bool
	faulty      bool
	// ack is the version of this gateway's state (this incarnation) the
	// peer has seen.
	ack       uint64
	lastHeard time.Time
	alive     bool // as of the last tick
	// answered is the version of this peer's state this gateway last
	// answered with a full state of its own.
	answered uint64
}

// view is one gateway's side of the protocol.
type view struct {
	self        string
	incarnation uint64
	dead        time.Duration
	startupEnd  time.Time
	started     bool // the startup wait is over
	dirty       bool // decide has something to look at
	// activeBackup: the first candidate in name order owns; else the
	// home, then the rendezvous hash. home: address → its gateway.
	activeBackup bool
	home         map[netip.Addr]string
	// ready: this gateway holds its peers' flow state; readyVersion is
	// the version in which it became so.
	ready        bool
	readyVersion uint64
	// leaving: this gateway drains (setLeaving); faulty: a link it
	// tracks is down (setFaulty), and fitVersion is the version in which
	// it was last fit again.
	leaving    bool
	faulty     bool
	fitVersion uint64

	version uint64
	serves  map[netip.Addr]uint64 // address → version in which it was added
	holds   map[netip.Addr]bool
	peers   map[string]*peerView

	// counters for the metrics: addresses taken from a live peer's
	// handover or by this gateway alone, taken over from a dead peer,
	// released.
	taken, takenOver, released uint64
}

func newView(self string, peers []string, incarnation uint64, dead time.Duration, startupEnd time.Time) *view {
	v := &view{self: self, incarnation: incarnation, dead: dead, startupEnd: startupEnd, version: 1, ready: true,
		serves: map[netip.Addr]uint64{}, holds: map[netip.Addr]bool{}, peers: map[string]*peerView{}}
	for _, p := range peers {
		v.peers[p] = &peerView{}
	}
	return v
}

// alive tells whether p counts at now.
func (v *view) alive(p *peerView, now time.Time) bool {
	return p.known && now.Sub(p.lastHeard) < v.dead
}

// setServed makes the served set equal to addrs; it tells whether the
// state changed (then the version has grown).
func (v *view) setServed(addrs []netip.Addr) bool {
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	var gone, added []netip.Addr
	for a := range v.serves {
		if !want[a] {
			gone = append(gone, a)
		}
	}
	for a := range want {
		if _, ok := v.serves[a]; !ok {
			added = append(added, a)
		}
	}
	if len(gone)+len(added) == 0 {
		return false
	}
	v.version++
	v.dirty = true
	for _, a := range gone {
		delete(v.serves, a)
	}
	for _, a := range added {
		v.serves[a] = v.version
	}
	return true
}

// setReady marks this gateway ready; it tells whether that changed (then
// the version has grown and the peers need the state).
func (v *view) setReady() bool {
	if v.ready {
		return false
	}
	v.version++
	v.ready, v.readyVersion, v.dirty = true, v.version, true
	return true
}

// setLeaving makes this gateway a candidate for an address only while no
// other live gateway serves it; it tells whether that changed (then the
// version has grown and the peers need the state).
func (v *view) setLeaving() bool {
	if v.leaving {
		return false
	}
	v.version++
	v.leaving, v.dirty = true, true
	return true
}

// setFaulty makes this gateway a candidate for an address only while no
// fit live gateway serves it (faulty), or a candidate as any again; it
// tells whether that changed (then the version has grown and the peers
// need the state). Once fit again it takes an address only after every
// live peer acked the state that says so.
func (v *view) setFaulty(faulty bool) bool {
	if v.faulty == faulty {
		return false
	}
	v.version++
	v.faulty, v.dirty = faulty, true
	if !faulty {
		v.fitVersion = v.version
	}
	return true
}

// The ranks of a gateway as a candidate: an address's candidates are the
// live gateways that serve it with the least rank among them. A faulty
// gateway (a link it tracks is down) is one only while no fit gateway
// serves the address, a leaving one (a drain) only while no other does.
const (
	rankFit = iota
	rankFaulty
	rankLeaving
)

func rankOf(leaving, faulty bool) int {
	switch {
	case leaving:
		return rankLeaving
	case faulty:
		return rankFaulty
	}
	return rankFit
}

// standby tells whether this gateway is faulty while a live peer is fit
// and stays: what it would announce for every gateway (active-active
// Service routes) is better drawn by that peer.
func (v *view) standby() bool {
	if !v.faulty || v.leaving {
		return false
	}
	for _, p := range v.peers {
		if p.alive && rankOf(p.leaving, p.faulty) == rankFit {
			return true
		}
	}
	return false
}

// receive takes a message from peer name at now; it tells whether the
// peer's view of this gateway needs a full state in answer.
func (v *view) receive(name string, incarnation uint64, m stateMsg, now time.Time) (answer bool) {
	p := v.peers[name]
	if p == nil {
		return false
	}
	if p.incarnation != incarnation {
		*p = peerView{incarnation: incarnation}
		v.dirty = true
	}
	p.lastHeard = now
	if m.AckIncarnation == v.incarnation && m.Ack > p.ack {
		p.ack = m.Ack
		v.dirty = true
	}
	if m.Full && (!p.known || m.Version > p.version) {
		v.dirty = true
		p.known, p.version = true, m.Version
		p.serves = toSet(m.Serves)
		p.holds = toSet(m.Holds)
		p.ready = m.Ready
		p.leaving = m.Leaving
		p.faulty = m.Faulty
	}
	return p.known && p.answered < p.version
}

// message is this gateway's state for peer name (full, or a heartbeat).
func (v *view) message(name string, full bool) stateMsg {
	p := v.peers[name]
	m := stateMsg{Version: v.version, AckIncarnation: p.incarnation, Full: full, Ready: full && v.ready, Leaving: full && v.leaving,
		Faulty: full && v.faulty}
	if p.known {
		m.Ack = p.version
		if full {
			p.answered = p.version
		}
	}
	if full {
		m.Serves = sortedKeys(v.serves)
		m.Holds = sortedKeys(v.holds)
	}
	return m
}

// owner is the owner of a among its candidates ("" when no live gateway
// serves it), liveness as of the last decide.
func (v *view) owner(a netip.Addr) string {
	_, self := v.serves[a]
	// The candidates are the live gateways that serve a with the least
	// rank among them (a faulty one only while no fit one serves a, a
	// leaving one only while no other does).
	least := rankLeaving + 1
	if self {
		least = rankOf(v.leaving, v.faulty)
	}
	for _, p := range v.peers {
		if p.alive && p.serves[a] {
			least = min(least, rankOf(p.leaving, p.faulty))
		}
	}
	self = self && rankOf(v.leaving, v.faulty) == least
	in := func(p *peerView) bool { return p.alive && p.serves[a] && rankOf(p.leaving, p.faulty) == least }
	// Among them, the eligible (ready, or holding a) if any, else all.
	eligibleOnly := self && (v.ready || v.holds[a])
	for _, p := range v.peers {
		eligibleOnly = eligibleOnly || in(p) && (p.ready || p.holds[a])
	}
	best, bestScore := "", uint64(0)
	consider := func(name string, eligible bool) {
		if eligibleOnly && !eligible {
			return
		}
		var s uint64
		if !v.activeBackup {
			s = score(a, name)
		}
		if best == "" || v.before(a, name, s, best, bestScore) {
			best, bestScore = name, s
		}
	}
	if self {
		consider(v.self, v.ready || v.holds[a])
	}
	for name, p := range v.peers {
		if in(p) {
			consider(name, p.ready || p.holds[a])
		}
	}
	return best
}

// before tells whether gateway name (of rendezvous score s) comes before
// best (of bestScore) as the owner of a.
func (v *view) before(a netip.Addr, name string, s uint64, best string, bestScore uint64) bool {
	if v.activeBackup {
		return name < best
	}
	if h, ok := v.home[a]; ok && (h == name || h == best) {
		return h == name
	}
	return s > bestScore || s == bestScore && name < best
}

// decide releases and takes addresses at now; it tells whether the held
// set changed (then the version has grown and the peers need the state).
//
// It costs a pass over the served addresses only when something it
// depends on changed since the last call: the served set, a peer's state
// or ack, a peer's liveness, the end of the startup wait. The heartbeat
// ticks call it every interval.
func (v *view) decide(now time.Time) bool {
	for _, p := range v.peers {
		if alive := v.alive(p, now); alive != p.alive {
			p.alive = alive
			v.dirty = true
		}
	}
	if started := v.started; v.mayTake(now) != started {
		v.dirty = true
	}
	if !v.dirty {
		return false
	}
	v.dirty = false
	changed := false
	for a := range v.holds {
		if v.owner(a) != v.self {
			delete(v.holds, a)
			v.released++
			changed = true
		}
	}
	if v.started {
		for a, since := range v.serves {
			if !v.holds[a] && v.owner(a) == v.self {
				if take, overDead := v.free(a, since); take {
					v.holds[a] = true
					changed = true
					if overDead {
						v.takenOver++
					} else {
						v.taken++
					}
				}
			}
		}
	}
	if changed {
		v.version++
	}
	return changed
}

// mayTake: after the startup wait, or once every peer was heard.
func (v *view) mayTake(now time.Time) bool {
	if v.started {
		return true
	}
	if now.Before(v.startupEnd) {
		for _, p := range v.peers {
			if !p.alive {
				return false
			}
		}
	}
	v.started = true
	return true
}

// free tells whether this gateway, the owner of a (served since version
// since), may take it: no live peer holds it and every live peer has
// acked a state in which this gateway served it and was as ready and as
// fit as now. overDead: a dead peer held it.
func (v *view) free(a netip.Addr, since uint64) (take, overDead bool) {
	since = max(since, v.readyVersion, v.fitVersion)
	for _, p := range v.peers {
		if !p.alive {
			overDead = overDead || p.known && p.holds[a]
			continue
		}
		if p.holds[a] || p.ack < since {
			return false, false
		}
	}
	return true, overDead
}

// held is the set this gateway answers for, sorted.
func (v *view) held() []netip.Addr { return sortedKeys(v.holds) }

func toSet(as []netip.Addr) map[netip.Addr]bool {
	m := make(map[netip.Addr]bool, len(as))
	for _, a := range as {
		m[a.Unmap()] = true
	}
	return m
}

func sortedKeys[V any](m map[netip.Addr]V) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
