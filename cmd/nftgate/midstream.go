package main

import "github.com/nftgate/nftgate/gateways"

// dropMidstreamTCP tells whether the ruleset drops masqueraded TCP packets
// that conntrack would pick up in mid-stream ([gateways] midstream_tcp =
// "wait", the default with state sync): a connection another gateway
// opened a moment before the router moved it here (a drain's withdrawal,
// a failure) then waits for its replica instead of being masqueraded
// afresh and reset by its endpoint.
func (c *Config) dropMidstreamTCP() bool {
	return c.Gateways != nil && c.Gateways.MidstreamTCP == gateways.MidstreamWait
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
