package main

import (
	"net/netip"

	"github.com/nftgate/nftgate/gateways"
)

// handOver makes a drain in active-backup mode give every floating address
// (the Service addresses and the masquerade address alike) to the backup
// at once, so that both directions of every flow pass the backup, which
// holds their state; with the state sync on, the drain ends once the flows
// have moved (flowsMoved) rather than when they close. Without it a
// draining active would keep the masquerade address, and the flows would
// be split: forward through the backup, replies through the draining one.
// In active-active mode the drain withdraws the Service routes only.
func (e *edge) handOver(d *drainer, cfg *Config) {
	if e.gateways == nil || cfg.Gateways.Mode != gateways.ModeActiveBackup {
		return
	}
	d.leave = e.gateways.Leave
	if e.statesync != nil {
		float := cfg.floatingMasquerade()
		d.moved = func(withdrawn []netip.Addr) bool { return e.flowsMoved(append(withdrawn, float...)) }
	}
}

// flowsMoved tells whether the flows to addrs have moved to the other
// gateways: this gateway holds none of them, live peers hold every one,
// and every live peer has acknowledged every update the state sync had
// for it.
func (e *edge) flowsMoved(addrs []netip.Addr) bool {
	st := e.gateways.Status()
	if len(st.Holds) > 0 {
		return false
	}
	held := map[netip.Addr]bool{}
	for _, p := range st.Peers {
		if p.State == "alive" {
			for _, a := range p.Holds {
				held[a] = true
			}
		}
	}
	for _, a := range addrs {
		if !held[a.Unmap()] {
			return false
		}
	}
	for _, p := range e.statesync.s.Status().Peers {
		if p.Up && (p.Queue > 0 || p.Unacked > 0 || p.Resyncing) {
			return false
		}
	}
	return true
}
