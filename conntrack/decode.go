package conntrack

import (
	"encoding/binary"
	"time"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/nlattr"
)

// parseFlow decodes one entry of a conntrack dump in place (nothing is
// allocated): the flow as Flows and OpenFlows read it, at the time of the
// dump (for its age), and whether its destination was translated (the
// reply comes from another address or port). ok is false for a message
// that is not an entry with both tuples. ti-mo/conntrack decoded the same
// into a flow of every attribute, with an allocation each: 0.5-0.8 s of
// CPU and the collector's work after it for a table of 100,000, every
// minute for the traffic history.
func parseFlow(msg []byte, at time.Time) (f Flow, translated, ok bool) {
	const hdr = 16 + ctnetlink.NFGenMsgLen // nlmsghdr, nfgenmsg
	if len(msg) < hdr || binary.NativeEndian.Uint16(msg[4:6]) != ctnetlink.Subsys<<8|ctnetlink.MsgNew {
		return f, false, false
	}
	var orig, reply ctnetlink.Tuple
	var haveOrig, haveReply, tcp bool
	var state uint8
	var start uint64
	err := nlattr.Walk(msg[hdr:], func(a uint16, v []byte) error {
		var err error
		switch a {
		case ctnetlink.TupleOrig:
			orig, err = ctnetlink.ParseTuple(v)
			haveOrig = err == nil
		case ctnetlink.TupleReply:
			reply, err = ctnetlink.ParseTuple(v)
			haveReply = err == nil
		case ctnetlink.Timeout:
			if len(v) >= 4 {
				f.Timeout = time.Duration(binary.BigEndian.Uint32(v)) * time.Second
			}
		case ctnetlink.Protoinfo:
			return nlattr.Walk(v, func(a uint16, v []byte) error {
				if a != ctnetlink.ProtoinfoTCP {
					return nil
				}
				tcp = true
				return nlattr.Walk(v, func(a uint16, v []byte) error {
					if a == ctnetlink.ProtoinfoTCPState && len(v) >= 1 {
						state = v[0]
					}
					return nil
				})
			})
		case ctnetlink.CountersOrig, ctnetlink.CountersReply:
			return nlattr.Walk(v, func(a uint16, v []byte) error {
				if a == ctnetlink.CountersBytes && len(v) >= 8 {
					f.Bytes += binary.BigEndian.Uint64(v)
				}
				return nil
			})
		case ctnetlink.Timestamp:
			return nlattr.Walk(v, func(a uint16, v []byte) error {
				if a == ctnetlink.TimestampStart && len(v) >= 8 {
					start = binary.BigEndian.Uint64(v)
				}
				return nil
			})
		}
		return nil
	})
	if err != nil || !haveOrig || !haveReply {
		return f, false, false
	}
	f.Proto = Protocol(orig.Proto)
	f.Client = ctnetlink.Unmapped(orig.Src)
	f.Dest = ctnetlink.Unmapped(orig.Dst)
	f.Endpoint = ctnetlink.Unmapped(reply.Src)
	if start != 0 {
		f.Age = max(at.Sub(time.Unix(0, int64(start))), 0)
	}
	if tcp {
		f.State = tcpStateName(state)
	}
	f.open = !tcp || state >= tcpSynSent && state <= tcpEstablished
	return f, f.Dest != f.Endpoint, true
}
