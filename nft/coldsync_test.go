package nft

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// TestColdSyncCommitsTableByTable: the first full sync onto no tables
// commits each table in a batch of its own (the kernel's generation moves
// once per table), and programs every Service; a restart onto tables in
// place replaces them in one batch.
func TestColdSyncCommitsTableByTable(t *testing.T) {
	ns, fd := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Shards: 4}
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var svcs []*model.Service
	for i := range 40 {
		svcs = append(svcs, isolationService(fmt.Sprintf("s%d", i), 10+i, fmt.Sprintf("198.18.2.%d", 10+i)))
	}
	services := serviceMap(svcs...)
	shards := map[string]bool{}
	for k := range services {
		shards[p.cfg.TableOf(k)] = true
	}
	if len(shards) < 2 {
		t.Fatalf("the Services are in %d shard tables; the test wants several", len(shards))
	}
	before, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Full(services)
	if err != nil {
		t.Fatal(err)
	}
	after, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	// At least the IPv4 main table and every shard holding a Service.
	if commits := after - before; commits < uint32(1+len(shards)) {
		t.Errorf("the cold sync was %d transactions; want one per table, at least %d", commits, 1+len(shards))
	}
	want := map[string]string{}
	for i := range svcs {
		want[fmt.Sprintf("198.19.0.%d", 10+i)] = fmt.Sprintf("198.18.2.%d", 10+i)
	}
	checkIsolated(t, ns, want)
	if res.Messages == 0 || res.Kernel == 0 {
		t.Errorf("result %+v: want the messages and the kernel's time of every batch", res)
	}

	// A restart: the tables are in place, and are replaced atomically.
	q, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	moved := isolationService("s0", 10, "198.18.2.99")
	services[moved.Key] = moved
	if before, err = q.batch.generation(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Full(services); err != nil {
		t.Fatal(err)
	}
	if after, err = q.batch.generation(); err != nil {
		t.Fatal(err)
	}
	if after != before+1 {
		t.Errorf("the full sync after a restart was %d transactions, want 1", after-before)
	}
	if out := nftList(t, ns, "list", "table", "ip", q.cfg.TableOf(moved.Key)); !strings.Contains(out, "198.18.2.99") {
		t.Errorf("the restart's sync did not program the change:\n%s", out)
	}
}
