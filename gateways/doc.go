// Package gateways is the gateway set: several nftgate boxes in front of
// one cluster that know each other by configuration ([gateways] in
// config.toml), talk over one authenticated channel per pair (channel.go),
// tell each other they are alive by heartbeats, and share out the floating
// addresses: the Service addresses announced on an L2 segment, where only
// one gateway may answer ARP/NDP for each.
//
// Ownership (owner.go) needs nothing outside the set: no Kubernetes Lease,
// no API call, so a partition of the API changes nothing. Each address is
// owned by one of its candidates, the live gateways that serve it and are
// ready (Options.Ready) or hold it already: in active-backup mode (the
// default) the first in name order, so one gateway holds every address;
// in active-active mode a masquerade address's own gateway (Config.Homes),
// else the one with the highest rendezvous score of (address, name), so
// addresses spread across the gateways and only the addresses of a
// gateway that comes or goes move. A live owner gives an address up before
// the next takes it (the handover, on the channel); a peer silent for the
// dead time (dead_after heartbeats) is taken over without its word. A
// split of the channel while both gateways still reach the segment can
// give two owners, which is why the channel can run over several links
// (several addresses per peer).
//
// The Set is the announce.AddrSetter the served addresses go to (the sync
// loop's announce Coordinator sets them), and hands the held ones to
// Options.OnChange: an announce.Gate, which gives them to the L2 announcer
// (gratuitous ARP / unsolicited neighbour advertisements for each address
// it starts to answer for) and their routes to the BGP speaker.
//
// The channel is the set's one channel, and carries the gateways'
// connection-state sync too: frames start with a message type; another
// user registers its types with Handle and sends with Send, and a receiver
// skips types it does not know.
package gateways
