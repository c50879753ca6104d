package e2e_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

// TestBadConfigKeepsTheRuleset: a gateway has programmed its Services and
// stopped; nftgate started again with a bad value (or a missing manifests
// directory) stops with a message naming the key and the value, logs
// nothing else, and leaves every rule in place.
func TestBadConfigKeepsTheRuleset(t *testing.T) {
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo)
	g.Write("web.yaml",
		gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-http", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	g.Start()
	g.Stop()
	before := g.Nft("list", "ruleset")
	if !strings.Contains(before, "198.19.0.10") {
		t.Fatalf("the gateway did not program web:\n%s", before)
	}
	notDir := filepath.Join(t.TempDir(), "file.yaml")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Without flowtables in the kernel, turning them on stops at the
	// kernel check; with them, an interface that is not there stops it.
	hasFlowtable := netnstest.KernelHas(t, "CONFIG_NF_FLOW_TABLE", "CONFIG_NF_FLOW_TABLE_INET", "CONFIG_NFT_FLOW_OFFLOAD")
	for _, tc := range []struct {
		args []string
		want []string
		skip bool
	}{
		{args: []string{"--table", "nftgate;"}, want: []string{"table", "nftgate;"}},
		{args: []string{"--reconcile-interval", "1ns"}, want: []string{"reconcile_interval", "1ns"}},
		{args: []string{"--memory-limit", "1B"}, want: []string{"memory_limit", "1B"}},
		{args: []string{"--masquerade-address", "10.0.0.0/8"}, want: []string{"masquerade_addresses[0]", "10.0.0.0/8"}},
		{args: []string{"--manifests", "/nonexistent/manifests"}, want: []string{"manifests", "/nonexistent/manifests"}},
		{args: []string{"--manifests", notDir}, want: []string{"manifests", notDir, "not a directory"}},
		{args: []string{"--manifests", "", "--kubeconfig", "/nonexistent/kubeconfig"}, want: []string{"kubeconfig", "/nonexistent/kubeconfig"}},
		{args: []string{"cleanup", "--table", "nftgate;"}, want: []string{"table", "nftgate;"}},
		// A flowtable on an interface the gateway has: on a kernel without
		// flowtables the check names the option, before anything is
		// programmed.
		{args: []string{"--flowtable", "--flowtable-device", topo.GatewayClientIface, "--flowtable-device", topo.GatewayBackendIface},
			want: []string{"flowtable (ip)", "CONFIG_NF_FLOW_TABLE", "flowtable (ip6)"}, skip: hasFlowtable},
		{args: []string{"--flowtable", "--flowtable-device", "nosuchdev0"}, want: []string{"flowtable_devices[0]", "nosuchdev0"}, skip: !hasFlowtable},
	} {
		if tc.skip {
			continue
		}
		args := append(append([]string(nil), g.Args...), tc.args...)
		if tc.args[0] == "cleanup" {
			args = tc.args
		}
		// A config accepted by mistake would serve: it is stopped after a while.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := topo.Gateway.Command(ctx, gatewaytest.Binary(t), args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Errorf("%v: %v, want a failed exit\n%s", tc.args, err, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%v: output does not name %q:\n%s", tc.args, w, out)
			}
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 {
			t.Errorf("%v: %d lines of output, want only the error:\n%s", tc.args, len(lines), out)
		}
		if after := g.Nft("list", "ruleset"); after != before {
			t.Fatalf("%v changed the ruleset:\n%s\nwas:\n%s", tc.args, after, before)
		}
	}
	// The ruleset still serves.
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	if err := awaitBackend(t, topo.Client, ap("198.19.0.10:80"), "198.18.2.10:8080", 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestTableClashIsAnError: with table = "filter" where the host has its
// own table ip filter with a rule, nftgate stops at start with a message
// naming the key and the table, and `nftgate cleanup` leaves that table,
// saying so; the host's table and rule are untouched.
func TestTableClashIsAnError(t *testing.T) {
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo, "--table", "filter")
	host := "table ip filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\ttcp dport 9999 drop\n\t}\n}\n"
	load := topo.Gateway.Command(context.Background(), "nft", "-f", "-")
	load.Stdin = strings.NewReader(host)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	before := g.Nft("list", "ruleset")
	for _, args := range [][]string{g.Args, {"cleanup", "--table", "filter"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := topo.Gateway.Command(ctx, gatewaytest.Binary(t), args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Errorf("%v: %v, want a failed exit\n%s", args, err, out)
		}
		want := []string{`table = "filter"`, "table ip filter", "not made by nftgate"}
		if args[0] == "cleanup" {
			want = []string{"cleanup", "left in place", "ip filter"}
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%v: output does not say %q:\n%s", args, w, out)
			}
		}
		if after := g.Nft("list", "ruleset"); after != before {
			t.Fatalf("%v changed the host's ruleset:\n%s\nwas:\n%s", args, after, before)
		}
	}
}
