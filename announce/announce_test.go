package announce

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/nftgate/nftgate/announce/bgp"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
)

var node = model.Node{Name: "gw"}

func svc(name string, lb string, local bool, eps ...model.Endpoint) *model.Service {
	return &model.Service{
		Key: model.NewServiceKey("ns", name), Type: model.TypeLoadBalancer, IPv4: true,
		Rare:          &model.Rare{LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(lb)}},
		ExternalLocal: local,
		Ports:         []model.ServicePort{{Protocol: model.TCP, Port: 80, Endpoints: eps}},
	}
}

func ep(addr, nodeName string, ready bool) model.Endpoint {
	return model.Endpoint{Port: 8080, Ready: ready, Serving: ready, Place: model.On(nodeName)}.WithAddr(netip.MustParseAddr(addr))
}

func TestAddresses(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *model.Service
		want bool
	}{
		{"cluster, ready endpoint", svc("a", "192.0.2.1", false, ep("10.0.0.1", "n1", true)), true},
		{"cluster, no endpoint", svc("a", "192.0.2.1", false), false},
		{"cluster, endpoint not ready", svc("a", "192.0.2.1", false, ep("10.0.0.1", "n1", false)), false},
		{"cluster, terminating but serving", svc("a", "192.0.2.1", false,
			model.Endpoint{Port: 1, Serving: true, Terminating: true}.WithAddr(netip.MustParseAddr("10.0.0.1"))), true},
		{"local, endpoint elsewhere", svc("a", "192.0.2.1", true, ep("10.0.0.1", "n1", true)), false},
		{"local, endpoint here", svc("a", "192.0.2.1", true, ep("10.0.0.1", "n1", true), ep("10.0.0.2", "gw", true)), true},
	} {
		addrs, ok := Addresses(tc.m, node)
		if ok != tc.want || len(addrs) != 1 {
			t.Errorf("%s: usable %v (%v), want %v", tc.name, ok, addrs, tc.want)
		}
	}
	if addrs, ok := Addresses(nil, node); ok || addrs != nil {
		t.Error("a deleted Service has addresses")
	}
}

func TestServedSharedAddressOnce(t *testing.T) {
	svcs := map[model.ServiceKey]*model.Service{
		model.NewServiceKey("ns", "a"): svc("a", "192.0.2.1", false, ep("10.0.0.1", "n1", true)),
		model.NewServiceKey("ns", "b"): svc("b", "192.0.2.1", false),
		model.NewServiceKey("ns", "c"): svc("c", "192.0.2.0", false, ep("10.0.0.1", "n1", true)),
		model.NewServiceKey("ns", "d"): svc("d", "192.0.2.9", false),
	}
	got := Served(svcs, node)
	want := []netip.Addr{netip.MustParseAddr("192.0.2.0"), netip.MustParseAddr("192.0.2.1")}
	if !slices.Equal(got, want) {
		t.Errorf("served %v, want %v", got, want)
	}
}

type fakeBGP struct{ sets [][]bgp.Route }

func (f *fakeBGP) Set(r []bgp.Route) error { f.sets = append(f.sets, r); return nil }

type fakeL2 struct{ sets [][]netip.Addr }

func (f *fakeL2) Set(a []netip.Addr) { f.sets = append(f.sets, a) }

// Endpoints to zero withdraw the address; back, it is announced again;
// a sync that changes nothing announced calls nobody.
func TestCoordinatorFollowsEndpoints(t *testing.T) {
	b, l := &fakeBGP{}, &fakeL2{}
	c := &Coordinator{Node: node, BGP: b, L2: l, PoolOf: func(netip.Addr) string { return "public" }}
	k := model.NewServiceKey("ns", "a")
	up := svc("a", "192.0.2.1", false, ep("10.0.0.1", "n1", true))
	down := svc("a", "192.0.2.1", false)
	c.Observe(loop.Event{Full: true, After: map[model.ServiceKey]*model.Service{k: up}})
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{model.NewServiceKey("ns", "other"): svc("other", "192.0.2.1", false)}})
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{k: down}})
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{k: up}})
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{k: nil}})
	wantLen := []int{1, 0, 1, 0}
	if len(b.sets) != len(wantLen) || len(l.sets) != len(wantLen) {
		t.Fatalf("BGP sets %v, L2 sets %v; want %d of each", b.sets, l.sets, len(wantLen))
	}
	for i, n := range wantLen {
		if len(b.sets[i]) != n || len(l.sets[i]) != n {
			t.Errorf("set %d: BGP %v, L2 %v; want %d addresses", i, b.sets[i], l.sets[i], n)
		}
	}
	if r := b.sets[0][0]; r != bgp.HostRoute(netip.MustParseAddr("192.0.2.1"), "public") {
		t.Errorf("route %+v", r)
	}
	sn := c.Snapshot()
	if len(sn.Services) != 1 || sn.Services[0].Name != "other" || sn.Services[0].Addresses[0].Announced {
		t.Errorf("snapshot %+v", sn)
	}
}

// The coordinator's incremental served set equals Served over every
// programmed Service after each of many random changes, shared addresses
// included.
func TestCoordinatorIncrementalEqualsServed(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	c := &Coordinator{Node: node}
	all := map[model.ServiceKey]*model.Service{}
	for i := range 2000 {
		after := map[model.ServiceKey]*model.Service{}
		for range 1 + r.IntN(4) {
			name := fmt.Sprintf("s%d", r.IntN(30))
			k := model.NewServiceKey("ns", name)
			var m *model.Service
			switch r.IntN(4) {
			case 0: // deleted
			case 1: // no usable endpoint
				m = svc(name, fmt.Sprintf("192.0.2.%d", r.IntN(8)), false)
			default:
				m = svc(name, fmt.Sprintf("192.0.2.%d", r.IntN(8)), r.IntN(2) == 0, ep("10.0.0.1", []string{"gw", "n1"}[r.IntN(2)], true))
			}
			after[k] = m
			if m == nil {
				delete(all, k)
			} else {
				all[k] = m
			}
		}
		c.Observe(loop.Event{After: after})
		if got, want := c.Served(), Served(all, node); !slices.Equal(got, want) {
			t.Fatalf("change %d: served %v, want %v", i, got, want)
		}
	}
}

// The masquerade addresses (Always) are announced from the first sync,
// even one without Services, and stay while Services come and go.
func TestCoordinatorAnnouncesAlways(t *testing.T) {
	b, l := &fakeBGP{}, &fakeL2{}
	pool := []netip.Addr{netip.MustParseAddr("198.51.100.200"), netip.MustParseAddr("2001:db8::200")}
	c := &Coordinator{Node: node, BGP: b, L2: l, Always: pool}
	k := model.NewServiceKey("ns", "a")
	c.Observe(loop.Event{Full: true})
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{k: svc("a", "192.0.2.1", false, ep("10.0.0.1", "n1", true))}})
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{k: nil}})
	want := [][]netip.Addr{pool, {netip.MustParseAddr("192.0.2.1"), pool[0], pool[1]}, pool}
	if len(l.sets) != len(want) || len(b.sets) != len(want) {
		t.Fatalf("L2 sets %v, BGP sets %v; want %v", l.sets, b.sets, want)
	}
	for i := range want {
		if !slices.Equal(l.sets[i], want[i]) {
			t.Errorf("L2 set %d: %v, want %v", i, l.sets[i], want[i])
		}
		if len(b.sets[i]) != len(want[i]) {
			t.Errorf("BGP set %d: %v, want routes to %v", i, b.sets[i], want[i])
		}
	}
}

// Withdraw takes the Services' addresses out of every announcer at once and
// for good, later syncs included, and keeps the masquerade addresses.
func TestCoordinatorWithdrawKeepsAlways(t *testing.T) {
	b, l := &fakeBGP{}, &fakeL2{}
	m := netip.MustParseAddr("198.51.100.200")
	c := &Coordinator{Node: node, BGP: b, L2: l, Always: []netip.Addr{m}}
	ka, kb := model.NewServiceKey("ns", "a"), model.NewServiceKey("ns", "b")
	c.Observe(loop.Event{Full: true, After: map[model.ServiceKey]*model.Service{ka: svc("a", "192.0.2.1", false, ep("10.0.0.1", "n1", true))}})
	gone := c.Withdraw()
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.1")}; !slices.Equal(gone, want) {
		t.Fatalf("withdrew %v, want %v", gone, want)
	}
	c.Observe(loop.Event{After: map[model.ServiceKey]*model.Service{kb: svc("b", "192.0.2.2", false, ep("10.0.0.1", "n1", true))}})
	for i, want := range [][]netip.Addr{{netip.MustParseAddr("192.0.2.1"), m}, {m}, {m}} {
		if !slices.Equal(l.sets[i], want) || len(b.sets[i]) != len(want) {
			t.Errorf("set %d: L2 %v, BGP %v; want %v", i, l.sets[i], b.sets[i], want)
		}
	}
	sn := c.Snapshot()
	if !slices.Equal(sn.Announced, []netip.Addr{m}) || sn.Services[0].Addresses[0].Announced || sn.Services[0].Addresses[0].Why != "the gateway drains" {
		t.Errorf("snapshot %+v", sn)
	}
	if c.Withdraw() != nil {
		t.Error("a second Withdraw withdrew again")
	}
}
