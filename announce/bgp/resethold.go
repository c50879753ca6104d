package bgp

import (
	"context"
	"net/netip"
	"time"

	"github.com/osrg/gobgp/v4/api"
)

// resetHold is the dampened idle hold after reset of one session: how
// long the speaker keeps the session down after BFD reset it before it
// connects again. Each time the session leaves established before it has
// stayed up for max, the hold doubles, up to max; once it has stayed up
// for max, the hold is base again.
type resetHold struct {
	base, max time.Duration
	// cur is the hold GoBGP holds now: the wait after the next reset.
	cur time.Duration
}

// down is the session leaving established: the hold for the reset after
// this one.
func (h *resetHold) down() time.Duration {
	h.cur = min(2*h.cur, h.max)
	return h.cur
}

// stable is the session having stayed up for max: the flapping is over.
func (h *resetHold) stable() time.Duration {
	h.cur = h.base
	return h.cur
}

// peerHold is a session's resetHold and what the speaker knows of it.
type peerHold struct {
	resetHold
	index int  // in Config.Peers and Speaker.peers
	bfd   bool // the session has BFD
	// up and gen are the session's state and how many times it changed,
	// so that a timer set at one change acts only if no other came since.
	up    bool
	gen   uint64
	timer *time.Timer
}

func newPeerHolds(peers []PeerConfig) map[netip.Addr]*peerHold {
	holds := make(map[netip.Addr]*peerHold, len(peers))
	for i, p := range peers {
		holds[netip.MustParseAddr(p.Address)] = &peerHold{
			resetHold: resetHold{base: p.IdleHoldAfterReset, max: p.IdleHoldAfterResetMax, cur: p.IdleHoldAfterReset},
			index:     i,
			bfd:       p.BFD,
		}
	}
	return holds
}

// dampen follows a session with BFD up or down (from sessionEvent).
//
// Down: the speaker removes the peer from GoBGP at once and adds it again
// after the hold, which then doubles for the next time. Waiting in GoBGP's
// own idle state instead (its idle hold after reset) lets a session come
// back and be cut at once: GoBGP's BFD keeps the session it had with the
// router's BFD, which the router replaces when its BGP session restarts;
// GoBGP's BFD expires a moment later, and the reset it then asks for,
// with BGP idle, waits in GoBGP's queue and goes out the moment the next
// session is established, again and again. A peer added anew has fresh
// BGP and BFD state.
//
// Up: once the session has stayed up for the hold's max, the hold is back
// to its base.
//
// GoBGP is called outside holdMu: its calls may wait for its event loop,
// which may be handing this speaker an event that waits for holdMu.
func (s *Speaker) dampen(addr netip.Addr, up bool) {
	s.holdMu.Lock()
	h, ok := s.holds[addr]
	if !ok || !h.bfd || h.up == up || s.holdsStopped {
		s.holdMu.Unlock()
		return
	}
	h.up = up
	h.gen++
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	gen := h.gen
	// current tells, under holdMu, whether no change came since this one.
	current := func() bool { return h.gen == gen && !s.holdsStopped }
	if up {
		if h.cur != h.base {
			h.timer = time.AfterFunc(h.max, func() {
				s.holdMu.Lock()
				defer s.holdMu.Unlock()
				if current() {
					h.stable()
				}
			})
		}
		s.holdMu.Unlock()
		return
	}
	wait := h.cur
	if next := h.down(); next != wait {
		s.log.Info("bgp: session flapping: the wait after its next reset is raised", "peer", addr, "wait", next)
	}
	peer := s.peers[h.index]
	s.holdMu.Unlock()
	ctx := context.Background()
	if err := s.bgp.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
		s.log.Warn("bgp: remove the peer after its session went down", "peer", addr, "err", err)
		return
	}
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if !current() {
		return
	}
	h.timer = time.AfterFunc(wait, func() {
		s.holdMu.Lock()
		ok := current()
		s.holdMu.Unlock()
		if !ok {
			return
		}
		if err := s.bgp.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
			s.log.Warn("bgp: add the peer again after its session went down", "peer", addr, "err", err)
		}
	})
}

// stopHolds ends the timers (Stop).
func (s *Speaker) stopHolds() {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	s.holdsStopped = true
	for _, h := range s.holds {
		if h.timer != nil {
			h.timer.Stop()
		}
	}
}

// idleHold is the session's wait after the next reset, for Status.
func (s *Speaker) idleHold(addr netip.Addr) time.Duration {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if h, ok := s.holds[addr]; ok {
		return h.cur
	}
	return 0
}
