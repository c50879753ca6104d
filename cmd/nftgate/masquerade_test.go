package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
)

// masquerade_addresses: addresses and CIDRs of both families, an IPv4 CIDR
// without its network and broadcast addresses, in the order given.
func TestMasqueradeAddresses(t *testing.T) {
	cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--config", writeConfig(t,
		"masquerade_addresses = [\"198.51.100.8/30\", \"2001:db8::7\", \"203.0.113.9\", \"2001:db8:1::/127\"]\n")})
	if err != nil {
		t.Fatal(err)
	}
	var want []netip.Addr
	for _, s := range []string{"198.51.100.9", "198.51.100.10", "2001:db8::7", "203.0.113.9", "2001:db8:1::", "2001:db8:1::1"} {
		want = append(want, netip.MustParseAddr(s))
	}
	if !slices.Equal(cfg.masqueradeAddrs, want) {
		t.Errorf("masquerade addresses %v, want %v", cfg.masqueradeAddrs, want)
	}
	if rc := cfg.ruleset(); !slices.Equal(rc.MasqueradeAddresses, want) || rc.KeepClientAddress {
		t.Errorf("ruleset config %v, keep %v", rc.MasqueradeAddresses, rc.KeepClientAddress)
	}
	cfg, _, err = loadConfig("nftgate", []string{"--node-name", "n", "--keep-client-address", "--masquerade-address", "198.51.100.1"})
	if err != nil || !cfg.ruleset().KeepClientAddress || len(cfg.masqueradeAddrs) != 1 {
		t.Errorf("flags: %v, %+v", err, cfg)
	}
}

func TestBadMasqueradeAddressesNameTheValue(t *testing.T) {
	pool := "[[pools]]\nname = \"public\"\naddresses = [\"198.51.100.0/28\"]\n"
	checkConfigErrors(t, []badConfig{
		{args: []string{"--masquerade-address", "nonsense"}, want: []string{"masquerade_addresses[0]", "nonsense", "not an address or a CIDR"}},
		{args: []string{"--masquerade-address", "198.51.100.300"}, want: []string{"masquerade_addresses[0]", "198.51.100.300"}},
		{args: []string{"--masquerade-address", "::ffff:198.51.100.1"}, want: []string{"masquerade_addresses[0]", "::ffff:198.51.100.1", "IPv4-mapped"}},
		{args: []string{"--masquerade-address", "fe80::1%eth0"}, want: []string{"masquerade_addresses[0]", "fe80::1%eth0"}},
		{args: []string{"--masquerade-address", "127.0.0.2"}, want: []string{"masquerade_addresses[0]", "127.0.0.2", "loopback"}},
		{args: []string{"--masquerade-address", "224.0.0.9"}, want: []string{"masquerade_addresses[0]", "224.0.0.9"}},
		{args: []string{"--masquerade-address", "203.0.113.0/24"}, want: []string{"masquerade_addresses[0]", "203.0.113.0/24", "more than 64 ip"}},
		{args: []string{"--masquerade-address", "2001:db8::/64"}, want: []string{"masquerade_addresses[0]", "2001:db8::/64", "more than 64 ip6"}},
		{args: []string{"--masquerade-address", "203.0.113.1", "--masquerade-address", "203.0.113.0/30"}, want: []string{"masquerade_addresses[1]", "203.0.113.0/30", "repeats", "203.0.113.1"}},
		{args: []string{"--cluster-cidr", "10.0.0.0/8", "--masquerade-address", "10.1.2.3"}, want: []string{"masquerade_addresses[0]", "10.1.2.3", "cluster_cidrs", "10.0.0.0/8"}},
		{args: []string{"--external-ip-cidr", "203.0.113.0/24", "--masquerade-address", "203.0.113.7"}, want: []string{"masquerade_addresses[0]", "203.0.113.7", "external_ip_cidrs", "203.0.113.0/24"}},
		{file: "masquerade_addresses = [\"203.0.113.1\", \"198.51.100.4/30\"]\n" + pool, want: []string{"masquerade_addresses[1]", "198.51.100.4/30", "pool \"public\""}},
	})
}

// gatewaySet is a [gateways] section of mode with one peer, gw-b, whose
// masquerade_addresses are peerMasq (TOML).
func gatewaySet(mode, peerMasq string) string {
	return "[gateways]\nname = \"gw-a\"\nkey_file = \"k\"\nmode = \"" + mode + "\"\n[[gateways.peers]]\nname = \"gw-b\"\naddresses = [\"10.0.0.2:7480\"]\nmasquerade_addresses = " + peerMasq + "\n"
}

// Active-active: each gateway's masquerade addresses are its home; this
// gateway announces its peers' too (while it holds them), and masquerades
// to its own only.
func TestActiveActiveMasqueradeHomes(t *testing.T) {
	cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--config", writeConfig(t,
		"masquerade_addresses = [\"198.51.100.1\"]\n"+gatewaySet("active-active", "[\"198.51.100.2\", \"2001:db8::2\"]"))})
	if err != nil {
		t.Fatal(err)
	}
	a1, a2, a6 := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("2001:db8::2")
	if h := cfg.Gateways.Homes; !slices.Equal(h["gw-a"], []netip.Addr{a1}) || !slices.Equal(h["gw-b"], []netip.Addr{a2, a6}) {
		t.Errorf("homes %v", h)
	}
	if got := cfg.floatingMasquerade(); !slices.Equal(got, []netip.Addr{a1, a2, a6}) {
		t.Errorf("floating masquerade addresses %v", got)
	}
	if got := cfg.ruleset().MasqueradeAddresses; !slices.Equal(got, []netip.Addr{a1}) {
		t.Errorf("masqueraded to %v, want its own only", got)
	}
}

func TestBadPeerMasqueradeAddressesNameTheValue(t *testing.T) {
	pool := "[[pools]]\nname = \"public\"\naddresses = [\"198.51.100.0/28\"]\n"
	key := "gateways.peers[0].masquerade_addresses"
	checkConfigErrors(t, []badConfig{
		{file: "masquerade_addresses = [\"203.0.113.1\"]\n" + gatewaySet("active-active", "[\"203.0.113.0/30\"]"),
			want: []string{key + "[0]", "203.0.113.0/30", "repeats", "203.0.113.1"}},
		{file: gatewaySet("active-active", "[\"203.0.113.9\", \"nonsense\"]"), want: []string{key + "[1]", "nonsense"}},
		{file: pool + gatewaySet("active-active", "[\"198.51.100.4\"]"), want: []string{key + "[0]", "198.51.100.4", "pool \"public\""}},
		{args: []string{"--cluster-cidr", "10.0.0.0/8"}, file: gatewaySet("active-active", "[\"10.9.9.9\"]"), want: []string{key + "[0]", "10.9.9.9", "cluster_cidrs"}},
		{file: gatewaySet("active-backup", "[\"203.0.113.9\"]"), want: []string{key, "203.0.113.9", "only in mode \"active-active\""}},
		{file: gatewaySet("both", "[]"), want: []string{"gateways.mode", "both"}},
	})
}

// The CPU count behind the masquerade port groups is read from the kernel's
// CPU list; what cannot be read counts the process's CPUs.
func TestCPUCount(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		list string
		want int
	}{
		{"0\n", 1},
		{"0-1\n", 2},
		{"0-63\n", 64},
		{"0,2-3,8\n", 9},
		{"0-3,5", 6},
	} {
		file := filepath.Join(dir, "online")
		if err := os.WriteFile(file, []byte(c.list), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := cpuCount(file); got != c.want {
			t.Errorf("cpuCount of %q = %d, want %d", c.list, got, c.want)
		}
	}
	for _, bad := range []string{"", "x-3", "0--1", "\n"} {
		file := filepath.Join(dir, "online")
		if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := cpuCount(file); got != runtime.NumCPU() {
			t.Errorf("cpuCount of %q = %d, want the process's %d", bad, got, runtime.NumCPU())
		}
	}
	if got := cpuCount(filepath.Join(dir, "missing")); got != runtime.NumCPU() {
		t.Errorf("cpuCount of a missing file = %d, want the process's %d", got, runtime.NumCPU())
	}
	cfg := defaults()
	cfg.MasqueradePortsByCPU = false
	if g := cfg.masqueradePortGroups(); g != 1 {
		t.Errorf("masquerade_ports_by_cpu = false gives %d groups, want 1", g)
	}
}
