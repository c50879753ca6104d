package statesync

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Status is the sync as GET /api/v1/statesync shows it.
type Status struct {
	// Ready: every live peer finished its resync to this gateway (or the
	// wait for them ended).
	Ready bool `json:"ready"`
	// Flows are this gateway's own entries as last sent; Replicas the
	// peers' entries written here.
	Flows      int    `json:"flows"`
	Replicas   int    `json:"replicas"`
	EventsLost uint64 `json:"eventsLost"`
	Adopted    uint64 `json:"adopted"`
	// Swept are the replicas deleted because their origin's full resync
	// left them out.
	Swept uint64 `json:"swept"`
	// NotReplicated are this gateway's own flows not sent to the peers,
	// by reason (NotReplicatedNodePort, NotReplicatedNotService): they
	// do not survive its failure. Not errors: the peers never see them.
	NotReplicated map[string]uint64 `json:"notReplicated"`
	// ConntrackEvents is what conntrack reports of the Services'
	// connections, as nftgate runs it (Options.ConntrackEvents).
	ConntrackEvents string       `json:"conntrackEvents,omitempty"`
	Peers           []PeerStatus `json:"peers"`
}

// PeerStatus is the sync with one peer.
type PeerStatus struct {
	Name string `json:"name"`
	Up   bool   `json:"up"`
	// Queue is the updates waiting; Unacked the batches sent and not yet
	// acknowledged.
	Queue     int  `json:"queue"`
	Unacked   int  `json:"unacked"`
	Resyncing bool `json:"resyncing"`
	// Sent, Received: entries; Refused: entries from the peer refused, by
	// reason; Lost: updates to the peer dropped (a full resync followed).
	Sent     uint64            `json:"sent"`
	Received uint64            `json:"received"`
	Refused  map[string]uint64 `json:"refused"`
	Lost     uint64            `json:"lost"`
	// ResyncsSent to the peer, ResyncsReceived from it; ResyncDone: it
	// finished one to this gateway since this gateway started.
	ResyncsSent     uint64 `json:"resyncsSent"`
	ResyncsReceived uint64 `json:"resyncsReceived"`
	ResyncDone      bool   `json:"resyncDone"`
	// LagSeconds is the last acked batch's time from its oldest event to
	// the peer's ack of the write.
	LagSeconds float64 `json:"lagSeconds"`
}

// Status returns the sync's state now.
func (s *Syncer) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Ready: s.readyDone, Flows: len(s.flows), Replicas: len(s.replicas), EventsLost: s.eventsLost, Adopted: s.adopted, Swept: s.swept,
		NotReplicated: maps.Clone(s.notReplicated), ConntrackEvents: s.o.ConntrackEvents, Peers: []PeerStatus{}}
	for _, n := range slices.Sorted(maps.Keys(s.peers)) {
		p := s.peers[n]
		st.Peers = append(st.Peers, PeerStatus{Name: n, Up: p.up, Queue: len(p.queue), Unacked: len(p.unacked), Resyncing: p.resyncing || p.resync,
			Sent: p.sent, Received: p.received, Refused: maps.Clone(p.refused), Lost: p.lost,
			ResyncsSent: p.resyncsSent, ResyncsReceived: p.resyncsReceived, ResyncDone: p.doneFromIt, LagSeconds: p.lastLag.Seconds()})
	}
	return st
}

type metrics struct {
	sent, received, lost *prometheus.CounterVec
	refused, resyncs     *prometheus.CounterVec
	notReplicated        *prometheus.CounterVec
	lag                  *prometheus.HistogramVec
	eventsLost           prometheus.Counter
	adopted, refreshed   prometheus.Counter
	passes, read         *prometheus.CounterVec
	swept                prometheus.Counter
	ready                prometheus.Gauge
	all                  []prometheus.Collector
}

func newMetrics(s *Syncer) *metrics {
	m := &metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_entries_sent_total",
			Help: "Conntrack entries sent to the peer gateway (puts and deletes)."}, []string{"peer"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_entries_received_total",
			Help: "Conntrack entries received from the peer gateway, written or refused."}, []string{"peer"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_entries_refused_total",
			Help: "Entries from the peer gateway not written, by reason (decode, protocol, destination, endpoint, reply_destination, timeout, write)."},
			[]string{"peer", "reason"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_updates_lost_total",
			Help: "Updates to the peer dropped (queue overflow, failed send); a full resync follows."}, []string{"peer"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_resyncs_total",
			Help: "Full resyncs sent to the peer and received from it."}, []string{"peer", "direction"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "nftgate_statesync_lag_seconds",
			Help:    "Time from a conntrack event here to the peer's ack of its write (the oldest event of each batch).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"peer"}),
		notReplicated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_flows_not_replicated_total",
			Help: "Own flows not sent to the peers, by reason (node_port: to a node port on this gateway's own address, which does not move to a peer; not_a_service: to no Service address served here); they do not survive a failover."},
			[]string{"reason"}),
		eventsLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftgate_statesync_kernel_event_losses_total",
			Help: "Times the kernel dropped conntrack events (each resyncs every peer)."}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftgate_statesync_adopted_total",
			Help: "Replicas of a dead peer's entries this gateway took into its custody."}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftgate_statesync_replicas_swept_total",
			Help: "Replicas deleted because the origin's full resync left them out (their deletes were lost)."}),
		refreshed: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftgate_statesync_refreshes_total",
			Help: "Entries resent because their replicas would have expired (or had never been sent)."}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_refresh_passes_total",
			Help: "Refresh passes, by what they read: the whole table (read=\"table\": one pass in 12, the first, the next after an adoption or lost events) or only the entries whose replicas would expire (read=\"due\")."},
			[]string{"read"}),
		read: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_statesync_refresh_entries_read_total",
			Help: "Conntrack entries the refresh passes read, by kind of pass (read=\"table\": every own entry; read=\"due\": those asked for)."},
			[]string{"read"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftgate_statesync_ready",
			Help: "1 once every live peer finished its resync to this gateway (or the wait ended)."}),
	}
	m.all = []prometheus.Collector{m.sent, m.received, m.refused, m.notReplicated, m.lost, m.resyncs, m.lag, m.eventsLost, m.adopted, m.swept, m.refreshed, m.passes, m.read, m.ready,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nftgate_statesync_replicas",
			Help: "Peers' entries written here (as far as this gateway knows)."}, func() float64 { return float64(s.Status().Replicas) })}
	for _, r := range []string{NotReplicatedNodePort, NotReplicatedNotService} {
		m.notReplicated.WithLabelValues(r)
	}
	for _, r := range []string{readTable, readDue} {
		m.passes.WithLabelValues(r)
		m.read.WithLabelValues(r)
	}
	for _, n := range s.o.Peers {
		m.sent.WithLabelValues(n)
		m.received.WithLabelValues(n)
		m.lost.WithLabelValues(n)
		m.all = append(m.all, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "nftgate_statesync_queue_depth",
			Help: "Updates waiting to be sent to the peer.", ConstLabels: prometheus.Labels{"peer": n}}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return float64(len(s.peers[n].queue))
		}))
	}
	return m
}

// Register adds the sync's metrics (nftgate_statesync_*) to reg.
func (s *Syncer) Register(reg prometheus.Registerer) error {
	for _, c := range s.m.all {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
