package podroutes

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/model"
)

// cluster is a gateway in front of two nodes (lab.AddPodNodes), each
// forwarding to one pod behind it: the pods are reachable from the
// gateway only through their node, and only with a route to them.
type cluster struct {
	gw    *lab.Host
	nodes []NodeInfo
	pods  [2][]netip.Addr // per node: the pod's IPv4 and IPv6 address
}

const echoPort = 8080

func newCluster(t *testing.T) *cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	l, err := lab.New("podroutes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	c := &cluster{}
	if c.gw, err = l.AddHost("gw"); err != nil {
		t.Fatal(err)
	}
	nodes, err := l.AddPodNodes(c.gw, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		for _, a := range n.Pods {
			if _, err := n.Pod.ServeEcho("tcp", netip.AddrPortFrom(a, echoPort)); err != nil {
				t.Fatal(err)
			}
		}
		c.pods[i] = n.Pods
		c.nodes = append(c.nodes, NodeInfo{Name: n.Name, InternalIPs: n.InternalIPs, PodCIDRs: n.PodCIDRs})
	}
	return c
}

func (c *cluster) reconciler(t *testing.T, reg prometheus.Registerer) *Reconciler {
	t.Helper()
	ns := netns.NsHandle(c.gw.FD())
	r, err := New(Options{Netns: &ns, Policy: policy(t, None), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// reach tells whether the gateway reaches the pod's echo server over TCP
// (one exchange, from the gateway's own addresses).
func (c *cluster) reach(a netip.Addr) error {
	rep, err := c.gw.Dial("tcp", netip.AddrPortFrom(a, echoPort), lab.DialOpts{Timeout: time.Second})
	if err != nil {
		return err
	}
	if want := netip.AddrPortFrom(a, echoPort).String(); rep.Backend != want {
		return fmt.Errorf("answered by %s, want %s", rep.Backend, want)
	}
	return nil
}

func (c *cluster) wantReach(t *testing.T, reachable bool, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		err := c.reach(a)
		switch {
		case reachable && err != nil:
			t.Errorf("%s from the gateway: %v", a, err)
		case !reachable && err == nil:
			t.Errorf("%s reached from the gateway, want no route", a)
		}
	}
}

// kernelRoutes lists the gateway's routes of protocol proto in the main
// table, as "dst via gw".
func (c *cluster) kernelRoutes(t *testing.T, proto netlink.RouteProtocol) []string {
	t.Helper()
	rs, err := c.gw.Netlink().RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: proto}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		gw, _ := netip.AddrFromSlice(r.Gw)
		out = append(out, Route{Dst: prefixOf(r.Dst), Via: gw.Unmap()}.String())
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func TestNodeModeRoutesTrafficThroughNodes(t *testing.T) {
	c := newCluster(t)
	reg := prometheus.NewRegistry()
	r := c.reconciler(t, reg)
	all := slices.Concat(c.pods[0], c.pods[1])
	c.wantReach(t, false, all...)

	pol := policy(t, Node, "10.244.0.0/16", "2001:db8:244::/48")
	if err := r.Set(pol.Plan(Input{Nodes: c.nodes})); err != nil {
		t.Fatal(err)
	}
	c.wantReach(t, true, all...)
	want := sorted("10.244.1.0/24 via 198.18.11.2", "10.244.2.0/24 via 198.18.12.2",
		"2001:db8:244:1::/64 via fd42:11::2", "2001:db8:244:2::/64 via fd42:12::2")
	if got := c.kernelRoutes(t, Protocol); !slices.Equal(got, want) {
		t.Errorf("kernel routes %q, want %q", got, want)
	}
	if v := testutil.ToFloat64(r.mInstalled.WithLabelValues("node")); v != 4 {
		t.Errorf("nftgate_pod_routes_installed{mode=node} = %v, want 4", v)
	}

	// The second Node goes away: its routes with it.
	if err := r.Set(pol.Plan(Input{Nodes: c.nodes[:1]})); err != nil {
		t.Fatal(err)
	}
	c.wantReach(t, true, c.pods[0]...)
	c.wantReach(t, false, c.pods[1]...)
	if got := c.kernelRoutes(t, Protocol); len(got) != 2 || strings.Contains(strings.Join(got, " "), "198.18.12.2") {
		t.Errorf("after the node's removal: %q", got)
	}
	if st := r.Status(); st.Mode != Node || st.Installed != 2 || st.Desired != 2 {
		t.Errorf("status %+v", st)
	}

	// pod_routes back to none: nothing of nftgate's is left.
	if err := r.Set(policy(t, None).Plan(Input{Nodes: c.nodes})); err != nil {
		t.Fatal(err)
	}
	if got := c.kernelRoutes(t, Protocol); len(got) != 0 {
		t.Errorf("mode none leaves %q", got)
	}
	c.wantReach(t, false, all...)
}

func TestEndpointModeRoutesEachPod(t *testing.T) {
	c := newCluster(t)
	r := c.reconciler(t, nil)
	svc := &model.Service{Key: model.NewServiceKey("default", "web"), Ports: []model.ServicePort{{Port: 80, Protocol: model.TCP}}}
	for i, pod := range c.pods {
		for _, a := range pod {
			svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, model.Endpoint{Port: echoPort, Place: model.On(c.nodes[i].Name), Ready: true}.WithAddr(a))
		}
	}
	pol := policy(t, Endpoint, "10.244.0.0/16", "2001:db8:244::/48")
	if err := r.Set(pol.Plan(Input{Nodes: c.nodes, Services: []*model.Service{svc}})); err != nil {
		t.Fatal(err)
	}
	c.wantReach(t, true, slices.Concat(c.pods[0], c.pods[1])...)
	want := sorted("10.244.1.10/32 via 198.18.11.2", "10.244.2.10/32 via 198.18.12.2",
		"2001:db8:244:1::10/128 via fd42:11::2", "2001:db8:244:2::10/128 via fd42:12::2")
	if got := c.kernelRoutes(t, Protocol); !slices.Equal(got, want) {
		t.Errorf("kernel routes %q, want %q", got, want)
	}

	// The endpoints of the second pod go away: its routes with them.
	svc.Ports[0].Endpoints = svc.Ports[0].Endpoints[:2]
	if err := r.Set(pol.Plan(Input{Nodes: c.nodes, Services: []*model.Service{svc}})); err != nil {
		t.Fatal(err)
	}
	c.wantReach(t, true, c.pods[0]...)
	c.wantReach(t, false, c.pods[1]...)
	if got := c.kernelRoutes(t, Protocol); !slices.Equal(got, sorted("10.244.1.10/32 via 198.18.11.2", "2001:db8:244:1::10/128 via fd42:11::2")) {
		t.Errorf("after the endpoint's removal: %q", got)
	}
}

// A route removed by hand comes back within a second; routes of other
// protocols in the same table are never touched, not even one to a
// destination nftgate wants; Cleanup removes only nftgate's.
func TestRepairOthersUntouchedAndCleanup(t *testing.T) {
	c := newCluster(t)
	reg := prometheus.NewRegistry()
	r := c.reconciler(t, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	ip := func(args ...string) {
		t.Helper()
		if out, err := c.gw.Command(context.Background(), "ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// The host's own routes: one beside nftgate's, one where nftgate
	// wants its own (the second node's pod CIDR).
	ip("route", "add", "10.99.0.0/24", "via", "198.18.11.2", "proto", "static")
	ip("route", "add", "10.244.2.0/24", "via", "198.18.11.2", "proto", "static")
	ip("-6", "route", "add", "2001:db8:99::/64", "via", "fd42:12::2", "proto", "boot")
	others := func() []string {
		return slices.Concat(c.kernelRoutes(t, netlink.RouteProtocol(4)), c.kernelRoutes(t, netlink.RouteProtocol(3)))
	}
	wantOthers := sorted("10.244.2.0/24 via 198.18.11.2", "10.99.0.0/24 via 198.18.11.2", "2001:db8:99::/64 via fd42:12::2")

	pol := policy(t, Node, "10.244.0.0/16", "2001:db8:244::/48")
	if err := r.Set(pol.Plan(Input{Nodes: c.nodes})); err != nil {
		t.Fatal(err)
	}
	if got := sorted(others()...); !slices.Equal(got, wantOthers) {
		t.Errorf("routes of other protocols %q, want %q", got, wantOthers)
	}
	want := sorted("10.244.1.0/24 via 198.18.11.2", "2001:db8:244:1::/64 via fd42:11::2", "2001:db8:244:2::/64 via fd42:12::2")
	if got := c.kernelRoutes(t, Protocol); !slices.Equal(got, want) {
		t.Errorf("kernel routes %q, want %q", got, want)
	}
	st := r.Status()
	if len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "10.244.2.0/24 via 198.18.12.2: the table holds another route to 10.244.2.0/24 (not nftgate's); left alone") {
		t.Errorf("problems %q", st.Problems)
	}

	for _, dst := range []string{"10.244.1.0/24", "2001:db8:244:2::/64"} {
		start := time.Now()
		ip("route", "del", dst)
		err := lab.EventuallyWithin(time.Second, func() error {
			if got := c.kernelRoutes(t, Protocol); !slices.Equal(got, want) {
				return fmt.Errorf("kernel routes %q", got)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s deleted by hand: not back within a second: %v", dst, err)
		}
		t.Logf("%s deleted by hand: back after %s", dst, time.Since(start).Round(time.Microsecond))
	}
	c.wantReach(t, true, c.pods[0]...)
	c.wantReach(t, true, c.pods[1][1])
	if err := lab.EventuallyWithin(time.Second, func() error {
		if v := testutil.ToFloat64(r.mRepairs); v != 2 {
			return fmt.Errorf("nftgate_pod_routes_repaired_total = %v, want 2", v)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	// A route of nftgate's changed by hand gets its next hop back.
	ip("route", "replace", "10.244.1.0/24", "via", "198.18.12.2", "proto", "246")
	if err := lab.EventuallyWithin(time.Second, func() error {
		if got := c.kernelRoutes(t, Protocol); !slices.Equal(got, want) {
			return fmt.Errorf("kernel routes %q", got)
		}
		return nil
	}); err != nil {
		t.Errorf("changed by hand: %v", err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
	done <- nil // for the cleanup
	n, err := Cleanup(c.gw.Netlink())
	if err != nil || n != 3 {
		t.Errorf("Cleanup: %d routes, %v; want 3", n, err)
	}
	if got := c.kernelRoutes(t, Protocol); len(got) != 0 {
		t.Errorf("after Cleanup: %q", got)
	}
	if got := sorted(others()...); !slices.Equal(got, wantOthers) {
		t.Errorf("after Cleanup, routes of other protocols %q, want %q", got, wantOthers)
	}
	if _, err := Cleanup(c.gw.Netlink()); err != nil {
		t.Errorf("Cleanup again: %v", err)
	}
}
