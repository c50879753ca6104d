package ruleset_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/ruleset"
)

// The map of homes has, per family, the least common multiple of the peers'
// pool sizes as its modulus, and a dead peer's pool of n addresses takes
// runs of modulus/n buckets, in the pool's order (jhash scales the hash to
// the modulus, so bucket i of k is bucket i·n/k of n); only the held ones.
func TestMidstreamHomes(t *testing.T) {
	a := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	cfg := &ruleset.Config{DropMidstreamTCP: true, MidstreamWait: time.Second,
		PeerMasquerade: [][]netip.Addr{a("10.0.0.1", "10.0.0.2"), a("10.0.1.1", "10.0.1.2", "10.0.1.3", "fd00::1")}}
	if m := ruleset.MidstreamHomesModulus(cfg, ruleset.IPv4); m != 6 {
		t.Errorf("IPv4 modulus %d, want 6 (pools of 2 and 3)", m)
	}
	if m := ruleset.MidstreamHomesModulus(cfg, ruleset.IPv6); m != 1 {
		t.Errorf("IPv6 modulus %d, want 1", m)
	}
	pickup := &ruleset.Config{PeerMasquerade: cfg.PeerMasquerade}
	if m := ruleset.MidstreamHomesModulus(pickup, ruleset.IPv4); m != 6 {
		t.Errorf("IPv4 modulus %d picking up at once (no wait), want 6", m)
	}
	var got []string
	for _, e := range ruleset.MidstreamHomeElements(cfg, ruleset.IPv4, cfg.PeerMasquerade[1], func(x netip.Addr) bool { return x != netip.MustParseAddr("10.0.1.2") }) {
		got = append(got, fmt.Sprintf("%d:%s", e.Key.Slot, e.To.Addr()))
	}
	if want := "0:10.0.1.1 1:10.0.1.1 4:10.0.1.3 5:10.0.1.3"; strings.Join(got, " ") != want {
		t.Errorf("elements %v, want %s", got, want)
	}
	pool := func(n int, net byte) []netip.Addr {
		out := make([]netip.Addr, n)
		for i := range out {
			out[i] = netip.AddrFrom4([4]byte{10, net, byte(i >> 8), byte(i)})
		}
		return out
	}
	for _, c := range []struct {
		name string
		cfg  ruleset.Config
	}{
		{"the wait without bound", ruleset.Config{DropMidstreamTCP: true, PeerMasquerade: cfg.PeerMasquerade}},
		{"no peer pool", ruleset.Config{DropMidstreamTCP: true, MidstreamWait: time.Second}},
		{"a multiple past the bound", ruleset.Config{DropMidstreamTCP: true, MidstreamWait: time.Second,
			PeerMasquerade: [][]netip.Addr{pool(61, 1), pool(67, 2), pool(2, 3)}}},
	} {
		if m := ruleset.MidstreamHomesModulus(&c.cfg, ruleset.IPv4); m != 0 {
			t.Errorf("%s: modulus %d, want none", c.name, m)
		}
	}
}

// A pool's bucket in the map of homes is the bucket its gateway's
// masquerading chose: the kernel's jhash scales the hash to the modulus
// (reciprocal_scale: h·m/2³²), so for every hash the home's element of
// bucket h·k/2³² is the address of index h·n/2³² of the sorted pool.
func TestMidstreamHomesFollowTheHashScale(t *testing.T) {
	scale := func(h uint32, m uint32) uint32 { return uint32(uint64(h) * uint64(m) >> 32) }
	for _, sizes := range [][]int{{1, 2}, {2, 3}, {3, 4, 6}, {5}, {7, 2}} {
		cfg := &ruleset.Config{DropMidstreamTCP: true, MidstreamWait: time.Second}
		for i, n := range sizes {
			var pool []netip.Addr
			for j := n - 1; j >= 0; j-- { // listed backwards: the pool is sorted
				pool = append(pool, netip.AddrFrom4([4]byte{10, byte(i), 0, byte(j)}))
			}
			cfg.PeerMasquerade = append(cfg.PeerMasquerade, pool)
		}
		k := ruleset.MidstreamHomesModulus(cfg, ruleset.IPv4)
		for i, pool := range cfg.PeerMasquerade {
			els := ruleset.MidstreamHomeElements(cfg, ruleset.IPv4, pool, func(netip.Addr) bool { return true })
			if len(els) != int(k) {
				t.Fatalf("sizes %v: %d elements, want %d", sizes, len(els), k)
			}
			for h := uint32(0); h < 1<<32-1<<20; h += 1<<20 + 12345 {
				got := els[scale(h, k)].To.Addr()
				want := netip.AddrFrom4([4]byte{10, byte(i), 0, byte(scale(h, uint32(sizes[i])))})
				if got != want {
					t.Fatalf("sizes %v, pool %d, hash %#x: bucket %d of %d gives %v, the pool's own choice is %v", sizes, i, h, scale(h, k), k, got, want)
				}
			}
		}
	}
}

// With the map of homes, the forward hook drops a TCP packet that is not a
// SYN, has no entry and goes to any masquerade address of the set (this
// gateway's and its peers', which the configuration keeps apart): the endpoint's answer to a pick-up
// masqueraded to an address that this gateway holds, before the pick-up's
// replica came. Only the packets that are not a SYN reach the addresses.
func TestStrayReplies(t *testing.T) {
	a := netip.MustParseAddr
	cfg := &ruleset.Config{DropMidstreamTCP: true, MidstreamWait: time.Second,
		MasqueradeAddresses: []netip.Addr{a("10.0.2.1"), a("fd00::2")},
		PeerMasquerade:      [][]netip.Addr{{a("10.0.1.2"), a("10.0.1.1")}, {a("10.0.3.1"), a("fd00::3")}}}
	chains := func(cfg *ruleset.Config, f ruleset.Family) map[string][]string {
		out := map[string][]string{}
		fr := ruleset.Static(cfg, f)
		for _, c := range fr.Chains {
			for _, r := range c.Rules {
				out[c.Name] = append(out[c.Name], r.Text(f))
			}
		}
		return out
	}
	for f, want := range map[ruleset.Family]string{
		ruleset.IPv4: "ip daddr 10.0.1.1 drop; ip daddr 10.0.1.2 drop; ip daddr 10.0.2.1 drop; ip daddr 10.0.3.1 drop",
		ruleset.IPv6: "ip6 daddr fd00::2 drop; ip6 daddr fd00::3 drop",
	} {
		cs := chains(cfg, f)
		if got := strings.Join(cs[ruleset.ChainStrayReplies], "; "); got != want {
			t.Errorf("%v: %s holds %q, want %q", f, ruleset.ChainStrayReplies, got, want)
		}
		jump := "tcp flags & (fin | syn | rst | ack) != syn jump " + ruleset.ChainStrayReplies
		if i := slices.Index(cs[ruleset.ChainForwardNew], jump); i < 0 || i > slices.Index(cs[ruleset.ChainForwardNew], "jump service-endpoints-check") {
			t.Errorf("%v: %s is %q, want %q before the checks of a new connection", f, ruleset.ChainForwardNew, cs[ruleset.ChainForwardNew], jump)
		}
	}
	counted := *cfg
	counted.Counters = true
	if got, want := chains(&counted, ruleset.IPv6)[ruleset.ChainStrayReplies], []string{"ip6 daddr fd00::2 counter drop", "ip6 daddr fd00::3 counter drop"}; !slices.Equal(got, want) {
		t.Errorf("with counters: %s holds %q, want %q", ruleset.ChainStrayReplies, got, want)
	}
	for _, c := range []struct {
		name string
		cfg  ruleset.Config
	}{
		{"no peer pool", ruleset.Config{DropMidstreamTCP: true, MidstreamWait: time.Second, MasqueradeAddresses: cfg.MasqueradeAddresses}},
		{"the wait without bound", ruleset.Config{DropMidstreamTCP: true, MasqueradeAddresses: cfg.MasqueradeAddresses, PeerMasquerade: cfg.PeerMasquerade}},
	} {
		if cs := chains(&c.cfg, ruleset.IPv4); cs[ruleset.ChainStrayReplies] != nil || len(cs[ruleset.ChainForwardNew]) != len(chains(&ruleset.Config{}, ruleset.IPv4)[ruleset.ChainForwardNew]) {
			t.Errorf("%s: %s %q and %s %q, want none and no jump", c.name, ruleset.ChainStrayReplies, cs[ruleset.ChainStrayReplies], ruleset.ChainForwardNew, cs[ruleset.ChainForwardNew])
		}
	}
}

// The shorter wait while a peer is dead exists only bounded and shorter
// than the wait: the flag and the second waiting set, the start adding to
// it, and the two rules that test the flag, in place of the one.
func TestMidstreamShortens(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  ruleset.Config
		want bool
	}{
		{"shorter", ruleset.Config{DropMidstreamTCP: true, MidstreamWait: 10 * time.Second, MidstreamWaitPeerDead: 500 * time.Millisecond}, true},
		{"as long", ruleset.Config{DropMidstreamTCP: true, MidstreamWait: 2 * time.Second, MidstreamWaitPeerDead: 2 * time.Second}, false},
		{"unset", ruleset.Config{DropMidstreamTCP: true, MidstreamWait: 2 * time.Second}, false},
		{"the wait without bound", ruleset.Config{DropMidstreamTCP: true, MidstreamWaitPeerDead: time.Second}, false},
	} {
		if got := c.cfg.MidstreamShortens(); got != c.want {
			t.Errorf("%s: MidstreamShortens %v, want %v", c.name, got, c.want)
		}
		fr := ruleset.Static(&c.cfg, ruleset.IPv4)
		var sets []string
		for _, s := range fr.Sets {
			if strings.HasPrefix(s.Name, "midstream-") {
				sets = append(sets, s.Name)
			}
		}
		slices.Sort(sets)
		var rules []string
		for _, ch := range fr.Chains {
			if ch.Name == ruleset.ChainMidstream {
				for _, r := range ch.Rules {
					rules = append(rules, r.Text(ruleset.IPv4))
				}
			}
		}
		flagged := 0
		for _, r := range rules {
			if strings.Contains(r, "@"+ruleset.SetMidstreamPeerDead) {
				flagged++
			}
		}
		wantSets := []string{ruleset.SetMidstreamWaited, ruleset.SetMidstreamWaiting}
		wantFlagged := 0
		if c.want {
			wantSets = []string{ruleset.SetMidstreamPeerDead, ruleset.SetMidstreamWaited, ruleset.SetMidstreamWaiting, ruleset.SetMidstreamWaitingShort}
			wantFlagged = 2
		}
		if c.cfg.MidstreamWait == 0 {
			wantSets = nil
		}
		if !slices.Equal(sets, wantSets) || flagged != wantFlagged {
			t.Errorf("%s: sets %v, %d rules of %s testing the flag (%q); want %v, %d", c.name, sets, flagged, ruleset.ChainMidstream, rules, wantSets, wantFlagged)
		}
	}
}
