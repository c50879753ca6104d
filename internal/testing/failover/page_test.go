package failover_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// ssRow is one row of the page's "Connection-state sync" table.
type ssRow struct {
	Peer     string `json:"peer"`
	Sync     string `json:"sync"`
	Queue    string `json:"queue"`
	Sent     string `json:"sent"`
	Received string `json:"received"`
	Refused  string `json:"refused"`
	Lag      string `json:"lag"`
}

const ssRowsExpr = `Array.from(document.querySelectorAll('#ss-peers-body tr'), tr => {
  const td = Array.from(tr.children, c => c.textContent.trim());
  return {peer: td[0], sync: td[1], queue: td[2], sent: td[3], received: td[4], refused: td[5], lag: td[8]};
})`

// gwRowsExpr reads the "Gateway set" table: name, state, readiness.
const gwRowsExpr = `Array.from(document.querySelectorAll('#gw-peers-body tr'), tr => Array.from(tr.children).slice(0, 3).map(c => c.textContent.trim()).join(' '))`

// TestPageShowsTheSetAndTheSync: two nftgates in active-backup mode carry
// real TCP and UDP flows through the active, whose entries the backup
// holds; each one's status page shows the mode and both gateways ready in
// the "Gateway set" panel, and in the "Connection-state sync" panel the
// other as its peer, in sync, with the entries it sent (the active) or
// received (the backup), none refused, and the sync lag. Screenshots in
// build/test-artifacts/failover.
func TestPageShowsTheSetAndTheSync(t *testing.T) {
	browsertest.Chromium(t) // fail or skip before the lab starts
	topo := newTopology(t, failover.Options{Gateways: 2})
	cfg := nftgateConfig(t, topo, failover.NftgateOptions{DeadAfter: testDeadAfter})
	gs := startNftgate(t, topo, cfg)
	holder := waitHolder(t, gs)
	standby := 1 - holder

	stop, err := failover.ServeEcho(topo.Endpoints, failover.Endpoints, failover.EndpointPort)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	traffic := failover.Traffic{TCP: 20, UDP: 5}
	run, err := failover.Start(topo.Client, cfg.Dst, traffic)
	if err != nil {
		t.Fatal(err)
	}
	defer run.Stop()
	if err := run.Established(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := failover.Replicated([]*lab.Host{topo.Gateways[standby]}, failover.ServiceAddr, traffic.TCP+traffic.UDP, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	const host = "127.0.0.1:9180"
	artifacts := browsertest.ArtifactDir(t, "failover")
	for _, c := range []struct {
		i     int
		count string // the column the flows' entries show in
	}{{holder, "sent"}, {standby, "received"}} {
		name, peer := failover.GatewayNames[c.i], failover.GatewayNames[1-c.i]
		b := browsertest.Start(t, browsertest.Options{Host: host, Netns: topo.Gateways[c.i].Name()})
		b.Navigate("http://" + host + "/")
		b.Poll(name+": the gateway set and sync panels", `!document.getElementById('gateways').hidden && !document.getElementById('statesync').hidden && `+
			`document.querySelectorAll('#gw-peers-body tr').length === 2 && document.querySelectorAll('#ss-peers-body tr').length === 1`)
		if got := b.Text("#gw-mode"); got != "active-backup" {
			t.Errorf("%s: the gateway set panel shows mode %q, want active-backup", name, got)
		}
		gw := browsertest.Eval[[]string](b, gwRowsExpr)
		if want := []string{name + " (this gateway) alive ready", peer + " alive ready"}; !slices.Equal(gw, want) {
			t.Errorf("%s: gateway set rows %q, want %q", name, gw, want)
		}
		rows := browsertest.Eval[[]ssRow](b, ssRowsExpr)
		if len(rows) != 1 {
			t.Fatalf("%s: sync rows %+v, want one (the peer)", name, rows)
		}
		r := rows[0]
		n := map[string]string{"sent": r.Sent, "received": r.Received}[c.count]
		got, err := strconv.Atoi(strings.ReplaceAll(n, ",", ""))
		switch {
		case r.Peer != peer || r.Sync != "in sync":
			t.Errorf("%s: sync row %+v, want peer %s in sync", name, r, peer)
		case err != nil || got < traffic.TCP+traffic.UDP:
			t.Errorf("%s: %s %q entries, want at least the %d flows", name, c.count, n, traffic.TCP+traffic.UDP)
		case r.Refused != "0":
			t.Errorf("%s: refused %q, want 0", name, r.Refused)
		case c.count == "sent" && !strings.HasSuffix(r.Lag, " ms"):
			t.Errorf("%s: lag %q, want the last batch's in ms", name, r.Lag)
		}
		t.Logf("%s: %+v", name, r)
		b.Screenshot(artifacts, fmt.Sprintf("statesync-%s.png", name))
		b.Check()
	}
}
