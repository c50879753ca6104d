package conntrack

import (
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
)

// TCP states of the kernel's conntrack (enum tcp_conntrack) up to an
// established connection: the ones open counts.
const (
	tcpSynSent     = 1
	tcpEstablished = 3
)

// OpenFlows counts the flows in the kernel's conntrack table (of the
// namespace the options name) whose original destination is one of dsts
// and that have not ended: TCP connections being opened or established
// (not closing, not in TIME_WAIT), and every UDP and SCTP flow, which ends
// with its conntrack timeout. A drain waits until it is 0.
func OpenFlows(dsts []netip.Addr, opts ...Option) (int, error) {
	if len(dsts) == 0 {
		return 0, nil
	}
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	want := make(map[netip.Addr]bool, len(dsts))
	for _, a := range dsts {
		want[a.Unmap()] = true
	}
	c, err := ct.Dial(&netlink.Config{NetNS: o.netNS})
	if err != nil {
		return 0, fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		return 0, fmt.Errorf("conntrack: dump: %w", err)
	}
	n := 0
	for i := range flows {
		f := &flows[i]
		if !want[f.TupleOrig.IP.DestinationAddress.Unmap()] {
			continue
		}
		if !open(f) {
			continue
		}
		n++
	}
	return n, nil
}
