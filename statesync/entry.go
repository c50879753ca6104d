package statesync

import (
	"context"
	"net/netip"
)

// Proto is an IP protocol number (6 TCP, 17 UDP, 132 SCTP).
type Proto = uint8

// Tuple is one direction of a flow.
type Tuple struct {
	Src, Dst netip.AddrPort
}

// TCPInfo is the TCP part of an entry: the protocol state (the kernel's
// enum tcp_conntrack) and the window scaling and flags of each direction.
type TCPInfo struct {
	State                   uint8
	WScaleOrig, WScaleReply uint8
	FlagsOrig, FlagsReply   uint8
}

// SCTPInfo is the SCTP part of an entry: the association's state (the
// kernel's enum sctp_conntrack) and the verification tag each direction's
// packets carry. A replica without the tags would take every packet of the
// association for invalid.
type SCTPInfo struct {
	State               uint8
	VTagOrig, VTagReply uint32
}

// Entry is one conntrack entry as the sync carries it: what the kernel of
// the origin holds and what a replica is created from.
type Entry struct {
	Proto Proto
	// Orig is the flow as the client sent it: client → Service address.
	Orig Tuple
	// Reply is the flow as the endpoint answers it: endpoint → the
	// masquerade address (or the client, without masquerade).
	Reply Tuple
	// Status holds the kernel's IPS_* bits of the origin entry.
	Status uint32
	// Timeout is the entry's time left, in seconds, when it was read.
	Timeout uint32
	// Mark is the entry's ct mark.
	Mark uint32
	// TCP is zero for other protocols.
	TCP TCPInfo
	// SCTP is zero for other protocols.
	SCTP SCTPInfo
	// ID is the kernel's id of the entry (CTA_ID), read from events and
	// dumps and never sent to peers: two entries of one tuple, one after
	// the other, have different ids. 0 when not known.
	ID uint32
}

// ReplicaMark is the ct mark bit of entries written by the sync: the
// kernel side never reports them as events of this gateway's own flows.
const ReplicaMark uint32 = 1 << 31

// EventType is what happened to an entry.
type EventType uint8

// Event types.
const (
	EventNew EventType = iota + 1
	EventUpdate
	EventDestroy
)

// Event is one conntrack event of an entry this gateway originated.
type Event struct {
	Type  EventType
	Entry Entry
}

// Kernel is this gateway's conntrack table as the sync uses it. Its
// methods are safe for concurrent use.
type Kernel interface {
	// Listen delivers, until ctx ends, the events of entries with the
	// DNAT or SNAT status bit that do not carry ReplicaMark, in batches
	// (deliver must not keep the slice). When the kernel dropped events
	// (the socket overflowed), lost is called with what is known of the
	// count (0 when unknown): the caller then resyncs from a Dump.
	Listen(ctx context.Context, deliver func([]Event), lost func(n int)) error
	// Dump calls fn for every entry with the DNAT status bit that is not
	// a replica (without ReplicaMark): the flows to a Service.
	Dump(fn func(Entry)) error
	// Get reads the given entries (matched by the original tuple) and
	// calls fn for each the table holds with the DNAT or SNAT status bit,
	// replicas included; those gone are left out. fn must not call the
	// Kernel.
	Get(entries []Entry, fn func(Entry)) error
	// Write creates each of puts as a replica (with its translations,
	// status, timeout, TCP state and ReplicaMark set in its mark), or
	// updates the replica that exists; it deletes each of dels (matched
	// by the original tuple), before the puts: no flow is in both. One
	// result per entry, puts first, nil for success.
	Write(puts, dels []Entry) []error
	// Update writes each of puts as Write does, for replicas written
	// before: it tries the update first, and creates one that is gone.
	Update(puts []Entry) []error
	// Adopt clears ReplicaMark on the given replicas (matched by the
	// original tuple): this gateway becomes their origin.
	Adopt(entries []Entry) []error
}
