// Package l2 announces the addresses this gateway serves on the local
// segment: it answers ARP requests (IPv4) and neighbour solicitations
// (IPv6) for them on the configured interfaces with the interface's MAC,
// and sends gratuitous ARP / unsolicited neighbour advertisements when an
// address starts being announced, so that neighbours that cached another
// owner move over at once. The addresses need not be configured on any
// interface: the gateway's nftables rules take the traffic (DNAT), and the
// kernel itself would not answer for them.
//
// The API is declarative, the same shape as package announce/bgp. New
// opens the sockets on the interfaces of a Config (the [l2] section of
// config.toml); Set(addrs) makes the announced set equal to addrs; Status
// lists each announced address (interfaces, announced since, last
// gratuitous message) for the status page; Register exports the metrics;
// Close stops answering.
//
// How it is meant to be fed: from the same sync as the ruleset and the BGP
// speaker, so that "this gateway serves this address" has one source of
// truth. After each sync the syncer collects the LoadBalancer ingress IPs
// (and externalIPs) that model.Exposure lets the gateway serve and that
// the Service can answer right now, and calls Set with the whole list,
// the same list whose host routes it gives bgp.Speaker.Set. Set is
// idempotent: calling it after every sync costs one map comparison when
// nothing changed. An address whose Service went away (or lost its last
// usable endpoint) drops out of the list and is answered for no more.
//
// Restarts: the announcer keeps no state. A new process starts with an
// empty set, so every address of its first Set is new and gets its
// gratuitous messages: neighbours learn the (possibly new) MAC after every
// restart or update, or after a failover to another gateway.
//
// IPv6 details (where L2 announcers commonly go wrong): the interface joins
// the solicited-node multicast group of every announced address, so that a
// NIC with multicast filtering passes the solicitations; solicitations are
// read from a packet socket, so the unicast ones of neighbour
// unreachability detection (addressed to the Service address, which the
// kernel does not deliver locally) are answered too; advertisements carry
// the target link-layer address option, the override flag, the solicited
// flag on answers (not on unsolicited ones), and never the router flag.
//
// The announcer needs CAP_NET_RAW and opens its sockets in the network
// namespace of the thread that calls New.
package l2
