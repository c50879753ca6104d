package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// The map of homes and the flag of a dead peer hold what
// SetMidstreamElements wrote: written at once after the first full sync
// (kept before it), kept by full syncs that find no drift, put back after
// another program flushed the ruleset, and emptied by
// SetMidstreamElements(nil); nft lists the rules that read them, and the
// shorter wait's set with its timeout of milliseconds, which a full sync
// reads back as no drift.
func TestMidstreamHomesWrittenAndKept(t *testing.T) {
	ns, fd := testNetNS(t)
	peer := []netip.Addr{netip.MustParseAddr("198.18.3.2"), netip.MustParseAddr("198.18.3.3"), netip.MustParseAddr("fd00:3::2")}
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, DropMidstreamTCP: true,
		MidstreamWait: 10 * time.Second, MidstreamWaitPeerDead: 500 * time.Millisecond, MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1")},
		PeerMasquerade: [][]netip.Addr{peer, {netip.MustParseAddr("198.18.4.2")}}}
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var els []ruleset.Element
	for _, f := range ruleset.Families {
		// Held: the second IPv4 address of the pool, and the IPv6 one.
		els = append(els, ruleset.MidstreamHomeElements(&cfg, f, peer, func(a netip.Addr) bool { return a != peer[0] })...)
	}
	if len(els) != 2 {
		t.Fatalf("elements %v, want two: bucket 1 of 2 for IPv4, bucket 0 of 1 for IPv6", els)
	}
	homes := els
	els = append(els, ruleset.MidstreamPeerDeadElement)
	if err := p.SetMidstreamElements(els); err != nil {
		t.Fatal(err)
	}
	svc := webService("198.18.2.10")
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	flag := "tcp"
	want := func(when string, v4, v6 string) {
		t.Helper()
		for _, c := range []struct{ family, kind, set, want string }{
			{"ip", "map", ruleset.MapMidstreamHomes, v4}, {"ip6", "map", ruleset.MapMidstreamHomes, v6},
			{"ip", "set", ruleset.SetMidstreamPeerDead, flag}, {"ip6", "set", ruleset.SetMidstreamPeerDead, flag},
		} {
			out := nftList(t, ns, "list", c.kind, c.family, "nftgate", c.set)
			got := ""
			if i := strings.Index(out, "elements = {"); i >= 0 {
				got = strings.Join(strings.Fields(strings.TrimSuffix(strings.SplitN(out[i+len("elements = {"):], "}", 2)[0], " ")), " ")
			}
			if got != c.want {
				t.Errorf("%s: %s %s %s holds %q, want %q:\n%s", when, c.family, c.kind, c.set, got, c.want, out)
			}
		}
	}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	want("after the first full sync", "1 : 198.18.3.3", "0 : fd00:3::2")
	rules := nftList(t, ns, "list", "chain", "ip", "nftgate", ruleset.ChainMidstreamPickUp)
	if !strings.Contains(rules, "snat to jhash ip saddr mod 2 seed 0x7 map @midstream-homes") {
		t.Errorf("nft lists the pick-up chain as:\n%s", rules)
	}
	rules = nftList(t, ns, "list", "chain", "ip6", "nftgate", ruleset.ChainMidstream)
	for _, r := range []string{"meta l4proto @midstream-peer-dead ", "meta l4proto != @midstream-peer-dead "} {
		if !strings.Contains(rules, r) {
			t.Errorf("nft lists the wait's chain without %q:\n%s", r, rules)
		}
	}
	if out := nftList(t, ns, "list", "set", "ip", "nftgate", ruleset.SetMidstreamWaitingShort); !strings.Contains(out, "timeout 500ms") {
		t.Errorf("nft lists the shorter wait's set as:\n%s", out)
	}
	res, err := p.Full(services)
	if err != nil || len(res.Drift) != 0 || res.Counts.Changes() != 0 {
		t.Fatalf("second full sync: %+v %v", res, err)
	}
	want("after a full sync without drift", "1 : 198.18.3.3", "0 : fd00:3::2")
	// Another program's change makes the next full sync read the tables
	// back: the elements written at run time are not drift.
	nftList(t, ns, "add", "table", "ip", "another")
	res, err = p.Full(services)
	if err != nil || !res.ReadBack || len(res.Drift) != 0 || res.Counts.Changes() != 0 {
		t.Fatalf("full sync after another program's change: %+v %v", res, err)
	}
	want("after a full sync that read the tables back", "1 : 198.18.3.3", "0 : fd00:3::2")
	nftList(t, ns, "flush", "ruleset")
	if res, err = p.Full(services); err != nil || len(res.Drift) == 0 {
		t.Fatalf("full sync after nft flush ruleset: %+v %v", res, err)
	}
	want("after the repair of nft flush ruleset", "1 : 198.18.3.3", "0 : fd00:3::2")
	if err := p.SetMidstreamElements(homes); err != nil {
		t.Fatal(err)
	}
	flag = ""
	want("the flag taken back (a peer not heard since the start is dead for the map alone)", "1 : 198.18.3.3", "0 : fd00:3::2")
	if err := p.SetMidstreamElements(nil); err != nil {
		t.Fatal(err)
	}
	want("emptied", "", "")
	res, err = p.Full(services)
	if err != nil || len(res.Drift) != 0 || res.Counts.Changes() != 0 {
		t.Fatalf("full sync after emptying: %+v %v", res, err)
	}
}
