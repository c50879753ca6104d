package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// TestTrafficElementsDestroyedWithTheirService: the partial sync that
// deletes a Service destroys its traffic elements in the kernel, both ways,
// and leaves every other Service's; a sync deleting a Service that has no
// elements (or whose elements expired) commits as well.
func TestTrafficElementsDestroyedWithTheirService(t *testing.T) {
	ns, fd := testNetNS(t)
	p, err := NewProgrammer(ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1,
		Counters: true, TrafficElements: 1024}, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	web, other := webService("198.18.2.10"), webService("198.18.2.11")
	other.Key, other.ClusterIPs = model.NewServiceKey(other.Key.Namespace(), "other"), []netip.Addr{netip.MustParseAddr("198.19.0.11")}
	quiet := webService("198.18.2.12")
	quiet.Key, quiet.ClusterIPs = model.NewServiceKey(quiet.Key.Namespace(), "quiet"), []netip.Addr{netip.MustParseAddr("198.19.0.12")}
	all := map[model.ServiceKey]*model.Service{web.Key: web, other.Key: other, quiet.Key: quiet}
	if _, err := p.Full(all); err != nil {
		t.Fatal(err)
	}
	if !p.destroy {
		t.Skip("the kernel does not destroy set elements (Linux 6.3)")
	}
	elems := map[string]string{
		"web":     "198.19.0.10 . tcp . 80 . 198.18.2.10 . 8080",
		"other":   "198.19.0.11 . tcp . 80 . 198.18.2.11 . 8080",
		"web-old": "198.19.0.10 . tcp . 80 . 198.18.2.99 . 8080", // an endpoint web had before
	}
	var script strings.Builder
	for _, set := range []string{ruleset.SetTrafficIn, ruleset.SetTrafficOut} {
		for _, e := range elems {
			script.WriteString("add element ip nftgate " + set + " { " + e + " counter packets 5 bytes 500 }\n")
		}
	}
	nftLoad(t, ns, script.String())

	if _, err := p.Partial(map[model.ServiceKey]*model.Service{web.Key: nil, quiet.Key: nil}); err != nil {
		t.Fatalf("partial sync deleting web and quiet: %v", err)
	}
	for _, set := range []string{ruleset.SetTrafficIn, ruleset.SetTrafficOut} {
		out := nftList(t, ns, "list", "set", "ip", "nftgate", set)
		if strings.Contains(out, "198.18.2.10 . 8080") {
			t.Errorf("%s still holds the deleted Service's element:\n%s", set, out)
		}
		if !strings.Contains(out, "198.19.0.11 . tcp . 80 . 198.18.2.11 . 8080") {
			t.Errorf("%s lost another Service's element:\n%s", set, out)
		}
		// An endpoint the Service no longer had when it was deleted is
		// not known to the sync: its element expires.
		if !strings.Contains(out, "198.18.2.99 . 8080") {
			t.Errorf("%s lost an element the sync did not know:\n%s", set, out)
		}
	}
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{other.Key: nil}); err != nil {
		t.Fatalf("partial sync deleting other: %v", err)
	}
	if out := nftList(t, ns, "list", "set", "ip", "nftgate", ruleset.SetTrafficIn); strings.Contains(out, "198.18.2.11") {
		t.Errorf("the element of other stayed:\n%s", out)
	}
	if _, err := p.Counters(); err != nil {
		t.Fatal(err)
	}
}
