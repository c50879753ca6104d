package loop

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
	"github.com/nftgate/nftgate/ruleset"
)

// countingProgrammer counts the syncs it passes on, and remembers what the
// last full sync was asked for.
type countingProgrammer struct {
	*nft.Programmer
	mu            sync.Mutex
	full, partial int
	lastFull      map[model.ServiceKey]*model.Service
}

func (c *countingProgrammer) Full(s map[model.ServiceKey]*model.Service) (nft.Result, error) {
	c.mu.Lock()
	c.full++
	c.lastFull = maps.Clone(s)
	c.mu.Unlock()
	return c.Programmer.Full(s)
}

func (c *countingProgrammer) Partial(s map[model.ServiceKey]*model.Service) (nft.Result, error) {
	c.mu.Lock()
	c.partial++
	c.mu.Unlock()
	return c.Programmer.Partial(s)
}

func (c *countingProgrammer) counts() (full, partial int, lastFull map[model.ServiceKey]*model.Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.full, c.partial, c.lastFull
}

// poisoned is the endpoint address whose Service's rules the kernel is
// made to refuse.
const poisoned = "198.18.2.66"

func refusedModel(s *model.Service) bool {
	for _, p := range s.Ports {
		for _, e := range p.Endpoints {
			if e.Addr().String() == poisoned {
				return true
			}
		}
	}
	return false
}

// TestSyncerKeepsRefusedServiceAtLastGoodState runs the Syncer on a real
// Programmer whose rules for one Service the kernel refuses: at a cold
// start, the others are programmed and the first sync completes; the
// refused Service carries the kernel's error, keeps its last good state
// when a later change is refused, is tried again by full syncs and when it
// changes, and never in a loop.
func TestSyncerKeepsRefusedServiceAtLastGoodState(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	ns := fmt.Sprintf("nftgate-synctest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	h, err := netns.GetFromName(ns)
	if err != nil {
		exec.Command("ip", "netns", "del", ns).Run()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del: %v: %s", err, out)
		}
	})
	np, err := nft.NewProgrammer(ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, Shards: 4},
		nft.Options{NetNSFD: int(h), RefuseForTest: refusedModel})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	prog := &countingProgrammer{Programmer: np}
	ruleset := func() string {
		out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list ruleset: %v: %s", err, out)
		}
		return string(out)
	}

	tr := NewTracker()
	web := model.NewServiceKey("default", "web")
	bad := model.NewServiceKey("default", "bad")
	put := func(name, clusterIP, endpoint string) {
		tr.SetService(gatewaytest.Service("default", name, "ClusterIP", []string{clusterIP}, gatewaytest.Port{Name: "http", Port: 80}))
		tr.SetSlice(gatewaytest.Slice("default", name+"-http", name, "http", "", 8080, gatewaytest.Endpoint{Addr: endpoint}))
	}
	put("web", "198.19.0.10", "198.18.2.10")
	put("bad", "198.19.0.12", poisoned)
	tr.SetSynced()
	s := &Syncer{Tracker: tr, Programmer: prog, Log: slog.New(slog.DiscardHandler), MinInterval: time.Millisecond, Reconcile: 2 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// wait waits until the Syncer's view of both Services and the kernel
	// satisfy check.
	wait := func(what string, check func(w, b ServiceState, rules string) error) {
		t.Helper()
		var rules string
		err := lab.EventuallyWithin(10*time.Second, func() error {
			w, _ := s.Service(web)
			b, _ := s.Service(bad)
			rules = ruleset()
			return check(w, b, rules)
		})
		if err != nil {
			t.Fatalf("%s: %v\nruleset:\n%s", what, err, rules)
		}
	}
	endpointOf := func(st ServiceState) string {
		if st.Model == nil || len(st.Model.Ports) == 0 || len(st.Model.Ports[0].Endpoints) == 0 {
			return ""
		}
		return st.Model.Ports[0].Endpoints[0].Addr().String()
	}

	wait("cold start", func(w, b ServiceState, rules string) error {
		switch {
		case !s.FirstSyncDone():
			return fmt.Errorf("first sync not done")
		case !strings.Contains(b.KernelError, "refused") || b.Model != nil:
			return fmt.Errorf("default/bad: kernel error %q, model %v; want refused and not programmed", b.KernelError, b.Model)
		case w.KernelError != "" || endpointOf(w) != "198.18.2.10" || !serves(rules, "198.18.2.10"):
			return fmt.Errorf("default/web not programmed: %+v", w)
		case strings.Contains(rules, "198.19.0.12") || s.KernelRefused() != 1:
			return fmt.Errorf("default/bad in the kernel, or %d refused", s.KernelRefused())
		}
		return nil
	})
	if states := s.Services(); len(states) != 2 {
		t.Errorf("Services() lists %d, want both, the refused one too", len(states))
	}

	put("bad", "198.19.0.12", "198.18.2.12") // accepted now
	wait("bad fixed", func(w, b ServiceState, rules string) error {
		if b.KernelError != "" || endpointOf(b) != "198.18.2.12" || !serves(rules, "198.18.2.12") || s.KernelRefused() != 0 {
			return fmt.Errorf("default/bad not programmed: %+v", b)
		}
		return nil
	})

	put("bad", "198.19.0.12", poisoned) // refused again: the last good state stays
	put("web", "198.19.0.10", "198.18.2.20")
	wait("bad refused again", func(w, b ServiceState, rules string) error {
		switch {
		case b.KernelError == "" || endpointOf(b) != "198.18.2.12" || !serves(rules, "198.18.2.12"):
			return fmt.Errorf("default/bad: %+v; want refused at its last good state", b)
		case endpointOf(w) != "198.18.2.20" || !serves(rules, "198.18.2.20"):
			return fmt.Errorf("default/web's change not programmed: %+v", w)
		}
		return nil
	})

	// A full sync tries it again (and it stays refused).
	full0, partial0, _ := prog.counts()
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		full, _, last := prog.counts()
		if full == full0 {
			return fmt.Errorf("no full sync yet")
		}
		if m := last[bad]; m == nil || !refusedModel(m) {
			return fmt.Errorf("the full sync was not asked for default/bad's refused model: %+v", m)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wait("after the full sync", func(w, b ServiceState, rules string) error {
		if b.KernelError == "" || endpointOf(b) != "198.18.2.12" || !serves(rules, "198.18.2.12") {
			return fmt.Errorf("default/bad: %+v; want refused at its last good state", b)
		}
		return nil
	})
	// No retry in between: partial syncs run only for changes.
	if _, partial, _ := prog.counts(); partial != partial0 {
		t.Errorf("%d partial syncs without a change", partial-partial0)
	}
}

// serves tells whether a ruleset's text DNATs to endpoint addr port 8080:
// in a chain of a Service's own, or as an element of an endpoint map.
func serves(rules, addr string) bool {
	return strings.Contains(rules, "dnat to "+addr+":8080") || strings.Contains(rules, ": "+addr+" . 8080")
}
