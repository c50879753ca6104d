package nft

import (
	"fmt"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// TestCountersCountConnections sends real connections from inside a
// namespace to a Service with an endpoint, one without, and one whose
// source ranges leave the gateway out, and reads the counters back.
func TestCountersCountConnections(t *testing.T) {
	ns, fd := testNetNS(t)
	addLink(t, ns, "198.19.0.1/16")
	p, err := NewProgrammer(ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Counters: true, TrafficElements: 1024}, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// The endpoint is the namespace's own address, where nothing listens:
	// the connection is refused by the endpoint, after the DNAT counted it.
	web := webService("198.19.0.1")
	empty := &model.Service{Key: model.NewServiceKey("default", "empty"), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.11")},
		Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}}}
	guarded := &model.Service{Key: model.NewServiceKey("default", "guarded"), Type: model.TypeLoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.12")}, Rare: &model.Rare{LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.19.1.1")}, SourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr("198.19.0.1"))}}}}
	services := map[model.ServiceKey]*model.Service{web.Key: web, empty.Key: empty, guarded.Key: guarded}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	connect := func(addr string, n int) {
		t.Helper()
		for range n {
			// Refused, rejected or (dropped) timed out: the counters
			// count each attempt either way.
			exec.Command("ip", "netns", "exec", ns, "timeout", "0.3", "bash", "-c", "echo > /dev/tcp/"+addr+"/80").Run()
		}
	}
	connect("198.19.0.10", 3)
	connect("198.19.0.11", 2)
	connect("198.19.1.1", 1)

	reading, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	got := func(ref PortRef) PortCounters {
		c, _ := reading.Port(ref)
		return c
	}
	if r, ok := reading.PortOf(model.TCP, netip.MustParseAddrPort("198.19.0.10:80")); !ok || r.Service != web.Key {
		t.Errorf("destination 198.19.0.10:80 belongs to %v, want %v", r, web.Key)
	}
	ref := func(s *model.Service) PortRef { return PortRef{Service: s.Key, Proto: model.TCP, Port: 80} }
	if c := got(ref(web)); c.New != 3 || c.Rejected != 0 {
		t.Errorf("web: %+v, want 3 new connections", c)
	}
	if c := got(ref(empty)); c.Rejected != 2 || c.New != 0 {
		t.Errorf("empty: %+v, want 2 rejected", c)
	}
	// A dropped SYN is sent again, and each is a new connection.
	if c := got(ref(guarded)); c.Dropped < 1 || c.New != 0 {
		t.Errorf("guarded: %+v, want drops and no new connection", c)
	}
	// A reading is served again within CountersMaxAge.
	connect("198.19.0.10", 1)
	again, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := again.Port(ref(web)); c.New != 3 {
		t.Errorf("a second reading at once read the kernel again: %+v", c)
	}
	// Past its age, the last reading is still what a caller gets at once,
	// and the next one is made in the background.
	p.counters.mu.Lock()
	p.counters.next = time.Time{}
	p.counters.mu.Unlock()
	if stale, err := p.Counters(); err != nil || stale != again {
		t.Errorf("a reading past its age: %p %v, want the last one (%p) served at once", stale, err, again)
	}
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		rd, err := p.Counters()
		if c, _ := rd.Port(ref(web)); err == nil && c.New != 4 {
			err = fmt.Errorf("web: %+v, want 4 new connections", c)
		}
		return err
	}); err != nil {
		t.Errorf("the background reading: %v", err)
	}
	// The counted maps read back as what was programmed: no drift.
	p.genKnown = false
	res, err := p.Full(services)
	if err != nil || !res.ReadBack || res.Counts.Changes() != 0 || len(res.Drift) != 0 {
		t.Fatalf("full sync over counted maps: %+v %v", res, err)
	}
}

// addLink gives namespace ns a link that is up, with the prefixes, so
// that connections to them leave through it (a veth whose peer is up).
func addLink(t *testing.T, ns string, prefixes ...string) {
	t.Helper()
	cmds := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1"},
		{"link", "set", "dummy1", "up"},
	}
	for _, pfx := range prefixes {
		cmds = append(cmds, []string{"addr", "add", pfx, "dev", "dummy0"})
	}
	for _, args := range append(cmds, []string{"link", "set", "dummy0", "up"}) {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
}

// TestCountersOffStillTellDestinations: without counters there is nothing
// counted, and the reading still tells which Service port a destination
// is (the active flows are attributed by it).
func TestCountersOffStillTellDestinations(t *testing.T) {
	_, p := testProgrammer(t)
	web := webService("198.18.2.10")
	if _, err := p.Full(map[model.ServiceKey]*model.Service{web.Key: web}); err != nil {
		t.Fatal(err)
	}
	rd, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if rd.NumPorts() != 0 {
		t.Errorf("counts without counters: %+v", rd.counts)
	}
	if r, ok := rd.PortOf(model.TCP, netip.MustParseAddrPort("198.19.0.10:80")); !ok || r != (PortRef{Service: web.Key, Proto: model.TCP, Port: 80}) {
		t.Errorf("198.19.0.10:80 is %+v %v, want web's port 80", r, ok)
	}
	if _, ok := rd.PortOf(model.TCP, netip.MustParseAddrPort("198.19.0.10:81")); ok {
		t.Error("a port the Service does not have belongs to it")
	}

	// The next reading, with no sync between, shares the index of
	// destinations; after a sync it tells the Services as programmed.
	next := func() *Reading {
		t.Helper()
		p.counters.mu.Lock()
		p.counters.next = time.Time{}
		p.counters.mu.Unlock()
		var got *Reading
		if err := lab.EventuallyWithin(10*time.Second, func() error {
			r, err := p.Counters()
			if err == nil && r == rd {
				err = fmt.Errorf("no new reading yet")
			}
			got = r
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	again := next()
	if again.ports != rd.ports {
		t.Error("a reading with no sync since the last made its index of destinations again")
	}
	api := &model.Service{Key: model.NewServiceKey("default", "api"), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.20")},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 8080, Endpoints: []model.Endpoint{
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr("198.18.2.11"))}}}}
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{web.Key: nil, api.Key: api}); err != nil {
		t.Fatal(err)
	}
	rd = again
	after := next()
	if r, ok := after.PortOf(model.TCP, netip.MustParseAddrPort("198.19.0.20:8080")); !ok || r.Service != api.Key {
		t.Errorf("after the sync 198.19.0.20:8080 is %+v %v, want api's", r, ok)
	}
	if r, ok := after.PortOf(model.TCP, netip.MustParseAddrPort("198.19.0.10:80")); ok {
		t.Errorf("after the sync the deleted web still has 198.19.0.10:80: %+v", r)
	}
}
