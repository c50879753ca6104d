package ruleset

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	"github.com/nftgate/nftgate/model"
)

// Tables per family: one main table and Config.Shards service shards.
//
// The kernel validates a table as a whole in every commit that adds a rule
// or a jump into it: it walks every chain reachable from each of the table's
// base chains. With every Service in one table, moving one endpoint at
// 10,000 Services costs 63 ms of that walk; with the Services spread over
// 16 tables it walks one sixteenth of them: 4.7 ms (both measured by
// BenchmarkKernelPartialEndpointChange). So each Service's chains live in
// one shard table, chosen by a hash of its name, and each shard has its own
// NAT base chains and dispatch maps. (Every commit also walks every chain
// of every table in the network namespace, shards or not, to make the new
// rules visible: about 75 ns a chain, 7.4 ms a commit when each of 100,000
// Services had a chain; only fewer chains, not more shards, make that
// smaller, which is why most ports now have none: endpoints.go.) What is shared by all Services
// and rarely changes stays in the main table: the filter hooks (rejecting
// Services without endpoints, source ranges), masquerading, the hairpin set.
//
// A new connection to no Service passes the NAT chains of every shard: a
// map lookup and a fib lookup each, for the first packet only, 0.2-0.28 µs
// a shard (docs/design/dataplane.md, "What a shard costs a new
// connection"); one to a Service passes those up to its own, which the
// kernel passes last created first. Established connections never see NAT
// chains; the filter chains, which see every packet, are in the main table
// once.

// DefaultShards is the number of service shard tables when Config.Shards is
// zero. 16 keeps a shard near 600 Services at 10,000.
const DefaultShards = 16

// MaxShards bounds Config.Shards.
const MaxShards = 256

// The shard counts AutoShardCount chooses from, and the Services it keeps
// a shard to. The kernel re-validates a whole shard on each commit that
// changes its rules, so a change costs in proportion to its shard; and the
// first packet of every new connection passes each shard's NAT chains, so
// more shards cost every new connection a map lookup each: 64 against 16
// cost a connection to no Service about 14 µs, a sixth of its CPU in the
// bench's lab, and 16 against one about 17,000 instructions, a fifth of a
// routed connection's on the appliance (docs/design/dataplane.md; the
// earlier measurement, README "Shards and size", did not see it under
// load). So a small cluster gets few shards: one up to 1,000 Services.
// More than 64 was not measured, so 64 bounds it.
const (
	AutoShardsMin   = 1
	AutoShardsMax   = 64
	autoShardTarget = 1000
)

// AutoShardCount is the shard count for n Services: the least power of
// two from AutoShardsMin to AutoShardsMax that keeps a shard to about
// autoShardTarget Services (1 up to 1,000, 2 up to 2,000, 4 up to 4,000,
// and so on to 16 up to 16,000, 32 up to 32,000, 64 above).
// inPlace, the shard count of the tables already in the kernel (0 for
// none), is kept while it is within a factor of two of that either way,
// Services counted: a gateway restarted beside a cluster near a boundary
// does not move every Service from one layout to the other at each start.
func AutoShardCount(n, inPlace int) int {
	ideal := func(n int) int {
		k := AutoShardsMin
		for k < AutoShardsMax && k*autoShardTarget < n {
			k *= 2
		}
		return k
	}
	if inPlace >= ideal(n/2) && inPlace <= ideal(2*n) {
		return inPlace
	}
	return ideal(n)
}

// ShardCount is the number of service shard tables per family.
func (c Config) ShardCount() int {
	if c.Shards <= 0 {
		return DefaultShards
	}
	return c.Shards
}

// ShardTable is the name of service shard i's table.
func (c Config) ShardTable(i int) string {
	return fmt.Sprintf("%s-services-%02d", c.Table, i)
}

// shardPrefix starts the name of every shard table.
func (c Config) shardPrefix() string { return c.Table + "-services-" }

// isShardTable tells whether a table name is one of nftgate's shard tables,
// of this shard count or another.
func (c Config) IsShardTable(name string) bool {
	rest, ok := strings.CutPrefix(name, c.shardPrefix())
	if !ok || len(rest) < 2 {
		return false
	}
	for _, r := range rest {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// ShardOf is the shard holding a Service's chains.
func (c Config) ShardOf(k model.ServiceKey) int {
	h := fnv.New32a()
	h.Write([]byte(k.Namespace()))
	h.Write([]byte{'/'})
	h.Write([]byte(k.Name()))
	return int(h.Sum32() % uint32(c.ShardCount()))
}

// TableOf is the name of the table holding a Service's chains.
func (c Config) TableOf(k model.ServiceKey) string { return c.ShardTable(c.ShardOf(k)) }

// mainSet tells whether a named set or map lives in the main table. The
// dispatch maps are in the shards, next to the chains their verdicts jump
// to; a Service's affinity sets are in its shard.
func MainSet(name string) bool {
	switch name {
	case MapNoEndpointServices, MapNoEndpointNodePorts, MapFirewallIPs, SetClusterIPs, SetHairpin, SetServiceAddrs:
		return true
	}
	return false
}

// mainChain tells whether a Service's chain lives in the main table: its
// firewall chain, which the main table's firewall map jumps to.
func MainChain(name string) bool { return strings.HasPrefix(name, "fw-") }

// hasMainChains tells whether a Service may have chains in the main table:
// firewall chains, which only source ranges make (renderPort).
// TestFullPlanShardByShard fails if a rendering puts a main chain where
// this says none can be.
func hasMainChains(svc *model.Service) bool { return len(svc.SourceRanges()) > 0 }

// Table is the content of one kernel table.
type Table struct {
	Name string
	Fragment
}

// Layout lays family f's ruleset for the given Services out in nftgate's
// tables, main table first, as the Programmer programs it: an element that
// several Services claim goes to the oldest one. It is for people (nftgate
// render), the packet tracer and tests.
func Layout(cfg *Config, f Family, services []*model.Service) []Table {
	k := cfg.ShardCount()
	main, shard := Static(cfg, f), StaticShard(cfg, f)
	tables := make([]Table, k+1)
	tables[0] = Table{Name: cfg.Table, Fragment: main}
	for i := range k {
		// Clipped: every shard appends its own Services to the skeleton.
		tables[i+1] = Table{Name: cfg.ShardTable(i), Fragment: Fragment{Chains: slices.Clip(shard.Chains), Sets: slices.Clip(shard.Sets)}}
	}
	svcs := append([]*model.Service(nil), services...)
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Key.Less(svcs[j].Key) })
	var claims elemMap[claimSet]
	var order []famElem
	shared := make([]map[string]bool, k+1)
	picks := map[famElem]map[model.ServiceKey]Pick{} // by dispatch element and Service
	for _, svc := range svcs {
		r := RenderService(cfg, svc)
		fr := r.Of(f)
		si := cfg.ShardOf(svc.Key) + 1
		t := &tables[si]
		if shared[si] == nil {
			shared[si] = map[string]bool{}
		}
		for _, c := range fr.Chains {
			switch {
			case MainChain(c.Name):
				tables[0].Chains = append(tables[0].Chains, c)
			case !Shared(c.Name):
				t.Chains = append(t.Chains, c)
			case !shared[si]["c/"+c.Name]:
				shared[si]["c/"+c.Name] = true
				t.Chains = append(t.Chains, c)
			}
		}
		for _, s := range fr.Sets {
			if !Shared(s.Name) {
				t.Sets = append(t.Sets, s)
			} else if !shared[si]["s/"+s.Name] {
				shared[si]["s/"+s.Name] = true
				t.Sets = append(t.Sets, s)
			}
		}
		for _, p := range fr.Picks {
			fe := famElem{f, dispatchID(&p)}
			if picks[fe] == nil {
				picks[fe] = map[model.ServiceKey]Pick{}
			}
			if _, ok := picks[fe][svc.Key]; !ok {
				picks[fe][svc.Key] = p
			}
		}
		for _, e := range fr.Elements {
			fe := famElem{f, e.ID()}
			if _, ok := claims.get(fe); !ok {
				order = append(order, fe)
			}
			addClaim(&claims, fe, claim{svc: svc.Key, created: svc.Created, verdict: e.Verdict, pick: pickFP(fr, &e)})
		}
	}
	for _, fe := range order {
		w := claims.at(fe).winner()
		i := 0
		if !MainSet(fe.id.Map()) {
			i = cfg.ShardOf(w.svc) + 1
		}
		tables[i].Elements = append(tables[i].Elements, Element{Map: fe.id.Map(), Key: fe.id.Key(), Verdict: w.verdict})
		if p, ok := picks[fe][w.svc]; ok {
			tables[i].Picks = append(tables[i].Picks, p)
		}
	}
	return tables
}

// tableRef names one kernel table.
type TableRef struct {
	Family Family
	Name   string
}

// tableSet is the Programmer's list of tables: per family the main table,
// then the shards. A table's index in it is its slot.
type Tables struct {
	cfg       *Config
	k         int
	Refs      []TableRef
	Skeletons []Fragment // each table's skeleton
	// Refuse names the Services to program with a rule the kernel
	// refuses (Options.RefuseForTest in package nft).
	Refuse func(*model.Service) bool
}

// RefusedChain is the chain the rule that Tables.Refuse adds jumps
// to: no table has it, so the kernel refuses the rule.
const RefusedChain = "refused-for-test"

// render renders a Service as the Programmer programs it.
func (ts *Tables) Render(svc *model.Service) ByFamily {
	r := RenderService(ts.cfg, svc)
	if ts.Refuse == nil || !ts.Refuse(svc) {
		return r
	}
	refused := Rule{Verdict{Kind: Jump, Chain: RefusedChain}}
	for i := range r {
		for j, c := range r[i].Chains {
			if MainChain(c.Name) || Shared(c.Name) {
				continue
			}
			bad := *c
			bad.Rules = append(slices.Clip(c.Rules), refused)
			chains := slices.Clone(r[i].Chains)
			chains[j] = &bad
			r[i].Chains = chains
			return r
		}
	}
	// A Service whose ports choose through the endpoint maps has no chain
	// of its own: it gets one for the rule.
	for i := range r {
		if len(r[i].Picks) > 0 {
			name := "svc-" + string(appendEscaped(nil, svc.Key.Namespace())) + "/" + string(appendEscaped(nil, svc.Key.Name())) + "/refused"
			r[i].Chains = append(slices.Clip(r[i].Chains), &Chain{Name: name, Rules: []Rule{refused}})
			return r
		}
	}
	return r
}

func NewTables(cfg *Config) *Tables {
	ts := &Tables{cfg: cfg, k: cfg.ShardCount()}
	for _, f := range Families {
		main, shard := Static(cfg, f), StaticShard(cfg, f)
		ts.Refs = append(ts.Refs, TableRef{f, cfg.Table})
		ts.Skeletons = append(ts.Skeletons, main)
		for i := range ts.k {
			ts.Refs = append(ts.Refs, TableRef{f, cfg.ShardTable(i)})
			ts.Skeletons = append(ts.Skeletons, shard)
		}
	}
	return ts
}

// main is the slot of family f's main table.
func (ts *Tables) Main(f Family) int { return familyIndex(f) * (ts.k + 1) }

// shard is the slot of the shard holding Service k's chains.
func (ts *Tables) Shard(f Family, k model.ServiceKey) int {
	return ts.Main(f) + 1 + ts.cfg.ShardOf(k)
}

// slots lists family f's slots, main first.
func (ts *Tables) Slots(f Family) []int {
	out := make([]int, ts.k+1)
	for i := range out {
		out[i] = ts.Main(f) + i
	}
	return out
}

// names lists family f's table names, main first.
func (ts *Tables) Names(f Family) []string {
	var out []string
	for _, slot := range ts.Slots(f) {
		out = append(out, ts.Refs[slot].Name)
	}
	return out
}

// elem is the slot an element belongs in when Service winner's claim on
// it wins.
func (ts *Tables) elem(fe famElem, winner model.ServiceKey) int {
	if MainSet(fe.id.Map()) {
		return ts.Main(fe.f)
	}
	return ts.Shard(fe.f, winner)
}

// holders lists the slots that may hold an element: the main table for its
// maps, every shard for theirs.
func (ts *Tables) holders(fe famElem) []int {
	if MainSet(fe.id.Map()) {
		return []int{ts.Main(fe.f)}
	}
	return ts.Slots(fe.f)[1:]
}

// setShape is the key shape of each set whose elements nftgate writes, and
// zero for the sets the packet path fills.
func SetShape(name string) KeyShape {
	switch name {
	case MapServiceNodePorts, MapNoEndpointNodePorts:
		return KeyProtoPort
	case MapServiceIPs, MapNoEndpointServices, MapFirewallIPs:
		return KeyAddrProtoPort
	case SetClusterIPs, SetServiceAddrs:
		return KeyAddr
	case SetHairpin:
		return KeyAddrPair
	case SetTrafficIn, SetTrafficOut:
		return KeyTraffic
	case SetRefusedSYNs, SetMidstreamWaiting, SetMidstreamWaited, SetMidstreamWaitingShort:
		return KeyConn
	case MapMidstreamHomes:
		return KeySlot
	case SetMidstreamPeerDead:
		return KeyProto
	}
	if strings.HasPrefix(name, MaglevClusterKind+"-") || strings.HasPrefix(name, MaglevLocalKind+"-") {
		return KeySlot
	}
	if _, nodePort, ok := endpointMapIndex(name); ok {
		if nodePort {
			return KeyProtoPort
		}
		return KeyAddrProtoPort
	}
	return 0
}
