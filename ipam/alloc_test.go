package ipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
func itoa(i int) string            { return strconv.Itoa(i) }
func secs(i int) time.Duration     { return time.Duration(i) * time.Second }

// lb is a LoadBalancer Service on TCP/80, IPv4, created at epoch.
func lb(ns, name string) *Service {
	return &Service{Key: Key{ns, name}, Created: epoch, LoadBalancer: true, Families: []int{4},
		Ports: []Port{{corev1.ProtocolTCP, 80}}}
}

type opt func(*Service)

func age(i int) opt         { return func(s *Service) { s.Created = epoch.Add(secs(i)) } }
func families(f ...int) opt { return func(s *Service) { s.Families = f } }
func requireAll() opt       { return func(s *Service) { s.RequireAll = true } }
func class(c string) opt    { return func(s *Service) { s.Class = c } }
func pool(p string) opt {
	return func(s *Service) { s.Pool, s.PoolFrom = p, "annotation nftgate.io/address-pool" }
}
func share(k string) opt     { return func(s *Service) { s.SharingKey = k } }
func backend(b string) opt   { return func(s *Service) { s.Backend = b } }
func label(k, v string) opt  { return func(s *Service) { s.Labels = map[string]string{k: v} } }
func invalid(why string) opt { return func(s *Service) { s.Invalid = why } }
func ports(ps ...int32) opt {
	return func(s *Service) {
		s.Ports = nil
		for _, p := range ps {
			s.Ports = append(s.Ports, Port{corev1.ProtocolTCP, p})
		}
	}
}
func request(as ...string) opt {
	return func(s *Service) {
		s.RequestedFrom = "spec.loadBalancerIP"
		for _, a := range as {
			s.Requested = append(s.Requested, mustAddr(a))
		}
	}
}
func held(as ...string) opt {
	return func(s *Service) {
		for _, a := range as {
			s.Held = append(s.Held, mustAddr(a))
		}
	}
}

func svc(name string, opts ...opt) *Service {
	ns, n, ok := strings.Cut(name, "/")
	if !ok {
		ns, n = "default", name
	}
	s := lb(ns, n)
	for _, o := range opts {
		o(s)
	}
	return s
}

// summary is "addr,addr" or "-", then " Reason Reason" for the problems.
func summary(al *Allocation) string {
	var b strings.Builder
	if len(al.Addresses) == 0 {
		b.WriteString("-")
	}
	for i, a := range al.Addresses {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(a.Addr.String())
	}
	for _, p := range al.Problems {
		b.WriteString(" " + p.Reason)
	}
	return b.String()
}

func compile(t testing.TB, cfg Config) *Policy {
	t.Helper()
	pol, err := cfg.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

var (
	pools2 = Config{Pools: []PoolConfig{
		{Name: "a", Addresses: []string{"10.0.0.1-10.0.0.2", "2001:db8::1-2001:db8::2"}},
		{Name: "b", Addresses: []string{"10.0.1.0/30"}, AutoAssign: new(false)},
		{Name: "prod", Addresses: []string{"10.0.2.0/30"}, Namespaces: []string{"prod"}},
		{Name: "web", Addresses: []string{"10.0.3.0/30"}, ServiceSelector: "app=web", AutoAssign: new(false)},
	}}
)

func TestAllocate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		services []*Service
		want     map[string]string // name → summary; Services not listed are not served
	}{
		{"next free, older first", pools2,
			[]*Service{svc("new", age(2)), svc("old", age(1))},
			map[string]string{"default/old": "10.0.0.1", "default/new": "10.0.0.2"}},
		{"same age: by namespace and name", pools2,
			[]*Service{svc("b"), svc("a")},
			map[string]string{"default/a": "10.0.0.1", "default/b": "10.0.0.2"}},
		{"exhausted", pools2,
			[]*Service{svc("x", age(1)), svc("y", age(2)), svc("z", age(3))},
			map[string]string{"default/x": "10.0.0.1", "default/y": "10.0.0.2", "default/z": "- PoolExhausted"}},
		{"requested address, also from a pool without auto_assign", pools2,
			[]*Service{svc("x", age(1), held("10.0.0.1")), svc("r", age(2), request("10.0.0.1")), svc("b", request("10.0.1.2"))},
			map[string]string{"default/x": "10.0.0.1", "default/r": "- AddressTaken", "default/b": "10.0.1.2"}},
		{"requested addresses are claimed before automatic ones", pools2,
			[]*Service{svc("auto", age(1)), svc("r", age(2), request("10.0.0.1"))},
			map[string]string{"default/auto": "10.0.0.2", "default/r": "10.0.0.1"}},
		{"a request never takes an address from its holder, even a younger one", pools2,
			[]*Service{svc("h", age(2), held("10.0.0.1")), svc("r", age(1), request("10.0.0.1"))},
			map[string]string{"default/r": "- AddressTaken", "default/h": "10.0.0.1"}},
		{"a request moves the Service's own address", pools2,
			[]*Service{svc("m", held("10.0.0.1"), request("10.0.0.2"))},
			map[string]string{"default/m": "10.0.0.2"}},
		{"requested address outside every pool, or skipped", Config{Pools: []PoolConfig{{Name: "s", Addresses: []string{"10.9.0.0/24"}, SkipNetworkAndBroadcast: true}}},
			[]*Service{svc("out", request("192.0.2.1")), svc("net", request("10.9.0.0")), svc("bc", request("10.9.0.255"))},
			map[string]string{"default/out": "- AddressNotInPool", "default/net": "- AddressNotInPool", "default/bc": "- AddressNotInPool"}},
		{"named pool, unknown pool", pools2,
			[]*Service{svc("b", pool("b")), svc("nope", pool("nope")), svc("wrong", pool("b"), request("10.0.0.1"))},
			map[string]string{"default/b": "10.0.1.0", "default/nope": "- UnknownPool", "default/wrong": "- AddressNotInPool"}},
		{"namespaces and selectors", pools2,
			[]*Service{svc("prod/x", age(1)), svc("prod/y", age(2)), svc("prod/z", age(3)), svc("w", pool("web"), label("app", "web")), svc("nw", pool("web"))},
			map[string]string{"prod/x": "10.0.0.1", "prod/y": "10.0.0.2", "prod/z": "10.0.2.0", "default/w": "10.0.3.0", "default/nw": "- NoPoolForFamily"}},
		{"sharing: same key, other ports", pools2,
			[]*Service{svc("s1", age(1), share("k")), svc("s2", age(2), share("k"), ports(443)), svc("s3", age(3), share("k"), ports(80, 8080))},
			map[string]string{"default/s1": "10.0.0.1", "default/s2": "10.0.0.1", "default/s3": "10.0.0.2"}},
		{"sharing refused: no key, other key, same port, Local with another selector", pools2,
			[]*Service{svc("s1", age(1), share("k"), held("10.0.0.1")),
				svc("nokey", age(2), ports(443), request("10.0.0.1")),
				svc("other", age(3), share("j"), ports(443), request("10.0.0.1")),
				svc("port", age(4), share("k"), request("10.0.0.1")),
				svc("local", age(5), share("k"), ports(443), backend("app=x"), request("10.0.0.1"))},
			map[string]string{"default/s1": "10.0.0.1", "default/nokey": "- AddressTaken", "default/other": "- SharingRefused",
				"default/port": "- SharingRefused", "default/local": "- SharingRefused"}},
		{"sharing under Local with the same selector", pools2,
			[]*Service{svc("l1", age(1), share("k"), backend("app=x")), svc("l2", age(2), share("k"), backend("app=x"), ports(443))},
			map[string]string{"default/l1": "10.0.0.1", "default/l2": "10.0.0.1"}},
		{"dual stack", pools2,
			[]*Service{svc("d", families(6, 4), requireAll()), svc("v6", age(1), families(6))},
			map[string]string{"default/d": "2001:db8::1,10.0.0.1", "default/v6": "2001:db8::2"}},
		{"RequireDualStack without an IPv6 pool gets nothing; PreferDualStack gets IPv4", Config{Pools: []PoolConfig{{Name: "v4", Addresses: []string{"10.0.0.0/30"}}}},
			[]*Service{svc("req", families(4, 6), requireAll()), svc("pref", age(1), families(4, 6))},
			map[string]string{"default/req": "- NoPoolForFamily NoPoolForFamily", "default/pref": "10.0.0.0"}},
		{"held addresses are kept; a held address outside every pool is released", pools2,
			[]*Service{svc("h", age(3), held("10.0.0.2")), svc("gone", age(2), held("192.0.2.9")), svc("n", age(1))},
			map[string]string{"default/h": "10.0.0.2", "default/gone": "- AddressReleased PoolExhausted", "default/n": "10.0.0.1"}},
		{"two holders of one address: the younger is moved", pools2,
			[]*Service{svc("young", age(2), held("10.0.0.1")), svc("old", age(1), held("10.0.0.1"))},
			map[string]string{"default/old": "10.0.0.1", "default/young": "10.0.0.2 AddressReleased"}},
		{"invalid request keeps what it holds", pools2,
			[]*Service{svc("bad", invalid(`annotation metallb.io/loadBalancerIPs: "x" is not an IP address`), held("10.0.0.2")), svc("n", age(1))},
			map[string]string{"default/bad": "10.0.0.2 InvalidRequest", "default/n": "10.0.0.1"}},
		{"classes", pools2,
			[]*Service{svc("other", class("example.com/lb")), svc("mine")},
			map[string]string{"default/mine": "10.0.0.1"}},
		{"a class of nftgate's own", Config{Pools: pools2.Pools, LoadBalancerClass: "nftgate.io/lb"},
			[]*Service{svc("other"), svc("mine", class("nftgate.io/lb"))},
			map[string]string{"default/mine": "10.0.0.1"}},
		{"not a LoadBalancer", pools2,
			[]*Service{svc("cip", func(s *Service) { s.LoadBalancer = false })},
			map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := compile(t, tc.cfg)
			res := pol.Allocate(tc.services)
			got := map[string]string{}
			for _, al := range res.Allocations {
				got[al.Service.Key.String()] = summary(al)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("%s: %q, want %q (%v)", k, got[k], w, res.Find(keyOf(k)).Problems)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("served %v, want %v", got, tc.want)
			}
			checkNoCollision(t, res)
		})
	}
}

func keyOf(s string) Key {
	ns, n, _ := strings.Cut(s, "/")
	return Key{ns, n}
}

// checkNoCollision fails when two Services hold one address without
// being allowed to share it, or a pool's usage does not add up.
func checkNoCollision(t testing.TB, res *Result) {
	t.Helper()
	holders := map[netip.Addr][]*Service{}
	for _, al := range res.Allocations {
		for _, a := range al.Addresses {
			holders[a.Addr] = append(holders[a.Addr], al.Service)
		}
	}
	for a, hs := range holders {
		seen := map[Port]Key{}
		for _, h := range hs {
			if len(hs) > 1 && (h.SharingKey == "" || h.SharingKey != hs[0].SharingKey || h.Backend != hs[0].Backend) {
				t.Errorf("%s held by %v without a common sharing key", a, hs)
			}
			for _, p := range h.Ports {
				if o, ok := seen[p]; ok {
					t.Errorf("%s: port %v of %s and %s", a, p, o, h.Key)
				}
				seen[p] = h.Key
			}
		}
	}
}

// A Service converted from the API object: families, requests from each
// source in their order, sharing and backend, ports and status.
func TestNewService(t *testing.T) {
	dual := corev1.IPFamilyPolicyPreferDualStack
	single := corev1.IPFamilyPolicySingleStack
	mk := func(ann map[string]string, mod func(*corev1.Service)) *Service {
		o := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: ann, CreationTimestamp: metav1.NewTime(epoch)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
				IPFamilyPolicy: &dual, Ports: []corev1.ServicePort{{Port: 80}, {Port: 53, Protocol: corev1.ProtocolUDP}}},
		}
		if mod != nil {
			mod(o)
		}
		return NewService(o)
	}
	s := mk(map[string]string{"metallb.io/loadBalancerIPs": "10.0.0.7, 2001:db8::7", "metallb.universe.tf/loadBalancerIPs": "10.0.0.8",
		"metallb.io/address-pool": "a", "metallb.universe.tf/allow-shared-ip": "k"}, func(o *corev1.Service) {
		o.Spec.LoadBalancerIP = "10.0.0.9"
		o.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		o.Spec.Selector = map[string]string{"b": "2", "a": "1"}
		o.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.7"}, {Hostname: "x"}}
	})
	if s.Invalid != "" || fmt.Sprint(s.Requested) != "[10.0.0.7 2001:db8::7]" || s.RequestedFrom != "annotation metallb.io/loadBalancerIPs" ||
		s.Pool != "a" || s.SharingKey != "k" || s.Backend != "a=1,b=2" || !slices.Equal(s.Families, []int{4, 6}) || s.RequireAll ||
		fmt.Sprint(s.Ports) != "[{TCP 80} {UDP 53}]" || fmt.Sprint(s.Held) != "[10.0.0.7]" {
		t.Errorf("converted %+v", s)
	}
	s = mk(map[string]string{"nftgate.io/load-balancer-ips": "10.0.0.1", "metallb.io/loadBalancerIPs": "10.0.0.2"}, nil)
	if fmt.Sprint(s.Requested) != "[10.0.0.1]" {
		t.Errorf("nftgate's annotation first: %v", s.Requested)
	}
	s = mk(nil, func(o *corev1.Service) { o.Spec.LoadBalancerIP = "10.0.0.9"; o.Spec.IPFamilyPolicy = &single })
	if fmt.Sprint(s.Requested) != "[10.0.0.9]" || s.RequestedFrom != "spec.loadBalancerIP" || !slices.Equal(s.Families, []int{4}) {
		t.Errorf("spec.loadBalancerIP: %+v", s)
	}
	for ann, want := range map[string]string{
		"10.0.0.x":          `annotation metallb.io/loadBalancerIPs: "10.0.0.x" is not an IP address`,
		"10.0.0.1,10.0.0.2": "10.0.0.1 and 10.0.0.2 are both IPv4",
	} {
		s = mk(map[string]string{"metallb.io/loadBalancerIPs": ann}, nil)
		if !strings.Contains(s.Invalid, want) {
			t.Errorf("%q: Invalid %q, want %q", ann, s.Invalid, want)
		}
	}
	s = mk(map[string]string{"metallb.io/loadBalancerIPs": "2001:db8::1"}, func(o *corev1.Service) { o.Spec.IPFamilyPolicy = &single })
	if !strings.Contains(s.Invalid, "2001:db8::1 is IPv6, but the Service asks for IPv4") {
		t.Errorf("family: Invalid %q", s.Invalid)
	}
}

// manyServices are n Services of varied kinds over a pool big enough for
// all, created one second apart.
func manyServices(n int) []*Service {
	var out []*Service
	for i := range n {
		s := svc(fmt.Sprintf("ns%d/s%d", i%50, i), age(i))
		switch i % 10 {
		case 1:
			s.SharingKey = "k" + itoa(i%7)
			s.Ports = []Port{{corev1.ProtocolTCP, int32(1000 + i%3)}}
		case 2:
			s.Families = []int{4, 6}
		case 3:
			s.Requested, s.RequestedFrom = []netip.Addr{netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})}, "spec.loadBalancerIP"
		}
		out = append(out, s)
	}
	return out
}

var bigPools = Config{Pools: []PoolConfig{
	{Name: "req", Addresses: []string{"10.200.0.0/16"}, AutoAssign: new(false)},
	{Name: "v4", Addresses: []string{"10.0.0.0/16"}},
	{Name: "v6", Addresses: []string{"2001:db8::/112"}},
}}

// The allocation depends on the set of Services, not on their order.
func TestAllocateIgnoresOrder(t *testing.T) {
	pol := compile(t, bigPools)
	svcs := manyServices(2000)
	want := render(pol.Allocate(svcs))
	for i := range 5 {
		shuffled := slices.Clone(svcs)
		rand.New(rand.NewPCG(uint64(i), 1)).Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		if got := render(pol.Allocate(shuffled)); got != want {
			t.Fatalf("order %d gives another allocation", i)
		}
	}
}

// Services arriving one by one, each allocation written back to status
// before the next arrives, end where all of them at once do; and a
// second allocation from status (a restart) changes nothing.
func TestIncrementalEqualsBatchAndRestartIsStable(t *testing.T) {
	pol := compile(t, Config{Pools: []PoolConfig{{Name: "small", Addresses: []string{"10.0.0.0/26"}}, {Name: "v6", Addresses: []string{"2001:db8::/120"}}}})
	svcs := manyServices(120) // more than the IPv4 pool holds: exhaustion too
	for _, s := range svcs {
		s.Requested = nil
	}
	batch := pol.Allocate(svcs)
	var seen []*Service
	for _, s := range svcs {
		seen = append(seen, s)
		res := pol.Allocate(seen)
		for _, x := range seen {
			y := *x
			y.Held = res.Find(x.Key).IPs()
			*x = y
		}
	}
	restarted := pol.Allocate(svcs)
	if a, b := render(batch), render(restarted); a != b {
		t.Fatalf("incremental and batch differ:\n%s", diffLines(a, b))
	}
	for _, al := range restarted.Allocations {
		for _, p := range al.Problems {
			if p.Reason == ReasonReleased {
				t.Errorf("restart released: %v", p)
			}
		}
	}
	checkNoCollision(t, restarted)
}

// A pool change moves only the addresses it leaves outside every pool.
func TestPoolChangeMovesOnlyAddressesOutside(t *testing.T) {
	before := compile(t, Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"10.0.0.0/29"}}}})
	after := compile(t, Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"10.0.0.4/30", "10.0.1.0/30"}}}})
	svcs := []*Service{svc("a", age(1)), svc("b", age(2)), svc("c", age(3)), svc("d", age(4)), svc("e", age(5))}
	for _, s := range svcs {
		s.Held = before.Allocate(svcs).Find(s.Key).IPs()
	}
	got := map[string]string{}
	for _, al := range after.Allocate(svcs).Allocations {
		got[al.Service.Name] = summary(al)
	}
	// e keeps 10.0.0.4; the others, oldest first, get the next free ones.
	want := map[string]string{"a": "10.0.0.5 AddressReleased", "b": "10.0.0.6 AddressReleased", "c": "10.0.0.7 AddressReleased",
		"d": "10.0.1.0 AddressReleased", "e": "10.0.0.4"}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s: %q, want %q", n, got[n], w)
		}
	}
}

func render(res *Result) string {
	var b strings.Builder
	for _, al := range res.Allocations {
		fmt.Fprintf(&b, "%s %s\n", al.Service.Key, summary(al))
	}
	fmt.Fprintf(&b, "%v\n", res.Usage)
	return b.String()
}

func diffLines(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			out = append(out, "- "+al[i], "+ "+bl[i])
		}
		if len(out) > 20 {
			break
		}
	}
	return strings.Join(out, "\n")
}

// 10,000 LoadBalancer Services of every kind (automatic, dual-stack,
// requested, shared) allocated from nothing.
func BenchmarkAllocate10000(b *testing.B) {
	pol := compile(b, bigPools)
	svcs := manyServices(10000)
	b.ReportAllocs()
	for b.Loop() {
		pol.Allocate(svcs)
	}
}

// 10,000 Services all on one port and one sharing key: none can share,
// and the scan for a shareable address must not make this quadratic.
func BenchmarkAllocateSharingKeyOnePort(b *testing.B) {
	pol := compile(b, bigPools)
	var svcs []*Service
	for i := range 10000 {
		svcs = append(svcs, svc("s"+itoa(i), age(i), share("k")))
	}
	for b.Loop() {
		pol.Allocate(svcs)
	}
}

// 10,000 Services all get an address, shared only by a sharing key; how long it
// takes is measured by BenchmarkAllocate (a timed test would fail with the
// machine's load).
func TestAllocateTenThousand(t *testing.T) {
	pol := compile(t, bigPools)
	svcs := manyServices(10000)
	res := pol.Allocate(svcs)
	if len(res.Allocations) != 10000 {
		t.Fatalf("%d of 10,000 Services allocated", len(res.Allocations))
	}
	// An address is given twice only to Services of one sharing key.
	holder := map[netip.Addr]*Service{}
	for _, a := range res.Allocations {
		for _, ip := range a.IPs() {
			if h, ok := holder[ip]; ok && (h.SharingKey == "" || h.SharingKey != a.Service.SharingKey) {
				t.Fatalf("address %s given to %s and %s", ip, h.Key, a.Service.Key)
			}
			holder[ip] = a.Service
		}
	}
}
