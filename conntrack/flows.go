package conntrack

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/nftgate/nftgate/internal/ctnetlink"
)

// TCP states of the kernel's conntrack (enum tcp_conntrack) up to an
// established connection: the ones open counts.
const (
	tcpSynSent     = 1
	tcpEstablished = 3
)

// OpenFlows counts the translated flows (DNAT: the kernel writes no
// others) in the kernel's conntrack table (of the namespace the options
// name) whose original destination is one of dsts and that have not
// ended: TCP connections being opened or established (not closing, not in
// TIME_WAIT), and every UDP and SCTP flow, which ends with its conntrack
// timeout. A drain waits until it is 0.
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
	n := 0
	if err := ctnetlink.Dump(o.netNS, ctnetlink.DNATOnly, func(msg []byte) {
		if f, _, ok := parseFlow(msg, time.Time{}); ok && f.open && want[f.Dest.Addr()] {
			n++
		}
	}); err != nil {
		return 0, fmt.Errorf("conntrack: %w", err)
	}
	return n, nil
}
