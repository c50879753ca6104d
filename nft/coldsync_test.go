package nft

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// TestColdSyncCommitsTableByTable: the first full sync onto no tables
// commits each table (with the main tables' elements of its Services) in a
// batch of its own (the kernel's generation moves once per table), says so (Options.Streamed), and programs every Service;
// a restart onto tables in place replaces them in one batch.
func TestColdSyncCommitsTableByTable(t *testing.T) {
	ns, fd := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Shards: 4}
	streamed := 0
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd, Streamed: func() { streamed++ }})
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
	res, commits := fullCommits(t, p, services)
	// At least the IPv4 main table and every shard holding a Service.
	if commits < uint32(1+len(shards)) {
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
	if streamed != 1 {
		t.Errorf("the cold sync told %d times that it streamed, want once", streamed)
	}

	// A restart: the tables are in place, and are replaced atomically.
	q, err := NewProgrammer(cfg, Options{NetNSFD: fd, Streamed: func() { streamed++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	moved := isolationService("s0", 10, "198.18.2.99")
	services[moved.Key] = moved
	if _, commits := fullCommits(t, q, services); commits != 1 {
		t.Errorf("the full sync after a restart was %d transactions, want 1", commits)
	}
	if streamed != 1 {
		t.Errorf("the sync onto tables in place told it streamed")
	}
	if out := nftList(t, ns, "list", "table", "ip", q.cfg.TableOf(moved.Key)); !strings.Contains(out, "198.18.2.99") {
		t.Errorf("the restart's sync did not program the change:\n%s", out)
	}
}

// TestFlushRepairServesTheBusiestFirst: after nft flush ruleset the repair
// commits shard by shard as a cold start does, and the shard of the
// Service that counted the most new connections comes right after the
// main table, before shards that come before it in the layout; with two
// readings, the shard that counted the most between them comes first,
// before one that counted more once.
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
	var busy, now *model.Service
	last := p.cfg.ShardCount() - 1
	for i := range 40 {
		s := isolationService(fmt.Sprintf("s%d", i), 10+i, fmt.Sprintf("198.18.2.%d", 10+i))
		svcs = append(svcs, s)
		switch sh := p.cfg.ShardOf(s.Key); {
		case busy == nil && sh == last:
			busy = s
		case now == nil && sh == last-1:
			now = s
		}
	}
	if busy == nil || now == nil {
		t.Fatalf("no Service in shard %d or %d; the test wants one in each", last, last-1)
	}
	services := serviceMap(svcs...)
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	connect := func(s *model.Service, n int) {
		t.Helper()
		for range n {
			// No endpoint answers: the DNAT counts the attempt all the same.
			exec.Command("ip", "netns", "exec", ns, "timeout", "0.3", "bash", "-c", "echo > /dev/tcp/"+s.ClusterIPs[0].String()+"/80").Run()
		}
	}
	// read reads the counters, and returns the new connections of each
	// of ss.
	read := func(ss ...*model.Service) []uint64 {
		t.Helper()
		rd, err := p.readCounters(true)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, s := range ss {
			c, _ := rd.Port(PortRef{Service: s.Key, Proto: model.TCP, Port: 80})
			out = append(out, c.New)
		}
		return out
	}
	flushAndRepair := func() map[string]int {
		t.Helper()
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
			t.Fatalf("nft flush ruleset: %v: %s", err, out)
		}
		res, commits := fullCommits(t, p, services)
		if commits < uint32(1+p.cfg.ShardCount()) {
			t.Errorf("the repair was %d transactions; want one per table, at least %d", commits, 1+p.cfg.ShardCount())
		}
		if res.FirstServed <= 0 || res.FirstServed > res.Duration {
			t.Errorf("the repair's first shard in after %v, the repair %v", res.FirstServed, res.Duration)
		}
		want := map[string]string{}
		for i := range svcs {
			want[fmt.Sprintf("198.19.0.%d", 10+i)] = fmt.Sprintf("198.18.2.%d", 10+i)
		}
		checkIsolated(t, ns, want)
		return tablesMade(t, ns, 1+p.cfg.ShardCount())
	}
	// first checks that the main table was made first, then the shard of
	// s, then every other.
	first := func(made map[string]int, s *model.Service) {
		t.Helper()
		first := p.cfg.TableOf(s.Key)
		for name, h := range made {
			switch {
			case name == cfg.Table:
				if h > made[first] {
					t.Errorf("table %s (handle %d) was made after %s (handle %d): the main table comes first", name, h, first, made[first])
				}
			case name != first && h < made[first]:
				t.Errorf("table %s (handle %d) was made before %s (handle %d), the shard of %v", name, h, first, made[first], s.Key)
			}
		}
	}

	connect(busy, 3)
	if n := read(busy)[0]; n == 0 {
		t.Fatalf("%v counted no new connection", busy.Key)
	}
	first(flushAndRepair(), busy)

	// busy counts more than now, but all of it before the reading before
	// the last.
	connect(busy, 4)
	read()
	connect(now, 2)
	if n := read(busy, now); n[0] <= n[1] || n[1] == 0 {
		t.Fatalf("new connections counted: %v %d, %v %d; want more for the first, some for the second", busy.Key, n[0], now.Key, n[1])
	}
	first(flushAndRepair(), now)
}

// tablesMade returns the handles of the ip tables in namespace ns, which
// the kernel numbers in the order they are made, and checks there are n.
func tablesMade(t *testing.T, ns string, n int) map[string]int {
	t.Helper()
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
	if len(made) != n {
		t.Errorf("ip tables after the repair: %v, want %d", made, n)
	}
	return made
}

// fullCommits runs a full sync, and returns its result and how many
// transactions it committed.
func fullCommits(t *testing.T, p *Programmer, services map[model.ServiceKey]*model.Service) (Result, uint32) {
	t.Helper()
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
	return res, after - before
}

// TestRepairStoppedPartwayIsDoneInFull: a repair after nft flush ruleset
// drops the record of the deleted tables when it begins (it would be held
// beside the new one until the end) and records each table as it commits
// it. When the repair stops part-way (a batch lost, and the read-back
// after it too), the record is of the tables it committed, which is what
// the kernel holds, but not of the Services: the next full sync must not
// take the kernel's agreement with it for a sync of every Service, and
// repairs all of them.
func TestRepairStoppedPartwayIsDoneInFull(t *testing.T) {
	ns, fd := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1, Shards: 4}
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var svcs []*model.Service
	want := map[string]string{}
	for i := range 40 {
		svcs = append(svcs, isolationService(fmt.Sprintf("s%d", i), 10+i, fmt.Sprintf("198.18.2.%d", 10+i)))
		want[fmt.Sprintf("198.19.0.%d", 10+i)] = fmt.Sprintf("198.18.2.%d", 10+i)
	}
	services := serviceMap(svcs...)
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	old := p.state
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("nft flush ruleset: %v: %s", err, out)
	}
	// The main table and one shard go in; every batch after them is lost,
	// the fallback's read-back included (its reader's socket is closed).
	sent := 0
	p.failSend = func() error {
		if sent++; sent > 2 {
			p.reader.Close()
			return errors.New("lost on its way")
		}
		return nil
	}
	if _, err := p.Full(services); err == nil {
		t.Fatal("the repair with its batches lost succeeded")
	}
	if !p.partway || p.trusted {
		t.Errorf("after the repair stopped: partway %v, trusted %v; want true, false", p.partway, p.trusted)
	}
	for slot := range p.state {
		if p.state[slot] == old[slot] {
			t.Errorf("table %s: the record of the deleted tables is still held", p.tables.Refs[slot].Name)
		}
	}
	exists := 0
	for _, st := range p.state {
		if st.Exists {
			exists++
		}
	}
	if exists != 2 {
		t.Errorf("the record holds %d tables; want the 2 committed", exists)
	}
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{svcs[0].Key: svcs[0]}); err == nil {
		t.Error("a partial sync after the repair stopped part-way was taken")
	}

	p.failSend = nil
	if p.reader, err = newReader(fd); err != nil {
		t.Fatal(err)
	}
	res, err := p.Full(services)
	if err != nil {
		t.Fatal(err)
	}
	if !res.ReadBack || p.partway {
		t.Errorf("the next full sync: read back %v, partway after it %v; want true, false", res.ReadBack, p.partway)
	}
	checkIsolated(t, ns, want)
}
