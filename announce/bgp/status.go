package bgp

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus"
)

// Session states, as the status page shows them.
const (
	StateIdle        = "idle"
	StateConnect     = "connect"
	StateActive      = "active"
	StateOpenSent    = "opensent"
	StateOpenConfirm = "openconfirm"
	StateEstablished = "established"
)

// PeerStatus is one session, for the status page and the API.
type PeerStatus struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	// State is one of the State constants.
	State string `json:"state"`
	// Since is when the session was established (zero when it is not).
	Since time.Time `json:"since,omitzero"`
	// PrefixesSent is how many prefixes the peer holds from this speaker;
	// PrefixesReceived how many it sent (before any filter).
	PrefixesSent     uint64 `json:"prefixesSent"`
	PrefixesReceived uint64 `json:"prefixesReceived"`
	// GracefulRestart: both sides negotiated it.
	GracefulRestart bool `json:"gracefulRestart"`
	// BFD is the BFD session state ("up", "down", "init", "admin-down"),
	// "" without BFD.
	BFD string `json:"bfd,omitempty"`
	// IdleHoldAfterReset is how long the session will stay idle after
	// its next reset: idle_hold_after_reset, or more while it flaps.
	IdleHoldAfterReset time.Duration `json:"idleHoldAfterReset"`
}

// Status returns every configured session, in configuration order.
func (s *Speaker) Status() []PeerStatus {
	ctx := context.Background()
	byAddr := map[string]PeerStatus{}
	_ = s.bgp.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		st := PeerStatus{Address: p.GetConf().GetNeighborAddress(), ASN: p.GetConf().GetPeerAsn()}
		st.State = sessionState(p.GetState().GetSessionState())
		if st.State == StateEstablished {
			if up := p.GetTimers().GetState().GetUptime(); up != nil {
				st.Since = up.AsTime()
			}
		}
		for _, a := range p.GetAfiSafis() {
			st.PrefixesSent += a.GetState().GetAdvertised()
			st.PrefixesReceived += a.GetState().GetReceived()
		}
		for _, c := range p.GetState().GetRemoteCap() {
			if c.GetGracefulRestart() != nil {
				st.GracefulRestart = s.cfg.GracefulRestart()
			}
		}
		byAddr[st.Address] = st
	})
	s.bgp.ListBfdPeer(ctx, func(addr string, b *api.BfdPeerState) {
		if st, ok := byAddr[addr]; ok {
			st.BFD = bfdState(b.GetSessionState())
			byAddr[addr] = st
		}
	})
	out := make([]PeerStatus, 0, len(s.cfg.Peers))
	for _, p := range s.cfg.Peers {
		addr := netip.MustParseAddr(p.Address).String()
		st, ok := byAddr[addr]
		if !ok {
			st = PeerStatus{Address: addr, ASN: p.ASN, State: StateIdle}
		}
		st.IdleHoldAfterReset = s.idleHold(netip.MustParseAddr(p.Address))
		if p.BFD && st.BFD == "" {
			st.BFD = "down"
		}
		out = append(out, st)
	}
	return out
}

func sessionState(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_SESSION_STATE_CONNECT:
		return StateConnect
	case api.PeerState_SESSION_STATE_ACTIVE:
		return StateActive
	case api.PeerState_SESSION_STATE_OPENSENT:
		return StateOpenSent
	case api.PeerState_SESSION_STATE_OPENCONFIRM:
		return StateOpenConfirm
	case api.PeerState_SESSION_STATE_ESTABLISHED:
		return StateEstablished
	default:
		return StateIdle
	}
}

func bfdState(s api.BfdSessionState) string {
	switch s {
	case api.BfdSessionState_BFD_SESSION_STATE_UP:
		return "up"
	case api.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "init"
	case api.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "admin-down"
	default:
		return "down"
	}
}

// ReceivedRoute is a route a peer announced to this speaker.
type ReceivedRoute struct {
	Peer    netip.Addr
	Prefix  netip.Prefix
	NextHop netip.Addr
	// Stale: the peer is restarting and has not refreshed it yet.
	Stale bool
}

// Received returns the routes learned from the peers (their adj-RIB-in,
// before any filter), sorted by peer and prefix. This speaker never passes
// them on to other peers, nor installs them anywhere.
func (s *Speaker) Received() []ReceivedRoute {
	var out []ReceivedRoute
	for _, p := range s.cfg.Peers {
		peer := netip.MustParseAddr(p.Address)
		family := bgp.RF_IPv4_UC
		if peer.Is6() {
			family = bgp.RF_IPv6_UC
		}
		_ = s.bgp.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: peer.String(), Family: family},
			func(nlri bgp.NLRI, paths []*apiutil.Path) {
				prefix, ok := nlri.(*bgp.IPAddrPrefix)
				if !ok {
					return
				}
				for _, path := range paths {
					out = append(out, ReceivedRoute{Peer: peer, Prefix: prefix.Prefix, NextHop: nextHop(path), Stale: path.Stale})
				}
			})
	}
	slices.SortFunc(out, func(a, b ReceivedRoute) int {
		if c := a.Peer.Compare(b.Peer); c != 0 {
			return c
		}
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
	return out
}

func nextHop(p *apiutil.Path) netip.Addr {
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			return a.Value
		case *bgp.PathAttributeMpReachNLRI:
			return a.Nexthop
		}
	}
	return netip.Addr{}
}

// Register adds the speaker's metrics to reg, read from the speaker at
// each scrape: nftgate_bgp_session_up{peer}, nftgate_bgp_announced_prefixes,
// nftgate_bgp_prefixes_sent{peer}, nftgate_bgp_prefixes_received{peer} and
// nftgate_bgp_bfd_up{peer} (for peers with BFD).
func (s *Speaker) Register(reg prometheus.Registerer) error {
	return reg.Register(collector{s})
}

var (
	descSessionUp = prometheus.NewDesc("nftgate_bgp_session_up",
		"1 when the BGP session with the peer is established.", []string{"peer"}, nil)
	descAnnounced = prometheus.NewDesc("nftgate_bgp_announced_prefixes",
		"Prefixes this gateway announces (to every peer of their address family).", nil, nil)
	descSent = prometheus.NewDesc("nftgate_bgp_prefixes_sent",
		"Prefixes the peer holds from this gateway.", []string{"peer"}, nil)
	descReceived = prometheus.NewDesc("nftgate_bgp_prefixes_received",
		"Prefixes received from the peer.", []string{"peer"}, nil)
	descBFDUp = prometheus.NewDesc("nftgate_bgp_bfd_up",
		"1 when the BFD session with the peer is up (peers with BFD only).", []string{"peer"}, nil)
)

type collector struct{ s *Speaker }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessionUp, descAnnounced, descSent, descReceived, descBFDUp} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	announced := len(c.s.announced)
	c.s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descAnnounced, prometheus.GaugeValue, float64(announced))
	for _, st := range c.s.Status() {
		ch <- prometheus.MustNewConstMetric(descSessionUp, prometheus.GaugeValue, boolValue(st.State == StateEstablished), st.Address)
		ch <- prometheus.MustNewConstMetric(descSent, prometheus.GaugeValue, float64(st.PrefixesSent), st.Address)
		ch <- prometheus.MustNewConstMetric(descReceived, prometheus.GaugeValue, float64(st.PrefixesReceived), st.Address)
		if st.BFD != "" {
			ch <- prometheus.MustNewConstMetric(descBFDUp, prometheus.GaugeValue, boolValue(st.BFD == "up"), st.Address)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
