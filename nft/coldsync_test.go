package nft

import (
	"encoding/json"
	"fmt"
	"os/exec"
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

// TestFlushRepairServesTheBusiestFirst: after nft flush ruleset the repair
// commits table by table as a cold start does, and the shard of the
// Service that counted the most new connections comes right after the
// main table, before shards that come before it in the layout.
func TestFlushRepairServesTheBusiestFirst(t *testing.T) {
	ns, fd := testNetNS(t)
	addLink(t, ns, "198.19.0.1/16", "198.18.0.1/16")
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Shards: 4, Counters: true, TrafficElements: 1024}
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var svcs []*model.Service
	var busy *model.Service
	last := p.cfg.ShardCount() - 1
	for i := range 40 {
		s := isolationService(fmt.Sprintf("s%d", i), 10+i, fmt.Sprintf("198.18.2.%d", 10+i))
		svcs = append(svcs, s)
		if busy == nil && p.cfg.ShardOf(s.Key) == last {
			busy = s
		}
	}
	if busy == nil {
		t.Fatalf("no Service in shard %d; the test wants one in the last shard", last)
	}
	services := serviceMap(svcs...)
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		// No endpoint answers: the DNAT counts the attempt all the same.
		exec.Command("ip", "netns", "exec", ns, "timeout", "0.3", "bash", "-c", "echo > /dev/tcp/"+busy.ClusterIPs[0].String()+"/80").Run()
	}
	rd, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c := rd.Ports[PortRef{Service: busy.Key, Proto: model.TCP, Port: 80}]; c.New.Packets == 0 {
		t.Fatalf("%v counted no new connection: %+v", busy.Key, c)
	}

	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft flush ruleset: %v: %s", err, out)
	}
	before, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	after, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	if commits := after - before; commits < uint32(1+p.cfg.ShardCount()) {
		t.Errorf("the repair was %d transactions; want one per table, at least %d", commits, 1+p.cfg.ShardCount())
	}
	want := map[string]string{}
	for i := range svcs {
		want[fmt.Sprintf("198.19.0.%d", 10+i)] = fmt.Sprintf("198.18.2.%d", 10+i)
	}
	checkIsolated(t, ns, want)

	// The kernel numbers tables in the order they are made.
	var listing struct {
		Nftables []struct {
			Table *struct {
				Family, Name string
				Handle       int
			}
		}
	}
	if err := json.Unmarshal([]byte(nftList(t, ns, "-j", "list", "tables")), &listing); err != nil {
		t.Fatal(err)
	}
	made := map[string]int{}
	for _, o := range listing.Nftables {
		if o.Table != nil && o.Table.Family == "ip" {
			made[o.Table.Name] = o.Table.Handle
		}
	}
	busyTable := p.cfg.TableOf(busy.Key)
	for name, h := range made {
		switch {
		case name == cfg.Table:
			if h > made[busyTable] {
				t.Errorf("table %s (handle %d) was made after %s (handle %d): the main table comes first", name, h, busyTable, made[busyTable])
			}
		case name != busyTable && h < made[busyTable]:
			t.Errorf("table %s (handle %d) was made before %s (handle %d), the shard of the busiest Service", name, h, busyTable, made[busyTable])
		}
	}
	if len(made) != 1+p.cfg.ShardCount() {
		t.Errorf("ip tables after the repair: %v, want the main table and %d shards", made, p.cfg.ShardCount())
	}
}
