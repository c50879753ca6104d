package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	mdnetlink "github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/statesync"
)

// synthFlow is a conntrack entry created over netlink, as NAT would leave
// it: the reply comes from replySrc instead of the original destination.
type synthFlow struct {
	proto              uint8
	src, dst, replySrc netip.AddrPort
}

func (f synthFlow) String() string {
	return fmt.Sprintf("%d %s->%s reply from %s", f.proto, f.src, f.dst, f.replySrc)
}

func (f synthFlow) flow(timeout uint32) ct.Flow {
	return ct.Flow{
		TupleOrig: ct.Tuple{
			IP:    ct.IPTuple{SourceAddress: f.src.Addr(), DestinationAddress: f.dst.Addr()},
			Proto: ct.ProtoTuple{Protocol: f.proto, SourcePort: f.src.Port(), DestinationPort: f.dst.Port()},
		},
		TupleReply: ct.Tuple{
			IP:    ct.IPTuple{SourceAddress: f.replySrc.Addr(), DestinationAddress: f.src.Addr()},
			Proto: ct.ProtoTuple{Protocol: f.proto, SourcePort: f.replySrc.Port(), DestinationPort: f.src.Port()},
		},
		Timeout: timeout,
	}
}

// natConn is a writer of ns's conntrack table that creates entries with
// the kernel's translations (statesync's, as the sync's load generator
// does), which ti-mo/conntrack's Create cannot.
func natConn(t testing.TB, ns netns.NsHandle) *statesync.Conntrack {
	t.Helper()
	c, err := statesync.NewConntrack(statesync.ConntrackOptions{NetNS: int(ns)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// createDNAT creates each of flows in c's table as a flow whose
// destination the kernel translated to its replySrc (DNAT, 120 s left).
func createDNAT(t testing.TB, c *statesync.Conntrack, flows ...synthFlow) {
	t.Helper()
	es := make([]statesync.Entry, len(flows))
	for i, f := range flows {
		es[i] = statesync.Entry{Proto: f.proto, Orig: statesync.Tuple{Src: f.src, Dst: f.dst},
			Reply: statesync.Tuple{Src: f.replySrc, Dst: f.src}, Timeout: 120}
	}
	for i, err := range c.CreateOrigins(es) {
		if err != nil {
			t.Fatalf("create %v with DNAT: %v", flows[i], err)
		}
	}
}

func ctConn(t testing.TB, ns netns.NsHandle) *ct.Conn {
	t.Helper()
	c, err := ct.Dial(&mdnetlink.Config{NetNS: int(ns)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func createFlows(t testing.TB, c *ct.Conn, flows []synthFlow) {
	t.Helper()
	for _, f := range flows {
		if err := c.Create(f.flow(3600)); err != nil {
			t.Fatalf("create %s: %v", f, err)
		}
	}
}

func remaining(t testing.TB, c *ct.Conn) []string {
	t.Helper()
	flows, err := c.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range flows {
		out = append(out, synthFlow{
			proto:    f.TupleOrig.Proto.Protocol,
			src:      netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort),
			dst:      netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort),
			replySrc: netip.AddrPortFrom(f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort),
		}.String())
	}
	slices.Sort(out)
	return out
}

// TestCleanExact checks, per family and protocol and with both the narrow
// and the broad kernel filter, that exactly the stale entries go and that
// near misses (other port, other VIP, other endpoint, other target port,
// TCP, non-local node port destination, a translated flow where only
// untranslated ones are stale) stay. SCTP and IPv6 matter here:
// the kernel does not filter their ports and addresses exactly.
func TestCleanExact(t *testing.T) {
	requireRoot(t)
	type fam struct {
		name                            string
		local, remote, vip1, vip2, vip3 netip.Addr
		ep1, ep2, client                netip.Addr
	}
	fams := []fam{
		{"ipv4", mustAddr("10.9.0.1"), mustAddr("10.9.9.9"), mustAddr("10.96.1.1"), mustAddr("10.96.1.2"), mustAddr("10.96.1.3"),
			mustAddr("10.1.0.1"), mustAddr("10.1.0.2"), mustAddr("192.0.2.1")},
		{"ipv6", mustAddr("fd09::1"), mustAddr("fd09::9:9"), mustAddr("fd96::1:1"), mustAddr("fd96::1:2"), mustAddr("fd96::1:3"),
			mustAddr("fd01::1"), mustAddr("fd01::2"), mustAddr("2001:db8::1")},
	}
	for _, f := range fams {
		for _, proto := range []Protocol{UDP, SCTP} {
			for _, maxNarrow := range []int{32, 0} {
				name := fmt.Sprintf("%s/%s/narrow=%d", f.name, proto, maxNarrow)
				t.Run(name, func(t *testing.T) {
					ns := newNetNS(t)
					h := nlHandle(t, ns)
					linkUp(t, h, "lo", netip.PrefixFrom(f.local, f.local.BitLen()))

					ap := netip.AddrPortFrom
					p := uint8(proto)
					client := func(i uint16) netip.AddrPort { return ap(f.client, 1000+i) }
					del := []synthFlow{
						{p, client(1), ap(f.vip1, 53), ap(f.ep1, 5353)},
						{p, client(2), ap(f.vip1, 53), ap(f.ep1, 5353)},
						{p, client(3), ap(f.vip3, 53), ap(f.vip3, 53)},
						{p, client(4), ap(f.vip3, 53), ap(f.ep2, 5353)},
						{p, client(5), ap(f.local, 30053), ap(f.ep1, 5353)},
						{p, client(6), ap(f.local, 30060), ap(f.local, 30060)},
						{p, client(7), ap(f.vip2, 55), ap(f.vip2, 55)},
						{p, client(8), ap(f.local, 30070), ap(f.local, 30070)},
					}
					keep := []synthFlow{
						{p, client(11), ap(f.vip1, 53), ap(f.ep2, 5353)},
						{p, client(12), ap(f.vip1, 54), ap(f.ep1, 5353)},
						{p, client(13), ap(f.vip2, 53), ap(f.ep1, 5353)},
						{p, client(14), ap(f.vip1, 53), ap(f.ep1, 5354)},
						{6, client(15), ap(f.vip1, 53), ap(f.ep1, 5353)},
						{6, client(16), ap(f.vip3, 53), ap(f.vip3, 53)},
						{p, client(17), ap(f.vip3, 54), ap(f.vip3, 54)},
						{p, client(18), ap(f.remote, 30053), ap(f.ep1, 5353)},
						{p, client(19), ap(f.local, 30054), ap(f.ep1, 5353)},
						{p, client(20), ap(f.remote, 30060), ap(f.remote, 30060)},
						{p, client(21), ap(f.vip2, 55), ap(f.ep1, 5353)},
						{p, client(22), ap(f.local, 30070), ap(f.ep1, 5353)},
						{p, client(23), ap(f.remote, 30070), ap(f.remote, 30070)},
					}
					conn := ctConn(t, ns)
					createFlows(t, conn, append(slices.Clone(del), keep...))

					c, err := New(WithNetNS(int(ns)), WithMaxNarrowDumps(maxNarrow))
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					res, err := c.Clean(context.Background(),
						[]StaleEndpoint{
							{Protocol: proto, VIP: f.vip1, Port: 53, Endpoint: ap(f.ep1, 5353)},
							{Protocol: proto, VIP: f.vip3, Port: 53, Endpoint: ap(f.ep2, 5353)},
							{Protocol: proto, NodePort: true, Port: 30053, Endpoint: ap(f.ep1, 5353)},
						},
						[]StaleService{
							{Protocol: proto, VIP: f.vip3, Port: 53},
							{Protocol: proto, NodePort: true, Port: 30060},
							{Protocol: proto, VIP: f.vip2, Port: 55, Untranslated: true},
							{Protocol: proto, NodePort: true, Port: 30070, Untranslated: true},
						})
					if err != nil {
						t.Fatalf("Clean: %v", err)
					}
					t.Logf("%+v", res)
					if res.Deleted != len(del) {
						t.Errorf("deleted %d, want %d", res.Deleted, len(del))
					}
					var want []string
					for _, k := range keep {
						want = append(want, k.String())
					}
					slices.Sort(want)
					if got := remaining(t, conn); !slices.Equal(got, want) {
						t.Errorf("remaining entries:\n got %q\nwant %q", got, want)
					}
					// Where the kernel filter is exact (IPv4 UDP), nothing but
					// the stale entries crosses into user space, except three
					// node port flows to a non-local address (the kernel cannot
					// tell local destinations) and the translated flow to the
					// node port whose untranslated flows go (nor can it compare
					// the reply source with the destination).
					if maxNarrow > 0 && f.name == "ipv4" && proto == UDP && res.Returned != res.Deleted+4 {
						t.Errorf("kernel returned %d entries for %d deletions, want %d: the filter should be exact", res.Returned, res.Deleted, res.Deleted+4)
					}
				})
			}
		}
	}
}

func TestCleanRejectsBadInput(t *testing.T) {
	ep := netip.MustParseAddrPort("10.0.0.1:53")
	vip := mustAddr("10.96.0.1")
	cases := []struct {
		name      string
		endpoints []StaleEndpoint
		services  []StaleService
		want      string
	}{
		{"tcp", []StaleEndpoint{{Protocol: 6, VIP: vip, Port: 53, Endpoint: ep}}, nil,
			"StaleEndpoint[0].Protocol: tcp flows are never cleaned, got tcp"},
		{"unknown protocol", nil, []StaleService{{Protocol: 1, VIP: vip, Port: 53}},
			"StaleService[0].Protocol: want udp (17) or sctp (132), got 1"},
		{"no port", nil, []StaleService{{Protocol: UDP, VIP: vip}},
			"StaleService[0].Port: must not be 0"},
		{"no vip", []StaleEndpoint{{Protocol: UDP, Port: 53, Endpoint: ep}}, nil,
			`StaleEndpoint[0].VIP: need a service address, got "invalid IP"`},
		{"vip on node port", nil, []StaleService{{Protocol: UDP, VIP: vip, Port: 30000, NodePort: true}},
			"StaleService[0].VIP: must be unset for a NodePort, got 10.96.0.1"},
		{"endpoint without port", []StaleEndpoint{{Protocol: UDP, VIP: vip, Port: 53, Endpoint: netip.AddrPortFrom(ep.Addr(), 0)}}, nil,
			`StaleEndpoint[0].Endpoint: need address and port, got "10.0.0.1:0"`},
		{"mixed families", []StaleEndpoint{{Protocol: UDP, VIP: mustAddr("fd00::1"), Port: 53, Endpoint: ep}}, nil,
			"StaleEndpoint[0].Endpoint: address family differs from VIP fd00::1, got 10.0.0.1:53"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := buildPlan(tc.endpoints, tc.services, 32)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPlanFilters(t *testing.T) {
	vip := mustAddr("10.96.0.1")
	ep := func(i int) netip.AddrPort { return netip.AddrPortFrom(mustAddr("10.0.0.1"), uint16(1000+i)) }
	var sameDst []StaleEndpoint
	for i := range 5 {
		sameDst = append(sameDst, StaleEndpoint{Protocol: UDP, VIP: vip, Port: 53, Endpoint: ep(i)})
	}
	filters := func(t *testing.T, eps []StaleEndpoint, svcs []StaleService, maxNarrow int) []kernelFilter {
		t.Helper()
		p, err := buildPlan(eps, svcs, maxNarrow)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.groups) != 1 {
			t.Fatalf("want one group, got %d", len(p.groups))
		}
		return p.groups[0].filters
	}

	// One stale endpoint: destination and reply source.
	if fs := filters(t, sameDst[:1], nil, 8); len(fs) != 1 || fs[0] != (kernelFilter{dst: vip, dport: 53, replySrc: ep(0)}) {
		t.Errorf("one endpoint: got %+v", fs)
	}
	// Several endpoints of one destination: one walk for the destination.
	if fs := filters(t, sameDst, nil, 8); len(fs) != 1 || fs[0] != (kernelFilter{dst: vip, dport: 53}) {
		t.Errorf("five endpoints of one destination: got %+v", fs)
	}
	// The service is gone as a whole: its filter covers the endpoints.
	if fs := filters(t, sameDst[:1], []StaleService{{Protocol: UDP, VIP: vip, Port: 53}}, 8); len(fs) != 1 || fs[0] != (kernelFilter{dst: vip, dport: 53}) {
		t.Errorf("stale service and endpoint: got %+v", fs)
	}

	// Untranslated flows of a service address answer from the address
	// itself; those of a node port from any local address.
	if fs := filters(t, nil, []StaleService{{Protocol: UDP, VIP: vip, Port: 53, Untranslated: true}}, 8); len(fs) != 1 ||
		fs[0] != (kernelFilter{dst: vip, dport: 53, replySrc: netip.AddrPortFrom(vip, 53)}) {
		t.Errorf("untranslated service address: got %+v", fs)
	}
	np, err := buildPlan(nil, []StaleService{{Protocol: UDP, NodePort: true, Port: 30053, Untranslated: true}}, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(np.groups) != 2 || !np.needsLocal() {
		t.Fatalf("untranslated node port: want both families and the local addresses, got %d groups", len(np.groups))
	}
	for _, g := range np.groups {
		if len(g.filters) != 1 || g.filters[0] != (kernelFilter{dport: 30053}) {
			t.Errorf("untranslated node port, family %d: got %+v", g.key.family, g.filters)
		}
	}

	var manyDst []StaleEndpoint
	for i := range 5 {
		manyDst = append(manyDst, StaleEndpoint{Protocol: UDP, VIP: vip, Port: uint16(53 + i), Endpoint: ep(i)})
	}
	if fs := filters(t, manyDst, nil, 5); len(fs) != 5 {
		t.Errorf("five destinations at the limit: want five narrow filters, got %d", len(fs))
	}
	// Over the limit: one broad dump of the family and protocol.
	if fs := filters(t, manyDst, nil, 4); len(fs) != 1 || fs[0] != (kernelFilter{}) {
		t.Errorf("over the limit: want one broad filter, got %+v", fs)
	}
}

func TestCleanStopsOnCancelledContext(t *testing.T) {
	requireRoot(t)
	ns := newNetNS(t)
	c, err := New(WithNetNS(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := c.Clean(ctx, nil, []StaleService{{Protocol: UDP, VIP: mustAddr("10.96.0.1"), Port: 53}})
	if !errors.Is(err, context.Canceled) || res.Requests != 0 {
		t.Errorf("got %+v, %v; want no request and context.Canceled", res, err)
	}
}
