package bgp

import (
	"context"
	"net/netip"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"google.golang.org/protobuf/proto"
)

// resetHold is the dampened idle hold after reset of one session: how
// long GoBGP keeps the session idle after it reset it (BFD down) before it
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
	index int // in Config.Peers and Speaker.peers
	// up and gen are the session's state and how many times it changed,
	// so that a decay timer set when it came up acts only if it is still
	// that same up.
	up    bool
	gen   uint64
	decay *time.Timer
}

func newPeerHolds(peers []PeerConfig) map[netip.Addr]*peerHold {
	holds := make(map[netip.Addr]*peerHold, len(peers))
	for i, p := range peers {
		holds[netip.MustParseAddr(p.Address)] = &peerHold{
			resetHold: resetHold{base: p.IdleHoldAfterReset, max: p.IdleHoldAfterResetMax, cur: p.IdleHoldAfterReset},
			index:     i,
		}
	}
	return holds
}

// dampen follows a session up or down (from sessionEvent): down doubles
// the hold for the next reset; up starts the time after which the hold
// is back to base.
func (s *Speaker) dampen(addr netip.Addr, up bool) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	h, ok := s.holds[addr]
	if !ok || h.up == up || s.holdsStopped {
		return
	}
	h.up = up
	h.gen++
	if h.decay != nil {
		h.decay.Stop()
		h.decay = nil
	}
	if up {
		if h.cur == h.base {
			return
		}
		gen := h.gen
		h.decay = time.AfterFunc(h.max, func() {
			s.holdMu.Lock()
			defer s.holdMu.Unlock()
			if h.gen != gen || s.holdsStopped {
				return
			}
			s.setHold(addr, h, h.stable())
		})
		return
	}
	if prev := h.cur; h.down() != prev {
		s.setHold(addr, h, h.cur)
	}
}

// setHold gives GoBGP the session's hold after reset; s.holdMu is held.
// Only the timers change, which GoBGP applies without touching the
// session.
func (s *Speaker) setHold(addr netip.Addr, h *peerHold, d time.Duration) {
	peer := proto.Clone(s.peers[h.index]).(*api.Peer)
	peer.Timers.Config.IdleHoldTimeAfterReset = uint64(d / time.Second)
	if _, err := s.bgp.UpdatePeer(context.Background(), &api.UpdatePeerRequest{Peer: peer}); err != nil {
		s.log.Warn("bgp: set the idle hold after reset", "peer", addr, "hold", d, "err", err)
		return
	}
	if d != h.base {
		s.log.Info("bgp: session flapping: idle hold after reset raised", "peer", addr, "hold", d)
	}
}

// stopHolds ends the decay timers (Stop).
func (s *Speaker) stopHolds() {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	s.holdsStopped = true
	for _, h := range s.holds {
		if h.decay != nil {
			h.decay.Stop()
		}
	}
}

// idleHold is the session's hold after the next reset, for Status.
func (s *Speaker) idleHold(addr netip.Addr) time.Duration {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if h, ok := s.holds[addr]; ok {
		return h.cur
	}
	return 0
}
