package nft

import (
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// trafficSvc is a ClusterIP Service with one TCP port at dest and one
// endpoint.
func trafficSvc(name string, dest, ep netip.AddrPort) *model.Service {
	return &model.Service{
		Key:        model.NewServiceKey("default", name),
		Type:       model.TypeClusterIP,
		IPv4:       true,
		ClusterIPs: []netip.Addr{dest.Addr()},
		Ports: []model.ServicePort{{Protocol: model.TCP, Port: dest.Port(), Endpoints: []model.Endpoint{
			model.Endpoint{Port: ep.Port(), Ready: true, Serving: true}.WithAddr(ep.Addr()),
		}}},
	}
}

// trafficReading runs the bookkeeping of one reading of the traffic sets,
// which hold now, with svcs programmed (none before the first sync when
// !synced), and returns the traffic of each port.
func trafficReading(p *Programmer, synced bool, now map[trafficKey]Count, svcs ...*model.Service) map[string]Traffic {
	p.synced = synced
	p.services = map[model.ServiceKey]*model.Service{}
	ix := &portIndex{dests: ruleset.NewElemIndex(0)}
	for _, s := range svcs {
		p.services[s.Key] = s
		for _, sp := range s.Ports {
			ix.refs = append(ix.refs, PortRef{Service: s.Key, Proto: sp.Protocol, Port: sp.Port})
			for _, a := range s.ClusterIPs {
				id := ruleset.NewElemID(ruleset.MapServiceIPs, ruleset.Key{Addr: a, Proto: sp.Protocol, Port: sp.Port})
				ix.dests.Put(id, int32(len(ix.refs)-1))
			}
		}
	}
	rd := &Reading{ports: ix, counts: make([]PortCounters, len(ix.refs))}
	p.counters.traffic(now)
	rd.Endpoints = p.attributeTraffic(rd, p.forgotten.take())
	out := map[string]Traffic{}
	for ref, pc := range rd.Ports() {
		if pc.Traffic != (Traffic{}) {
			out[ref.Service.Name()] = pc.Traffic
		}
	}
	return out
}

func trafficIn(n uint64) Count { return Count{Packets: n, Bytes: 100 * n} }

// TestTrafficAddressReused: a Service gets the address and port of one
// deleted while the deleted one's traffic elements still live. Its totals
// start at 0 and count only its own packets, whether its flows go to
// other endpoints or to the same endpoint address (the old elements then
// go on counting), also when those elements expire and are made anew.
func TestTrafficAddressReused(t *testing.T) {
	dest := netip.MustParseAddrPort("10.96.0.10:80")
	epA := netip.MustParseAddrPort("10.0.0.1:8080")
	epB := netip.MustParseAddrPort("10.0.0.2:8080")
	kA := trafficKey{proto: model.TCP, dest: dest, ep: epA}
	kAOut := trafficKey{reply: true, proto: model.TCP, dest: dest, ep: epA}
	kB := trafficKey{proto: model.TCP, dest: dest, ep: epB}
	a := trafficSvc("a", dest, epA)

	type step struct {
		now    map[trafficKey]Count
		svc    *model.Service // nil: no Service at dest
		wantIn uint64         // the packets In of svc's port
	}
	check := func(t *testing.T, steps []step) {
		t.Helper()
		var p Programmer
		for i, s := range steps {
			var svcs []*model.Service
			if s.svc != nil {
				svcs = append(svcs, s.svc)
			}
			got := trafficReading(&p, true, s.now, svcs...)
			if s.svc == nil {
				if len(got) != 0 {
					t.Fatalf("reading %d: no Service, yet traffic %v", i, got)
				}
				continue
			}
			if g := got[s.svc.Key.Name()]; g.In != trafficIn(s.wantIn) {
				t.Fatalf("reading %d: %s in = %+v, want %+v", i, s.svc.Key.Name(), g.In, trafficIn(s.wantIn))
			}
		}
		if len(p.counters.before) != 0 {
			t.Errorf("remembered counts of keys no longer read: %v", p.counters.before)
		}
	}

	t.Run("other endpoint", func(t *testing.T) {
		b := trafficSvc("b", dest, epB)
		check(t, []step{
			{map[trafficKey]Count{kA: trafficIn(10), kAOut: trafficIn(8)}, a, 10},
			{map[trafficKey]Count{kA: trafficIn(12), kAOut: trafficIn(9)}, nil, 0},
			{map[trafficKey]Count{kA: trafficIn(12), kAOut: trafficIn(9), kB: trafficIn(3)}, b, 3},
			{map[trafficKey]Count{kAOut: trafficIn(9), kB: trafficIn(5)}, b, 5}, // kA expired
			{map[trafficKey]Count{kB: trafficIn(7)}, b, 7},
			{map[trafficKey]Count{kB: trafficIn(8)}, b, 8},
		})
	})
	t.Run("same endpoint", func(t *testing.T) {
		b := trafficSvc("b", dest, epA)
		check(t, []step{
			{map[trafficKey]Count{kA: trafficIn(10)}, a, 10},
			{map[trafficKey]Count{kA: trafficIn(12)}, nil, 0},
			{map[trafficKey]Count{kA: trafficIn(15)}, b, 3},
			{map[trafficKey]Count{kA: trafficIn(2)}, b, 5}, // made anew
			{map[trafficKey]Count{kA: trafficIn(4)}, b, 7},
			{map[trafficKey]Count{}, b, 7},
			{map[trafficKey]Count{}, nil, 0},
		})
	})
}

// TestTrafficKeptAcrossRestart: a restarted nftgate finds the traffic
// elements of Services that still exist and keeps their counts, also
// when it reads the counters before its first sync.
func TestTrafficKeptAcrossRestart(t *testing.T) {
	dest := netip.MustParseAddrPort("10.96.0.10:80")
	ep := netip.MustParseAddrPort("10.0.0.1:8080")
	k := trafficKey{proto: model.TCP, dest: dest, ep: ep}
	a := trafficSvc("a", dest, ep)

	var before Programmer
	if got := trafficReading(&before, true, map[trafficKey]Count{k: trafficIn(10)}, a); got["a"].In != trafficIn(10) {
		t.Fatalf("before the restart: %+v", got)
	}
	var p Programmer
	if got := trafficReading(&p, false, map[trafficKey]Count{k: trafficIn(11)}); len(got) != 0 {
		t.Fatalf("before the first sync: %+v", got)
	}
	for _, n := range []uint64{12, 14} {
		if got := trafficReading(&p, true, map[trafficKey]Count{k: trafficIn(n)}, a); got["a"].In != trafficIn(n) {
			t.Fatalf("after the restart: a in = %+v, want %+v", got["a"].In, trafficIn(n))
		}
	}
}

// TestTrafficReusedBetweenReadings: a Service takes the address and port
// of one deleted since the last reading (another Service, or the same one
// deleted and made again). With the kernel's elements destroyed by the
// deleting sync it counts exactly its own packets; without (a kernel that
// cannot destroy elements), it starts from the elements' count at the
// first reading that sees it, never from the deleted one's.
func TestTrafficReusedBetweenReadings(t *testing.T) {
	dest := netip.MustParseAddrPort("10.96.0.10:80")
	epA := netip.MustParseAddrPort("10.0.0.1:8080")
	epB := netip.MustParseAddrPort("10.0.0.2:8080")
	kA := trafficKey{proto: model.TCP, dest: dest, ep: epA}
	kB := trafficKey{proto: model.TCP, dest: dest, ep: epB}
	a := trafficSvc("a", dest, epA)
	deletedA := func(destroyed ...trafficKey) forgotten {
		f := forgotten{deleted: map[model.ServiceKey]bool{a.Key: true}, destroyed: map[trafficKey]bool{}}
		for _, k := range destroyed {
			f.destroyed[k] = true
		}
		return f
	}
	type step struct {
		forgot forgotten // what the syncs since the last reading removed
		now    map[trafficKey]Count
		svc    *model.Service
		in     uint64 // the packets In of its port
	}
	for _, tc := range []struct {
		name  string
		svc   *model.Service // the one programmed after a's deletion
		steps []step
	}{
		{"other Service, destroyed", trafficSvc("b", dest, epA), []step{
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(10)}, a, 10},
			{deletedA(kA), map[trafficKey]Count{kA: trafficIn(3)}, nil, 3},
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(5)}, nil, 5},
		}},
		{"same Service made again, destroyed", a, []step{
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(10)}, a, 10},
			{deletedA(kA), map[trafficKey]Count{kA: trafficIn(4)}, nil, 4},
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(6)}, nil, 6},
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(2)}, nil, 8}, // made anew
		}},
		{"other Service, not destroyed", trafficSvc("b", dest, epA), []step{
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(10)}, a, 10},
			{deletedA(), map[trafficKey]Count{kA: trafficIn(14)}, nil, 0},
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(20)}, nil, 6},
		}},
		{"same Service made again, not destroyed, new endpoint", trafficSvc("a", dest, epB), []step{
			{forgotten{}, map[trafficKey]Count{kA: trafficIn(10)}, a, 10},
			{deletedA(), map[trafficKey]Count{kA: trafficIn(10), kB: trafficIn(4)}, nil, 4},
			{forgotten{}, map[trafficKey]Count{kB: trafficIn(9)}, nil, 9},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Programmer
			for i, s := range tc.steps {
				svc := s.svc
				if svc == nil {
					svc = tc.svc
				}
				p.forgotten = s.forgot
				got := trafficReading(&p, true, s.now, svc)
				if g := got[svc.Key.Name()]; g.In != trafficIn(s.in) {
					t.Fatalf("reading %d: %s in = %+v, want %+v", i, svc.Key.Name(), g.In, trafficIn(s.in))
				}
			}
		})
	}
}

// removedTraffic: an endpoint change removes nothing; a deleted Service
// removes its every destination to each endpoint, both ways; a Service
// that loses an address removes that address's only.
func TestRemovedTraffic(t *testing.T) {
	dest := netip.MustParseAddrPort("10.96.0.10:80")
	ep := netip.MustParseAddrPort("10.0.0.1:8080")
	a := trafficSvc("a", dest, ep)
	a.EditRare().LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.1.1")}
	moved := trafficSvc("a", dest, netip.MustParseAddrPort("10.0.0.2:8080"))
	moved.EditRare().LoadBalancerIPs = a.LoadBalancerIPs()
	noLB := trafficSvc("a", dest, ep)
	programmed := map[model.ServiceKey]*model.Service{a.Key: a}
	for _, tc := range []struct {
		name string
		to   *model.Service
		want int
	}{{"endpoint moved", moved, 0}, {"deleted", nil, 4}, {"load-balancer address gone", noLB, 2}} {
		got := removedTraffic(programmed, map[model.ServiceKey]*model.Service{a.Key: tc.to})
		if len(got) != tc.want {
			t.Errorf("%s: %d elements removed, want %d: %v", tc.name, len(got), tc.want, got)
		}
		for _, k := range got {
			if tc.to == noLB && k.dest.Addr() != a.LoadBalancerIPs()[0] {
				t.Errorf("%s: removed %v, which the Service still has", tc.name, k)
			}
		}
	}
}
