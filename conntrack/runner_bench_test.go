package conntrack_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/nftgate/nftgate/conntrack"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// udpCluster is n UDP Services of 4 endpoints each, as a cold sync's
// Event.After holds them.
func udpCluster(n int) map[model.ServiceKey]*model.Service {
	out := make(map[model.ServiceKey]*model.Service, n)
	for i := range n {
		var es []model.Endpoint
		for j := range 4 {
			es = append(es, ep(fmt.Sprintf("10.%d.%d.%d", 1+i>>16, i>>8&0xff, i&0xfc|j)))
		}
		s := svc(es, withNodePort(uint16(30000+i%2000)))
		s.Key = model.NewServiceKey(s.Key.Namespace(), fmt.Sprintf("dns-%d", i))
		s.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}
		out[s.Key] = s
	}
	return out
}

// BenchmarkStaleFlowsCold is what a cold sync of 10,000 UDP Services costs
// the sync loop's goroutine for the conntrack cleanup.
func BenchmarkStaleFlowsCold(b *testing.B) {
	after := udpCluster(10_000)
	cfg := &ruleset.Config{Node: model.Node{Name: nodeName}}
	b.ReportAllocs()
	for b.Loop() {
		conntrack.StaleFlows(cfg, nil, after)
	}
}
