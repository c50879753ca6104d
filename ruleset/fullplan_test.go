package ruleset_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/world"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// fullPlanServices are Services of every shape (the golden cases), two
// Services claiming one address with different verdicts, and enough plain
// ones to span several of the planner's blocks.
func fullPlanServices() map[model.ServiceKey]*model.Service {
	services := map[model.ServiceKey]*model.Service{}
	for _, c := range goldenCases() {
		for _, s := range c.svcs {
			services[s.Key] = s
		}
	}
	rival := *services[model.NewServiceKey("ns1", "dual")]
	rival.Key = model.NewServiceKey(rival.Key.Namespace(), "dual-rival")
	rival.Created = model.InstantOf(time.Unix(1, 0))
	rival.Ports = []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{world.Ready("10.180.9.9", 80)}}}
	services[rival.Key] = &rival
	for i := range 9_000 {
		k := model.NewServiceKey(fmt.Sprintf("ns%d", i%7), fmt.Sprintf("svc-%d", i))
		services[k] = &model.Service{Key: k, Type: model.TypeClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{172, 31, byte(i >> 8), byte(i)})},
			Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80,
				Endpoints: []model.Endpoint{world.Ready(fmt.Sprintf("10.181.%d.%d", i>>8, i&255), 8080)}}}}
	}
	return services
}

// plannedTables plans a full sync batch by batch, streamed (each shard
// rendered when planned) or from every Service rendered once (keep),
// perhaps with the book of these Services' claims, and merges the batches
// per table. It also returns the batches and the plan's book.
func plannedTables(cfg *ruleset.Config, ts *ruleset.Tables, observed []*ruleset.TableState, services map[model.ServiceKey]*model.Service, keep bool, book *ruleset.Claims) ([]*ruleset.Ops, []string, [][]ruleset.Batch, *ruleset.Claims) {
	fp := ruleset.NewFullPlan(cfg, ts, observed, services, keep, book)
	all := [][]ruleset.Batch{fp.Main()}
	for i := range cfg.ShardCount() {
		all = append(all, fp.Shard(i))
	}
	ds := ruleset.MergeBatches(len(ts.Refs), slices.Concat(all...))
	return ds, fp.Conflicts(), all, fp.Claims()
}

// A full sync planned a shard at a time, each shard's Services rendered
// only when it is planned, is the plan made from every Service rendered at
// once; onto no tables it puts every chain and element where the layout
// says, and onto tables holding more it removes what is no longer wanted.
func TestFullPlanShardByShard(t *testing.T) {
	cfg := world.Config()
	cfg.NodePortAddresses = []netip.Prefix{world.Prefix("192.168.0.0/24"), world.Prefix("2001:db8:1::/64")}
	cfg.Shards = 5
	ts := ruleset.NewTables(cfg)
	services := fullPlanServices()
	empty := func() []*ruleset.TableState {
		out := make([]*ruleset.TableState, len(ts.Refs))
		for i := range out {
			out[i] = ruleset.NewTableState()
		}
		return out
	}

	streamed, conflicts, batches, book := plannedTables(cfg, ts, empty(), services, false, nil)
	kept, keptConflicts, _, _ := plannedTables(cfg, ts, empty(), services, true, nil)
	if !reflect.DeepEqual(streamed, kept) {
		t.Fatal("onto no tables, the plan made shard by shard differs from the one made from every Service at once")
	}
	if len(conflicts) == 0 || !slices.Equal(conflicts, keptConflicts) {
		t.Fatalf("conflicts: %q streamed, %q kept; want the rival's, alike", conflicts, keptConflicts)
	}
	// The repair: the same Services, their claims known.
	repair, repairConflicts, _, _ := plannedTables(cfg, ts, empty(), services, false, book)
	if !reflect.DeepEqual(repair, kept) {
		t.Fatal("onto no tables, the plan made from the book of the same Services differs from the one made at once")
	}
	if !slices.Equal(repairConflicts, keptConflicts) {
		t.Fatalf("conflicts: %q from the book, %q kept", repairConflicts, keptConflicts)
	}

	// A Service's ClusterIP comes in the batch of its shard, which serves
	// it, unless another Service claims it too.
	owner := map[netip.Addr][]model.ServiceKey{}
	for k, s := range services {
		for _, a := range s.ClusterIPs {
			owner[a] = append(owner[a], k)
		}
	}
	for n, group := range batches {
		for _, b := range group {
			if len(b.Slots) != map[bool]int{true: 1, false: 2}[n == 0] {
				t.Fatalf("batch group %d has %d tables", n, len(b.Slots))
			}
			for _, e := range b.Ops[0].AddElems {
				if e.Map != ruleset.SetClusterIPs {
					continue
				}
				ks := owner[e.Key.Addr]
				switch {
				case n == 0 && len(ks) == 1:
					t.Errorf("the main tables' first batch holds %v, %v's alone", e.Key.Addr, ks[0])
				case n > 0 && (len(ks) != 1 || cfg.ShardOf(ks[0]) != n-1):
					t.Errorf("shard %d's batch holds %v, of %v", n-1, e.Key.Addr, ks)
				}
			}
		}
	}

	// The oracle: the layout, which renders every Service with its own
	// code, holds each table's chains and elements.
	list := make([]*model.Service, 0, len(services))
	for _, s := range services {
		list = append(list, s)
	}
	for _, f := range ruleset.Families {
		layout := ruleset.Layout(cfg, f, list)
		for i, slot := range ts.Slots(f) {
			o := streamed[slot]
			if !o.CreateTable {
				t.Errorf("%s table %s is not created", f, layout[i].Name)
			}
			var want, got []string
			for _, c := range layout[i].Chains {
				want = append(want, c.Name)
			}
			for _, c := range o.AddChains {
				got = append(got, c.Chain.Name)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(want, got) {
				t.Errorf("%s table %s: chains %d, want %d", f, layout[i].Name, len(got), len(want))
			}
			var wantE, gotE []string
			for _, e := range layout[i].Elements {
				wantE = append(wantE, fmt.Sprint(e))
			}
			for _, p := range layout[i].Picks {
				for _, e := range p.AppendElements(nil) {
					wantE = append(wantE, fmt.Sprint(e))
				}
			}
			for _, e := range o.AddElems {
				gotE = append(gotE, fmt.Sprint(e))
			}
			slices.Sort(wantE)
			slices.Sort(gotE)
			if !slices.Equal(wantE, gotE) {
				t.Errorf("%s table %s: elements %d, want %d", f, layout[i].Name, len(gotE), len(wantE))
			}
		}
	}

	// Onto the tables as planned, with half the Services gone and one
	// changed: the same plan either way, and it removes chains.
	full := func() []*ruleset.TableState {
		st := empty()
		for slot, o := range kept {
			st[slot].Exists = true
			st[slot].Apply(o)
		}
		return st
	}
	half := map[model.ServiceKey]*model.Service{}
	n := 0
	for k, s := range services {
		if n++; n%2 == 0 {
			half[k] = s
		}
	}
	moved := *world.Web(world.Ready("10.180.7.7", 8080))
	half[moved.Key] = &moved
	streamed, _, _, _ = plannedTables(cfg, ts, full(), half, false, nil)
	kept, _, _, _ = plannedTables(cfg, ts, full(), half, true, nil)
	if !reflect.DeepEqual(streamed, kept) {
		t.Fatal("onto full tables, the plan made shard by shard differs from the one made at once")
	}
	deleted := 0
	for _, o := range streamed {
		deleted += len(o.DelChains) + len(o.DelPicks)
	}
	if deleted < 4_000 {
		t.Fatalf("onto full tables with half the Services gone: %d chains and endpoint map destinations deleted, want thousands", deleted)
	}
}

// A refused partial plan's undo puts back the counts of the shared chains
// and maps as they were: a Service that changed endpoints, refused, and
// then deleted leaves them to the Service still using them.
func TestUndoKeepsSharedObjectsCounted(t *testing.T) {
	cfg := world.Config()
	cfg.Shards = 1
	ts := ruleset.NewTables(cfg)
	svc := func(name string, ip byte, eps ...string) *model.Service {
		k := model.NewServiceKey("default", name)
		s := &model.Service{Key: k, Type: model.TypeClusterIP, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{172, 30, 0, ip})},
			Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}}}
		for _, e := range eps {
			s.Ports[0].Endpoints = append(s.Ports[0].Endpoints, world.Ready(e, 8080))
		}
		return s
	}
	a, b := svc("a", 1, "10.1.0.1", "10.1.0.2"), svc("b", 2, "10.1.0.3", "10.1.0.4")
	programmed := map[model.ServiceKey]*model.Service{a.Key: a, b.Key: b}
	state := make([]*ruleset.TableState, len(ts.Refs))
	for i := range state {
		state[i] = ruleset.NewTableState()
	}
	ds, _, _, book := plannedTables(cfg, ts, state, programmed, false, nil)
	for i, o := range ds {
		state[i].Apply(o)
	}
	moved := svc("a", 1, "10.1.0.5", "10.1.0.6")
	_, undo, _ := ruleset.PlanPartial(cfg, ts, state, book, programmed, map[model.ServiceKey]*model.Service{a.Key: moved})
	book.Undo(undo) // the kernel refused it
	ds, _, _ = ruleset.PlanPartial(cfg, ts, state, book, programmed, map[model.ServiceKey]*model.Service{a.Key: nil})
	for _, o := range ds {
		for _, c := range o.DelChains {
			if ruleset.Shared(c) {
				t.Errorf("deleting one of two Services deletes the shared chain %s", c)
			}
		}
		for _, s := range o.DelSets {
			if ruleset.Shared(s) {
				t.Errorf("deleting one of two Services deletes the shared map %s", s)
			}
		}
	}
}
