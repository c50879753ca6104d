package main

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/nftgate/nftgate/gateways"
)

// dropMidstreamTCP tells whether the ruleset drops masqueraded TCP packets
// that conntrack would pick up in mid-stream ([gateways] midstream_tcp =
// "wait", the default with state sync): a connection another gateway
// opened a moment before the router moved it here (a drain's withdrawal,
// a failure) then waits for its replica instead of being masqueraded
// afresh and reset by its endpoint.
func (c *Config) dropMidstreamTCP() bool {
	return c.Gateways != nil && c.Gateways.MidstreamTCP == gateways.MidstreamWait
}

// midstreamWait is how long, with dropMidstreamTCP, one connection's
// packets are dropped before the next is picked up ([gateways]
// midstream_tcp_wait).
func (c *Config) midstreamWait() time.Duration {
	if !c.dropMidstreamTCP() {
		return 0
	}
	return c.Gateways.MidstreamTCPWait
}

// midstreamWaitPeerDead is how long the wait is instead while a peer of
// the set is dead ([gateways] midstream_tcp_wait_peer_dead); not shorter
// than midstreamWait: no shorter wait.
func (c *Config) midstreamWaitPeerDead() time.Duration {
	if !c.dropMidstreamTCP() {
		return 0
	}
	return c.Gateways.MidstreamTCPWaitPeerDead
}

// untranslatedEventsOff tells whether conntrack reports no events of the
// connections nftgate does not translate ([gateways] conntrack_events =
// "services", the default with state sync, or "lean"): the sync's
// listener wants only the Services' flows, and the kernel would build
// every routed connection's events for it to drop.
func (c *Config) untranslatedEventsOff() bool {
	return c.Gateways != nil && c.Gateways.ConntrackEvents != gateways.EventsAll
}

// leanServiceEvents tells whether conntrack reports of a masqueraded
// Service TCP connection only the five events a replica needs ([gateways]
// conntrack_events = "lean").
func (c *Config) leanServiceEvents() bool {
	return c.Gateways != nil && c.Gateways.ConntrackEvents == gateways.EventsLean
}

// The namespace's conntrack FIN_WAIT timeout, which a replica of a closed
// connection holds under "lean" until the connection's end is reported.
const conntrackFinWaitSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_fin_wait"

// leanChecks are what chooseConntrackEvents asks of the kernel: whether it
// takes the lean rules (nft.CheckLeanEvents), and the namespace's conntrack
// TIME_WAIT and FIN_WAIT timeouts in seconds.
type leanChecks struct {
	lean              func() error
	timeWait, finWait func() (int, error)
}

// chooseConntrackEvents settles [gateways] conntrack_events = "auto" (the
// default with state sync) at start, after setupReleaseTimeWait set
// conntrack's TIME_WAIT: "lean" where a closed connection's entry ends
// before its replica, left in FIN_WAIT by the lean events, would be read
// again by the refresh (TIME_WAIT plus two refresh intervals within
// FIN_WAIT: the release's 2 s, not the kernel's 120 s) and the kernel takes
// the lean rules (ct labels); "services" otherwise, saying why.
func chooseConntrackEvents(cfg *Config, log *slog.Logger, check leanChecks) {
	g := cfg.Gateways
	if g == nil || g.ConntrackEvents != gateways.EventsAuto {
		return
	}
	g.ConntrackEvents = gateways.EventsServices
	why := func(reason string, args ...any) {
		log.Info("statesync: conntrack_events = \"auto\" runs as \"services\": "+reason, args...)
	}
	tw, err := check.timeWait()
	if err != nil {
		why("conntrack's TIME_WAIT timeout is not readable", "err", err)
		return
	}
	fw, err := check.finWait()
	if err != nil {
		why("conntrack's FIN_WAIT timeout is not readable", "err", err)
		return
	}
	if horizon := 2 * g.SyncRefreshInterval; time.Duration(tw)*time.Second+horizon >= time.Duration(fw)*time.Second {
		why("a closed connection stays in conntrack's TIME_WAIT too long for a replica left in FIN_WAIT (\"lean\" would have the refresh read and send every closed connection again); the release's conntrack_tcp_time_wait keeps it short",
			"time_wait", strconv.Itoa(tw)+"s", "fin_wait", strconv.Itoa(fw)+"s", "sync_refresh_interval", g.SyncRefreshInterval.String())
		return
	}
	if err := check.lean(); err != nil {
		why("the kernel refuses the lean rules", "err", err)
		return
	}
	g.ConntrackEvents = gateways.EventsLean
}
