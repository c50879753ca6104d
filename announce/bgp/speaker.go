package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Route is one prefix to announce: a service address as a /32 or /128,
// with the attributes of the pool it was allocated from.
type Route struct {
	Prefix netip.Prefix
	// Pool names the Config.Pools entry whose communities, local
	// preference, MED and AS-path prepend the route carries; "" or a pool
	// without an entry: the gateway's MED and prepend only.
	Pool string
}

// HostRoute is the Route of one address: a /32 or a /128.
func HostRoute(a netip.Addr, pool string) Route {
	a = a.Unmap()
	return Route{Prefix: netip.PrefixFrom(a, a.BitLen()), Pool: pool}
}

// Speaker is one in-process BGP speaker (GoBGP) that announces a set of
// prefixes to the configured peers. Its methods are safe for concurrent
// use.
type Speaker struct {
	cfg    Config
	bgp    *server.BgpServer
	log    *slog.Logger
	pools  map[string]poolAttrs
	nextV4 netip.Addr
	nextV6 netip.Addr

	mu        sync.Mutex // serialises Set and Stop
	announced map[netip.Prefix]string
	stopped   bool
	// peers are the sessions, built by New and added to the BGP server
	// by the first Set (peersUp), so that no session opens before the
	// speaker holds the routes of a whole sync.
	peers   []*api.Peer
	peersUp bool

	// stopWatch ends the watch of the sessions' states; up holds the
	// sessions established, by peer address.
	stopWatch context.CancelFunc
	upMu      sync.Mutex
	up        map[netip.Addr]bool

	// holds are the sessions' dampened idle holds after reset.
	holdMu       sync.Mutex
	holds        map[netip.Addr]*peerHold
	holdsStopped bool
}

type poolAttrs struct {
	communities []uint32
	localPref   uint32
	med         *uint32
	prepend     int
}

// exportPolicy lets only this speaker's own routes out: a route learned
// from one peer is never passed to another (the gateway is no transit).
const exportPolicy = "nftgate-own-routes-only"

// New validates cfg (after WithDefaults), starts the speaker and builds
// its sessions; it opens them, and announces, with the first Set. Every
// session advertises graceful restart with the restart bit set (unless
// restart_time = -1s), so that after a restart of the process the peers
// keep the routes they held and refresh them from the next Set, then flush
// what was not announced again (End-of-RIB). Opening the sessions only once
// the first Set has put a whole sync's routes in the RIB is what makes that
// End-of-RIB come after the routes: a session opened earlier would send it
// as soon as the peer's own End-of-RIB arrived, and the peer would flush
// every route the restarted speaker had not announced yet.
func New(cfg Config, log *slog.Logger) (*Speaker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Speaker{cfg: cfg, log: log, pools: map[string]poolAttrs{}, announced: map[netip.Prefix]string{}, holds: newPeerHolds(cfg.Peers)}
	for name, p := range cfg.Pools {
		a := poolAttrs{localPref: p.LocalPreference, med: cfg.MED, prepend: cfg.ASPathPrepend}
		for _, c := range p.Communities {
			v, _ := ParseCommunity(c) // checked by Validate
			a.communities = append(a.communities, v)
		}
		if p.MED != nil {
			a.med = p.MED
		}
		if p.ASPathPrepend != nil {
			a.prepend = *p.ASPathPrepend
		}
		s.pools[name] = a
	}
	if cfg.NextHopIPv4 != "" {
		s.nextV4 = netip.MustParseAddr(cfg.NextHopIPv4)
	}
	if cfg.NextHopIPv6 != "" {
		s.nextV6 = netip.MustParseAddr(cfg.NextHopIPv6)
	}
	// GoBGP logs through slog; its info level is chatty per message.
	level := new(slog.LevelVar)
	level.Set(slog.LevelWarn)
	s.bgp = server.NewBgpServer(server.LoggerOption(log.With("component", "bgp"), level))
	go s.bgp.Serve()
	ctx := context.Background()
	global := &api.Global{Asn: cfg.ASN, RouterId: cfg.RouterID, ListenPort: int32(cfg.ListenPort)}
	if err := s.bgp.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		s.bgp.Stop()
		return nil, fmt.Errorf("%s: start: %w", Key, err)
	}
	watch, stopWatch := context.WithCancel(ctx)
	s.stopWatch, s.up = stopWatch, map[netip.Addr]bool{}
	if err := s.bgp.WatchEvent(watch, server.WatchEventMessageCallbacks{OnPeerUpdate: s.sessionEvent}, server.WatchPeer()); err != nil {
		stopWatch()
		s.bgp.Stop()
		return nil, fmt.Errorf("%s: watch the sessions: %w", Key, err)
	}
	if err := s.setPolicies(ctx); err != nil {
		stopWatch()
		s.bgp.Stop()
		return nil, err
	}
	for i, p := range cfg.Peers {
		peer, err := s.peer(p)
		if err != nil {
			stopWatch()
			s.bgp.Stop()
			return nil, fmt.Errorf("%s.peer[%d] (%s): %w", Key, i, p.Address, err)
		}
		s.peers = append(s.peers, peer)
	}
	return s, nil
}

// sessionEvent logs a session that came up (established) or went down
// (left established), with the reason GoBGP gives.
func (s *Speaker) sessionEvent(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	st := ev.Peer.State
	up := st.SessionState == bgp.BGP_FSM_ESTABLISHED
	s.upMu.Lock()
	was := s.up[st.NeighborAddress]
	s.up[st.NeighborAddress] = up
	s.upMu.Unlock()
	s.dampen(st.NeighborAddress, up)
	switch {
	case up && !was:
		s.log.Info("bgp: session up", "peer", st.NeighborAddress, "asn", st.PeerASN)
	case !up && was:
		reason := strings.ToLower(strings.TrimPrefix(st.DisconnectReason.String(), "DISCONNECT_REASON_"))
		s.log.Info("bgp: session down", "peer", st.NeighborAddress, "asn", st.PeerASN, "reason", reason, "message", st.DisconnectMessage)
	}
}

// openSessions adds the peers to the BGP server, once; s.mu is held.
func (s *Speaker) openSessions() error {
	if s.peersUp {
		return nil
	}
	s.peersUp = true
	var errs []error
	for i, peer := range s.peers {
		if err := s.bgp.AddPeer(context.Background(), &api.AddPeerRequest{Peer: peer}); err != nil {
			errs = append(errs, fmt.Errorf("%s.peer[%d] (%s): %w", Key, i, s.cfg.Peers[i].Address, err))
		}
	}
	return errors.Join(errs...)
}

func (s *Speaker) setPolicies(ctx context.Context) error {
	own := &api.Policy{Name: exportPolicy, Statements: []*api.Statement{{
		Name:       exportPolicy + "-accept",
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
	}}}
	if err := s.bgp.AddPolicy(ctx, &api.AddPolicyRequest{Policy: own}); err != nil {
		return fmt.Errorf("%s: export policy: %w", Key, err)
	}
	err := s.bgp.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name:          "global",
		Direction:     api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies:      []*api.Policy{{Name: exportPolicy}},
		DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
	}})
	if err != nil {
		return fmt.Errorf("%s: export policy: %w", Key, err)
	}
	return nil
}

func familyOf(a netip.Addr) *api.Family {
	if a.Is4() {
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
}

func (s *Speaker) peer(p PeerConfig) (*api.Peer, error) {
	addr := netip.MustParseAddr(p.Address) // checked by Validate
	var password string
	if p.PasswordFile != "" {
		var err error
		if password, err = ReadPassword(p.PasswordFile); err != nil {
			return nil, fmt.Errorf("password_file %s: %w", p.PasswordFile, err)
		}
	}
	gr := s.cfg.GracefulRestart()
	afi := &api.AfiSafi{
		Config:            &api.AfiSafiConfig{Family: familyOf(addr), Enabled: true},
		MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: gr}},
	}
	peer := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: addr.String(),
			PeerAsn:         p.ASN,
			LocalAsn:        p.LocalASN,
			AuthPassword:    password,
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime:          uint64(p.HoldTime / time.Second),
			KeepaliveInterval: uint64(max(p.HoldTime/3/time.Second, 1)),
			ConnectRetry:      uint64(p.ConnectRetry / time.Second),
			// GoBGP's own default (for 0) is 30s: after a BFD blip the
			// session would stay down that long.
			IdleHoldTimeAfterReset: uint64(p.IdleHoldAfterReset / time.Second),
		}},
		Transport: &api.Transport{PassiveMode: p.Passive, RemotePort: uint32(p.Port)},
		AfiSafis:  []*api.AfiSafi{afi},
	}
	if gr {
		peer.GracefulRestart = &api.GracefulRestart{
			Enabled:     true,
			RestartTime: uint32(s.cfg.RestartTime / time.Second),
			// The restart bit: the peer keeps stale routes until this
			// speaker's End-of-RIB, and the forwarding bit (which GoBGP
			// sets with it) tells it the data plane kept forwarding, as
			// the kernel's nftables rules do across a restart.
			LocalRestarting: true,
			DeferralTime:    uint32(s.cfg.SelectionDeferral / time.Second),
		}
	}
	if p.Multihop != 0 {
		peer.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.Multihop)}
	}
	if p.BFD {
		us := uint32(p.BFDInterval / time.Microsecond)
		peer.Bfd = &api.BfdPeerConfig{
			Enabled:                  true,
			DesiredMinimumTxInterval: us,
			RequiredMinimumReceive:   us,
			DetectionMultiplier:      uint32(p.BFDMultiplier),
		}
	}
	return peer, nil
}

// Set makes the announced set equal to routes: prefixes not announced yet
// (or announced with another pool) are announced, prefixes no longer in
// routes are withdrawn, the others are left alone. Its cost is in
// proportion to len(routes) plus the changes. A route whose prefix is
// invalid is refused with the others applied; the error names it.
func (s *Speaker) Set(routes []Route) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New(Key + ": speaker stopped")
	}
	var errs []error
	want := make(map[netip.Prefix]string, len(routes))
	for _, r := range routes {
		if !r.Prefix.IsValid() {
			errs = append(errs, fmt.Errorf("%s: route %q: not a prefix", Key, r.Prefix))
			continue
		}
		p := netip.PrefixFrom(r.Prefix.Addr().Unmap(), r.Prefix.Bits()-unmapBits(r.Prefix.Addr())).Masked()
		want[p] = r.Pool
	}
	var add, del []*apiutil.Path
	var addPrefixes, delPrefixes []netip.Prefix
	for p, pool := range want {
		if old, ok := s.announced[p]; ok && old == pool {
			continue
		}
		path, err := s.path(p, pool, false)
		if err != nil {
			errs = append(errs, err)
			delete(want, p)
			continue
		}
		add = append(add, path)
		addPrefixes = append(addPrefixes, p)
	}
	for p, pool := range s.announced {
		if _, ok := want[p]; !ok {
			path, err := s.path(p, pool, true)
			if err != nil {
				return err
			}
			del = append(del, path)
			delPrefixes = append(delPrefixes, p)
		}
	}
	if len(del) > 0 {
		if err := s.bgp.DeletePath(apiutil.DeletePathRequest{Paths: del}); err != nil {
			return errors.Join(append(errs, fmt.Errorf("%s: withdraw: %w", Key, err))...)
		}
		for _, p := range delPrefixes {
			delete(s.announced, p)
		}
	}
	if len(add) > 0 {
		resp, err := s.bgp.AddPath(apiutil.AddPathRequest{Paths: add})
		for i, p := range addPrefixes {
			if i < len(resp) && resp[i].Error != nil || i >= len(resp) && err != nil {
				continue
			}
			s.announced[p] = want[p]
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: announce: %w", Key, err))
		}
	}
	if err := s.openSessions(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

// path builds the GoBGP path of prefix p with the attributes of pool.
func (s *Speaker) path(p netip.Prefix, pool string, withdraw bool) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(p)
	if err != nil {
		return nil, fmt.Errorf("%s: route %s: %w", Key, p, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := bgp.RF_IPv4_UC
	if p.Addr().Is4() {
		nh := s.nextV4
		if !nh.IsValid() {
			nh = netip.IPv4Unspecified() // GoBGP puts the session's own address
		}
		a, err := bgp.NewPathAttributeNextHop(nh)
		if err != nil {
			return nil, fmt.Errorf("%s: route %s: %w", Key, p, err)
		}
		attrs = append(attrs, a)
	} else {
		family = bgp.RF_IPv6_UC
		nh := s.nextV6
		if !nh.IsValid() {
			nh = netip.IPv6Unspecified()
		}
		a, err := bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, nh)
		if err != nil {
			return nil, fmt.Errorf("%s: route %s: %w", Key, p, err)
		}
		attrs = append(attrs, a)
	}
	a, ok := s.pools[pool]
	if !ok {
		a = poolAttrs{med: s.cfg.MED, prepend: s.cfg.ASPathPrepend}
	}
	if len(a.communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(slices.Clone(a.communities)))
	}
	if a.localPref != 0 {
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(a.localPref))
	}
	if a.med != nil {
		attrs = append(attrs, bgp.NewPathAttributeMultiExitDisc(*a.med))
	}
	if a.prepend > 0 {
		// GoBGP puts the session's own AS in front once more on export
		// to an eBGP peer: the path the peer sees is asn × (1+prepend).
		attrs = append(attrs, bgp.NewPathAttributeAsPath([]bgp.AsPathParamInterface{
			bgp.NewAs4PathParam(bgp.BGP_ASPATH_ATTR_TYPE_SEQ, slices.Repeat([]uint32{s.cfg.ASN}, a.prepend)),
		}))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs, Withdrawal: withdraw}, nil
}

// Announced is the announced set, sorted.
func (s *Speaker) Announced() []Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Route, 0, len(s.announced))
	for p, pool := range s.announced {
		out = append(out, Route{Prefix: p, Pool: pool})
	}
	slices.SortFunc(out, func(a, b Route) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	return out
}

// Stop withdraws every route on purpose (drain, shutdown), waits until
// the withdrawals are sent or ctx ends, and closes the sessions. A process
// that exits without Stop leaves its routes with the peers for the
// restart time (graceful restart): that is how an update or a restart
// keeps traffic flowing.
func (s *Speaker) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	var err error
	if len(s.announced) > 0 {
		err = s.bgp.DeletePath(apiutil.DeletePathRequest{DeleteAll: true})
		clear(s.announced)
		if err == nil {
			err = s.waitSent(ctx)
		}
	}
	s.stopHolds()
	s.bgp.Stop()
	s.stopWatch()
	return err
}

// waitSent waits until no established peer has routes of this speaker
// left (its adj-RIB-out is empty).
func (s *Speaker) waitSent(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		left := 0
		for _, st := range s.Status() {
			if st.State == StateEstablished {
				left += int(st.PrefixesSent)
			}
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: withdrawals not sent: %w", Key, ctx.Err())
		case <-t.C:
		}
	}
}
