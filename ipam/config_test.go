package ipam

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestConfigErrorsNamePoolFieldAndValue(t *testing.T) {
	no := false
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // every one in the error
	}{
		{"empty range", Config{Pools: []PoolConfig{{Name: "web", Addresses: []string{"10.0.0.9-10.0.0.1"}}}},
			[]string{`pools[0] (name "web")`, "addresses", `"10.0.0.9-10.0.0.1"`, "empty"}},
		{"range across families", Config{Pools: []PoolConfig{{Name: "web", Addresses: []string{"10.0.0.1-2001:db8::1"}}}},
			[]string{`pools[0] (name "web")`, `"10.0.0.1-2001:db8::1"`, "crosses address families"}},
		{"not an address", Config{Pools: []PoolConfig{{Name: "a", Addresses: []string{"10.0.0.0/24", "nope"}}}},
			[]string{`pools[0] (name "a")`, `"nope"`}},
		{"host bits", Config{Pools: []PoolConfig{{Name: "a", Addresses: []string{"10.0.0.5/24"}}}},
			[]string{`"10.0.0.5/24"`, "10.0.0.0/24"}},
		{"no addresses", Config{Pools: []PoolConfig{{Name: "a"}}},
			[]string{`pools[0] (name "a"): addresses: empty`}},
		{"overlapping pools", Config{Pools: []PoolConfig{
			{Name: "a", Addresses: []string{"10.0.0.0/24"}},
			{Name: "b", Addresses: []string{"10.0.0.200-10.0.1.5"}}}},
			[]string{`pool "a" (10.0.0.0-10.0.0.255)`, `pool "b" (10.0.0.200-10.0.1.5)`, "overlap"}},
		{"overlap inside a pool", Config{Pools: []PoolConfig{{Name: "a", Addresses: []string{"2001:db8::/120", "2001:db8::10"}}}},
			[]string{`pool "a"`, "overlap"}},
		{"duplicate name", Config{Pools: []PoolConfig{
			{Name: "a", Addresses: []string{"10.0.0.1"}}, {Name: "a", Addresses: []string{"10.0.0.2"}, AutoAssign: &no}}},
			[]string{`pools[1] (name "a"): name "a": already the name of pools[0]`}},
		{"bad name", Config{Pools: []PoolConfig{{Name: "Web_1", Addresses: []string{"10.0.0.1"}}}},
			[]string{`pools[0] (name "Web_1"): name "Web_1"`}},
		{"no name", Config{Pools: []PoolConfig{{Addresses: []string{"10.0.0.1"}}}},
			[]string{`pools[0]: name ""`}},
		{"bad namespace", Config{Pools: []PoolConfig{{Name: "a", Addresses: []string{"10.0.0.1"}, Namespaces: []string{"Prod"}}}},
			[]string{`pools[0] (name "a"): namespaces: "Prod"`}},
		{"bad selector", Config{Pools: []PoolConfig{{Name: "a", Addresses: []string{"10.0.0.1"}, ServiceSelector: "app in (x"}}},
			[]string{`pools[0] (name "a"): service_selector: "app in (x"`}},
		{"bad class", Config{LoadBalancerClass: "nftgate"},
			[]string{`load_balancer_class = "nftgate"`, "prefix"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.Compile()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigFromTOML(t *testing.T) {
	const text = `
load_balancer_class = "nftgate.io/lb"

[[pools]]
name = "public"
addresses = ["192.0.2.0/24", "2001:db8:1::/120", "198.51.100.10-198.51.100.20"]
skip_network_and_broadcast = true

[[pools]]
name = "internal"
addresses = ["10.96.0.0/28"]
auto_assign = false
namespaces = ["prod"]
service_selector = "tier=internal"
`
	var cfg Config
	md, err := toml.Decode(text, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("undecoded keys %v", und)
	}
	pol, err := cfg.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if pol.Class != "nftgate.io/lb" || len(pol.Pools) != 2 {
		t.Fatalf("policy %+v", pol)
	}
	pub, in := pol.Pools[0], pol.Pools[1]
	// 256 - .0 - .255, 11 in the range (none ends in .0 or .255), 256 IPv6.
	if got, want := pub.Size(), uint64(254+11+256); got != want {
		t.Errorf("public size %d, want %d", got, want)
	}
	if !pub.AutoAssign || in.AutoAssign {
		t.Errorf("auto_assign: public %v internal %v", pub.AutoAssign, in.AutoAssign)
	}
	if got := in.Size(); got != 16 {
		t.Errorf("internal size %d, want 16", got)
	}
	for addr, want := range map[string]string{"192.0.2.77": "public", "198.51.100.20": "public", "198.51.100.21": "", "10.96.0.15": "internal", "2001:db8:1::ff": "public", "2001:db8:1::100": ""} {
		p := pol.PoolOf(mustAddr(addr))
		got := ""
		if p != nil {
			got = p.Name
		}
		if got != want {
			t.Errorf("PoolOf(%s) = %q, want %q", addr, got, want)
		}
	}
}

func TestSkipNetworkAndBroadcastSize(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		want  uint64
	}{
		{[]string{"10.0.0.16/28"}, 14},            // .16 and .31
		{[]string{"10.0.0.0/23"}, 512 - 4},        // .0.0, .0.255, .1.0, .1.255
		{[]string{"10.0.0.250-10.0.1.5"}, 12 - 2}, // .0.255 and .1.0
		{[]string{"10.0.0.7"}, 1},
		{[]string{"2001:db8::/126"}, 4}, // IPv6 has none
	} {
		pol, err := Config{Pools: []PoolConfig{{Name: "p", Addresses: tc.addrs, SkipNetworkAndBroadcast: true}}}.Compile()
		if err != nil {
			t.Fatal(err)
		}
		if got := pol.Pools[0].Size(); got != tc.want {
			t.Errorf("%v: size %d, want %d", tc.addrs, got, tc.want)
		}
		// The size is what allocation hands out.
		var svcs []*Service
		for i := range 600 {
			s := lb("ns", "s"+itoa(i))
			if tc.addrs[0][0] == '2' {
				s.Families = []int{6}
			}
			s.Created = s.Created.Add(secs(i))
			svcs = append(svcs, s)
		}
		res := pol.Allocate(svcs)
		if res.Usage[0].Used != tc.want || res.Usage[0].Free != 0 {
			t.Errorf("%v: usage %+v, want %d used", tc.addrs, res.Usage[0], tc.want)
		}
		for _, al := range res.Allocations {
			for _, a := range al.IPs() {
				if a.Is4() && (a.As4()[3] == 0 || a.As4()[3] == 255 || tc.addrs[0] == "10.0.0.16/28" && (a == mustAddr("10.0.0.16") || a == mustAddr("10.0.0.31"))) {
					t.Errorf("%v: handed out %s", tc.addrs, a)
				}
			}
		}
	}
}

func TestHugeIPv6PoolSaturates(t *testing.T) {
	pol, err := Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"2001:db8::/64", "2001:db9::/64"}}}}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if got := pol.Pools[0].Size(); got != ^uint64(0) {
		t.Errorf("size %d, want saturated", got)
	}
}

// The commented example in config.toml, uncommented, is a valid
// configuration.
func TestConfigTomlExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "# --- LoadBalancer address allocation")
	if !ok {
		t.Fatal("config.toml has no LoadBalancer address allocation section")
	}
	var text []string
	example := false
	for _, l := range strings.Split(section, "\n") {
		example = example || strings.HasPrefix(l, "# [[pools]]")
		if example || strings.HasPrefix(l, "# load_balancer_class") {
			text = append(text, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
		}
	}
	var cfg Config
	md, err := toml.Decode(strings.Join(text, "\n"), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("unknown keys %v", und)
	}
	if _, err := cfg.Compile(); err != nil || len(cfg.Pools) != 2 {
		t.Fatalf("%v, %d pools", err, len(cfg.Pools))
	}
}
