package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

var nsCounter atomic.Int32

// testNetNS creates an empty network namespace for one test and removes it
// when the test ends.
func testNetNS(t testing.TB) (name string, fd int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	name = fmt.Sprintf("nftgate-nfttest-%d-%d", os.Getpid(), nsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		exec.Command("ip", "netns", "del", name).Run()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name, int(h)
}

func nftList(t testing.TB, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// testProgrammer is a Programmer of table nftgate in a namespace of its own.
func testProgrammer(t *testing.T) (ns string, p *Programmer) {
	t.Helper()
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1}, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return ns, p
}

func TestSmoke(t *testing.T) {
	ns, p := testProgrammer(t)
	svc := &model.Service{Key: model.NewServiceKey("default", "web"), Type: model.TypeLoadBalancer,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.10"), netip.MustParseAddr("fd42:ff::10")}, Rare: &model.Rare{LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.19.1.1")}, SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}, AffinityTimeout: 30 * time.Second}, Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080, Endpoints: []model.Endpoint{
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr("198.18.2.10")),
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr("198.18.2.11")),
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr("fd42:2::10")),
		}}}}
	empty := &model.Service{Key: model.NewServiceKey("default", "empty"), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.11")},
		Ports:      []model.ServicePort{{Protocol: model.UDP, Port: 53}}}
	res, err := p.Full(map[model.ServiceKey]*model.Service{svc.Key: svc, empty.Key: empty})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	out := nftList(t, ns, "list", "ruleset")
	t.Log(out)
	// "invalid" is nft's word for what it cannot decode, and the state
	// the unserved rules test.
	rendered := strings.NewReplacer("ct state invalid,new", "", "ct state invalid", "").Replace(out)
	if strings.Contains(rendered, "unknown") || strings.Contains(rendered, "invalid") {
		t.Fatal("nft could not render")
	}
	res, err = p.Full(map[model.ServiceKey]*model.Service{svc.Key: svc, empty.Key: empty})
	if err != nil || res.Counts.Changes() != 0 || len(res.Drift) != 0 {
		t.Fatalf("second full sync: %+v %v", res, err)
	}
}

// webService is default/web, ClusterIP 198.19.0.10 port 80, with one
// endpoint on port 8080.
func webService(endpoint string) *model.Service {
	return &model.Service{Key: model.NewServiceKey("default", "web"), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.10")},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{
			model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr(endpoint)),
		}}}}
}

// TestRefusedBatchNamesTheMessage makes the kernel refuse a batch (a chain
// nftgate deletes is still the target of a hand-added rule) and checks that
// the error names the refused message, and that nothing of the batch was
// applied.
func TestRefusedBatchNamesTheMessage(t *testing.T) {
	ns, p := testProgrammer(t)
	svc := webService("198.18.2.10")
	if _, err := p.Full(map[model.ServiceKey]*model.Service{svc.Key: svc}); err != nil {
		t.Fatal(err)
	}
	// The chain its ClusterIP's element goes to, which goes with it.
	r := ruleset.RenderService(&p.cfg, svc)
	table, chain := p.cfg.TableOf(svc.Key), r.Of(ruleset.IPv4).Elements[0].Verdict.Chain
	nftList(t, ns, "add", "chain", "ip", table, "hand-made")
	nftList(t, ns, "add", "rule", "ip", table, "hand-made", "jump", chain)

	_, err := p.Partial(map[model.ServiceKey]*model.Service{svc.Key: nil})
	var be *BatchError
	if !errors.As(err, &be) {
		t.Fatalf("deleting a chain that a rule jumps to: %v, want a BatchError", err)
	}
	want := fmt.Sprintf("delete chain ip %s %s: ", table, chain)
	if len(be.Failures) != 1 || !strings.HasPrefix(be.Failures[0], want) {
		t.Fatalf("failures %q, want one starting with %q", be.Failures, want)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "goto "+chain) {
		t.Fatalf("the refused batch changed the map:\n%s", out)
	}
}

// TestFullSyncReadsBackOnlyAfterOthersCommit: a full sync reads the tables
// back only when a transaction other than nftgate's was committed since
// its last; a hand edit is then found and repaired.
func TestFullSyncReadsBackOnlyAfterOthersCommit(t *testing.T) {
	ns, p := testProgrammer(t)
	svc := webService("198.18.2.10")
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	if res, err := p.Full(services); err != nil || !res.ReadBack {
		t.Fatalf("first full sync: %+v, %v; want it to read the kernel", res, err)
	}
	if res, err := p.Full(services); err != nil || res.ReadBack || res.Counts.Changes() != 0 {
		t.Fatalf("full sync with nothing committed since: %+v, %v; want no read-back and no change", res, err)
	}
	moved := webService("198.18.2.11")
	services[svc.Key] = moved
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{svc.Key: moved}); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Full(services); err != nil || res.ReadBack {
		t.Fatalf("full sync after nftgate's own partial sync: %+v, %v; want no read-back", res, err)
	}

	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "flush", "map", "ip", table, ruleset.MapServiceIPs) // someone else's transaction
	res, err := p.Full(services)
	if err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after a hand edit: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the hand edit was not repaired:\n%s", out)
	}
	if res, err := p.Full(services); err != nil || res.ReadBack {
		t.Fatalf("full sync after the repair: %+v, %v; want no read-back", res, err)
	}
}
