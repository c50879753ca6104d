package nft

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// hostTable is a host's own firewall table with a rule.
const hostTable = `table ip filter {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 accept
	}
}
`

func nftLoad(t *testing.T, ns, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
}

// TestForeignTableIsNotTakenOver: with table = "filter" where the host has
// its own table ip filter, nftgate refuses to start, naming the table, and
// the host's table and rule are untouched; a table of nftgate's name
// replaced behind its back by someone else's is not touched either; and
// cleanup leaves such a table, saying so.
func TestForeignTableIsNotTakenOver(t *testing.T) {
	ns, fd := testNetNS(t)
	nftLoad(t, ns, hostTable)
	before := nftList(t, ns, "list", "ruleset")

	_, err := NewProgrammer(ruleset.Config{Table: "filter", Node: model.Node{Name: "gw"}}, Options{NetNSFD: fd})
	var fe *ForeignTableError
	if !errors.As(err, &fe) || fe.Name != "filter" || fe.Family != ruleset.IPv4 || !strings.Contains(err.Error(), "table ip filter") {
		t.Fatalf("NewProgrammer with table filter: %v, want a ForeignTableError naming table ip filter", err)
	}
	err = Cleanup("filter", Options{NetNSFD: fd})
	if err == nil || !strings.Contains(err.Error(), "left in place") || !strings.Contains(err.Error(), "ip filter") {
		t.Fatalf("cleanup of table filter: %v, want it to say the table is left in place", err)
	}
	if after := nftList(t, ns, "list", "ruleset"); after != before {
		t.Fatalf("the host's table changed:\n%s\nwas:\n%s", after, before)
	}

	// nftgate's own tables carry the mark; a table of its name that does
	// not, made after it started, stops the next full sync untouched.
	p, err := NewProgrammer(ruleset.Config{Table: "gw", Node: model.Node{Name: "gw"}, Shards: 2}, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	svc := webService("198.18.2.10")
	if _, err := p.Full(map[model.ServiceKey]*model.Service{svc.Key: svc}); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"gw", "gw-services-00", "gw-services-01"} {
		if out := nftList(t, ns, "list", "table", "ip", table); !strings.Contains(out, `comment "`+TableComment+`"`) {
			t.Fatalf("table ip %s is not marked:\n%s", table, out)
		}
	}
	nftList(t, ns, "delete", "table", "ip", "gw")
	nftLoad(t, ns, strings.ReplaceAll(hostTable, "filter {", "gw {"))
	hostGW := nftList(t, ns, "list", "table", "ip", "gw")
	_, err = p.Full(map[model.ServiceKey]*model.Service{svc.Key: svc})
	if !errors.As(err, &fe) || fe.Name != "gw" {
		t.Fatalf("full sync over someone else's table ip gw: %v, want a ForeignTableError", err)
	}
	if got := nftList(t, ns, "list", "table", "ip", "gw"); got != hostGW {
		t.Fatalf("someone else's table ip gw changed:\n%s\nwas:\n%s", got, hostGW)
	}
	// Cleanup removes nftgate's tables and leaves the other.
	err = Cleanup("gw", Options{NetNSFD: fd})
	if err == nil || !strings.Contains(err.Error(), "ip gw") || strings.Contains(err.Error(), "services") {
		t.Fatalf("cleanup of gw: %v, want it to leave only table ip gw", err)
	}
	out := nftList(t, ns, "list", "tables")
	if strings.Contains(out, "gw-services") || !strings.Contains(out, "table ip gw") || !strings.Contains(out, "table ip filter") {
		t.Fatalf("tables after cleanup:\n%s", out)
	}
}

// TestUnmarkedNftgateTableIsAdopted: tables an older nftgate made, without
// the mark, are nftgate's by their layout: the first full sync replaces
// them by marked ones, and cleanup removes them.
func TestUnmarkedNftgateTableIsAdopted(t *testing.T) {
	ns, fd := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 1}
	svc := webService("198.18.2.10")
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	full := func() {
		t.Helper()
		p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
		if err != nil {
			t.Fatalf("NewProgrammer: %v", err)
		}
		defer p.Close()
		if _, err := p.Full(services); err != nil {
			t.Fatal(err)
		}
	}
	full()
	old := strings.ReplaceAll(nftList(t, ns, "list", "ruleset"), `comment "`+TableComment+`"`, "")
	unmarked := func() {
		t.Helper()
		nftList(t, ns, "flush", "ruleset")
		nftLoad(t, ns, old)
		if strings.Contains(nftList(t, ns, "list", "ruleset"), TableComment) {
			t.Fatal("the older ruleset has the mark")
		}
	}
	unmarked()
	full()
	out := nftList(t, ns, "list", "ruleset")
	if n := strings.Count(out, `comment "`+TableComment+`"`); n != 2*(ruleset.DefaultShards+1) {
		t.Fatalf("%d tables marked after the first sync, want %d:\n%s", n, 2*(ruleset.DefaultShards+1), out)
	}
	if !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("web is not programmed:\n%s", out)
	}
	unmarked()
	if err := Cleanup(cfg.Table, Options{NetNSFD: fd}); err != nil {
		t.Fatal(err)
	}
	if out := nftList(t, ns, "list", "tables"); strings.TrimSpace(out) != "" {
		t.Fatalf("tables after cleanup:\n%s", out)
	}
}
