package nft

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// TestProgrammerChoosesShards: with Options.ChooseShards the first full
// sync lays the tables out for the count chosen from the number of
// Services and the count of the tables in place (cfg.Shards is ignored);
// a restart that keeps the count replaces no table, and one that chooses
// another moves every Service in its batch and drops the shards left over;
// later full syncs only tell what the chooser would choose then.
func TestProgrammerChoosesShards(t *testing.T) {
	ns, fd := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Shards: 3}
	services := map[model.ServiceKey]*model.Service{}
	for i := range 12 {
		svc := webService(fmt.Sprintf("198.18.2.%d", 10+i))
		svc.Key = model.NewServiceKey("default", fmt.Sprintf("web-%d", i))
		svc.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 0, byte(10 + i)})}
		services[svc.Key] = svc
	}
	shardTables := func() []string {
		t.Helper()
		var out []string
		for _, m := range regexp.MustCompile(`table ip (nftgate-services-\d+)`).FindAllStringSubmatch(nftList(t, ns, "list", "tables"), -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return out
	}
	want := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("nftgate-services-%02d", i))
		}
		return out
	}
	// start runs a gateway's first full sync with chooser, and returns
	// what it was asked and chose.
	start := func(chooser func(services, inPlace int) int) (asked [2]int, chosen int, p *Programmer) {
		t.Helper()
		p, err := NewProgrammer(cfg, Options{NetNSFD: fd, ChooseShards: func(services, inPlace int) int {
			asked = [2]int{services, inPlace}
			return chooser(services, inPlace)
		}})
		if err != nil {
			t.Fatalf("NewProgrammer: %v", err)
		}
		t.Cleanup(func() { p.Close() })
		res, err := p.Full(services)
		if err != nil {
			t.Fatal(err)
		}
		if c := p.Config(); c.Shards != res.Shards {
			t.Errorf("Config().Shards %d, Result.Shards %d", c.Shards, res.Shards)
		}
		return asked, res.Shards, p
	}
	servedIn := func(p *Programmer) {
		t.Helper()
		out := nftList(t, ns, "list", "ruleset")
		for k, svc := range services {
			table := p.Config().TableOf(k)
			block := out[strings.Index(out, "table ip "+table+" {"):]
			block = block[:strings.Index(block, "\n}")]
			// Its ClusterIP's element, and its endpoint for it.
			ip := svc.ClusterIPs[0].String()
			ep := svc.Ports[0].Endpoints[0].AddrPort()
			if !strings.Contains(block, ip+" . tcp . 80 : goto ") || !strings.Contains(block, fmt.Sprintf("%s . tcp . 80 : %s . %d", ip, ep.Addr(), ep.Port())) {
				t.Errorf("%s is not in its shard %s:\n%s", k, table, block)
			}
		}
	}

	asked, chosen, p := start(func(n, inPlace int) int { return n / 3 })
	if asked != [2]int{12, 0} || chosen != 4 {
		t.Fatalf("cold start: asked %v, chose %d; want [12 0], 4", asked, chosen)
	}
	if got := shardTables(); !slices.Equal(got, want(4)) {
		t.Fatalf("shard tables %v, want %v", got, want(4))
	}
	servedIn(p)
	before := nftList(t, ns, "list", "ruleset")

	asked, chosen, p = start(func(n, inPlace int) int { return inPlace })
	if asked != [2]int{12, 4} || chosen != 4 {
		t.Fatalf("restart keeping the layout: asked %v, chose %d; want [12 4], 4", asked, chosen)
	}
	if after := nftList(t, ns, "list", "ruleset"); after != before {
		t.Errorf("restart with the same layout changed the ruleset:\n%s\nwas\n%s", after, before)
	}

	for _, n := range []int{7, 2} {
		asked, chosen, p = start(func(int, int) int { return n })
		if chosen != n {
			t.Fatalf("chose %d, want %d", chosen, n)
		}
		if got := shardTables(); !slices.Equal(got, want(n)) {
			t.Fatalf("shard tables after moving to %d: %v, want %v", n, got, want(n))
		}
		servedIn(p)
	}

	// The full syncs after the first ask again and tell what a restart
	// would choose; the layout stays.
	next := 2
	_, _, p = start(func(int, int) int { return next })
	if res, err := p.Full(services); err != nil || res.ShardsWanted != 0 {
		t.Fatalf("reconcile with the count the chooser wants: ShardsWanted %d, %v; want 0", res.ShardsWanted, err)
	}
	next = 8
	res, err := p.Full(services)
	if err != nil || res.Shards != 2 || res.ShardsWanted != 8 {
		t.Fatalf("reconcile after the chooser changed its mind: Shards %d, ShardsWanted %d, %v; want 2, 8", res.Shards, res.ShardsWanted, err)
	}
	if got := shardTables(); !slices.Equal(got, want(2)) {
		t.Fatalf("shard tables after the reconcile: %v, want %v", got, want(2))
	}
	servedIn(p)
}
