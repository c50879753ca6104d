package nft

import (
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// A deleted Service's traffic elements (its destinations and endpoints,
// counted both ways) are deleted from the traffic sets in the batch that
// deletes the Service, so that a Service given the same address and port
// later starts from zero in the kernel, whenever it comes. They are
// dynamic elements: some may have expired, others never existed, so the
// batch destroys them (NFT_MSG_DESTROYSETELEM, Linux 6.3), which unlike a
// deletion does not fail on an element that is not there. On an older
// kernel nothing is deleted and the counters reading tells a reused
// destination apart by itself (counterCache.fresh).

// msgDestroySetElem is NFT_MSG_DESTROYSETELEM (Linux 6.3).
const msgDestroySetElem = 30

// maxForgotten bounds what the programmer remembers between two readings
// of the counters (the Services deleted, the elements destroyed): a
// gateway whose counters nobody reads forgets the rest, and a reused
// destination then starts from its count at the next reading.
const maxForgotten = 1 << 16

// trafficKeysOf lists the traffic elements a Service can have made, each
// way: every address of each port (ClusterIPs, external and load-balancer
// addresses) to each of its endpoints in that address's family.
func trafficKeysOf(svc *model.Service, out []trafficKey) []trafficKey {
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		for _, addrs := range [][]netip.Addr{svc.ClusterIPs, svc.ExternalIPs(), svc.LoadBalancerIPs()} {
			for _, a := range addrs {
				for _, ep := range sp.Endpoints {
					if ep.Addr().Is4() != a.Is4() {
						continue
					}
					k := trafficKey{proto: sp.Protocol, dest: netip.AddrPortFrom(a, sp.Port), ep: netip.AddrPortFrom(ep.Addr(), ep.Port)}
					out = append(out, k)
					k.reply = true
					out = append(out, k)
				}
			}
		}
	}
	return out
}

// appendTrafficKey appends k as the traffic sets store it: the
// destination as in the service maps, then the endpoint's address and
// port, padded to four bytes (readTraffic reads it back).
func appendTrafficKey(b []byte, k trafficKey) []byte {
	b = appendKey(b, ruleset.KeyAddrProtoPort, ruleset.Key{Addr: k.dest.Addr(), Proto: k.proto, Port: k.dest.Port()})
	b = append(b, k.ep.Addr().AsSlice()...)
	return append(b, byte(k.ep.Port()>>8), byte(k.ep.Port()), 0, 0)
}

// destroyTraffic writes the destruction of the traffic elements keys, all
// of the encoder's family, from the set each belongs to.
func (e *encoder) destroyTraffic(keys []trafficKey) {
	var in, out []trafficKey
	for _, k := range keys {
		if k.reply {
			out = append(out, k)
		} else {
			in = append(in, k)
		}
	}
	w := e.w
	var key []byte
	for _, set := range []string{ruleset.SetTrafficIn, ruleset.SetTrafficOut} {
		ks := in
		if set == ruleset.SetTrafficOut {
			ks = out
		}
		for len(ks) > 0 {
			n := min(len(ks), elementsPerMessage)
			w.begin(msgDestroySetElem, netlink.Request, byte(e.f))
			w.str(unix.NFTA_SET_ELEM_LIST_SET, set)
			w.str(unix.NFTA_SET_ELEM_LIST_TABLE, e.table)
			list := w.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
			for i, k := range ks[:n] {
				item := w.nest(uint16(i + 1))
				key = appendTrafficKey(key[:0], k)
				w.value(unix.NFTA_SET_ELEM_KEY, key)
				w.close(item)
			}
			w.close(list)
			w.end()
			e.note(note{op: noteDestroyTraffic, name: set, n: n})
			ks = ks[n:]
		}
	}
}

// encodeForget writes the destruction of the traffic elements forget, in
// the main table of each one's family, into a part of its own.
func encodeForget(ts *ruleset.Tables, lastID *atomic.Uint32, forget []trafficKey, describe bool) *wire {
	w := newWire(256+len(forget)*96, len(forget)/elementsPerMessage+4, describe)
	for _, f := range ruleset.Families {
		if keys := ofFamily(forget, f); len(keys) > 0 {
			newEncoder(w, lastID, ts.Refs[ts.Main(f)].Name, f).destroyTraffic(keys)
		}
	}
	return w
}

// ofFamily returns the keys of family f's destinations.
func ofFamily(keys []trafficKey, f ruleset.Family) []trafficKey {
	var out []trafficKey
	for _, k := range keys {
		if ruleset.Of(k.dest.Addr()) == f {
			out = append(out, k)
		}
	}
	return out
}

// canDestroy tells whether the kernel destroys set elements: it sends a
// batch that makes a table with the traffic sets, destroys an element they
// do not have and deletes the table again.
func canDestroy(netnsFD int, table string) (bool, error) {
	probe := kernelProbe{Feature: "destroying set elements", add: func(b *probeBatch) {
		for _, name := range []string{ruleset.SetTrafficIn, ruleset.SetTrafficOut} {
			b.set(ruleset.IPv4, &ruleset.Set{Name: name, Shape: ruleset.KeyTraffic, Timeout: ruleset.TrafficTimeout, Size: 16})
		}
		k := trafficKey{proto: model.TCP, dest: netip.MustParseAddrPort("192.0.2.1:80"), ep: netip.MustParseAddrPort("192.0.2.2:8080")}
		b.forget = append(b.forget, k)
		k.reply = true
		b.forget = append(b.forget, k)
	}}
	if err := netlinkProbeRunner(netnsFD, table)([]kernelProbe{probe}); err != nil {
		return false, err
	}
	return true, nil
}

// probeSeq numbers the probe tables of one process.
var probeSeq atomic.Uint32

// countsTraffic tells whether the traffic sets are programmed.
func (p *Programmer) countsTraffic() bool { return p.cfg.Counters && p.cfg.TrafficElements > 0 }

// destKey is a Service destination as the traffic sets key it.
type destKey struct {
	proto model.Protocol
	dest  netip.AddrPort
}

// removedTraffic lists the traffic elements of the destinations that
// changes remove from the Services programmed (a deleted Service's, or an
// address a Service no longer has), to each endpoint they had.
func removedTraffic(programmed, changes map[model.ServiceKey]*model.Service) []trafficKey {
	var out []trafficKey
	for k, svc := range changes {
		old := programmed[k]
		if old == nil {
			continue
		}
		if svc == nil {
			out = trafficKeysOf(old, out)
			continue
		}
		if sameDests(old, svc) {
			continue // an endpoint change, the usual one: nothing removed
		}
		kept := dests(svc)
		n := len(out)
		out = trafficKeysOf(old, out)
		removed := slices.DeleteFunc(out[n:], func(t trafficKey) bool { return kept[destKey{t.proto, t.dest}] })
		out = out[:n+len(removed)]
	}
	return out
}

// sameDests tells, without allocating (it runs for every changed Service
// of every sync), whether a and b have the same addresses and ports, in
// the same order.
func sameDests(a, b *model.Service) bool {
	return slices.Equal(a.ClusterIPs, b.ClusterIPs) && slices.Equal(a.ExternalIPs(), b.ExternalIPs()) &&
		slices.Equal(a.LoadBalancerIPs(), b.LoadBalancerIPs()) &&
		slices.EqualFunc(a.Ports, b.Ports, func(p, q model.ServicePort) bool { return p.Protocol == q.Protocol && p.Port == q.Port })
}

// dests are the destinations of a Service's ports.
func dests(svc *model.Service) map[destKey]bool {
	out := map[destKey]bool{}
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		for _, addrs := range [][]netip.Addr{svc.ClusterIPs, svc.ExternalIPs(), svc.LoadBalancerIPs()} {
			for _, a := range addrs {
				out[destKey{sp.Protocol, netip.AddrPortFrom(a, sp.Port)}] = true
			}
		}
	}
	return out
}

// forgotten is what the syncs since the last counters reading removed:
// the Services deleted, and the traffic elements destroyed with them.
// The reading that takes it (take) starts a Service deleted and programmed
// again meanwhile afresh, and each of its destinations from zero where its
// elements were destroyed, or from their count at that reading where they
// were not (what the Service after the reuse counted until then is lost,
// rather than the count before it inherited).
type forgotten struct {
	deleted   map[model.ServiceKey]bool
	destroyed map[trafficKey]bool
}

// note records what a committed sync of changes onto programmed removed;
// destroyed are the elements its batch destroyed.
func (f *forgotten) note(programmed, changes map[model.ServiceKey]*model.Service, destroyed []trafficKey) {
	for k, svc := range changes {
		if svc == nil && programmed[k] != nil {
			f.deleteService(k)
		}
	}
	if len(destroyed) == 0 {
		return
	}
	if f.destroyed == nil {
		f.destroyed = map[trafficKey]bool{}
	}
	for _, t := range destroyed {
		if len(f.destroyed) >= maxForgotten {
			return
		}
		f.destroyed[t] = true
	}
}

func (f *forgotten) deleteService(k model.ServiceKey) {
	if f.deleted == nil {
		f.deleted = map[model.ServiceKey]bool{}
	}
	if len(f.deleted) >= maxForgotten {
		return
	}
	f.deleted[k] = true
}

// take returns what was recorded, and starts afresh.
func (f *forgotten) take() forgotten {
	out := *f
	*f = forgotten{}
	return out
}
