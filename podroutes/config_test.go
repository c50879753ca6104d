package podroutes

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// The commented keys in config.toml, uncommented, decode into Config and
// give the defaults.
func TestConfigTomlExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "# --- Routes to pods")
	if !ok {
		t.Fatal("config.toml has no section on routes to pods")
	}
	var text []string
	for _, l := range strings.Split(section, "\n")[1:] {
		if strings.HasPrefix(l, "# pod_routes") {
			text = append(text, strings.TrimPrefix(l, "# "))
		}
		if !strings.HasPrefix(l, "#") {
			break
		}
	}
	if len(text) != 4 {
		t.Fatalf("keys %q, want 4", text)
	}
	var cfg Config
	md, err := toml.Decode(strings.Join(text, "\n"), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("unknown keys %v", und)
	}
	p, err := cfg.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	def, _ := Config{}.Compile(nil)
	if p.Mode != def.Mode || p.Table != def.Table || p.RepairInterval != def.RepairInterval {
		t.Errorf("config.toml gives %+v, the defaults are %+v", p, def)
	}
}

func TestConfigFromTOML(t *testing.T) {
	var cfg Config
	if _, err := toml.Decode("pod_routes = \"endpoint\"\npod_routes_table = 100\npod_routes_repair_interval = \"2s\"\n", &cfg); err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Compile([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != Endpoint || p.Table != 100 || p.RepairInterval != 2*time.Second {
		t.Errorf("%+v", p)
	}
}
