package bgp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/nftgate/nftgate/lab"
)

var (
	service4 = netip.MustParseAddr("198.19.0.1")
	service6 = netip.MustParseAddr("2001:db8:ff::1")
)

// The router learns the gateway's service addresses from the speaker,
// installs them in its kernel, and the client behind it reaches the
// gateway; a withdrawn address leaves the router's table within a second,
// and comes back when announced again.
func TestBIRDLearnsAndForgetsServiceAddresses(t *testing.T) {
	e := newEdge(t)
	b := startBird(t, e.router, birdConf(""))
	sp := startSpeaker(t, e.gateway, speakerConfig())
	for _, svc := range []netip.Addr{service4, service6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[svc.Is4()], func(t *testing.T) {
			dst := e.serve(t, svc)
			prefix := netip.PrefixFrom(svc, svc.BitLen())
			protocol := map[bool]string{true: "gw4", false: "gw6"}[svc.Is4()]
			sp.Set(HostRoute(svc, ""))
			b.waitState(t, protocol, "Established", false, 30*time.Second)
			took := b.waitRoute(t, prefix, true, 30*time.Second)
			t.Logf("%s in BIRD %v after Set", prefix, took)
			if err := lab.EventuallyWithin(5*time.Second, func() error {
				return e.router.Do(func() error { return kernelHasRoute(prefix) })
			}); err != nil {
				t.Fatal(err)
			}
			rep, err := e.client.Dial("tcp", dst, lab.DialOpts{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatalf("client to %s through the router: %v", dst, err)
			}
			if rep.Backend != dst.String() {
				t.Fatalf("answered by %s, want the gateway's %s", rep.Backend, dst)
			}

			start := time.Now()
			sp.Set()
			b.waitRoute(t, prefix, false, 5*time.Second)
			took = time.Since(start)
			t.Logf("withdrawal of %s reached BIRD in %v", prefix, took)
			if took > time.Second {
				t.Errorf("withdrawal took %v, want within 1s", took)
			}
			sp.Set(HostRoute(svc, ""))
			b.waitRoute(t, prefix, true, 5*time.Second)
			if _, err := e.client.Dial("tcp", dst, lab.DialOpts{Timeout: 2 * time.Second}); err != nil {
				t.Fatalf("client after re-announcement: %v", err)
			}
			sp.Set()
			b.waitRoute(t, prefix, false, 5*time.Second)
		})
	}
}
