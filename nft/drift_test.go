package nft

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// randomWorld is a set of Services that a test mutates at random.
type randomWorld struct {
	r        *rand.Rand
	services map[model.ServiceKey]*model.Service
	next     int
	// unique gives every Service its own external addresses; otherwise
	// they come from a small pool and sometimes collide.
	unique bool
}

func (w *randomWorld) poolAddr(net byte) netip.Addr {
	if w.unique {
		return w.addr4(net, w.next)
	}
	return w.addr4(net, w.r.Intn(20))
}

func (w *randomWorld) addr4(net byte, n int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, net, byte(n / 250), byte(1 + n%250)})
}

func (w *randomWorld) newService() *model.Service {
	w.next++
	n := w.next
	k := model.NewServiceKey(fmt.Sprintf("ns%d", n%3), fmt.Sprintf("svc%d", n))
	s := &model.Service{Key: k, Type: model.TypeClusterIP, Created: model.InstantOf(time.Unix(int64(n), 0))}
	s.ClusterIPs = []netip.Addr{w.addr4(19, n)}
	if w.r.Intn(3) == 0 {
		s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd42:ff::%x", n)))
	}
	switch w.r.Intn(4) {
	case 1:
		s.Type = model.TypeNodePort
	case 2:
		s.Type = model.TypeLoadBalancer
		// A small pool, so that Services sometimes claim the same IP.
		s.EditRare().LoadBalancerIPs = []netip.Addr{w.poolAddr(20)}
		if w.r.Intn(2) == 0 {
			s.EditRare().SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}
		}
	}
	if w.r.Intn(5) == 0 {
		s.EditRare().ExternalIPs = []netip.Addr{w.poolAddr(21)}
	}
	if w.r.Intn(4) == 0 {
		s.EditRare().AffinityTimeout = time.Duration(10+w.r.Intn(3)) * time.Second
	}
	s.ExternalLocal = w.r.Intn(4) == 0
	s.InternalLocal = w.r.Intn(8) == 0
	if n%3 == 1 {
		s.EditRare().EndpointSelection = model.SelectionMaglev
	}
	nports := 1 + w.r.Intn(2)
	for i := 0; i < nports; i++ {
		p := model.ServicePort{Name: fmt.Sprintf("p%d", i), Protocol: []model.Protocol{model.TCP, model.UDP, model.SCTP}[w.r.Intn(3)], Port: uint16(80 + i)}
		if s.Type != model.TypeClusterIP {
			p.NodePort = uint16(30000 + n*2 + i)
		}
		p.Endpoints = w.endpoints()
		s.Ports = append(s.Ports, p)
	}
	return s
}

func (w *randomWorld) endpoints() []model.Endpoint {
	var eps []model.Endpoint
	for j, n := 0, w.r.Intn(5); j < n; j++ {
		e := model.Endpoint{Port: uint16(8080 + w.r.Intn(2)), Ready: w.r.Intn(6) != 0}.WithAddr(w.addr4(18, 10+w.r.Intn(40)))
		e.Serving = e.Ready || w.r.Intn(2) == 0
		e.Terminating = !e.Ready && w.r.Intn(2) == 0
		if w.r.Intn(2) == 0 {
			e.Place = model.On("gw")
		}
		if w.r.Intn(4) == 0 {
			e.SetAddr(netip.MustParseAddr(fmt.Sprintf("fd42:2::%x", 10+w.r.Intn(40))))
		}
		dup := false
		for _, x := range eps {
			dup = dup || x.AddrPort() == e.AddrPort()
		}
		if !dup {
			eps = append(eps, e)
		}
	}
	return eps
}

// mutate changes one random Service and returns its key and new model (nil
// when deleted).
func (w *randomWorld) mutate() (model.ServiceKey, *model.Service) {
	if len(w.services) == 0 || w.r.Intn(6) == 0 {
		s := w.newService()
		w.services[s.Key] = s
		return s.Key, s
	}
	keys := make([]model.ServiceKey, 0, len(w.services))
	for k := range w.services {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	k := keys[w.r.Intn(len(keys))]
	old := w.services[k]
	c := *old
	c.Ports = append([]model.ServicePort(nil), old.Ports...)
	switch w.r.Intn(7) {
	case 0:
		delete(w.services, k)
		return k, nil
	case 1:
		if c.AffinityTimeout() == 0 {
			c.EditRare().AffinityTimeout = 7 * time.Second
			c.EditRare().EndpointSelection = model.SelectionMaglev
		} else {
			c.EditRare().AffinityTimeout = 0
			c.EditRare().EndpointSelection = ""
		}
	case 2:
		c.ExternalLocal = !c.ExternalLocal
	case 3:
		c.ClusterIPs = []netip.Addr{w.addr4(19, 200+w.r.Intn(50))}
	default:
		i := w.r.Intn(len(c.Ports))
		c.Ports[i].Endpoints = w.endpoints()
	}
	w.services[k] = &c
	return k, &c
}

// programWorld makes a random world of n Services and programs it with a
// full sync into the namespace fd.
func programWorld(t *testing.T, cfg ruleset.Config, fd int, seed int64, n int, unique bool) (*randomWorld, *Programmer) {
	t.Helper()
	w := &randomWorld{r: rand.New(rand.NewSource(seed)), services: map[model.ServiceKey]*model.Service{}, unique: unique}
	for i := 0; i < n; i++ {
		s := w.newService()
		w.services[s.Key] = s
	}
	p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if _, err := p.Full(ruleset.CloneServices(w.services)); err != nil {
		t.Fatal(err)
	}
	return w, p
}

// TestRandomChangesLeaveNoDrift applies a long random sequence of partial
// syncs, then checks that the kernel holds exactly what one fresh full sync
// of the final state programs, and what nft itself programs from the
// rendered text: no drift, no leftovers, and bytecode as nft writes it.
func TestRandomChangesLeaveNoDrift(t *testing.T) {
	nsA, fdA := testNetNS(t)
	nsB, fdB := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, Shards: 4,
		ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("198.18.2.0/24")},
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.18.1.1/32"), netip.MustParsePrefix("fd42:1::1/128")}}

	w, pa := programWorld(t, cfg, fdA, 1, 40, false)
	// The conflicts of each Service, as the partial syncs report their
	// changes.
	reported := pa.claims.Losses()
	for step := 0; step < 300; step++ {
		changes := map[model.ServiceKey]*model.Service{}
		for j, n := 0, 1+w.r.Intn(3); j < n; j++ {
			k, s := w.mutate()
			changes[k] = s
		}
		res, err := pa.Partial(changes)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for k, c := range res.ServiceConflicts {
			if len(c) == 0 {
				delete(reported, k)
			} else {
				reported[k] = c
			}
		}
	}
	// Nothing to repair: the state nftgate believes in is the kernel's.
	res, err := pa.Full(ruleset.CloneServices(w.services))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Drift) != 0 || res.Counts.Changes() != 0 {
		t.Fatalf("full sync after partial ones changed something: drift %v, counts %+v", res.Drift, res.Counts)
	}

	pb, err := NewProgrammer(cfg, Options{NetNSFD: fdB})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	if _, err := pb.Full(ruleset.CloneServices(w.services)); err != nil {
		t.Fatal(err)
	}

	for _, fam := range []string{"ip", "ip6"} {
		a := normalizedTables(t, nsA, fam, cfg)
		b := normalizedTables(t, nsB, fam, cfg)
		if a != b {
			t.Errorf("%s tables after random partial syncs differ from a fresh full sync:\n%s", fam, firstDifference(a, b))
		}
	}
	if len(res.Conflicts) == 0 {
		t.Error("the random world never made two Services claim one address: the test lost its reach")
	}
	// Each Service's conflicts, kept up to date by the partial syncs, are
	// those a fresh full sync finds.
	fresh := pb.claims.Losses()
	if !reflect.DeepEqual(reported, fresh) || !reflect.DeepEqual(pa.claims.Losses(), fresh) {
		t.Errorf("conflicts per Service after partial syncs\n%v\nreported as\n%v\nwant, as a fresh full sync finds them,\n%v",
			pa.claims.Losses(), reported, fresh)
	}
	if len(fresh) == 0 {
		t.Error("no Service lost a claim to another: the test lost its reach")
	}
}

// TestNetlinkMatchesNft programs a varied ruleset over netlink and the same
// ruleset, as text, with nft itself: the kernel must end up with the same
// objects and bytecode, which is what makes `nft list ruleset` show exactly
// what nftgate meant.
func TestNetlinkMatchesNft(t *testing.T) {
	base := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, Shards: 4, ReleaseTimeWait: true, AnswerRefusedSYNs: true,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("fd42:2::/64")}}
	// Masquerade ports by CPU group, to the interface's address and to a
	// pool (two IPv4 addresses by hash, one IPv6).
	cpus := base
	cpus.MasqueradePortGroups = 4
	pool := cpus
	pool.MasqueradePortGroups = 2
	pool.MasqueradeAddresses = []netip.Addr{netip.MustParseAddr("198.18.3.1"), netip.MustParseAddr("198.18.3.2"), netip.MustParseAddr("fd42:3::1")}
	// The answer to refused SYNs without the release (a kernel without
	// conntrack marks), its rules counting.
	answer := base
	answer.ReleaseTimeWait, answer.Counters = false, true
	// The bounded wait for a replica (counted here; with ports by CPU its
	// pick-up without a range), and the plain drop.
	answer.DropMidstreamTCP, answer.MidstreamWait = true, 10*time.Second
	cpus.DropMidstreamTCP, cpus.MidstreamWait = true, 10*time.Second
	cpus.MidstreamWaitPeerDead = 500 * time.Millisecond // a timeout of milliseconds, read back
	pool.DropMidstreamTCP = true
	for name, cfg := range map[string]ruleset.Config{"default": base, "cpu-ports": cpus, "cpu-ports-pool": pool, "answer-without-release": answer} {
		t.Run(name, func(t *testing.T) {
			nsA, fdA := testNetNS(t)
			nsC, _ := testNetNS(t)
			w, pa := programWorld(t, cfg, fdA, 2, 60, true)
			res, err := pa.Full(ruleset.CloneServices(w.services))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Conflicts) > 0 {
				t.Fatalf("conflicts in a world without shared addresses: %v", res.Conflicts)
			}
			var text bytes.Buffer
			for _, f := range ruleset.Families {
				var svcs []*model.Service
				for _, s := range w.services {
					svcs = append(svcs, s)
				}
				if err := ruleset.WriteTables(&text, f, ruleset.Layout(&cfg, f, svcs)); err != nil {
					t.Fatal(err)
				}
			}
			file := filepath.Join(t.TempDir(), "ruleset.nft")
			if err := os.WriteFile(file, text.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("ip", "netns", "exec", nsC, "nft", "-f", file).CombinedOutput(); err != nil {
				t.Fatalf("nft -f of the rendered ruleset: %v\n%s", err, out)
			}
			for _, fam := range []string{"ip", "ip6"} {
				a := normalizedTables(t, nsA, fam, cfg)
				c := normalizedTables(t, nsC, fam, cfg)
				if a != c {
					t.Errorf("%s tables programmed over netlink differ from nft's own programming of the same text:\n%s", fam, firstDifference(a, c))
				}
			}
		})
	}
}

// normalizedTables is normalizedTable of each of nftgate's tables of a
// family, main first.
func normalizedTables(t *testing.T, ns, family string, cfg ruleset.Config) string {
	t.Helper()
	out := normalizedTable(t, ns, family, cfg.Table)
	for i := range cfg.ShardCount() {
		out += "\n" + normalizedTable(t, ns, family, cfg.ShardTable(i))
	}
	return out
}

// normalizedTable lists a table as JSON and sorts away what carries no
// meaning: handles, the order of chains, sets and elements. Rule order
// within a chain is kept.
func normalizedTable(t *testing.T, ns, family, table string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-j", "list", "table", family, table).Output()
	if err != nil {
		t.Fatalf("nft -j list table %s %s: %v", family, table, err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var objs []string
	rules := map[string][]string{}
	for _, o := range doc.Nftables {
		for kind, raw := range o {
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatal(err)
			}
			m, _ := v.(map[string]any)
			if m == nil || kind == "metainfo" {
				continue
			}
			delete(m, "handle")
			if el, ok := m["elem"].([]any); ok {
				sort.Slice(el, func(i, j int) bool { return jsonString(el[i]) < jsonString(el[j]) })
			}
			if kind == "rule" {
				chain, _ := m["chain"].(string)
				rules[chain] = append(rules[chain], jsonString(stripAnonymous(m["expr"])))
				continue
			}
			objs = append(objs, kind+" "+jsonString(m))
		}
	}
	for chain, rs := range rules {
		objs = append(objs, fmt.Sprintf("rules of %s: %v", chain, rs))
	}
	sort.Strings(objs)
	var b bytes.Buffer
	for _, o := range objs {
		b.WriteString(o)
		b.WriteByte('\n')
	}
	return b.String()
}

// stripAnonymous sorts the elements of anonymous maps inside rules.
func stripAnonymous(v any) any {
	switch x := v.(type) {
	case []any:
		for i := range x {
			x[i] = stripAnonymous(x[i])
		}
		return x
	case map[string]any:
		for k := range x {
			x[k] = stripAnonymous(x[k])
		}
		if s, ok := x["set"].([]any); ok {
			sort.Slice(s, func(i, j int) bool { return jsonString(s[i]) < jsonString(s[j]) })
		}
		return x
	}
	return v
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func firstDifference(a, b string) string {
	al, bl := bytes.Split([]byte(a), []byte("\n")), bytes.Split([]byte(b), []byte("\n"))
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y []byte
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if !bytes.Equal(x, y) {
			return fmt.Sprintf("line %d:\n  got:  %s\n  want: %s", i, x, y)
		}
	}
	return ""
}

// TestFullRepairsHandEdits changes the kernel behind the programmer's back
// and checks that a full sync notices and repairs each change.
func TestFullRepairsHandEdits(t *testing.T) {
	ns, fd := testNetNS(t)
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, Shards: 3}
	w, p := programWorld(t, cfg, fd, 3, 10, true)
	want := map[string]string{"ip": normalizedTables(t, ns, "ip", cfg), "ip6": normalizedTables(t, ns, "ip6", cfg)}
	shard := cfg.ShardTable(1)
	nft := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	// driftOf is what the drift report must say after an edit, where that
	// is exact: a verdict read back wrong would count every element.
	driftOf := map[string]string{"element's verdict changed": "map elements: 0 missing, 1 changed, 0 unknown"}
	for _, tc := range []struct {
		name string
		edit func()
	}{
		{"table deleted", func() { nft("delete", "table", "ip", cfg.Table) }},
		{"table flushed", func() { nft("flush", "table", "ip", cfg.Table) }},
		{"shard table deleted", func() { nft("delete", "table", "ip", shard) }},
		{"shard table flushed", func() { nft("flush", "table", "ip6", shard) }},
		{"chain flushed", func() { nft("flush", "chain", "ip", shard, ruleset.ChainServices) }},
		{"rule added", func() { nft("add", "rule", "ip", shard, ruleset.ChainServices, "ip", "daddr", "1.2.3.4", "drop") }},
		{"element edited", func() {
			nft("flush", "map", "ip", shard, ruleset.MapServiceIPs)
			nft("add", "element", "ip", shard, ruleset.MapServiceIPs, "{ 198.19.9.9 . tcp . 80 : drop }")
		}},
		{"element's verdict changed", func() {
			// The same keys, one of them sent elsewhere: only a read-back
			// that compares verdicts sees it.
			out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "map", "ip", shard, ruleset.MapServiceIPs).CombinedOutput()
			if err != nil {
				t.Fatalf("list the map: %v: %s", err, out)
			}
			m := regexp.MustCompile(`([0-9.]+ \. [a-z]+ \. [0-9]+) : (goto|jump) `).FindSubmatch(out)
			if m == nil {
				t.Fatalf("no element with a jump or goto in:\n%s", out)
			}
			nft("delete", "element", "ip", shard, ruleset.MapServiceIPs, "{ "+string(m[1])+" }")
			nft("add", "element", "ip", shard, ruleset.MapServiceIPs, "{ "+string(m[1])+" : drop }")
		}},
		{"hairpin element removed", func() { nft("flush", "set", "ip", cfg.Table, ruleset.SetHairpin) }},
		{"chain added", func() { nft("add", "chain", "ip", cfg.Table, "intruder") }},
		{"shard table of another shard count", func() {
			nft("add", "table", "ip", cfg.ShardTable(7), "{ comment \""+TableComment+"\"; }")
			nft("add", "chain", "ip", cfg.ShardTable(7), "nat-prerouting", "{ type nat hook prerouting priority -100; }")
		}},
	} {
		tc.edit()
		res, err := p.Full(ruleset.CloneServices(w.services))
		if err != nil {
			t.Fatalf("%s: repair failed: %v", tc.name, err)
		}
		if len(res.Drift) == 0 {
			t.Errorf("%s: the full sync reported no drift", tc.name)
		}
		if want := driftOf[tc.name]; want != "" && !strings.Contains(strings.Join(res.Drift, "\n"), want) {
			t.Errorf("%s: drift reported as %q, want %q", tc.name, res.Drift, want)
		}
		for fam, w := range want {
			if got := normalizedTables(t, ns, fam, cfg); got != w {
				t.Errorf("%s: %s tables not repaired:\n%s", tc.name, fam, firstDifference(got, w))
			}
		}
		if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput(); err != nil || strings.Contains(string(out), cfg.ShardTable(7)) {
			t.Errorf("%s: tables after the repair (%v):\n%s", tc.name, err, out)
		}
	}
}

// TestUpgradeFromOneTable starts from the ruleset of an nftgate that kept
// every Service in its main table (testdata/upgrade-one-table.nft, loaded
// with nft): the first full sync must move everything into the shard
// tables in one batch and leave exactly what a fresh start programs.
func TestUpgradeFromOneTable(t *testing.T) {
	nsA, fdA := testNetNS(t)
	nsB, fdB := testNetNS(t)
	if out, err := exec.Command("ip", "netns", "exec", nsA, "nft", "-f", filepath.Join("testdata", "upgrade-one-table.nft")).CombinedOutput(); err != nil {
		t.Fatalf("load the one-table ruleset: %v\n%s", err, out)
	}
	cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw", Zone: "zone-a"}, HashSeed: 7, Shards: 2,
		ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00:10::/48")},
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("2001:db8:1::/64")}}
	ready := func(a string, port uint16) model.Endpoint {
		return model.Endpoint{Port: port, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr(a))
	}
	api := &model.Service{Key: model.NewServiceKey("ns1", "api"), Type: model.TypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("172.30.0.10")},
		Ports: []model.ServicePort{
			{Name: "https", Protocol: model.TCP, Port: 443, Endpoints: []model.Endpoint{ready("10.180.0.10", 6443), ready("10.180.1.10", 6443), ready("10.180.2.10", 6443)}},
			{Name: "sig", Protocol: model.SCTP, Port: 3868, Endpoints: []model.Endpoint{ready("10.180.0.10", 3868)}},
		}}
	services := map[model.ServiceKey]*model.Service{api.Key: api}
	for i, fd := range []int{fdA, fdB} {
		p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := p.Full(ruleset.CloneServices(services)); err != nil {
			t.Fatalf("programmer %d: %v", i, err)
		}
		res, err := p.Full(ruleset.CloneServices(services))
		if err != nil || res.Counts.Changes() != 0 || len(res.Drift) != 0 {
			t.Fatalf("programmer %d: second full sync: %+v %v", i, res, err)
		}
	}
	for _, fam := range []string{"ip", "ip6"} {
		if a, b := normalizedTables(t, nsA, fam, cfg), normalizedTables(t, nsB, fam, cfg); a != b {
			t.Errorf("%s tables after the upgrade differ from a fresh start:\n%s", fam, firstDifference(a, b))
		}
	}
}
