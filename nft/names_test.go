package nft

import (
	"bytes"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// identity is everything an object name of a Service port depends on.
type identity struct {
	ns, name, portName string
	proto              model.Protocol
	port               uint16
	ep                 netip.AddrPort
	timeout            time.Duration
}

func (id identity) service() (*model.Service, *model.ServicePort) {
	svc := &model.Service{Key: model.NewServiceKey(id.ns, id.name), Rare: &model.Rare{AffinityTimeout: id.timeout}}
	svc.Ports = []model.ServicePort{{Name: id.portName, Protocol: id.proto, Port: id.port}}
	return svc, &svc.Ports[0]
}

// names are every object name the identity gives, by kind.
func (id identity) names() map[string]string {
	svc, p := id.service()
	out := map[string]string{}
	for _, kind := range []string{"svc", "local", "ext", "fw"} {
		out[kind] = ruleset.PortObject(kind, svc, p)
	}
	out["ep"] = ruleset.EndpointObject("ep", svc, p, id.ep, "")
	out["aff"] = ruleset.EndpointObject("aff", svc, p, id.ep, ruleset.DurationText(id.timeout))
	return out
}

// TestObjectNamesInjective: two different Service ports (or endpoints of
// them) never get the same chain or set name, whatever their names hold,
// and every name is an nft identifier.
func TestObjectNamesInjective(t *testing.T) {
	ep := netip.MustParseAddrPort("10.0.0.1:80")
	ids := []identity{
		// The collision the readable names used to have.
		{ns: "a/b", name: "c", portName: "http", proto: model.TCP, port: 80, ep: ep},
		{ns: "a", name: "b/c", portName: "http", proto: model.TCP, port: 80, ep: ep},
		// Escapes and what they stand for.
		{ns: "a_2F", name: "c", portName: "http", proto: model.TCP, port: 80, ep: ep},
		{ns: "a_", name: "2F/c", portName: "http", proto: model.TCP, port: 80, ep: ep},
		{ns: "a.b", name: "c", portName: "http", proto: model.TCP, port: 80, ep: ep},
		// A port named like a number, and the unnamed port of that number.
		{ns: "a", name: "b", portName: "80", proto: model.TCP, port: 81, ep: ep},
		{ns: "a", name: "b", portName: "", proto: model.TCP, port: 80, ep: ep},
		{ns: "a", name: "b", portName: ".80", proto: model.TCP, port: 80, ep: ep},
		{ns: "a", name: "b", portName: "http/10.0.0.1", proto: model.TCP, port: 80, ep: ep},
		// Endpoints of one port.
		{ns: "a", name: "b", portName: "http", proto: model.TCP, port: 80, ep: netip.MustParseAddrPort("10.0.0.1:8080")},
		{ns: "a", name: "b", portName: "http", proto: model.TCP, port: 80, ep: netip.MustParseAddrPort("[::a00:1]:8080")},
		{ns: "a", name: "b", portName: "http", proto: model.TCP, port: 80, ep: netip.MustParseAddrPort("[1:2:3:4::]:8080")},
		{ns: "a", name: "b", portName: "http", proto: model.TCP, port: 80, ep: netip.MustParseAddrPort("[1:2:3:4:5:6:7:8]:8080")},
		{ns: "a", name: "b", portName: "http", proto: model.TCP, port: 80, ep: netip.MustParseAddrPort("1.2.3.4:8080")},
		{ns: "a", name: "b", portName: "http", proto: model.UDP, port: 80, ep: netip.MustParseAddrPort("1.2.3.4:8080")},
		{ns: "a", name: "b", portName: "http", proto: model.TCP, port: 80, ep: netip.MustParseAddrPort("1.2.3.4:8080"), timeout: time.Hour},
		// What a script could be made of.
		{ns: "x\n}\ntable ip evil {", name: "\"; flush ruleset #", portName: "{}", proto: model.TCP, port: 80, ep: ep},
		{ns: "é", name: "\x00", portName: "\xff", proto: model.SCTP, port: 80, ep: ep},
	}
	// And many random ones, from an alphabet rich in separators and
	// escape characters.
	rng := rand.New(rand.NewSource(1))
	alphabet := []string{"a", "2", "F", "f", "-", "/", "_", "_2F", ".", ":", "\n", "p"}
	word := func() string {
		var b strings.Builder
		for n := rng.Intn(5); n > 0; n-- {
			b.WriteString(alphabet[rng.Intn(len(alphabet))])
		}
		return b.String()
	}
	addrs := []string{"10.0.0.1", "10.0.0.10", "::a00:1", "::1", "1::", "1:0:0:1::", "1::1"}
	for i := 0; i < 50000; i++ {
		ids = append(ids, identity{ns: word(), name: word(), portName: word(),
			proto: []model.Protocol{model.TCP, model.UDP}[rng.Intn(2)], port: uint16(rng.Intn(3)),
			ep:      netip.AddrPortFrom(netip.MustParseAddr(addrs[rng.Intn(len(addrs))]), uint16(rng.Intn(3))),
			timeout: time.Duration(rng.Intn(2)) * time.Second})
	}

	// key is what must tell objects apart: the port's identity for port
	// objects (its number only when unnamed), plus the endpoint for
	// endpoint objects, plus the timeout for affinity sets.
	key := func(id identity, kind string) string {
		k := fmt.Sprintf("%q %q %d %q", id.ns, id.name, id.proto, id.portName)
		if id.portName == "" {
			k += fmt.Sprint(" ", id.port)
		}
		switch kind {
		case "ep":
			k += " " + id.ep.String()
		case "aff":
			k += " " + id.ep.String() + " " + id.timeout.String()
		}
		return k
	}
	owner := map[string]string{} // name -> kind and key
	for _, id := range ids {
		for kind, name := range id.names() {
			if err := ruleset.CheckName("chain", name); err != nil {
				t.Fatalf("%+v: %v", id, err)
			}
			k := kind + " " + key(id, kind)
			if prev, ok := owner[name]; ok && prev != k {
				t.Fatalf("%s and %s share the name %q", prev, k, name)
			}
			owner[name] = k
		}
	}
	// The static objects' names never meet a Service's.
	for _, c := range append(ruleset.Static(&ruleset.Config{}, ruleset.IPv4).Chains, ruleset.StaticShard(&ruleset.Config{}, ruleset.IPv4).Chains...) {
		if _, ok := owner[c.Name]; ok || strings.Contains(c.Name, "/") {
			t.Errorf("static chain %q could be a Service's", c.Name)
		}
	}
}

// TestValidNamesReadable: the names the model accepts are written as they
// are, for admins reading `nft list ruleset`.
func TestValidNamesReadable(t *testing.T) {
	id := identity{ns: "shop", name: "1st-cart", portName: "http-2", proto: model.TCP, port: 80,
		ep: netip.MustParseAddrPort("[fd00::1]:8080"), timeout: time.Hour}
	got := id.names()
	for kind, want := range map[string]string{
		"svc": "svc-shop/1st-cart/tcp/http-2",
		"ep":  "ep-shop/1st-cart/tcp/http-2/fd00..1/8080",
		"aff": "aff-shop/1st-cart/tcp/http-2/fd00..1/8080/3600s",
	} {
		if got[kind] != want {
			t.Errorf("%s: %q, want %q", kind, got[kind], want)
		}
	}
	id.portName = ""
	if got := id.names()["svc"]; got != "svc-shop/1st-cart/tcp/.80" {
		t.Errorf("unnamed port: %q", got)
	}
}

// hostileService has names no API would accept, and every kind of object:
// affinity, both traffic policies, source ranges, both families.
func hostileService(ns, name, port string) *model.Service {
	eps := []model.Endpoint{
		model.Endpoint{Port: 8080, Ready: true, Serving: true, Place: model.On("gw")}.WithAddr(netip.MustParseAddr("198.18.2.10")),
		model.Endpoint{Port: 8080, Ready: true, Serving: true, Place: model.On("gw")}.WithAddr(netip.MustParseAddr("fd00:2::10")),
	}
	return &model.Service{Key: model.NewServiceKey(ns, name), Type: model.TypeLoadBalancer,
		IPv4: true, IPv6: true,
		ClusterIPs:    []netip.Addr{netip.MustParseAddr("198.19.0.10"), netip.MustParseAddr("fd00:30::10")},
		Rare:          &model.Rare{LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.19.1.1")}, SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}, AffinityTimeout: 30 * time.Second},
		ExternalLocal: true,
		Ports:         []model.ServicePort{{Name: port, Protocol: model.TCP, Port: 80, NodePort: 30080, Endpoints: eps}}}
}

// TestRenderedScriptIsSafe: whatever the names hold, even past the model's
// checks, the script is one table per family, and nft reads it back as it
// is; a table name that is not an identifier is refused, not written.
func TestRenderedScriptIsSafe(t *testing.T) {
	svc := hostileService("x\n}\ntable ip evil {", "a\"; flush ruleset #", "{ }")
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}}
	var script bytes.Buffer
	for _, f := range ruleset.Families {
		if err := ruleset.WriteTables(&script, f, ruleset.Layout(&cfg, f, []*model.Service{svc})); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"\"", "#", "{ }"} {
		if strings.Contains(script.String(), bad) {
			t.Fatalf("the script holds %q:\n%s", bad, script.String())
		}
	}
	for _, table := range []string{"x\n}", "a;b", "a b", `a"b`, "", strings.Repeat("t", 256)} {
		err := ruleset.WriteText(&bytes.Buffer{}, table, ruleset.IPv4)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", table)) {
			t.Errorf("table %q: %v, want an error naming it", table, err)
		}
	}
	ns := nftCheck(t, script.Bytes())
	// Applied, it makes nftgate's tables and nothing else, and leaves
	// the tables already there alone.
	nftList(t, ns, "add", "table", "ip", "keep")
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = bytes.NewReader(script.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	want := []string{"table ip keep"}
	for _, f := range ruleset.Families {
		for _, tb := range ruleset.Layout(&cfg, f, nil) {
			want = append(want, fmt.Sprintf("table %s %s", f, tb.Name))
		}
	}
	got := strings.Split(strings.TrimSpace(nftList(t, ns, "list", "tables")), "\n")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("tables after applying the script: %q, want %q", got, want)
	}
}

// nftCheck runs `nft -c -f` on a script in a network namespace of the
// test's own; without root it skips.
func nftCheck(t testing.TB, script []byte) (ns string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nft -c needs root (a network namespace)")
	}
	ns, _ = testNetNS(t)
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
	cmd.Stdin = bytes.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f refused the script: %v\n%s\nscript:\n%s", err, out, script)
	}
	return ns
}

// TestLongestNamesFitTheKernel programs a Service whose names are as long
// as the model allows, with every kind of object and the longest IPv6
// endpoint address, and checks the kernel takes all of it.
func TestLongestNamesFitTheKernel(t *testing.T) {
	long := func(c string) string { return strings.Repeat(c, 63) }
	svc := hostileService(long("n"), long("s"), long("p"))
	svc.EditRare().AffinityTimeout = 86400 * time.Second
	svc.Ports[0].Protocol = model.SCTP
	svc.Ports[0].Endpoints[1].SetAddr(netip.MustParseAddr("fd00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
	for i := range svc.Ports[0].Endpoints {
		svc.Ports[0].Endpoints[i].Port = 65535
	}
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}}
	longest := 0
	for _, f := range ruleset.Families {
		for _, tb := range ruleset.Layout(&cfg, f, []*model.Service{svc}) {
			for _, c := range tb.Chains {
				longest = max(longest, len(c.Name))
			}
			for _, s := range tb.Sets {
				longest = max(longest, len(s.Name))
			}
		}
	}
	if longest != 253 {
		t.Errorf("the longest name is %d bytes, want 253 (the documented worst case)", longest)
	}
	ns, p := testProgrammer(t)
	if _, err := p.Full(map[model.ServiceKey]*model.Service{svc.Key: svc}); err != nil {
		t.Fatalf("the kernel refused the longest names: %v", err)
	}
	if out := nftList(t, ns, "list", "ruleset"); !strings.Contains(out, "aff-"+long("n")+"/"+long("s")+"/sctp/"+long("p")+"/fd00.ffff.ffff.ffff.ffff.ffff.ffff.ffff/65535/86400s") {
		t.Errorf("the longest set is not in the kernel:\n%s", out)
	}
}

// TestTwoServicesNeverShareAChain: Service c in namespace a/b and Service
// b/c in namespace a (names only a hand-made manifest or a bug can give)
// used to share their chain, in the same shard table: traffic for one went
// to the other's endpoint, and deleting one made every later sync fail.
func TestTwoServicesNeverShareAChain(t *testing.T) {
	ns, p := testProgrammer(t)
	one := webService("198.18.2.10")
	one.Key = model.NewServiceKey("a/b", "c")
	two := webService("198.18.2.11")
	two.Key = model.NewServiceKey("a", "b/c")
	two.ClusterIPs = []netip.Addr{netip.MustParseAddr("198.19.0.11")}
	if _, err := p.Full(map[model.ServiceKey]*model.Service{one.Key: one, two.Key: two}); err != nil {
		t.Fatal(err)
	}
	// dnatOf follows a ClusterIP's element to its chain, and returns
	// where that chain sends the traffic.
	dnatOf := func(clusterIP string) string {
		t.Helper()
		table := p.cfg.TableOf(one.Key)
		elems := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs)
		_, rest, ok := strings.Cut(elems, clusterIP+" . tcp . 80 : goto ")
		if !ok {
			t.Fatalf("no element for %s:\n%s", clusterIP, elems)
		}
		chain := strings.TrimRight(strings.Fields(rest)[0], ",}")
		if ruleset.Shared(chain) {
			// A shared chain: the endpoint is the ClusterIP's element
			// in the endpoint map.
			out := nftList(t, ns, "list", "map", "ip", table, ruleset.EndpointMap(false, 0))
			_, to, ok := strings.Cut(out, clusterIP+" . tcp . 80 : ")
			if !ok {
				t.Fatalf("no endpoint for %s:\n%s", clusterIP, out)
			}
			f := strings.Fields(to)
			return f[0] + ":" + strings.TrimRight(f[2], ",}")
		}
		out := nftList(t, ns, "list", "chain", "ip", table, chain)
		_, to, ok := strings.Cut(out, "dnat to ")
		if !ok {
			t.Fatalf("chain %s has no dnat:\n%s", chain, out)
		}
		return strings.Fields(to)[0]
	}
	if got := dnatOf("198.19.0.10"); got != "198.18.2.10:8080" {
		t.Errorf("a/b/c's ClusterIP goes to %s, want its own endpoint 198.18.2.10:8080", got)
	}
	if got := dnatOf("198.19.0.11"); got != "198.18.2.11:8080" {
		t.Errorf("a/b/c's ClusterIP goes to %s, want its own endpoint 198.18.2.11:8080", got)
	}
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{one.Key: nil}); err != nil {
		t.Fatalf("deleting one of them: %v", err)
	}
	if got := dnatOf("198.19.0.11"); got != "198.18.2.11:8080" {
		t.Errorf("after deleting the other, a/b/c's ClusterIP goes to %s", got)
	}
	moved := webService("198.18.2.12")
	moved.Key, moved.ClusterIPs = two.Key, two.ClusterIPs
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{two.Key: moved}); err != nil {
		t.Fatalf("a later sync: %v", err)
	}
}
