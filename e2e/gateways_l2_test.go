package e2e_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/browsertest"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// gwLab is two gateways and a neighbour on one segment (a bridge), with a
// second link between the gateways for the channel:
//
//	           backend 198.18.2.10 ──(9.2)───────────┐
//	              │ 198.18.2.1                     │ 198.18.9.1
//	gw-a (topo.Gateway) ──10.1── 10.2── gw-b ──────┘
//	   │ 198.18.8.1                 │ 198.18.8.2
//	   └────────── bridge ───────────┴──── neighbour 198.18.8.3
//
// Both masquerade, so each flow returns through the gateway that took it.
type gwLab struct {
	topo      *lab.Topology
	b, nb     *lab.Host
	seg       []string // segment interfaces of gw-a, gw-b, the neighbour
	ab        lab.Veth // gw-a ↔ gw-b
	ga, gb    *gatewaytest.Gateway
	gc        *gatewaytest.Gateway // on the neighbour, with the wrong key
	macs      map[string]string    // MAC of each gateway's segment interface → name
	addrs     []netip.Addr
	configDir string
	// mode of the set; top: configuration before the sections.
	mode, top string
}

// newGWLab is the lab in active-active mode: each address has its own
// owner.
func newGWLab(t *testing.T) *gwLab { return newGWLabMode(t, "active-active", "") }

func newGWLabMode(t *testing.T, mode, top string) *gwLab {
	topo := labtest.Gateway(t)
	e := &gwLab{topo: topo, configDir: t.TempDir(), macs: map[string]string{}, mode: mode, top: top}
	var err error
	if e.b, err = topo.AddHost("gwb"); err != nil {
		t.Fatal(err)
	}
	if e.nb, err = topo.AddHost("neighbour"); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	if _, e.seg, err = topo.Segment("segment", []*lab.Host{topo.Gateway, e.b, e.nb},
		[][]netip.Prefix{{p("198.18.8.1/24"), p("fd42:8::1/64")}, {p("198.18.8.2/24"), p("fd42:8::2/64")}, {p("198.18.8.3/24"), p("fd42:8::3/64")}}); err != nil {
		t.Fatal(err)
	}
	if _, err = topo.Link(e.b, []netip.Prefix{p("198.18.9.1/24"), p("fd42:9::1/64")}, topo.Backend, []netip.Prefix{p("198.18.9.2/24"), p("fd42:9::2/64")}); err != nil {
		t.Fatal(err)
	}
	if e.ab, err = topo.Link(topo.Gateway, []netip.Prefix{p("198.18.10.1/30")}, e.b, []netip.Prefix{p("198.18.10.2/30")}); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
		if err := e.b.Sysctl(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.b.AddRoute(p("198.18.2.0/24"), netip.MustParseAddr("198.18.9.2")); err != nil {
		t.Fatal(err)
	}
	if err := e.b.AddRoute(p("fd42:2::/64"), netip.MustParseAddr("fd42:9::2")); err != nil {
		t.Fatal(err)
	}
	for i, h := range []*lab.Host{topo.Gateway, e.b} {
		l, err := h.Netlink().LinkByName(e.seg[i])
		if err != nil {
			t.Fatal(err)
		}
		e.macs[l.Attrs().HardwareAddr.String()] = []string{"gw-a", "gw-b"}[i]
	}
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))

	// Six IPv4 and two IPv6 external addresses on the segment, one
	// Service each.
	var objs []any
	for i := range 8 {
		a, cluster, ep := fmt.Sprintf("198.18.8.%d", 17+i), fmt.Sprintf("198.19.0.%d", 10+i), "198.18.2.10"
		if i >= 6 {
			a, cluster, ep = fmt.Sprintf("fd42:8::%x", 17+i), fmt.Sprintf("fd42:ff::%d", 10+i), "fd42:2::10"
		}
		e.addrs = append(e.addrs, netip.MustParseAddr(a))
		name := fmt.Sprintf("web%d", i)
		svc := gatewaytest.Service("default", name, "ClusterIP", []string{cluster}, gatewaytest.Port{Name: "http", Port: 80})
		svc.Spec.ExternalIPs = []string{a}
		objs = append(objs, svc, gatewaytest.Slice("default", name+"-1", name, "http", "", 8080, gatewaytest.Endpoint{Addr: ep}))
	}
	key := filepath.Join(e.configDir, "gateways.key")
	if err := os.WriteFile(key, []byte("a key shared by gw-a and gw-b only, 32+ bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// gw-c, on the neighbour, is configured on every side but holds
	// another key (see wrongKeyPeer).
	c := gwPeer{"gw-c", []string{"198.18.8.3:7480"}}
	e.ga = e.gateway(t, topo.Gateway, "gw-a", e.seg[0], key, gwPeer{"gw-b", []string{"198.18.8.2:7480", "198.18.10.2:7480"}}, c)
	e.gb = e.gateway(t, e.b, "gw-b", e.seg[1], key, gwPeer{"gw-a", []string{"198.18.8.1:7480", "198.18.10.1:7480"}}, c)
	other := filepath.Join(e.configDir, "other.key")
	if err := os.WriteFile(other, []byte("another key, not the set's, 32+ bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.gc = e.gateway(t, e.nb, "gw-c", "", other, gwPeer{"gw-a", []string{"198.18.8.1:7480"}}, gwPeer{"gw-b", []string{"198.18.8.2:7480"}})
	e.ga.Write("web.yaml", objs...)
	e.gb.Write("web.yaml", objs...)
	return e
}

// gwPeer is a peer in a gateway's configuration.
type gwPeer struct {
	name  string
	addrs []string
}

// gateway prepares nftgate in h as the set member name; iface "" leaves
// [l2] out.
func (e *gwLab) gateway(t *testing.T, h *lab.Host, name, iface, key string, peers ...gwPeer) *gatewaytest.Gateway {
	cfg := filepath.Join(e.configDir, name+".toml")
	q := func(ss []string) string { b, _ := json.Marshal(ss); return string(b) }
	text := "external_ip_cidrs = [\"198.18.8.16/28\", \"fd42:8::10/124\"]\n" + e.top
	if iface != "" {
		text += fmt.Sprintf("\n[l2]\ninterfaces = [%q]\ngratuitous_interval = \"100ms\"\n", iface)
	}
	text += fmt.Sprintf(`
[gateways]
name = %q
key_file = %q
dead_after = %d
mode = %q
`, name, key, gwDeadAfter, e.mode)
	for _, p := range peers {
		text += fmt.Sprintf("\n[[gateways.peers]]\nname = %q\naddresses = %s\n", p.name, q(p.addrs))
	}
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	topo := *e.topo
	topo.Gateway = h
	return gatewaytest.New(t, &topo, "--config", cfg, "--node-name", name)
}

// status is a gateway's GET /api/v1/gateways.
func gwStatus(g *gatewaytest.Gateway) (gateways.Status, error) {
	var st gateways.Status
	code, body, err := g.Get("/api/v1/gateways")
	if err != nil {
		return st, err
	}
	if code != 200 {
		return st, fmt.Errorf("/api/v1/gateways: %d %s", code, body)
	}
	return st, json.Unmarshal([]byte(body), &st)
}

// holders asks both gateways what they hold: address → gateway names.
func (e *gwLab) holders(gs ...*gatewaytest.Gateway) (map[netip.Addr][]string, error) {
	out := map[netip.Addr][]string{}
	for _, g := range gs {
		st, err := gwStatus(g)
		if err != nil {
			return nil, err
		}
		for _, a := range st.Holds {
			out[a] = append(out[a], st.Name)
		}
	}
	return out, nil
}

// settled: every address held by exactly one of gs, per their APIs.
func (e *gwLab) settled(gs ...*gatewaytest.Gateway) (map[netip.Addr]string, error) {
	h, err := e.holders(gs...)
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]string{}
	for _, a := range e.addrs {
		if len(h[a]) != 1 {
			return nil, fmt.Errorf("%v held by %v", a, h[a])
		}
		out[a] = h[a][0]
	}
	return out, nil
}

// answerers sends one ARP request (IPv4) or neighbour solicitation (IPv6)
// for a from the neighbour and returns the gateways whose answers arrive
// within window, one entry per answer (so two answers from one gateway
// count twice).
func (e *gwLab) answerers(t *testing.T, a netip.Addr, window time.Duration) []string {
	t.Helper()
	var macs []string
	err := e.nb.Do(func() error {
		ifi, err := net.InterfaceByName(e.seg[2])
		if err != nil {
			return err
		}
		if a.Is4() {
			c, err := arp.Dial(ifi)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.Request(a); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(window))
			for {
				p, _, err := c.Read()
				if err != nil {
					return nil // the window ended
				}
				if p.Operation == arp.OperationReply && p.SenderIP == a {
					macs = append(macs, p.SenderHardwareAddr.String())
				}
			}
		}
		c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			return err
		}
		defer c.Close()
		snm, err := ndp.SolicitedNodeMulticast(a)
		if err != nil {
			return err
		}
		ns := &ndp.NeighborSolicitation{TargetAddress: a, Options: []ndp.Option{
			&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}}
		if err := c.WriteTo(ns, nil, snm); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(window))
		for {
			m, _, _, err := c.ReadFrom()
			if err != nil {
				return nil
			}
			na, ok := m.(*ndp.NeighborAdvertisement)
			if !ok || na.TargetAddress != a || !na.Solicited {
				continue
			}
			for _, o := range na.Options {
				if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Target {
					macs = append(macs, l.Addr.String())
				}
			}
		}
	})
	if err != nil {
		t.Fatalf("asking for %v: %v", a, err)
	}
	out := make([]string, len(macs))
	for i, m := range macs {
		out[i] = e.macs[m]
		if out[i] == "" {
			out[i] = m
		}
	}
	return out
}

// gwDeadAfter is the test's dead_after: 500 ms rather than the default
// 300 ms, which declares a peer dead on a machine loaded enough to stall a
// process that long (with 3 the failover measured 218 and 435 ms here).
const gwDeadAfter = 5

// answerWindow is how long answers to one question are collected.
const answerWindow = 300 * time.Millisecond

// oneAnswerer checks that exactly want answers for every address.
func (e *gwLab) oneAnswerer(t *testing.T, want map[netip.Addr]string) {
	t.Helper()
	for _, a := range e.addrs {
		if got := e.answerers(t, a, answerWindow); len(got) != 1 || got[0] != want[a] {
			t.Errorf("%v answered by %v, want %s alone", a, got, want[a])
		}
	}
}

// servedBy dials a:80 from the neighbour and names the gateway the flow
// went through, by the masquerade source the backend saw.
func (e *gwLab) servedBy(a netip.Addr, timeout time.Duration) (string, error) {
	r, err := e.nb.Dial("tcp", netip.AddrPortFrom(a, 80), lab.DialOpts{Timeout: timeout})
	if err != nil {
		return "", err
	}
	switch src := r.ObservedSource.Addr(); {
	case strings.HasPrefix(src.String(), "198.18.2.") || strings.HasPrefix(src.String(), "fd42:2::"):
		return "gw-a", nil
	case strings.HasPrefix(src.String(), "198.18.9.") || strings.HasPrefix(src.String(), "fd42:9::"):
		return "gw-b", nil
	default:
		return src.String(), nil
	}
}

func setLink(t *testing.T, h *lab.Host, name string, up bool) {
	t.Helper()
	l, err := h.Netlink().LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if up {
		err = h.Netlink().LinkSetUp(l)
	} else {
		err = h.Netlink().LinkSetDown(l)
	}
	if err != nil {
		t.Fatalf("link %s of %s up=%v: %v", name, h, up, err)
	}
}

// TestGatewaysL2Failover: two gateways on one segment share the floating
// addresses (each answered by exactly one, spread over both); the channel
// runs over two links and losing one changes nothing; kill -9 of a gateway
// hands its addresses to the other, which answers ARP and NDP and serves
// them (the gap is measured); the killed one, restarted, gets its
// addresses back without two gateways ever answering for one.
func TestGatewaysL2Failover(t *testing.T) {
	e := newGWLab(t)
	e.ga.Launch()
	e.gb.Launch()
	e.ga.WaitReady()
	e.gb.WaitReady()
	// The first gateway ready (its peer's state synced) may hold every
	// address until the other is ready too and takes its share back.
	var owners map[netip.Addr]string
	if err := lab.EventuallyWithin(20*time.Second, func() (err error) {
		if owners, err = e.settled(e.ga, e.gb); err != nil {
			return err
		}
		count := map[string]int{}
		for _, o := range owners {
			count[o]++
		}
		if count["gw-a"] == 0 || count["gw-b"] == 0 {
			return fmt.Errorf("the addresses are not spread: %v", count)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("owners: %v", owners)
	count := map[string]int{}
	for _, o := range owners {
		count[o]++
	}
	for _, g := range []*gatewaytest.Gateway{e.ga, e.gb} {
		name, peer := "gw-a", "gw-b"
		if g == e.gb {
			name, peer = peer, name
		}
		_, m, err := g.Get("/metrics")
		for _, want := range []string{fmt.Sprintf("nftgate_gateway_peer_up{peer=%q} 1", peer), `nftgate_gateway_peer_up{peer="gw-c"} 0`,
			fmt.Sprintf("nftgate_gateway_owned_addresses %d", count[name]), `nftgate_gateway_handovers_total{change="taken"}`} {
			if err != nil || !strings.Contains(m, want) {
				t.Errorf("%s's /metrics lacks %s (%v)", name, want, err)
			}
		}
	}
	if _, body, err := e.ga.Get("/api/v1/edge"); err != nil || !strings.Contains(body, `"l2 held by gw-b"`) || !strings.Contains(body, `"l2 `+e.seg[0]+`"`) {
		t.Errorf("gw-a's /api/v1/edge does not tell its own addresses from gw-b's: %v %s", err, body)
	}
	e.oneAnswerer(t, owners)
	for _, a := range e.addrs {
		flush(t, e.nb, a)
		if by, err := e.servedBy(a, 5*time.Second); err != nil || by != owners[a] {
			t.Errorf("%v served by %q (%v), want %s", a, by, err, owners[a])
		}
	}

	e.wrongKeyPeer(t, owners)
	e.panel(t)

	// One of the two channel links cut: one owner per address still.
	setLink(t, e.topo.Gateway, e.ab.A, false)
	deadline := time.Now().Add(2 * time.Second) // several dead times
	for time.Now().Before(deadline) {
		got, err := e.settled(e.ga, e.gb)
		if err != nil {
			t.Fatalf("with one channel link cut: %v", err)
		}
		if !mapsEqual(got, owners) {
			t.Fatalf("with one channel link cut the owners moved: %v, were %v", got, owners)
		}
	}
	e.oneAnswerer(t, owners)
	setLink(t, e.topo.Gateway, e.ab.A, true)

	// kill -9 gw-a and cut its links, as a dead box.
	var moved []netip.Addr
	for _, a := range e.addrs {
		if owners[a] == "gw-a" {
			moved = append(moved, a)
		}
	}
	e.ga.Kill()
	start := time.Now()
	setLink(t, e.topo.Gateway, e.seg[0], false)
	setLink(t, e.topo.Gateway, e.ab.A, false)
	gaps := map[netip.Addr]time.Duration{}
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		for _, a := range moved {
			if _, ok := gaps[a]; ok {
				continue
			}
			if by, err := e.servedBy(a, 200*time.Millisecond); err != nil || by != "gw-b" {
				return fmt.Errorf("%v: served by %q (%v)", a, by, err)
			}
			gaps[a] = time.Since(start)
		}
		return nil
	}); err != nil {
		t.Fatalf("after gw-a was killed: %v\ngw-b logs:\n%s", err, e.gb.Logs())
	}
	worst := time.Duration(0)
	for a, g := range gaps {
		t.Logf("failover: %v served by gw-b %v after the kill", a, g.Round(time.Millisecond))
		worst = max(worst, g)
	}
	t.Logf("failover: worst gap %v over %d addresses (heartbeat 100ms, dead after %d)", worst.Round(time.Millisecond), len(moved), gwDeadAfter)
	// The goal is 2 s; the bound asserted is generous so that a loaded
	// machine does not fail the test (make bench measures).
	if worst > 10*time.Second {
		t.Errorf("failover took %v", worst)
	}
	all := map[netip.Addr]string{}
	for _, a := range e.addrs {
		all[a] = "gw-b"
	}
	e.oneAnswerer(t, all)
	if st, err := gwStatus(e.gb); err != nil || st.Peers[0].State != "dead" || st.TakenOver < uint64(len(moved)) {
		t.Errorf("gw-b's status after the kill: %+v %v", st, err)
	}

	// gw-a comes back: its addresses return to it by handover, never two
	// answering on the way.
	setLink(t, e.topo.Gateway, e.seg[0], true)
	setLink(t, e.topo.Gateway, e.ab.A, true)
	e.ga.Launch()
	e.ga.WaitReady()
	if err := lab.EventuallyWithin(30*time.Second, func() error {
		for _, a := range e.addrs {
			if got := e.answerers(t, a, 100*time.Millisecond); len(got) > 1 {
				t.Fatalf("%v answered by %v at once during the move back", a, got)
			}
		}
		got, err := e.settled(e.ga, e.gb)
		if err != nil {
			return err
		}
		if !mapsEqual(got, owners) {
			return fmt.Errorf("owners %v, want %v again", got, owners)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.oneAnswerer(t, owners)
	if st, err := gwStatus(e.gb); err != nil || st.Released < uint64(len(moved)) {
		t.Errorf("gw-b's status after the return: %+v %v", st, err)
	}
}

func mapsEqual(a, b map[netip.Addr]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// wrongKeyPeer starts gw-c, configured in the set but with another key:
// both gateways refuse it (counted, shown) and nothing changes.
func (e *gwLab) wrongKeyPeer(t *testing.T, owners map[netip.Addr]string) {
	t.Helper()
	e.gc.Start()
	if err := lab.EventuallyWithin(20*time.Second, func() error {
		for _, g := range []*gatewaytest.Gateway{e.ga, e.gb} {
			st, err := gwStatus(g)
			if err != nil {
				return err
			}
			i := slices.IndexFunc(st.Peers, func(p gateways.PeerStatus) bool { return p.Name == "gw-c" })
			if i < 0 || st.Peers[i].RefusedHellos == 0 || st.Peers[i].State != "unknown" {
				return fmt.Errorf("%s sees gw-c as %+v", st.Name, st.Peers)
			}
			if len(st.Refused) == 0 || st.Refused[len(st.Refused)-1].Reason != "key" {
				return fmt.Errorf("%s's refusals: %+v", st.Name, st.Refused)
			}
			_, m, err := g.Get("/metrics")
			if err != nil || !strings.Contains(m, `nftgate_gateway_hellos_refused_total{reason="key"}`) {
				return fmt.Errorf("%s's metrics count no refusal for the key: %v", st.Name, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := e.settled(e.ga, e.gb); err != nil || !mapsEqual(got, owners) {
		t.Fatalf("with gw-c refused the owners are %v (%v), were %v", got, err, owners)
	}
	e.oneAnswerer(t, owners)
	e.gc.Stop()
}

// panel: the status page of gw-a shows the set (itself, gw-b, gw-c) and
// the refusal.
func (e *gwLab) panel(t *testing.T) {
	t.Helper()
	const host = "127.0.0.1:9180"
	b := browsertest.Start(t, browsertest.Options{Host: host, Netns: e.topo.Gateway.Name()})
	b.Navigate("http://" + host + "/")
	b.Poll("the gateway set panel", `!document.getElementById('gateways').hidden && document.querySelectorAll('#gw-peers-body tr').length === 3 && document.querySelectorAll('#gw-refused-body tr').length > 0`)
	rows := browsertest.Eval[[]string](b, `Array.from(document.querySelectorAll('#gw-peers-body tr'), tr => tr.children[0].textContent + ' ' + tr.children[1].textContent)`)
	if want := []string{"gw-a (this gateway) alive", "gw-b alive", "gw-c unknown"}; !slices.Equal(rows, want) {
		t.Errorf("gateway panel rows %q, want %q", rows, want)
	}
	b.Screenshot(browsertest.ArtifactDir(t, "nftgate"), "gateways.png")
}
