package podroutes

import (
	"net/netip"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
)

// 10,000 endpoint routes are installed in one Set, a Set that changes
// nothing costs one listing, and one removed endpoint takes its route.
func TestTenThousandEndpointRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("scale")
	}
	c := newCluster(t)
	r := c.reconciler(t, nil)
	const n = 10000
	svc := &model.Service{Key: model.NewServiceKey("default", "big"), Ports: []model.ServicePort{{Port: 80, Protocol: model.TCP}}}
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 244, byte(1 + i/250%2), byte(11 + i%250)})
		if i >= 500 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0x02, 0x44, 0, byte(1 + i%2), 14: byte(i >> 8), 15: byte(i)})
		}
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, model.Endpoint{Port: echoPort, Place: model.On(c.nodes[i%2].Name)}.WithAddr(a))
	}
	pol := policy(t, Endpoint, "10.244.0.0/16", "2001:db8:244::/48")
	in := Input{Nodes: c.nodes, Services: []*model.Service{svc}}
	step := func(what string) {
		t.Helper()
		start := time.Now()
		plan := pol.Plan(in)
		planned := time.Since(start)
		if err := r.Set(plan); err != nil {
			t.Fatal(err)
		}
		st := r.Status()
		if st.Installed != len(plan.Routes) || len(st.Problems) != 0 {
			t.Fatalf("%s: %d of %d installed, problems %q", what, st.Installed, len(plan.Routes), st.Problems)
		}
		t.Logf("%s: %d routes, plan %s, plan and Set %s", what, len(plan.Routes), planned.Round(time.Microsecond), time.Since(start).Round(time.Microsecond))
	}
	step("first Set")
	if got := len(c.kernelRoutes(t, Protocol)); got != n {
		t.Fatalf("%d routes in the kernel, want %d", got, n)
	}
	step("the same again")
	svc.Ports[0].Endpoints = svc.Ports[0].Endpoints[1:]
	step("one endpoint fewer")
	if got := len(c.kernelRoutes(t, Protocol)); got != n-1 {
		t.Fatalf("%d routes in the kernel, want %d", got, n-1)
	}
	if got, err := Cleanup(c.gw.Netlink()); err != nil || got != n-1 {
		t.Fatalf("Cleanup: %d, %v", got, err)
	}
}
