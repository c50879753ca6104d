package conntrack

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
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
// those whose reply comes from another address or port than the original
// destination (an endpoint's, after DNAT).
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
	c, err := ct.Dial(&netlink.Config{NetNS: f.opts.netNS})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	defer c.Close()
	at := time.Now()
	flows, err := c.Dump(nil)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("conntrack: dump: %w", err)
	}
	out := make([]Flow, 0, len(flows))
	for i := range flows {
		k := &flows[i]
		o, r := &k.TupleOrig, &k.TupleReply
		if o.IP.DestinationAddress == r.IP.SourceAddress && o.Proto.DestinationPort == r.Proto.SourcePort {
			continue
		}
		fl := Flow{
			Proto:    Protocol(o.Proto.Protocol),
			Client:   netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
			Dest:     netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort),
			Endpoint: netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort),
			Timeout:  time.Duration(k.Timeout) * time.Second,
			Bytes:    k.CountersOrig.Bytes + k.CountersReply.Bytes,
		}
		if st := k.Timestamp.Start; !st.IsZero() {
			fl.Age = max(at.Sub(st), 0)
		}
		fl.open = open(k)
		if tcp := k.ProtoInfo.TCP; tcp != nil {
			fl.State = tcpStateName(tcp.State)
		}
		out = append(out, fl)
	}
	f.last, f.at = out, at
	return out, at, nil
}

// tcpStateName names the kernel's TCP conntrack states (enum tcp_conntrack).
func tcpStateName(s uint8) string {
	names := []string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprint(s)
}

// Open tells whether the flow has not ended (see open).
func (f *Flow) Open() bool { return f.open }

// open tells whether a flow has not ended: a TCP connection being opened
// or established (not closing, not in TIME_WAIT), or any UDP and SCTP
// flow, which ends with its conntrack timeout.
func open(f *ct.Flow) bool {
	tcp := f.ProtoInfo.TCP
	return tcp == nil || tcp.State >= tcpSynSent && tcp.State <= tcpEstablished
}
