package l2

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func TestConfigDecodesFromTOML(t *testing.T) {
	src := `
[l2]
interfaces = ["eth0", "vlan.42"]
gratuitous_interval = "250ms"
`
	var doc struct {
		L2 Config `toml:"l2"`
	}
	md, err := toml.Decode(src, &doc)
	if err != nil {
		t.Fatal(err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("undecoded keys: %v", u)
	}
	c := doc.L2.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.Interfaces) != 2 || c.Interfaces[1] != "vlan.42" || c.GratuitousCount != DefaultGratuitousCount || c.GratuitousInterval != 250*time.Millisecond {
		t.Fatalf("decoded %+v", c)
	}
}

func TestBadConfigNamesFieldAndValue(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Interfaces = nil }, `l2.interfaces = []: want at least one interface`},
		{func(c *Config) { c.Interfaces[0] = "" }, `l2.interfaces[0] = "": not an interface name`},
		{func(c *Config) { c.Interfaces[0] = "a-very-long-interface" }, `l2.interfaces[0] = "a-very-long-interface": interface names have at most 15 bytes`},
		{func(c *Config) { c.Interfaces[0] = "eth0/1" }, `l2.interfaces[0] = "eth0/1": an interface name has no '/'`},
		{func(c *Config) { c.Interfaces = append(c.Interfaces, "eth0") }, `l2.interfaces[1] = "eth0": listed twice (also l2.interfaces[0])`},
		{func(c *Config) { c.GratuitousCount = -1 }, `l2.gratuitous_count = -1: want 1 to 100`},
		{func(c *Config) { c.GratuitousInterval = time.Millisecond }, `l2.gratuitous_interval = "1ms": want 10ms to 1m`},
	} {
		c := Config{Interfaces: []string{"eth0"}}
		tc.edit(&c)
		err := c.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// New names the interface it cannot use, and holds nothing open.
func TestNewNamesMissingInterface(t *testing.T) {
	_, err := New(Config{Interfaces: []string{"lo", "nftg-missing0"}}, nil)
	if err == nil || !strings.Contains(err.Error(), `l2.interfaces[0] = "lo": not an Ethernet interface`) {
		t.Fatalf("got %v", err)
	}
}

// The commented example in config.toml, uncommented, is a valid
// configuration.
func TestConfigTomlExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "# --- L2 announcement")
	if !ok {
		t.Fatal("config.toml has no L2 announcement section")
	}
	section, _, _ = strings.Cut(section, "\n\n")
	var text []string
	example := false
	for _, l := range strings.Split(section, "\n") {
		example = example || l == "# [l2]"
		if example {
			text = append(text, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
		}
	}
	var doc struct {
		L2 Config `toml:"l2"`
	}
	md, err := toml.Decode(strings.Join(text, "\n"), &doc)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("unknown keys %v", und)
	}
	c := doc.L2
	if err := c.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	if d := (Config{Interfaces: c.Interfaces}).WithDefaults(); d.GratuitousCount != c.GratuitousCount || d.GratuitousInterval != c.GratuitousInterval {
		t.Fatalf("config.toml shows %+v, defaults are %+v", c, d)
	}
}
