// Package statesync keeps the connections a gateway carries alive on its
// peers: it reads the kernel's conntrack events for the flows this gateway
// translates (DNAT to an endpoint, masquerade), sends their state changes
// to the other gateways of the set over the set's authenticated channel
// (package gateways, message types of its own), and writes what the peers
// send as replica entries into this gateway's kernel, so that a packet of a
// moved flow is handled as established here with the same translations.
//
// The kernel side (Kernel) is conntrack netlink: events, a dump for the
// full resync, and the writer of replicas, which carry the ct mark bit
// ReplicaMark so that their own events are not sent again. The sync side
// (the Syncer) batches updates per peer, bounds its queues, refreshes
// entries that would expire, resyncs a peer that (re)joins, and refuses
// any entry for a destination, endpoint or source address this gateway
// does not serve (Policy). The design is docs/design/gateways.md.
package statesync
