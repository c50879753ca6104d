// Package conntrack removes the conntrack entries that a service change left
// stale, so that UDP and SCTP clients reach a live endpoint with their next
// datagram instead of waiting for the entry to time out.
//
// TCP is never touched: a client of a vanished TCP endpoint gets a reset.
//
// The cleaner never reads the whole conntrack table into user space. For each
// stale destination it asks the kernel for a dump filtered in the kernel
// (ctnetlink CTA_FILTER: address family, L4 protocol, original destination,
// reply source), checks every returned entry again in user space and deletes
// exactly those entries by tuple and id. The entries that cross the socket
// are, for IPv4 UDP, exactly the ones that get deleted; memory is bounded by
// one socket buffer of messages, whatever the table size. When one sync
// brings many stale destinations of one protocol, one dump filtered by family
// and protocol replaces many narrow ones, so a sync walks the kernel table at
// most WithMaxNarrowDumps times per family and protocol. See filter.go for
// what the kernel can and cannot filter.
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/mdlayher/netlink"

	"github.com/nftgate/nftgate/model"
)

// Protocol is an IP protocol number: a Service port's. Only UDP and SCTP
// flows are cleaned.
type Protocol = model.Protocol

// The protocols whose flows the cleaner removes.
const (
	UDP  = model.UDP
	SCTP = model.SCTP
)

// StaleEndpoint names an endpoint that a service port no longer sends to.
// Flows to the service destination whose reply comes from Endpoint are
// deleted.
type StaleEndpoint struct {
	Protocol Protocol
	// VIP is the ClusterIP, ExternalIP or load balancer IP. It must be unset
	// for a NodePort.
	VIP netip.Addr
	// Port is the service port, or the node port when NodePort is set.
	Port uint16
	// NodePort means the destination is any local address at Port.
	NodePort bool
	// Endpoint is the removed backend address and target port.
	Endpoint netip.AddrPort
}

// StaleService names a service destination that no longer exists or has no
// endpoints left. Every flow to it is deleted.
type StaleService struct {
	Protocol Protocol
	// VIP must be unset for a NodePort.
	VIP      netip.Addr
	Port     uint16
	NodePort bool
	// Untranslated limits the deletion to the flows that no service rule
	// translated: their reply comes from the destination itself. A client
	// that sent to the destination before it had endpoints left such an
	// entry, and its later datagrams would follow it, untranslated, for as
	// long as it keeps sending.
	Untranslated bool
}

// Result reports one Clean call.
type Result struct {
	// Deleted counts entries the kernel removed.
	Deleted int
	// Requests counts filtered dumps sent to the kernel; each one is a walk
	// of the kernel's conntrack hash table.
	Requests int
	// Returned counts entries the kernel returned to user space. With
	// filters the kernel applies exactly it equals the matched entries.
	Returned int
	// Failed counts stale destinations (requests) whose dump or deletes
	// failed, the rest going ahead; the joined error of Clean names each
	// one with the reason.
	Failed   int
	Duration time.Duration
}

// Option configures a Cleaner.
type Option func(*options)

type options struct {
	netNS        int
	maxNarrow    int
	deleteBatch  int
	receiveBytes int
}

// WithNetNS makes the cleaner work on the conntrack table of the network
// namespace behind the file descriptor fd (for example from
// vishvananda/netns). The caller keeps ownership of fd.
func WithNetNS(fd int) Option {
	return func(o *options) { o.netNS = fd }
}

// WithMaxNarrowDumps sets how many filtered dumps (one per stale
// destination) per address family and protocol one Clean may issue before it
// falls back to a single dump of that family and protocol, matched in user
// space. Every dump walks the kernel's whole conntrack hash table (all
// namespaces, every protocol); a narrow one returns only matches, the broad
// one returns every flow of the protocol, which costs several narrow walks
// when the table is large (see BenchmarkClean). Default 8; 0 always uses the
// broad dump.
func WithMaxNarrowDumps(n int) Option {
	return func(o *options) { o.maxNarrow = n }
}

// Cleaner deletes stale conntrack entries. It is not safe for concurrent use;
// the sync loop calls Clean once per committed batch.
type Cleaner struct {
	opts options
	// dump carries the filtered dumps, del the deletions issued while a dump
	// is still being read; one socket cannot interleave both.
	dump, del *netlink.Conn
	// scratch is reused between Clean calls to keep allocations flat.
	scratch []deleteReq
}

// New opens the netlink sockets of a Cleaner.
func New(opts ...Option) (*Cleaner, error) {
	o := options{maxNarrow: 8, deleteBatch: 128, receiveBytes: 1 << 20}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxNarrow < 0 {
		return nil, fmt.Errorf("conntrack: WithMaxNarrowDumps: must not be negative, got %d", o.maxNarrow)
	}
	cfg := &netlink.Config{NetNS: o.netNS}
	dump, err := netlink.Dial(netlinkNetfilter, cfg)
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	del, err := netlink.Dial(netlinkNetfilter, cfg)
	if err != nil {
		dump.Close()
		return nil, fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	// A larger receive buffer lets the kernel fill more entries per read of
	// a dump; failing to raise it only costs speed.
	_ = dump.SetReadBuffer(o.receiveBytes)
	// Errors of a deletion are reported in its acknowledgement; extended
	// acks add the kernel's message to them.
	_ = del.SetOption(netlink.ExtendedAcknowledge, true)
	_ = dump.SetOption(netlink.ExtendedAcknowledge, true)
	return &Cleaner{opts: o, dump: dump, del: del}, nil
}

// Close releases the sockets.
func (c *Cleaner) Close() error {
	return errors.Join(c.dump.Close(), c.del.Close())
}

// Clean deletes the stale flows named by endpoints and services in one pass.
// Invalid input is rejected before anything is deleted. Failures of single
// requests do not stop the others: they are counted in Result.Failed and
// joined into the returned error.
func (c *Cleaner) Clean(ctx context.Context, endpoints []StaleEndpoint, services []StaleService) (Result, error) {
	start := time.Now()
	var res Result
	plan, err := buildPlan(endpoints, services, c.opts.maxNarrow)
	if err != nil {
		return res, err
	}
	if plan.empty() {
		res.Duration = time.Since(start)
		return res, nil
	}
	if plan.needsLocal() {
		local, err := localAddrs(c.opts.netNS)
		if err != nil {
			res.Failed++
			res.Duration = time.Since(start)
			return res, fmt.Errorf("conntrack: list local addresses for node ports: %w", err)
		}
		plan.local = local
	}

	var errs []error
	for _, g := range plan.groups {
		for _, f := range g.filters {
			if err := ctx.Err(); err != nil {
				errs = append(errs, err)
				res.Duration = time.Since(start)
				return res, errors.Join(errs...)
			}
			res.Requests++
			if err := c.cleanOne(g, f, plan.local, &res); err != nil {
				res.Failed++
				errs = append(errs, fmt.Errorf("conntrack: %s: %w", f.describe(g.key), err))
			}
		}
	}
	res.Duration = time.Since(start)
	return res, errors.Join(errs...)
}

// cleanOne runs one filtered dump and deletes the entries it returns that the
// group's matcher accepts, in batches, while the dump is still running.
func (c *Cleaner) cleanOne(g *group, f kernelFilter, local localSet, res *Result) error {
	req := dumpRequest(g.key, f)
	if _, err := c.dump.Send(req); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	pending := c.scratch[:0]
	var delErrs []error
	flush := func() {
		if len(pending) == 0 {
			return
		}
		n, err := c.deleteBatch(g.key.family, pending)
		res.Deleted += n
		if err != nil {
			delErrs = append(delErrs, err)
		}
		pending = pending[:0]
	}
	var dumpErr error
	var e entry
	for msg, err := range c.dump.ReceiveIter() {
		if err != nil {
			dumpErr = fmt.Errorf("dump: %w", err)
			break
		}
		if err := parseEntry(msg.Data, &e); err != nil {
			dumpErr = fmt.Errorf("dump: %w", err)
			continue
		}
		res.Returned++
		if !g.matches(&e, local) {
			continue
		}
		pending = append(pending, e.deleteReq())
		if len(pending) >= c.opts.deleteBatch {
			flush()
		}
	}
	flush()
	c.scratch = pending[:0]
	return errors.Join(append(delErrs, dumpErr)...)
}

// deleteBatch sends one delete per entry in a single write and reads one
// acknowledgement per delete. An entry that is already gone (expired, or
// removed by an earlier filter of the same Clean) is not an error.
func (c *Cleaner) deleteBatch(family uint8, batch []deleteReq) (int, error) {
	msgs := make([]netlink.Message, len(batch))
	for i := range batch {
		msgs[i] = deleteMessage(family, &batch[i])
	}
	if _, err := c.del.SendMessages(msgs); err != nil {
		return 0, fmt.Errorf("delete: %w", err)
	}
	deleted := 0
	var errs []error
	// Each acknowledgement arrives as its own datagram, so one Receive
	// returns exactly one of them, success or failure.
	for range batch {
		_, err := c.del.Receive()
		switch {
		case err == nil:
			deleted++
		case isNotFound(err):
		default:
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return deleted, fmt.Errorf("delete: %d of %d failed, first: %w", len(errs), len(batch), errs[0])
	}
	return deleted, nil
}

// sortedKeys returns the map's keys in a stable order so that requests and
// error messages do not depend on map iteration.
func sortedKeys[K comparable, V any](m map[K]V, less func(a, b K) int) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, less)
	return keys
}
