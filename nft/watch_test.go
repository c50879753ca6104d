package nft

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Another program's transaction stays known as one after nftgate commits
// its own: the next full sync reads the tables back and repairs them.
func TestFullReadsBackAfterOthersCommitBeforeAPartial(t *testing.T) {
	ns, p := testProgrammer(t)
	svc := webService("198.18.2.10")
	other := webService("198.18.2.20")
	other.Key.Name, other.ClusterIPs[0] = "other", other.ClusterIPs[0].Next()
	services := map[model.ServiceKey]*model.Service{svc.Key: svc, other.Key: other}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	moved := webService("198.18.2.11")
	moved.Key, moved.ClusterIPs = other.Key, other.ClusterIPs
	services[other.Key] = moved
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{other.Key: moved}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Full(services)
	if err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after another program's edit and a partial sync: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the edit was not repaired:\n%s", out)
	}
}

// watchDrifts runs p.Watch until the test ends and returns the channel
// of what it reports.
func watchDrifts(t *testing.T, p *Programmer) <-chan Drift {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Drift, 64)
	done := make(chan error, 1)
	go func() { done <- p.Watch(ctx, func(d Drift) { ch <- d }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	// Watching has begun when a full sync reads the tables back for it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.watch.mu.Lock()
		running := p.watch.running
		p.watch.mu.Unlock()
		if running {
			return ch
		}
		if time.Now().After(deadline) {
			t.Fatal("Watch did not start")
		}
		select {
		case err := <-done:
			t.Fatalf("Watch: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// nextDrift waits for the next report that is not about lost messages.
func nextDrift(t *testing.T, ch <-chan Drift, what string) Drift {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case d := <-ch:
			if !d.Lost {
				return d
			}
		case <-deadline:
			t.Fatalf("no drift reported after %s", what)
		}
	}
}

// noDrift checks nothing but lost messages was reported, after the
// notifications caught up with the kernel's generation.
func noDrift(t *testing.T, p *Programmer, ch <-chan Drift, what string) {
	t.Helper()
	g, err := p.batch.generation()
	if err != nil {
		t.Fatal(err)
	}
	if !p.watch.quietSince(p.watch.snapshot(), g, 5*time.Second) {
		t.Fatalf("notifications did not catch up with generation %d after %s", g, what)
	}
	for {
		select {
		case d := <-ch:
			if !d.Lost {
				t.Fatalf("drift reported after %s: %s", what, d)
			}
		default:
			return
		}
	}
}

func TestWatchReportsOthersChanges(t *testing.T) {
	ns, p := testProgrammer(t)
	ch := watchDrifts(t, p)
	svc := webService("198.18.2.10")
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	if res, err := p.Full(services); err != nil || !res.ReadBack {
		t.Fatalf("first full sync: %+v, %v", res, err)
	}
	moved := webService("198.18.2.11")
	services[svc.Key] = moved
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{svc.Key: moved}); err != nil {
		t.Fatal(err)
	}
	noDrift(t, p, ch, "nftgate's own syncs")

	// Another program's table is none of nftgate's business, and a full
	// sync after it need not read nftgate's tables back.
	nftList(t, ns, "add", "table", "ip", "someone-else")
	noDrift(t, p, ch, "another program's table")
	if res, err := p.Full(services); err != nil || res.ReadBack {
		t.Fatalf("full sync after another program changed only its own table: %+v, %v; want no read-back", res, err)
	}

	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	d := nextDrift(t, ch, "deleting an element")
	if want := "deleted elements of set " + ruleset.MapServiceIPs + " of table ip " + table; !strings.Contains(d.String(), want) || !strings.Contains(d.Writer, "nft") {
		t.Fatalf("reported %q; want it to name %q and nft", d, want)
	}
	if res, err := p.Full(services); err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after the report: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the edit was not repaired:\n%s", out)
	}

	nftList(t, ns, "flush", "ruleset")
	d = nextDrift(t, ch, "nft flush ruleset")
	if !strings.Contains(d.String(), "deleted table ip") {
		t.Fatalf("reported %q; want the tables' deletion", d)
	}
	if res, err := p.Full(services); err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after the flush: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the flush was not repaired:\n%s", out)
	}
	noDrift(t, p, ch, "the repair")
}
