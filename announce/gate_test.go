package announce

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nftgate/nftgate/announce/bgp"
)

// lastAddrs is the addresses of the last routes b was set to.
func lastAddrs(b *fakeBGP) []netip.Addr {
	var as []netip.Addr
	for _, rt := range b.sets[len(b.sets)-1] {
		as = append(as, rt.Prefix.Addr())
	}
	return as
}

func lastL2(l *fakeL2) []netip.Addr { return l.sets[len(l.sets)-1] }

// BGP carries a floating address only while it is held, a shared one
// always; L2 carries what is held; no route is set before the
// Coordinator's first.
func TestGateAnnouncesHeldAndShared(t *testing.T) {
	svcAddr, m := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1")
	r, l := &fakeBGP{}, &fakeL2{}
	g := &Gate{BGP: r, L2: l, Shared: func(a netip.Addr) bool { return a == svcAddr }}
	g.Held([]netip.Addr{m})
	if len(r.sets) != 0 || !slices.Equal(lastL2(l), []netip.Addr{m}) {
		t.Fatalf("before the first routes: BGP %v, L2 %v", r.sets, lastL2(l))
	}
	routes := []bgp.Route{bgp.HostRoute(svcAddr, ""), bgp.HostRoute(m, "")}
	if err := g.Routes().Set(routes); err != nil {
		t.Fatal(err)
	}
	if got := lastAddrs(r); !slices.Equal(got, []netip.Addr{svcAddr, m}) {
		t.Errorf("held m: BGP %v", got)
	}
	g.Held(nil)
	if got := lastAddrs(r); !slices.Equal(got, []netip.Addr{svcAddr}) || len(lastL2(l)) != 0 {
		t.Errorf("nothing held: BGP %v, L2 %v", got, lastL2(l))
	}
	g.Shared = nil // active-backup: nothing goes without ownership
	g.Held(nil)
	if got := lastAddrs(r); len(got) != 0 {
		t.Errorf("active-backup, nothing held: BGP %v", got)
	}
}

// With SharedWaits the shared routes wait for Ready; a held address goes
// out at once.
func TestGateSharedWaitsForReady(t *testing.T) {
	svcAddr, m := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1")
	r := &fakeBGP{}
	g := &Gate{BGP: r, SharedWaits: true, Shared: func(a netip.Addr) bool { return a == svcAddr }}
	if err := g.Routes().Set([]bgp.Route{bgp.HostRoute(svcAddr, ""), bgp.HostRoute(m, "")}); err != nil {
		t.Fatal(err)
	}
	if got := lastAddrs(r); len(got) != 0 {
		t.Errorf("not ready: BGP %v", got)
	}
	g.Held([]netip.Addr{m})
	if got := lastAddrs(r); !slices.Equal(got, []netip.Addr{m}) {
		t.Errorf("not ready, m held: BGP %v", got)
	}
	g.Ready()
	if got := lastAddrs(r); !slices.Equal(got, []netip.Addr{svcAddr, m}) {
		t.Errorf("ready: BGP %v", got)
	}
}

// On standby (faulty while a fit peer lives) the shared routes are
// withdrawn, a held address stays; off standby they go out again.
// Passes says the same for the status page.
func TestGateStandbyWithdrawsShared(t *testing.T) {
	svcAddr, m := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.1")
	r := &fakeBGP{}
	g := &Gate{BGP: r, Shared: func(a netip.Addr) bool { return a == svcAddr }}
	g.Held([]netip.Addr{m})
	if err := g.Routes().Set([]bgp.Route{bgp.HostRoute(svcAddr, ""), bgp.HostRoute(m, "")}); err != nil {
		t.Fatal(err)
	}
	g.Standby(true)
	if got := lastAddrs(r); !slices.Equal(got, []netip.Addr{m}) || g.Passes(svcAddr) || !g.Passes(m) {
		t.Errorf("on standby: BGP %v, passes %v %v; want only m", got, g.Passes(svcAddr), g.Passes(m))
	}
	g.Standby(false)
	if got := lastAddrs(r); !slices.Equal(got, []netip.Addr{svcAddr, m}) || !g.Passes(svcAddr) {
		t.Errorf("off standby: BGP %v; want both", got)
	}
}
