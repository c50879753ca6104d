package nft

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
// NAT base chains and dispatch maps. What is shared by all Services
// and rarely changes stays in the main table: the filter hooks (rejecting
// Services without endpoints, source ranges), masquerading, the hairpin set.
//
// A new connection to no Service passes the NAT chains of every shard: a
// map lookup and a fib lookup each, for the first packet only. Established
// connections never see NAT chains; the filter chains, which see every
// packet, are in the main table once.

// DefaultShards is the number of service shard tables when Config.Shards is
// zero. 16 keeps a shard near 600 Services at 10,000.
const DefaultShards = 16

// MaxShards bounds Config.Shards.
const MaxShards = 256

func (c Config) shards() int {
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
func (c Config) isShardTable(name string) bool {
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
	h.Write([]byte(k.Namespace))
	h.Write([]byte{'/'})
	h.Write([]byte(k.Name))
	return int(h.Sum32() % uint32(c.shards()))
}

// TableOf is the name of the table holding a Service's chains.
func (c Config) TableOf(k model.ServiceKey) string { return c.ShardTable(c.ShardOf(k)) }

// mainSet tells whether a named set or map lives in the main table. The
// dispatch maps are in the shards, next to the chains their verdicts jump
// to; a Service's affinity sets are in its shard.
func mainSet(name string) bool {
	switch name {
	case MapNoEndpointServices, MapNoEndpointNodePorts, MapFirewallIPs, SetClusterIPs, SetHairpin:
		return true
	}
	return false
}

// mainChain tells whether a Service's chain lives in the main table: its
// firewall chain, which the main table's firewall map jumps to.
func mainChain(name string) bool { return strings.HasPrefix(name, "fw-") }

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
	k := cfg.shards()
	main, shard := Static(cfg, f), StaticShard(cfg, f)
	tables := make([]Table, k+1)
	tables[0] = Table{Name: cfg.Table, Fragment: main}
	for i := range k {
		// Clipped: every shard appends its own Services to the skeleton.
		tables[i+1] = Table{Name: cfg.ShardTable(i), Fragment: Fragment{Chains: slices.Clip(shard.Chains), Sets: slices.Clip(shard.Sets)}}
	}
	svcs := append([]*model.Service(nil), services...)
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Key.Less(svcs[j].Key) })
	claims := map[famElem]*claimSet{}
	var order []famElem
	for _, svc := range svcs {
		r := RenderService(cfg, svc)
		fr := r.Of(f)
		t := &tables[cfg.ShardOf(svc.Key)+1]
		for _, c := range fr.Chains {
			if mainChain(c.Name) {
				tables[0].Chains = append(tables[0].Chains, c)
			} else {
				t.Chains = append(t.Chains, c)
			}
		}
		t.Sets = append(t.Sets, fr.Sets...)
		for _, e := range fr.Elements {
			fe := famElem{f, e.ID()}
			if _, ok := claims[fe]; !ok {
				order = append(order, fe)
			}
			addClaim(claims, fe, claim{svc: svc.Key, created: svc.Created, verdict: e.Verdict})
		}
	}
	for _, fe := range order {
		w := claims[fe].winner()
		i := 0
		if !mainSet(fe.id.Map) {
			i = cfg.ShardOf(w.svc) + 1
		}
		tables[i].Elements = append(tables[i].Elements, Element{Map: fe.id.Map, Key: fe.id.Key, Verdict: w.verdict})
	}
	return tables
}

// tableRef names one kernel table.
type tableRef struct {
	f    Family
	name string
}

// tableSet is the Programmer's list of tables: per family the main table,
// then the shards. A table's index in it is its slot.
type tableSet struct {
	cfg    *Config
	k      int
	refs   []tableRef
	static []Fragment // each table's skeleton
	// refuse names the Services to program with a rule the kernel
	// refuses (Options.RefuseForTest).
	refuse func(*model.Service) bool
}

// refusedChain is the chain the rule that Options.RefuseForTest adds jumps
// to: no table has it, so the kernel refuses the rule.
const refusedChain = "refused-for-test"

// render renders a Service as the Programmer programs it.
func (ts *tableSet) render(svc *model.Service) ByFamily {
	r := RenderService(ts.cfg, svc)
	if ts.refuse == nil || !ts.refuse(svc) {
		return r
	}
	for i := range r {
		for j, c := range r[i].Chains {
			if mainChain(c.Name) {
				continue
			}
			bad := *c
			bad.Rules = append(slices.Clip(c.Rules), Rule{Verdict{Kind: Jump, Chain: refusedChain}})
			chains := slices.Clone(r[i].Chains)
			chains[j] = &bad
			r[i].Chains = chains
			return r
		}
	}
	return r
}

func newTableSet(cfg *Config) *tableSet {
	ts := &tableSet{cfg: cfg, k: cfg.shards()}
	for _, f := range Families {
		main, shard := Static(cfg, f), StaticShard(cfg, f)
		ts.refs = append(ts.refs, tableRef{f, cfg.Table})
		ts.static = append(ts.static, main)
		for i := range ts.k {
			ts.refs = append(ts.refs, tableRef{f, cfg.ShardTable(i)})
			ts.static = append(ts.static, shard)
		}
	}
	return ts
}

// main is the slot of family f's main table.
func (ts *tableSet) main(f Family) int { return familyIndex(f) * (ts.k + 1) }

// shard is the slot of the shard holding Service k's chains.
func (ts *tableSet) shard(f Family, k model.ServiceKey) int {
	return ts.main(f) + 1 + ts.cfg.ShardOf(k)
}

// slots lists family f's slots, main first.
func (ts *tableSet) slots(f Family) []int {
	out := make([]int, ts.k+1)
	for i := range out {
		out[i] = ts.main(f) + i
	}
	return out
}

// names lists family f's table names, main first.
func (ts *tableSet) names(f Family) []string {
	var out []string
	for _, slot := range ts.slots(f) {
		out = append(out, ts.refs[slot].name)
	}
	return out
}

// elem is the slot an element belongs in when Service winner's claim on
// it wins.
func (ts *tableSet) elem(fe famElem, winner model.ServiceKey) int {
	if mainSet(fe.id.Map) {
		return ts.main(fe.f)
	}
	return ts.shard(fe.f, winner)
}

// holders lists the slots that may hold an element: the main table for its
// maps, every shard for theirs.
func (ts *tableSet) holders(fe famElem) []int {
	if mainSet(fe.id.Map) {
		return []int{ts.main(fe.f)}
	}
	return ts.slots(fe.f)[1:]
}
