package conntrack

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/nftgate/nftgate/internal/ctnetlink"
)

// Flow is one live flow to a Service: its client, the destination it
// asked for, the endpoint it was translated to, its TCP state (empty for
// UDP and SCTP), the seconds until conntrack forgets it, and its bytes in
// both directions (zero unless nf_conntrack_acct is on).
type Flow struct {
	Proto    Protocol
	Client   netip.AddrPort
	Dest     netip.AddrPort
	Endpoint netip.AddrPort
	State    string
	Timeout  time.Duration
	// Age is how long ago the flow began; zero unless the kernel stamps
	// flows (nf_conntrack_timestamp = 1).
	Age   time.Duration
	Bytes uint64
	open  bool
}

// FlowsMaxAge is how long a reading of the conntrack table is served again
// before the kernel is read anew.
const FlowsMaxAge = time.Second

// Flows reads the translated flows of the conntrack table, the whole table
// in one dump at most once per FlowsMaxAge, however often it is asked:
// a page load costs no dump of its own. Only translated flows are kept:
// the kernel writes only those whose destination it translated (the DNAT
// status bit: a table that routes much besides the Services costs no
// message for the routed flows), and of those the ones whose reply comes
// from another address or port than the original destination (an
// endpoint's).
type Flows struct {
	opts options
	mu   sync.Mutex // held while reading: callers at once share one reading
	at   time.Time
	last []Flow
}

// NewFlows returns a reader of the flows of the namespace the options name.
func NewFlows(opts ...Option) *Flows {
	f := &Flows{}
	for _, o := range opts {
		o(&f.opts)
	}
	return f
}

// Read returns the translated flows, and the time they were read.
func (f *Flows) Read() ([]Flow, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last != nil && time.Since(f.at) < FlowsMaxAge {
		return f.last, f.at, nil
	}
	at := time.Now()
	// About as many as the last reading: no append doubles a large slice.
	out := make([]Flow, 0, len(f.last)+len(f.last)/8)
	if err := ctnetlink.Dump(f.opts.netNS, ctnetlink.DNATOnly, func(msg []byte) {
		if fl, translated, ok := parseFlow(msg, at); ok && translated {
			out = append(out, fl)
		}
	}); err != nil {
		return nil, time.Time{}, fmt.Errorf("conntrack: %w", err)
	}
	f.last, f.at = out, at
	return out, at, nil
}

var tcpStateNames = [...]string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// tcpStateName names the kernel's TCP conntrack states (enum tcp_conntrack).
func tcpStateName(s uint8) string {
	if int(s) < len(tcpStateNames) {
		return tcpStateNames[s]
	}
	return fmt.Sprint(s)
}

// Open tells whether the flow has not ended: a TCP connection being opened
// or established (not closing, not in TIME_WAIT), or any UDP and SCTP
// flow, which ends with its conntrack timeout.
func (f *Flow) Open() bool { return f.open }
