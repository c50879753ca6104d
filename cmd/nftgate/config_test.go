package main

import (
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The documented config.toml holds every key, each at its default.
func TestDocumentedConfigIsTheDefault(t *testing.T) {
	cfg, _, err := loadConfig("nftgate", []string{"--config", filepath.Join("..", "..", "config.toml"), "--node-name", "n"})
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.NodeName = "n"
	if err := want.validate(); err != nil {
		t.Fatal(err)
	}
	// An empty list in the file is the default's absent list.
	if len(cfg.ClusterCIDRs) == 0 && len(cfg.NodePortAddresses) == 0 {
		cfg.ClusterCIDRs, cfg.NodePortAddresses = nil, nil
	}
	if len(cfg.HTTPAllowedHosts) == 0 {
		cfg.HTTPAllowedHosts = nil
	}
	if !reflect.DeepEqual(cfg, &want) {
		t.Errorf("config.toml differs from the defaults:\n got %+v\nwant %+v", *cfg, want)
	}
}

func TestFlagsOverrideTheFile(t *testing.T) {
	p := writeConfig(t, "table = \"fromfile\"\ncluster_cidrs = [\"10.0.0.0/8\"]\nmin_sync_interval = \"1s\"\n")
	cfg, _, err := loadConfig("nftgate", []string{"--config", p, "--table", "fromflag", "--cluster-cidr", "10.1.0.0/16", "--cluster-cidr", "fd00::/64", "--node-name", "n"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Table != "fromflag" || time.Duration(cfg.MinSyncInterval) != time.Second {
		t.Errorf("got table %q, min_sync_interval %s", cfg.Table, cfg.MinSyncInterval)
	}
	if got := strings.Join(cfg.ClusterCIDRs, ","); got != "10.1.0.0/16,fd00::/64" {
		t.Errorf("cluster CIDRs %s: the flag must replace the file's list", got)
	}
}

// Every bad input is an error that names the key or flag and the value.
func TestBadConfigNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		file string
		args []string
		want []string
	}{
		{file: "bogus = 1\n", want: []string{"unknown key bogus"}},
		{file: "min_sync_interval = \"soon\"\n", want: []string{"min_sync_interval", "soon"}},
		{file: "cluster_cidrs = [\"10.0.0.0/33\"]\n", want: []string{"cluster_cidrs[0]", "10.0.0.0/33"}},
		{args: []string{"--nodeport-addresses", "nonsense"}, want: []string{"nodeport_addresses[0]", "nonsense"}},
		{args: []string{"--listen", "9180"}, want: []string{"listen", "9180"}},
		{args: []string{"--log-level", "loud"}, want: []string{"log_level", "loud"}},
		{args: []string{"--log-format", "xml"}, want: []string{"log_format", "xml"}},
		{args: []string{"--table", "a b"}, want: []string{"table", "a b"}},
		{file: "masquerade_bit = 3\n", want: []string{"masquerade_bit", "0x3"}},
		{args: []string{"--kubeconfig", "k", "--manifests", "d"}, want: []string{"manifests", "kubeconfig"}},
		{args: []string{"stray"}, want: []string{"unexpected argument", "stray"}},
		{args: []string{"--reconcile-interval", "-1s"}, want: []string{"reconcile_interval", "-1s"}},
		{file: "memory_limit = \"96MB\"\n", want: []string{"memory_limit", "96MB"}},
		{file: "memory_limit = \"-1MiB\"\n", want: []string{"memory_limit", "-1MiB"}},
		{args: []string{"--memory-limit", "lots"}, want: []string{"memory-limit", "lots"}},
		{args: []string{"--pprof", "--listen", ":9180"}, want: []string{"pprof", "listen", ":9180", "auth_user"}},
		{args: []string{"--pprof", "--listen", "0.0.0.0:9180"}, want: []string{"pprof", "listen", "0.0.0.0:9180"}},
		{args: []string{"--pprof", "--listen", "10.0.0.1:9180"}, want: []string{"pprof", "listen", "10.0.0.1:9180"}},
		{file: "http_allowed_hosts = [\"ok.example\", \"a b\"]\n", want: []string{"http_allowed_hosts[1]", "a b"}},
		{args: []string{"--http-allowed-host", "evil/x"}, want: []string{"http_allowed_hosts[0]", "evil/x"}},
		{file: "tls_cert_file = \"c.pem\"\n", want: []string{"tls_cert_file", "tls_key_file"}},
		{file: "tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\ntls_self_signed_dir = \"/perm/tls\"\n", want: []string{"tls_self_signed_dir", "/perm/tls", "c.pem"}},
	} {
		args := append([]string{"--node-name", "n"}, tc.args...)
		if tc.file != "" {
			args = append(args, "--config", writeConfig(t, tc.file))
		}
		_, _, err := loadConfig("nftgate", args)
		if err == nil {
			t.Errorf("%q %v: accepted", tc.file, tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q %v: error %q does not name %q", tc.file, tc.args, err, w)
			}
		}
	}
}

// pprof without auth is accepted on loopback only.
func TestPprofWithoutAuthOnLoopback(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:9180", "[::1]:9180", "localhost:9180", "127.0.0.2:1"} {
		if _, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--pprof", "--listen", listen}); err != nil {
			t.Errorf("pprof on %s: %v", listen, err)
		}
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, "auth_user = \"admin\"\nauth_password_file = \""+pw+"\"\n")
	if _, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--config", p, "--pprof", "--listen", ":9180"}); err != nil {
		t.Errorf("pprof with auth on :9180: %v", err)
	}
}

func TestUnknownFlagIsAFlagError(t *testing.T) {
	_, fs, err := loadConfig("nftgate", []string{"--bogus"})
	var fe flagError
	if !errors.As(err, &fe) || fs == nil {
		t.Fatalf("got %v", err)
	}
	if code := run([]string{"--bogus"}); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
}

func TestMemoryLimitSizes(t *testing.T) {
	for in, want := range map[string]ByteSize{
		"0": 0, "96MiB": 96 << 20, "1GiB": 1 << 30, "512 KiB": 512 << 10, "65536": 65536, "100B": 100,
	} {
		cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--config", writeConfig(t, "memory_limit = \""+in+"\"\n")})
		if err != nil {
			t.Errorf("memory_limit %q: %v", in, err)
			continue
		}
		if cfg.MemoryLimit != want {
			t.Errorf("memory_limit %q = %d, want %d", in, cfg.MemoryLimit, want)
		}
	}
	cfg, _, err := loadConfig("nftgate", []string{"--node-name", "n", "--memory-limit", "2GiB"})
	if err != nil || cfg.MemoryLimit != 2<<30 || cfg.MemoryLimit.String() != "2GiB" {
		t.Errorf("--memory-limit 2GiB: %v, %v", cfg, err)
	}
}

// TestMemoryLimitFollowsLiveData checks that the soft limit never stays
// below the live data a sync leaves, and that a full sync runs without it:
// with a floor far under this test process's own heap, the limit is raised
// to leave minHeadroom above it.
func TestMemoryLimitFollowsLiveData(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetMemoryLimit(math.MaxInt64)
	keep := make([]byte, 8<<20) // live data well above the floor
	m := newMemoryLimit(1<<20, slog.New(slog.DiscardHandler))
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("limit before the first full sync = %d, want none", got)
	}
	gcPercent := func() int { p := debug.SetGCPercent(100); debug.SetGCPercent(p); return p }
	before := gcPercent()
	m.beforeFull()
	if p := gcPercent(); p != coldGCPercent {
		t.Errorf("GOGC during the first full sync = %d, want %d", p, coldGCPercent)
	}
	m.synced(true)
	if p := gcPercent(); p != before {
		t.Errorf("GOGC after the first full sync = %d, want %d again", p, before)
	}
	got := debug.SetMemoryLimit(-1)
	if got < int64(len(keep))+minHeadroom {
		t.Errorf("limit after the full sync = %d, want at least %d live bytes + %d", got, len(keep), minHeadroom)
	}
	m.beforeFull()
	if p := gcPercent(); p != before {
		t.Errorf("GOGC during a later full sync = %d, want %d", p, before)
	}
	if during := debug.SetMemoryLimit(-1); during != math.MaxInt64 {
		t.Errorf("limit during a full sync = %d, want none", during)
	}
	m.synced(false)
	if after := debug.SetMemoryLimit(-1); after < int64(len(keep))+minHeadroom || after > 2*got {
		t.Errorf("limit after a partial sync = %d, want about %d again", after, got)
	}
	runtime.KeepAlive(keep)
}
