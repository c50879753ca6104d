package nft

// Synthetic clusters for scale tests and benchmarks: a realistic mix of
// Service shapes at any size, what the kernel must hold for them (computed
// from the model, not from the renderer, so that the check can disagree with
// the renderer), and a check of a namespace's tables against it.

import (
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// scaleConfig is the ruleset configuration of every scale test: a gateway
// node that no synthetic endpoint lives on.
func scaleConfig() ruleset.Config {
	return ruleset.Config{
		Table:             "nftgate",
		Node:              model.Node{Name: "gw", Zone: "zone-a"},
		ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")},
		MasqueradeBit:     ruleset.DefaultMasqueradeBit,
		HashSeed:          7,
		EndpointSelection: *benchSelection,
		Counters:          *benchCounters,
		TrafficElements:   benchTrafficElements,
		Shards:            *benchShards,
	}
}

// benchCounters turns the counters on in the synthetic clusters' ruleset,
// to measure what they cost:
//
//	go test -run '^$' -bench 'Kernel(ColdFull|PartialEndpointChange)/services=10000$' ./nft -args -bench-counters
//
// benchTrafficElements bounds the traffic sets as nftgate's default does
// (counters_traffic_elements); they are on with -bench-counters.
const benchTrafficElements = 65536

var benchCounters = flag.Bool("bench-counters", false, "count new connections per service map element (Config.Counters)")

// benchShards is the synthetic clusters' number of service shard tables
// (0: ruleset.DefaultShards), to compare what a change costs the kernel:
//
//	go test -run '^$' -bench 'KernelPartialEndpointChange' ./nft -args -bench-shards 64
var benchShards = flag.Int("bench-shards", 0, "service shard tables of the benchmarks' clusters (0: the default)")

// benchSelection is the synthetic clusters' endpoint selection, so that
// the costs of both can be compared in one sitting:
//
//	go test -run '^$' -bench 'Kernel(ColdFull|PartialEndpointChange)/services=10000$' ./nft -args -bench-selection maglev
var benchSelection = flag.String("bench-selection", model.SelectionHash, "endpoint selection of the benchmarks' clusters: hash or maglev")

// Address plan of the synthetic cluster. Nothing is ever sent to these
// addresses: they only fill map keys and DNAT targets inside test namespaces.
var (
	scaleClusterIPBase = netip.MustParseAddr("10.96.0.0")  // /12: a million ClusterIPs
	scaleLBIPBase      = netip.MustParseAddr("198.18.0.0") // /15: LoadBalancer ingress
	scaleEndpointBase  = netip.MustParseAddr("10.128.0.0") // pods
	scaleReplaceBase   = netip.MustParseAddr("10.200.0.0") // endpoints that replace others
	scaleSourceRange   = netip.MustParsePrefix("203.0.113.0/24")
	scaleFirstNodePort = uint16(30000)
	scaleLastNodePort  = uint16(32767) // the API server's default range
)

func addrPlus(base netip.Addr, n uint32) netip.Addr {
	b := base.As4()
	v := binary.BigEndian.Uint32(b[:]) + n
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// scaleCluster is a synthetic cluster and what it must program.
type scaleCluster struct {
	Services map[model.ServiceKey]*model.Service
	Keys     []model.ServiceKey // in creation order, for picking Services to change
	Want     scaleExpect
}

// scaleExpect counts what the IPv4 table must hold for a cluster in which
// every Service port has ready endpoints and none lives on the gateway.
type scaleExpect struct {
	ServiceIPs   int // elements of service-ips
	NodePorts    int // elements of service-nodeports
	FirewallIPs  int // elements of firewall-ips
	Chains       int // chains, static ones included, shared ones not
	AffinitySets int
	Picks        int // destinations in the endpoint maps
}

// newScaleCluster builds n Services with eps endpoints per port. The mix,
// by Service index modulo 20:
//
//	0-13  ClusterIP, one TCP port (70%)
//	14-15 ClusterIP, DNS-like UDP 53 + TCP 53 (10%)
//	16    ClusterIP, TCP 80 + 443 (5%)
//	17    NodePort, TCP 80 (5%)
//	18    LoadBalancer, TCP 443, externalTrafficPolicy Local (5%)
//	19    LoadBalancer, TCP 80 + UDP 8125, loadBalancerSourceRanges (5%)
//
// and one Service in ten (index modulo 10 == 3) has ClientIP affinity.
// NodePorts come from the default 30000-32767 range; once it is used up,
// later Services get none (LoadBalancers then behave as with
// allocateLoadBalancerNodePorts false, NodePort ones as ClusterIP).
func newScaleCluster(n, eps int) *scaleCluster {
	c := &scaleCluster{Services: make(map[model.ServiceKey]*model.Service, n), Keys: make([]model.ServiceKey, 0, n)}
	nextNodePort := scaleFirstNodePort
	nodePort := func() uint16 {
		if nextNodePort > scaleLastNodePort {
			return 0
		}
		nextNodePort++
		return nextNodePort - 1
	}
	lbIndex := uint32(0)
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		key := model.NewServiceKey(fmt.Sprintf("ns-%d", i/50), fmt.Sprintf("svc-%d", i))
		svc := &model.Service{
			Key:        key,
			Type:       model.TypeClusterIP,
			Created:    model.InstantOf(created.Add(time.Duration(i) * time.Second)),
			ClusterIPs: []netip.Addr{addrPlus(scaleClusterIPBase, uint32(i)+1)},
		}
		epBase := uint32(i * eps)
		endpoints := func(port uint16) []model.Endpoint {
			out := make([]model.Endpoint, eps)
			for j := range out {
				out[j] = model.Endpoint{Port: port,
					Place: model.On(fmt.Sprintf("node-%d", (i+j)%100)), Ready: true, Serving: true}.WithAddr(addrPlus(scaleEndpointBase, epBase+uint32(j)))
			}
			return out
		}
		port := func(name string, proto model.Protocol, p, target uint16, np uint16) model.ServicePort {
			return model.ServicePort{Name: name, Protocol: proto, Port: p, NodePort: np, Endpoints: endpoints(target)}
		}
		lbIP := func() netip.Addr {
			lbIndex++
			return addrPlus(scaleLBIPBase, lbIndex)
		}
		switch kind := i % 20; {
		case kind <= 13:
			svc.Ports = []model.ServicePort{port("http", model.TCP, 80, 8080, 0)}
		case kind <= 15:
			svc.Ports = []model.ServicePort{port("dns", model.UDP, 53, 53, 0), port("dns-tcp", model.TCP, 53, 53, 0)}
		case kind == 16:
			svc.Ports = []model.ServicePort{port("http", model.TCP, 80, 8080, 0), port("https", model.TCP, 443, 8443, 0)}
		case kind == 17:
			svc.Type = model.TypeNodePort
			svc.Ports = []model.ServicePort{port("http", model.TCP, 80, 8080, nodePort())}
		case kind == 18:
			svc.Type = model.TypeLoadBalancer
			svc.ExternalLocal = true
			svc.EditRare().LoadBalancerIPs = []netip.Addr{lbIP()}
			svc.Ports = []model.ServicePort{port("https", model.TCP, 443, 8443, nodePort())}
		default:
			svc.Type = model.TypeLoadBalancer
			svc.EditRare().LoadBalancerIPs = []netip.Addr{lbIP()}
			svc.EditRare().SourceRanges = []netip.Prefix{scaleSourceRange}
			svc.Ports = []model.ServicePort{port("http", model.TCP, 80, 8080, nodePort()),
				port("statsd", model.UDP, 8125, 8125, nodePort())}
		}
		if i%10 == 3 {
			svc.EditRare().AffinityTimeout = 3 * time.Hour
		}
		c.put(svc, eps)
	}
	c.finish()
	return c
}

// newPlainCluster builds n ClusterIP Services of one TCP port each, all
// sending to the same eps ready endpoints: the shape of the manifests the
// cold start of the nftgate binary is measured with.
func newPlainCluster(n, eps int) *scaleCluster {
	c := &scaleCluster{Services: make(map[model.ServiceKey]*model.Service, n), Keys: make([]model.ServiceKey, 0, n)}
	endpoints := make([]model.Endpoint, eps)
	for j := range endpoints {
		endpoints[j] = model.Endpoint{Port: 9000,
			Place: model.On(fmt.Sprintf("node-%d", j)), Ready: true, Serving: true}.WithAddr(addrPlus(scaleEndpointBase, uint32(j)))
	}
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		key := model.NewServiceKey("bench", fmt.Sprintf("svc-%06d", i))
		svc := &model.Service{
			Key:        key,
			Type:       model.TypeClusterIP,
			Created:    model.InstantOf(created.Add(time.Duration(i) * time.Second)),
			ClusterIPs: []netip.Addr{addrPlus(scaleClusterIPBase, uint32(i)+2)},
			Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80,
				Endpoints: append([]model.Endpoint(nil), endpoints...)}},
		}
		c.put(svc, eps)
	}
	c.finish()
	return c
}

// put adds a Service with eps endpoints per port.
func (c *scaleCluster) put(svc *model.Service, eps int) {
	c.Services[svc.Key] = svc
	c.Keys = append(c.Keys, svc.Key)
	c.Want.add(svc, eps)
}

// finish counts the chains every ruleset has besides its Services'.
func (c *scaleCluster) finish() {
	cfg := scaleConfig()
	c.Want.Chains += staticChains(&cfg, ruleset.IPv4)
}

func (w *scaleExpect) add(svc *model.Service, eps int) {
	// Ports of policy Cluster choosing by hash pick their endpoints from
	// the shard's endpoint maps, through chains the shard's Services share.
	mapped := svc.AffinityTimeout() == 0 && !svc.Maglev(*benchSelection) && !svc.InternalLocal && !svc.ExternalLocal &&
		eps > 0 && eps <= ruleset.MaxMapEndpoints
	for _, p := range svc.Ports {
		addrs := len(svc.ClusterIPs) + len(svc.ExternalIPs()) + len(svc.LoadBalancerIPs())
		w.ServiceIPs += addrs
		external := p.NodePort != 0 || len(svc.ExternalIPs()) > 0 || len(svc.LoadBalancerIPs()) > 0
		if mapped {
			w.Picks += addrs
			if p.NodePort != 0 {
				w.Picks++
			}
		} else {
			w.Chains++ // the Service port's chain
			if svc.AffinityTimeout() > 0 || svc.Maglev(*benchSelection) {
				w.Chains += eps // endpoints get chains only for session affinity and Maglev slots
			}
			if external {
				w.Chains++
			}
		}
		if p.NodePort != 0 {
			w.NodePorts++
		}
		if len(svc.SourceRanges()) > 0 && len(svc.LoadBalancerIPs()) > 0 {
			w.Chains++
			w.FirewallIPs += len(svc.LoadBalancerIPs())
		}
		if svc.AffinityTimeout() > 0 {
			w.AffinitySets += eps
		}
	}
}

// withReplacedEndpoint returns a copy of svc in which endpoint j of every
// port has moved to a new address: one rollout step of one pod. The copy
// shares nothing mutable with svc, which the Programmer keeps as programmed.
func withReplacedEndpoint(svc *model.Service, j int, newAddr netip.Addr) *model.Service {
	c := *svc
	c.Ports = make([]model.ServicePort, len(svc.Ports))
	for pi, p := range svc.Ports {
		p.Endpoints = append([]model.Endpoint(nil), p.Endpoints...)
		p.Endpoints[j%len(p.Endpoints)].SetAddr(newAddr)
		c.Ports[pi] = p
	}
	return &c
}

func scaleNft(tb testing.TB, ns string, args ...string) string {
	tb.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("nft %s: %v: %.2000s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// staticChains counts family f's skeleton chains in all its tables.
func staticChains(cfg *ruleset.Config, f ruleset.Family) int {
	return len(ruleset.Static(cfg, f).Chains) + cfg.ShardCount()*len(ruleset.StaticShard(cfg, f).Chains)
}

// checkKernel compares the IPv4 tables in namespace ns with what the
// cluster must program, through the nft CLI: an independent reader of the
// kernel.
func checkKernel(tb testing.TB, ns string, cfg ruleset.Config, want scaleExpect) {
	tb.Helper()
	countIn := func(sub string, args ...string) int {
		return strings.Count(scaleNft(tb, ns, args...), sub)
	}
	got := scaleExpect{
		FirewallIPs:  countIn(": goto ", "list", "map", "ip", cfg.Table, ruleset.MapFirewallIPs),
		Chains:       countIn("\tchain ", "list", "chains", "ip") - countIn("\tchain pick-", "list", "chains", "ip"),
		AffinitySets: countIn("\tset aff-", "list", "sets", "ip"),
	}
	for i := range cfg.ShardCount() {
		got.ServiceIPs += countIn(": goto ", "list", "map", "ip", cfg.ShardTable(i), ruleset.MapServiceIPs)
		got.NodePorts += countIn(": goto ", "list", "map", "ip", cfg.ShardTable(i), ruleset.MapServiceNodePorts)
		// Every destination in the endpoint maps has its first endpoint in map 0.
		maps := scaleNft(tb, ns, "list", "maps", "ip")
		_, block, _ := strings.Cut(maps, "table ip "+cfg.ShardTable(i)+" {")
		block, _, _ = strings.Cut(block, "\n}")
		for _, nodePort := range []bool{false, true} {
			if strings.Contains(block, "map "+ruleset.EndpointMap(nodePort, 0)+" {") {
				got.Picks += countIn(" : ", "list", "map", "ip", cfg.ShardTable(i), ruleset.EndpointMap(nodePort, 0)) - 1 // the type line has one
			}
		}
	}
	if got != want {
		tb.Fatalf("kernel tables ip %s* hold %+v, want %+v", cfg.Table, got, want)
	}
	if v6 := countIn("\tchain ", "list", "chains", "ip6"); v6 != staticChains(&cfg, ruleset.IPv6) {
		tb.Fatalf("ip6 tables have %d chains, want only the %d static ones", v6, staticChains(&cfg, ruleset.IPv6))
	}
}

// planCold is the user-space half of a cold Full sync, without a kernel:
// render every Service, diff against empty tables, encode the batch.
func planCold(tb testing.TB, cfg *ruleset.Config, services map[model.ServiceKey]*model.Service) ([]*ruleset.Ops, *batch) {
	ts := ruleset.NewTables(cfg)
	empty := make([]*ruleset.TableState, len(ts.Refs))
	for i := range empty {
		empty[i] = ruleset.NewTableState()
	}
	ds, _, _ := ruleset.PlanFull(cfg, ts, empty, services)
	return ds, encodeOps(tb, ts, ds)
}

// planChange is the user-space half of a Partial sync of one changed
// Service against state: render old and new, diff, encode.
func planChange(tb testing.TB, cfg *ruleset.Config, ts *ruleset.Tables, state []*ruleset.TableState, old, svc *model.Service) ([]*ruleset.Ops, *batch) {
	programmed := map[model.ServiceKey]*model.Service{old.Key: old}
	ds, _, _ := ruleset.PlanPartial(cfg, ts, state, ruleset.NewClaims(), programmed, map[model.ServiceKey]*model.Service{svc.Key: svc})
	return ds, encodeOps(tb, ts, ds)
}

// encodeOps encodes every table's operations as Programmer.commit does.
func encodeOps(tb testing.TB, ts *ruleset.Tables, ds []*ruleset.Ops) *batch {
	w, err := encodeBatch(ts, ds, nil, nil, false)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(w.release)
	return w
}
