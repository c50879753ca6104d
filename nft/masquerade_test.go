package nft

import (
	"net/netip"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// The masquerade pool's rules (address-only jhash, snat to an address),
// keep_client_address's marking, the release of the endpoints' TIME_WAIT
// and the answer to refused SYNs (also alone, counting) and the CPU groups'
// port ranges of a pool are written byte for byte as
// google/nftables writes them.
func TestWireMatchesGoogleNftablesMasquerade(t *testing.T) {
	svc := fuzzService("web", &fuzzReader{b: []byte{10, 20, 1, 0, 0, 1, 80, 0, 0, 30, 2, 3, 0, 80, 1, 0, 0}})
	for _, cfg := range []ruleset.Config{
		{MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("198.18.3.2"),
			netip.MustParseAddr("198.18.3.3"), netip.MustParseAddr("fd00:3::1")}},
		{MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1")}, KeepClientAddress: true},
		{ReleaseTimeWait: true, AnswerRefusedSYNs: true},
		{AnswerRefusedSYNs: true, Counters: true},
		{DropMidstreamTCP: true, MidstreamWait: 10 * time.Second, Counters: true},
		{DropMidstreamTCP: true, MidstreamWait: 10 * time.Second, MidstreamWaitPeerDead: 1500 * time.Millisecond, Counters: true},
		{DropMidstreamTCP: true, MidstreamWait: 10 * time.Second, LeanServiceEvents: true, MasqueradePortGroups: 2,
			MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("fd00:3::1")}},
		{DropMidstreamTCP: true, MidstreamWait: 10 * time.Second, MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1")},
			PeerMasquerade: [][]netip.Addr{{netip.MustParseAddr("198.18.3.2"), netip.MustParseAddr("198.18.3.3"), netip.MustParseAddr("fd00:3::2")}}},
		{MasqueradePortGroups: 2, MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("fd00:3::1")},
			PeerMasquerade: [][]netip.Addr{{netip.MustParseAddr("198.18.3.2")}}},
		{MasqueradePortGroups: 4, MasqueradeAddresses: []netip.Addr{netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("198.18.3.2"),
			netip.MustParseAddr("fd00:3::1")}},
	} {
		cfg.Table, cfg.Node, cfg.HashSeed, cfg.Shards = "nftgate", model.Node{Name: "gw"}, 7, 2
		ts := ruleset.NewTables(&cfg)
		state := make([]*ruleset.TableState, len(ts.Refs))
		for i := range state {
			state[i] = ruleset.NewTableState()
		}
		ds, _, _ := ruleset.PlanFull(&cfg, ts, state, map[model.ServiceKey]*model.Service{svc.Key: svc})
		compareBatches(t, "cold", wireMessages(encodeOps(t, ts, ds)), refEncode(t, ts, ds))
	}
}
