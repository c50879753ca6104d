package nft

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// isolationService is default/<name>, ClusterIP 198.19.0.<n> port 80, with
// one endpoint.
func isolationService(name string, n int, endpoint string) *model.Service {
	return &model.Service{Key: model.NewServiceKey("default", name), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr(fmt.Sprintf("198.19.0.%d", n))},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr(endpoint)),
		}}}}
}

// refusingProgrammer is a Programmer in a namespace of its own whose rules
// for the Service models in refuse the kernel refuses.
func refusingProgrammer(t *testing.T, refuse *atomic.Pointer[map[*model.Service]bool]) (string, *Programmer) {
	t.Helper()
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Shards: 4}, Options{NetNSFD: fd,
		RefuseForTest: func(s *model.Service) bool { return (*refuse.Load())[s] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return ns, p
}

// programmed checks, in the kernel, which ClusterIPs have a verdict and
// which endpoints their chains DNAT to.
func checkIsolated(t *testing.T, ns string, want map[string]string, absent ...string) {
	t.Helper()
	out := nftList(t, ns, "list", "ruleset")
	for ip, ep := range want {
		// A counted map's elements carry their counters.
		if !regexp.MustCompile(regexp.QuoteMeta(ip) + ` \. tcp \. 80 (counter packets \d+ bytes \d+ )?: goto`).MatchString(out) {
			t.Errorf("no verdict for %s in the kernel", ip)
		}
		// DNATed in a chain of the Service's own, or through an endpoint map.
		if !strings.Contains(out, "dnat to "+ep+":8080") &&
			!regexp.MustCompile(regexp.QuoteMeta(ip)+` \. tcp \. 80 : `+regexp.QuoteMeta(ep)+` \. 8080`).MatchString(out) {
			t.Errorf("no DNAT to %s in the kernel", ep)
		}
	}
	for _, a := range absent {
		if strings.Contains(out, a) {
			t.Errorf("%s is in the kernel, want it absent", a)
		}
	}
	if t.Failed() {
		t.Logf("ruleset:\n%s", out)
	}
}

func serviceMap(svcs ...*model.Service) map[model.ServiceKey]*model.Service {
	m := map[model.ServiceKey]*model.Service{}
	for _, s := range svcs {
		m[s.Key] = s
	}
	return m
}

// TestKernelRefusalIsIsolated makes the real kernel refuse one Service's
// rules, in a cold full sync and in partial syncs, and checks that every
// other Service is programmed, that the refused one keeps its last good
// state with the kernel's error, and that it is programmed once the kernel
// accepts it.
func TestKernelRefusalIsIsolated(t *testing.T) {
	for _, bisect := range []bool{false, true} {
		t.Run(fmt.Sprintf("bisect=%v", bisect), func(t *testing.T) { testKernelRefusal(t, bisect) })
	}
}

func testKernelRefusal(t *testing.T, bisect bool) {
	web, api, dns, bad := isolationService("web", 10, "198.18.2.10"), isolationService("api", 11, "198.18.2.11"),
		isolationService("dns", 13, "198.18.2.13"), isolationService("bad", 12, "198.18.2.12")
	web2, bad2 := isolationService("web", 10, "198.18.2.20"), isolationService("bad", 12, "198.18.2.22")
	api3, dns3, bad3 := isolationService("api", 11, "198.18.2.31"), isolationService("dns", 13, "198.18.2.33"), isolationService("bad", 12, "198.18.2.32")
	var refuse atomic.Pointer[map[*model.Service]bool]
	refuse.Store(&map[*model.Service]bool{bad: true, bad2: true})
	ns, p := refusingProgrammer(t, &refuse)
	p.bisectOnly = bisect

	// A cold start: everything but bad is programmed.
	res, err := p.Full(serviceMap(web, api, dns, bad))
	if err != nil {
		t.Fatalf("cold full sync: %v", err)
	}
	if len(res.Refused) != 1 || !strings.Contains(res.Refused[bad.Key], ruleset.RefusedChain) {
		t.Fatalf("refused %v, want default/bad refused by the kernel for its jump to %s", res.Refused, ruleset.RefusedChain)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.10": "198.18.2.10", "198.19.0.11": "198.18.2.11", "198.19.0.13": "198.18.2.13"},
		"198.19.0.12", "198.18.2.12")

	// A partial sync changing web and bad: web's change is programmed.
	res, err = p.Partial(serviceMap(web2, bad2))
	if err != nil || len(res.Refused) != 1 || res.Refused[bad.Key] == "" {
		t.Fatalf("partial sync: %v, refused %v; want only default/bad refused", err, res.Refused)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.10": "198.18.2.20", "198.19.0.11": "198.18.2.11"}, "198.18.2.10", "198.19.0.12")

	// The kernel accepts bad now: the next full sync programs it.
	refuse.Store(&map[*model.Service]bool{})
	res, err = p.Full(serviceMap(web2, api, dns, bad2))
	if err != nil || len(res.Refused) != 0 {
		t.Fatalf("full sync: %v, refused %v; want none", err, res.Refused)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.12": "198.18.2.22", "198.19.0.10": "198.18.2.20"})

	// Programmed, then refused: bad keeps its last good state, while
	// api's and dns's changes go through in the same sync.
	refuse.Store(&map[*model.Service]bool{bad3: true})
	res, err = p.Partial(serviceMap(api3, dns3, bad3))
	if err != nil || len(res.Refused) != 1 || res.Refused[bad.Key] == "" {
		t.Fatalf("partial sync: %v, refused %v; want only default/bad refused", err, res.Refused)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.12": "198.18.2.22", "198.19.0.11": "198.18.2.31", "198.19.0.13": "198.18.2.33"}, "198.18.2.32")

	// A full sync tries bad again, and keeps it at its last good state.
	res, err = p.Full(serviceMap(web2, api3, dns3, bad3))
	if err != nil || len(res.Refused) != 1 || res.Refused[bad.Key] == "" {
		t.Fatalf("full sync: %v, refused %v; want only default/bad refused", err, res.Refused)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.12": "198.18.2.22"}, "198.18.2.32")

	// Deleting the refused Service removes its last good state.
	res, err = p.Partial(map[model.ServiceKey]*model.Service{bad.Key: nil})
	if err != nil || len(res.Refused) != 0 {
		t.Fatalf("deleting default/bad: %v, refused %v", err, res.Refused)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.11": "198.18.2.31"}, "198.19.0.12", "198.18.2.22")
}

// TestKernelRefusalAfterDriftIsIsolated: a full sync that reads the tables
// back (another program changed them) and whose batch is refused still
// programs everything else, with the drift repaired.
func TestKernelRefusalAfterDriftIsIsolated(t *testing.T) {
	web, bad := isolationService("web", 10, "198.18.2.10"), isolationService("bad", 12, "198.18.2.12")
	bad2 := isolationService("bad", 12, "198.18.2.22")
	var refuse atomic.Pointer[map[*model.Service]bool]
	refuse.Store(&map[*model.Service]bool{bad2: true})
	ns, p := refusingProgrammer(t, &refuse)
	if _, err := p.Full(serviceMap(web, bad)); err != nil {
		t.Fatal(err)
	}
	nftList(t, ns, "flush", "map", "ip", p.cfg.TableOf(web.Key), ruleset.MapServiceIPs)
	res, err := p.Full(serviceMap(web, bad2))
	if err != nil || len(res.Refused) != 1 || len(res.Drift) == 0 {
		t.Fatalf("full sync: %v, refused %v, drift %v; want default/bad refused and the drift repaired", err, res.Refused, res.Drift)
	}
	checkIsolated(t, ns, map[string]string{"198.19.0.10": "198.18.2.10", "198.19.0.12": "198.18.2.12"}, "198.18.2.22")
}
