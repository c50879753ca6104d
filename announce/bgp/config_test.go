package bgp

import (
	"fmt"
	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestConfigDecodesFromTOML(t *testing.T) {
	src := `
[bgp]
asn = 64513
router_id = "198.18.0.2"
restart_time = "60s"
[[bgp.peer]]
address = "198.18.0.1"
asn = 64512
hold_time = "30s"
multihop = 3
[bgp.pool.public]
communities = ["64512:100", "no-export"]
local_preference = 200
`
	var doc struct {
		BGP Config `toml:"bgp"`
	}
	md, err := toml.Decode(src, &doc)
	if err != nil {
		t.Fatal(err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("undecoded keys: %v", u)
	}
	c := doc.BGP.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p := c.Peers[0]
	if c.RestartTime != time.Minute || p.HoldTime != 30*time.Second || p.Multihop != 3 || p.LocalASN != 64513 || p.Port != 179 || p.ConnectRetry != DefaultConnectRetry {
		t.Fatalf("decoded %+v", c)
	}
	if got := c.Pools["public"]; got.LocalPreference != 200 || len(got.Communities) != 2 {
		t.Fatalf("pool %+v", got)
	}
}

func TestBadConfigNamesFieldAndValue(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := func() Config {
		return Config{ASN: 64513, RouterID: "198.18.0.2", Peers: []PeerConfig{{Address: "198.18.0.1", ASN: 64512}}}
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.ASN = 0 }, `bgp.asn = 0: required`},
		{func(c *Config) { c.RouterID = "2001:db8::1" }, `bgp.router_id = "2001:db8::1": want an IPv4 address`},
		{func(c *Config) { c.RestartTime = 5000 * time.Second }, `bgp.restart_time = "1h23m20s": want whole seconds from 1s to 4095s`},
		{func(c *Config) { c.NextHopIPv6 = "198.18.0.2" }, `bgp.next_hop_ipv6 = "198.18.0.2": want an IPv6 address`},
		{func(c *Config) { c.Peers[0].Address = "router" }, `bgp.peer[0].address = "router": want an IP address`},
		{func(c *Config) { c.Peers = append(c.Peers, c.Peers[0]) }, `bgp.peer[1].address = "198.18.0.1": the same peer as bgp.peer[0]`},
		{func(c *Config) { c.Peers[0].ASN = 0 }, `bgp.peer[0].asn = 0: required`},
		{func(c *Config) { c.Peers[0].HoldTime = time.Second }, `bgp.peer[0].hold_time = "1s": want whole seconds from 3s to 65535s`},
		{func(c *Config) { c.Peers[0].IdleHoldAfterReset = 1500 * time.Millisecond }, `bgp.peer[0].idle_hold_after_reset = "1.5s": want whole seconds from 1s to 1h`},
		{func(c *Config) { c.Peers[0].IdleHoldAfterReset = -time.Second }, `bgp.peer[0].idle_hold_after_reset = "-1s": want whole seconds from 1s to 1h`},
		{func(c *Config) {
			c.Peers[0].IdleHoldAfterReset = 10 * time.Second
			c.Peers[0].IdleHoldAfterResetMax = 5 * time.Second
		}, `bgp.peer[0].idle_hold_after_reset_max = "5s": want whole seconds from idle_hold_after_reset (10s) to 1h`},
		{func(c *Config) { c.Peers[0].Multihop = 1 }, `bgp.peer[0].multihop = 1: want a TTL from 2 to 255`},
		{func(c *Config) { c.Peers[0].Multihop = 2; c.Peers[0].BFD = true }, `bgp.peer[0].bfd = true: BFD is single-hop only`},
		{func(c *Config) { c.Peers[0].PasswordFile = filepath.Join(dir, "missing") }, `bgp.peer[0].password_file = "` + filepath.Join(dir, "missing") + `": open `},
		{func(c *Config) { c.Peers[0].PasswordFile = empty }, `bgp.peer[0].password_file = "` + empty + `": the password must be 1 to 80 bytes (has 0)`},
		{func(c *Config) { c.ListenPort = -1; c.Peers[0].Passive = true }, `bgp.peer[0].passive = true: a passive peer needs listen_port`},
		{func(c *Config) { c.Pools = map[string]PoolConfig{"public": {Communities: []string{"65536:1"}}} }, `bgp.pool."public".communities[0] = "65536:1": want "ASN:value"`},
	} {
		c := good()
		tc.edit(&c)
		err := c.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error containing %q, got %v", tc.want, err)
		}
		if _, err := New(c, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New: want an error containing %q, got %v", tc.want, err)
		}
	}
}

// Set keeps the announced set equal to its argument, and touches only what
// changed (GoBGP's own table is the proof: a path left alone keeps its age).
func TestSetIsDeclarative(t *testing.T) {
	s, err := New(Config{ASN: 64513, RouterID: "198.18.0.2", ListenPort: -1, Pools: map[string]PoolConfig{"p": {Communities: []string{"64513:7"}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(t.Context())
	a, b, c := netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.0.2"), netip.MustParseAddr("2001:db8:ff::1")
	check := func(want ...Route) {
		t.Helper()
		got := s.Announced()
		if len(got) != len(want) {
			t.Fatalf("announced %v, want %v", got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("announced %v, want %v", got, want)
			}
		}
		if n := len(s.globalPaths()); n != len(want) {
			t.Fatalf("GoBGP holds %d paths, want %d", n, len(want))
		}
	}
	if err := s.Set([]Route{HostRoute(a, ""), HostRoute(b, "p"), HostRoute(c, "")}); err != nil {
		t.Fatal(err)
	}
	check(HostRoute(a, ""), HostRoute(b, "p"), HostRoute(c, ""))
	if err := s.Set([]Route{HostRoute(b, ""), HostRoute(c, "")}); err != nil {
		t.Fatal(err)
	}
	check(HostRoute(b, ""), HostRoute(c, ""))
	if err := s.Set([]Route{{Prefix: netip.Prefix{}}, HostRoute(a, "")}); err == nil || !strings.Contains(err.Error(), "not a prefix") {
		t.Fatalf("invalid prefix: %v", err)
	}
	check(HostRoute(a, ""))
	reg := prometheus.NewRegistry()
	if err := s.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nftgate_bgp_announced_prefixes Prefixes this gateway announces (to every peer of their address family).
# TYPE nftgate_bgp_announced_prefixes gauge
nftgate_bgp_announced_prefixes 1
`), "nftgate_bgp_announced_prefixes"); err != nil {
		t.Fatal(err)
	}
}

// globalPaths lists the paths of this speaker's own table.
func (s *Speaker) globalPaths() []netip.Prefix {
	var out []netip.Prefix
	for _, f := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
		_ = s.bgp.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: f}, func(nlri bgp.NLRI, _ []*apiutil.Path) {
			if p, ok := nlri.(*bgp.IPAddrPrefix); ok {
				out = append(out, p.Prefix)
			}
		})
	}
	return out
}

// The commented [bgp] example in config.toml, uncommented, decodes into
// Config with every key known, and its values are the defaults.
func TestConfigTOMLExample(t *testing.T) {
	b, err := os.ReadFile("../../config.toml")
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(b), "\n# [bgp]\n")
	if !ok {
		t.Fatal("config.toml has no commented [bgp] section")
	}
	// The section ends at the first blank line; other sections follow.
	example, _, _ = strings.Cut(example, "\n\n")
	var src strings.Builder
	src.WriteString("[bgp]\n")
	for _, line := range strings.Split(example, "\n") {
		if rest, ok := strings.CutPrefix(line, "# "); ok && !strings.HasPrefix(rest, "# ") {
			src.WriteString(rest + "\n")
		}
	}
	var doc struct {
		BGP Config `toml:"bgp"`
	}
	md, err := toml.Decode(src.String(), &doc)
	if err != nil {
		t.Fatalf("%v in:\n%s", err, src.String())
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("keys Config does not know: %v", u)
	}
	c := doc.BGP
	if err := c.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	p := c.Peers[0]
	d := Config{ASN: c.ASN, RouterID: c.RouterID, Peers: []PeerConfig{{Address: p.Address, ASN: p.ASN}}}.WithDefaults()
	dp := d.Peers[0]
	dp.LocalASN = 0
	if c.ListenPort != d.ListenPort || c.RestartTime != d.RestartTime || c.SelectionDeferral != d.SelectionDeferral ||
		p.Port != dp.Port || p.HoldTime != dp.HoldTime || p.ConnectRetry != dp.ConnectRetry ||
		p.IdleHoldAfterReset != dp.IdleHoldAfterReset || p.IdleHoldAfterResetMax != dp.IdleHoldAfterResetMax || p.BFDInterval != dp.BFDInterval || p.BFDMultiplier != dp.BFDMultiplier || p.LocalASN != 0 {
		t.Fatalf("config.toml's example %+v differs from the defaults %+v", c, d)
	}
}

// The gateway's MED and AS-path prepend go with every route; a pool's
// replace them for its addresses; a pool that sets neither keeps the
// gateway's.
func TestMEDAndPrependPerGatewayAndPool(t *testing.T) {
	med, poolMED, none := uint32(50), uint32(200), 0
	s, err := New(Config{ASN: 64513, RouterID: "198.18.0.2", ListenPort: -1, MED: &med, ASPathPrepend: 2,
		Peers: []PeerConfig{{Address: "198.18.0.1", ASN: 64512}},
		Pools: map[string]PoolConfig{
			"backup": {MED: &poolMED, ASPathPrepend: &none},
			"plain":  {LocalPreference: 1},
		}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(t.Context())
	prefix := netip.MustParsePrefix("198.19.0.1/32")
	for _, tc := range []struct {
		pool string
		med  uint32
		path string
	}{
		{"", 50, "64513 64513"},
		{"plain", 50, "64513 64513"},
		{"backup", 200, ""},
	} {
		p, err := s.path(prefix, tc.pool, false)
		if err != nil {
			t.Fatal(err)
		}
		var gotMED *uint32
		gotPath := ""
		for _, a := range p.Attrs {
			switch a := a.(type) {
			case *bgp.PathAttributeMultiExitDisc:
				gotMED = &a.Value
			case *bgp.PathAttributeAsPath:
				for _, seg := range a.Value {
					gotPath = strings.Trim(fmt.Sprint(seg.(*bgp.As4PathParam).AS), "[]")
				}
			}
		}
		if gotMED == nil || *gotMED != tc.med || gotPath != tc.path {
			t.Errorf("pool %q: MED %v, AS path %q; want %d, %q", tc.pool, fmtMED(gotMED), gotPath, tc.med, tc.path)
		}
	}
}

func TestPrependRefusedTowardsIBGP(t *testing.T) {
	two := 2
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{ASPathPrepend: 11}, `bgp.as_path_prepend = 11: want 0 to 10`},
		{Config{ASPathPrepend: 1, Peers: []PeerConfig{{Address: "198.18.0.1", ASN: 64513}}}, `bgp.as_path_prepend = 1: bgp.peer[0] (198.18.0.1) is iBGP`},
		{Config{Pools: map[string]PoolConfig{"p": {ASPathPrepend: &two}}, Peers: []PeerConfig{{Address: "198.18.0.1", ASN: 64513}}}, `bgp.pool."p".as_path_prepend = 2: bgp.peer[0] (198.18.0.1) is iBGP`},
	} {
		c := tc.c
		c.ASN, c.RouterID = 64513, "198.18.0.2"
		if err := c.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error containing %q, got %v", tc.want, err)
		}
	}
}

func fmtMED(m *uint32) string {
	if m == nil {
		return "none"
	}
	return fmt.Sprint(*m)
}
