package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/statesync"
)

// stateSync is the connection-state sync of the gateway set
// ([gateways] state_sync): the conntrack kernel side, the Policy fed by
// the sync loop and the Syncer on the set's channel.
type stateSync struct {
	kernel *statesync.Conntrack
	policy *statesync.Policy
	s      *statesync.Syncer
}

// newStateSync prepares the state sync before the gateway set starts (the
// set's OnPeer and Ready are the Syncer's); nil when it is off. A
// kernel without conntrack events or marks stops nftgate here, naming the
// key that turns the sync off.
func newStateSync(cfg *Config, reg prometheus.Registerer, log *slog.Logger) (*stateSync, error) {
	g := cfg.Gateways
	if g == nil || g.StateSync == nil || !*g.StateSync {
		return nil, nil
	}
	k, err := statesync.NewConntrack(statesync.ConntrackOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s.state_sync = true: %w (state_sync = false runs without it)", gateways.Key, err)
	}
	// Window tracking liberal where a flow's packets may pass a gateway
	// whose entry did not see the ones before: the key that asks for it.
	liberal, why := "", ""
	switch {
	case g.Mode == gateways.ModeActiveActive:
		liberal, why = fmt.Sprintf("%s.mode = %q", gateways.Key, g.Mode), "in active-active mode a flow's two directions may pass different gateways"
	case cfg.tracksLinks():
		liberal, why = gateways.Key+".track_interfaces", "with tracked links, the flows a peer carried while a link was down come back to entries of this gateway that did not see their packets"
	}
	if liberal != "" {
		if err := statesync.LiberalTCP(); err != nil {
			_ = k.Close()
			return nil, fmt.Errorf("%s with state_sync: %w", liberal, err)
		}
		log.Info("statesync: TCP window tracking is liberal in this namespace (nf_conntrack_tcp_be_liberal = 1): " + why)
	}
	switch {
	case cfg.leanServiceEvents():
		log.Info("statesync: conntrack reports events only of the connections translated to a Service, and of a masqueraded TCP connection only its start, the handshake's end, its first FIN or RST and its end (conntrack_events = \"lean\"); a routed connection makes none")
	case cfg.untranslatedEventsOff():
		log.Info("statesync: conntrack reports events only of the connections translated to a Service (conntrack_events = \"services\"); a routed connection makes none")
	}
	peers := make([]string, 0, len(g.Peers))
	for _, p := range g.Peers {
		peers = append(peers, p.Name)
	}
	policy := statesync.NewPolicy(cfg.ruleset(), cfg.floatingMasquerade())
	s, err := statesync.New(statesync.Options{Kernel: k, Policy: policy, Self: g.Name, Peers: peers,
		Queue: g.SyncQueue, BatchInterval: g.SyncBatchInterval, BatchBytes: g.SyncBatchBytes,
		RefreshInterval: g.SyncRefreshInterval, PeerWait: g.StartupWait, ReadyWait: g.ReadyTimeout,
		ConntrackEvents: g.ConntrackEvents, Log: log})
	if err != nil {
		_ = k.Close()
		return nil, err
	}
	if err := s.Register(reg); err != nil {
		_ = k.Close()
		return nil, err
	}
	return &stateSync{kernel: k, policy: policy, s: s}, nil
}

// hook wires the sync into the gateway set's options.
func (ss *stateSync) hook(opts *gateways.Options) {
	if ss == nil {
		return
	}
	opts.OnPeer = ss.s.PeerChanged
	opts.Ready = ss.s.Ready()
	opts.ReadyHold = ss.s.ResyncMoving
}

// run follows the sync loop (the Policy) and replicates until ctx ends,
// in wg; a failure of the kernel side goes to errc.
func (ss *stateSync) run(ctx context.Context, syncer *loop.Syncer, wg *sync.WaitGroup, errc chan<- error) {
	if ss == nil {
		return
	}
	syncer.Observers = append(syncer.Observers, ss.policy.Observe)
	wg.Go(func() {
		if err := ss.s.Run(ctx); err != nil {
			errc <- err
		}
	})
}

func (ss *stateSync) close() {
	if ss != nil {
		_ = ss.kernel.Close()
	}
}

// stateSyncAPI is the appliance's StateSync option: nil without the sync.
func (e *edge) stateSyncAPI() func() any {
	if e.statesync == nil {
		return nil
	}
	return func() any { return e.statesync.s.Status() }
}
