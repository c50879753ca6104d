//go:build customkernel

// TestApplianceStateSync needs two images with the kernel of `make kernel`
// (the stock gokrazy kernel has no conntrack events or marks); `make
// vmtest-statesync` builds them and runs it with the build tag
// customkernel.

package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/failover"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/repo"
	"github.com/nftgate/nftgate/statesync"
)

// The network of testdata/statesync: the client bridge (the client and
// each gateway's eth0, the Service address floating on it) and the cluster
// bridge (each gateway's eth1, the endpoints, the floating masquerade
// address F).
var (
	syncClientAddr = "10.124.1.2/24"
	syncService    = netip.MustParseAddrPort("10.124.1.100:80")
	syncFloating   = netip.MustParseAddr("10.124.2.100")
	syncEndpoints  = []netip.Addr{netip.MustParseAddr("10.124.2.50"), netip.MustParseAddr("10.124.2.51")}
)

const syncEndpointPort = 8080

// syncGateway is one appliance of the pair.
type syncGateway struct {
	name, imageEnv, addr string // addr: eth0's, where its status API is
	macs                 [2]string
}

var syncGateways = []syncGateway{
	{"gw-a", "NFTGATE_VMTEST_STATESYNC_A", "10.124.1.11", [2]string{"52:54:00:24:01:11", "52:54:00:24:02:11"}},
	{"gw-b", "NFTGATE_VMTEST_STATESYNC_B", "10.124.1.12", [2]string{"52:54:00:24:01:12", "52:54:00:24:02:12"}},
}

// TestApplianceStateSync boots gw-a and gw-b, an active/backup pair of
// appliances with state sync, side by side; long-lived TCP connections and
// UDP flows from the client namespace go through gw-a (which holds the
// Service address and F) to the endpoints. gw-b's kernel must hold a
// replica of each (ct mark bit 31, the endpoint and F in its reply tuple)
// and its status API must show gw-a as its peer and the entries received.
// Then gw-a's QEMU is killed with -9, the box pulled out: gw-b takes the
// addresses over and every flow carries on through it.
func TestApplianceStateSync(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and tap devices")
	}
	images := make([]string, len(syncGateways))
	for i, gw := range syncGateways {
		if images[i] = os.Getenv(gw.imageEnv); images[i] == "" {
			t.Skipf("%s does not name %s's image: make vmtest-statesync builds the kernel and both images and runs this test", gw.imageEnv, gw.name)
		}
		if _, err := os.Stat(images[i]); err != nil {
			t.Fatalf("%s's image: %v", gw.name, err)
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatalf("qemu-system-x86_64 not installed (make vmtest-deps installs it): %v", err)
	}
	acc := loadAccess(t, repo.Path(t))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	up := newNetns(t, "sync-up")
	cluster := newNetns(t, "sync-cl")
	if err := up.AddBridge("br-up", syncClientAddr); err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, e := range syncEndpoints {
		eps = append(eps, e.String()+"/24")
	}
	if err := cluster.AddBridge("br-cl", eps...); err != nil {
		t.Fatal(err)
	}
	client, clusterHost := openHost(t, up), openHost(t, cluster)
	stopEcho, err := failover.ServeEcho(clusterHost, syncEndpoints, syncEndpointPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopEcho)

	// Both boot at once: each waits here only until its kernel started
	// init, while the one before goes on booting.
	vms := make([]*VM, len(syncGateways))
	for i, gw := range syncGateways {
		vms[i] = startVM(t, Config{
			Image: images[i],
			NICs: []NIC{
				{Netns: up, Tap: gw.name + "-eth0", MAC: gw.macs[0], Bridge: "br-up"},
				{Netns: cluster, Tap: gw.name + "-eth1", MAC: gw.macs[1], Bridge: "br-cl"},
			},
		}, func() error { return nil })
	}
	a, b := vms[0], vms[1]
	apis := make([]*http.Client, len(vms))
	for i, gw := range syncGateways {
		apis[i], _ = pinStatusCertificate(ctx, t, vms[i], up, gw.addr+":"+statusPort)
	}
	api := func(i int, path string) string { return "https://" + syncGateways[i].addr + ":" + statusPort + path }

	// The set is up: gw-a active, holding the Service address and F;
	// gw-b ready, holding nothing, with gw-a's full resync done.
	floating := []netip.Addr{syncService.Addr(), syncFloating}
	waitAPI(ctx, t, a, apis[0], acc, api(0, "/api/v1/gateways"), func(st gateways.Status) error {
		if p := peer(st.Peers, "gw-b"); p == nil || p.State != "alive" || !p.Ready {
			return fmt.Errorf("peer gw-b %+v, want alive and ready", p)
		}
		if !holdsAll(st.Holds, floating) {
			return fmt.Errorf("holds %v, want %v", st.Holds, floating)
		}
		return nil
	})
	waitAPI(ctx, t, b, apis[1], acc, api(1, "/api/v1/statesync"), func(st statesync.Status) error {
		if p := syncPeer(st.Peers, "gw-a"); !st.Ready || p == nil || !p.Up || !p.ResyncDone {
			return fmt.Errorf("ready %v, peer gw-a %+v; want ready, gw-a up with its resync done", st.Ready, p)
		}
		return nil
	})
	t.Logf("the pair is up %.1f s after gw-a's QEMU started: gw-a holds %v", time.Since(a.Started).Seconds(), floating)

	// Without a replica, gw-b would pick a moved connection up in
	// mid-stream (conntrack's loose pickup) and translate it exactly as
	// gw-a did: the same endpoint (the same hash_seed), F, the client's
	// port kept. The connection would carry on without any state sync.
	// With pickup off in gw-b's kernel only a replica carries it, as in
	// the failover harness; set through the serial console, as nftgate
	// leaves this sysctl alone.
	if out, err := b.Shell(ctx, "echo 0 > /proc/sys/net/netfilter/nf_conntrack_tcp_loose; cat /proc/sys/net/netfilter/nf_conntrack_tcp_loose"); err != nil {
		t.Fatal(err)
	} else if !strings.HasSuffix(out, "0") {
		t.Fatalf("gw-b's nf_conntrack_tcp_loose: %q, want 0", out)
	}

	traffic := failover.Traffic{TCP: 32, UDP: 4, LossTimeout: 20 * time.Second}
	run, err := failover.Start(client, syncService, traffic)
	if err != nil {
		t.Fatal(err)
	}
	defer run.Stop()
	if err := run.Established(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	flows := traffic.TCP + traffic.UDP

	// gw-a translates every flow itself (no replica mark), and gw-b's
	// kernel holds a replica of each.
	if own := flowEntries(ctx, t, a); own.replicas > 0 || own.tcp < traffic.TCP || own.udp < traffic.UDP {
		t.Fatalf("gw-a's conntrack: %v; want every flow, none a replica", own)
	}
	var replicas ctCount
	if err := lab.EventuallyWithin(2*time.Minute, func() error {
		replicas = flowEntries(ctx, t, b)
		if replicas.tcp < traffic.TCP || replicas.udp < traffic.UDP || replicas.replicas != replicas.tcp+replicas.udp {
			return fmt.Errorf("gw-b's conntrack: %v; want a replica of each of %d TCP and %d UDP flows", replicas, traffic.TCP, traffic.UDP)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("gw-b's conntrack holds replicas of the flows through gw-a: %v", replicas)
	received := waitAPI(ctx, t, b, apis[1], acc, api(1, "/api/v1/statesync"), func(st statesync.Status) error {
		p := syncPeer(st.Peers, "gw-a")
		if p == nil || p.Received < uint64(flows) || len(p.Refused) > 0 || st.Replicas < flows {
			return fmt.Errorf("peer gw-a %+v, replicas %d; want at least %d entries received and held, none refused", p, st.Replicas, flows)
		}
		return nil
	})
	p := syncPeer(received.Peers, "gw-a")
	t.Logf("gw-b's /api/v1/statesync: peer gw-a up, %d entries received, none refused, %d replicas held",
		p.Received, received.Replicas)

	// The sender's side: gw-a's view of the sync to gw-b, and its lag
	// (from an event in gw-a's kernel to gw-b's acknowledgement of the
	// write, on gw-a's clock).
	sent := waitAPI(ctx, t, a, apis[0], acc, api(0, "/api/v1/statesync"), func(st statesync.Status) error {
		if p := syncPeer(st.Peers, "gw-b"); p == nil || !p.Up || p.Sent < uint64(flows) {
			return fmt.Errorf("peer gw-b %+v; want up, at least %d entries sent", p, flows)
		}
		return nil
	})
	p = syncPeer(sent.Peers, "gw-b")
	t.Logf("gw-a's /api/v1/statesync: peer gw-b up, %d entries sent, %d lost, last lag %.3f s, %d own flows",
		p.Sent, p.Lost, p.LagSeconds, sent.Flows)
	// The images leave conntrack_events to its default, "auto": on this
	// kernel (ct labels) with the release's TIME_WAIT it runs as "lean".
	if sent.ConntrackEvents != "lean" {
		t.Errorf("gw-a's /api/v1/statesync: conntrack events %q, want the default to run as \"lean\"", sent.ConntrackEvents)
	}

	// The box pulled out: QEMU killed with -9, its taps gone with it.
	killed := time.Now()
	a.Kill()
	run.Failed(killed)
	t.Logf("gw-a's QEMU killed with -9 at %s", killed.Format("15:04:05.000"))
	took := waitAPI(ctx, t, b, apis[1], acc, api(1, "/api/v1/gateways"), func(st gateways.Status) error {
		if p := peer(st.Peers, "gw-a"); p == nil || p.State != "dead" {
			return fmt.Errorf("peer gw-a %+v, want dead", p)
		}
		if !holdsAll(st.Holds, floating) {
			return fmt.Errorf("holds %v, want %v", st.Holds, floating)
		}
		return nil
	})
	t.Logf("gw-b holds %v %.1f s after the kill", took.Holds, time.Since(killed).Seconds())
	run.Settle()
	// gw-b has taken custody of gw-a's entries: they are its own now
	// (no replica mark), so it refreshes them and would resync them to
	// gw-a on its return.
	if c := flowEntries(ctx, t, b); c.tcp < traffic.TCP || c.udp < traffic.UDP || c.replicas > 0 {
		t.Errorf("gw-b's conntrack after the kill: %v; want every flow, none a replica any more", c)
	} else {
		t.Logf("gw-b's conntrack after the kill: %v", c)
	}
	res := run.Stop()
	t.Logf("through the kill of gw-a: %v", res)
	if res.TCP.Flows != traffic.TCP || res.UDP.Flows != traffic.UDP {
		t.Errorf("flows: %d TCP and %d UDP, want %d and %d", res.TCP.Flows, res.UDP.Flows, traffic.TCP, traffic.UDP)
	}
	if res.TCP.Lost > 0 || res.UDP.Lost > 0 {
		t.Errorf("lost through gw-a's kill: TCP %d of %d %v, UDP %d of %d %v; want none",
			res.TCP.Lost, res.TCP.Flows, res.TCP.Reasons, res.UDP.Lost, res.UDP.Flows, res.UDP.Reasons)
	}
	after := waitAPI(ctx, t, b, apis[1], acc, api(1, "/api/v1/statesync"), func(st statesync.Status) error {
		if st.Adopted == 0 {
			return fmt.Errorf("adopted %d: gw-b never took custody of gw-a's entries", st.Adopted)
		}
		return nil
	})
	t.Logf("gw-b's /api/v1/statesync after the kill: adopted %d of gw-a's entries", after.Adopted)
}

// openHost opens ns as a lab host, for the failover harness's traffic.
func openHost(t *testing.T, ns *Netns) *lab.Host {
	t.Helper()
	h, err := lab.OpenHost(ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// waitAPI requests url (nftgate's JSON API, as admin) until its answer
// decodes and cond accepts it, and returns that answer.
func waitAPI[T any](ctx context.Context, t *testing.T, vm *VM, c *http.Client, a access, url string, cond func(T) error) T {
	t.Helper()
	var v T
	if _, err := vm.WaitHTTP(ctx, c, url, "admin", a.nftgatePassword, func(code int, body string) error {
		if code != http.StatusOK {
			return fmt.Errorf("status %d", code)
		}
		var fresh T
		if err := json.Unmarshal([]byte(body), &fresh); err != nil {
			return err
		}
		v = fresh
		return cond(v)
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func peer(ps []gateways.PeerStatus, name string) *gateways.PeerStatus {
	for i := range ps {
		if ps[i].Name == name {
			return &ps[i]
		}
	}
	return nil
}

func syncPeer(ps []statesync.PeerStatus, name string) *statesync.PeerStatus {
	for i := range ps {
		if ps[i].Name == name {
			return &ps[i]
		}
	}
	return nil
}

func holdsAll(holds, want []netip.Addr) bool {
	for _, w := range want {
		if !slices.Contains(holds, w) {
			return false
		}
	}
	return true
}

// ctCount is what a gateway's conntrack table holds of the test's flows:
// entries from the client to the Service address, translated to an
// endpoint and masqueraded to F.
type ctCount struct{ tcp, udp, replicas int }

func (c ctCount) String() string {
	return fmt.Sprintf("%d TCP and %d UDP entries of the test's flows, %d of them replicas", c.tcp, c.udp, c.replicas)
}

// flowEntries reads the VM's conntrack table through the serial shell.
func flowEntries(ctx context.Context, t *testing.T, vm *VM) ctCount {
	t.Helper()
	out, err := vm.Shell(ctx, "grep 'dst="+syncService.Addr().String()+" ' /proc/net/nf_conntrack")
	if err != nil {
		t.Fatal(err)
	}
	var c ctCount
	for _, e := range parseConntrack(out) {
		if e.Orig.Dst != syncService || !slices.Contains(syncEndpoints, e.Reply.Src.Addr()) ||
			e.Reply.Src.Port() != syncEndpointPort || e.Reply.Dst.Addr() != syncFloating {
			continue
		}
		switch e.Proto {
		case "tcp":
			if e.State != "ESTABLISHED" {
				continue
			}
			c.tcp++
		case "udp":
			c.udp++
		default:
			continue
		}
		if e.Mark&replicaMark != 0 {
			c.replicas++
		}
	}
	return c
}
