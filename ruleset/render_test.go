package ruleset_test

import (
	"bytes"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/world"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenCases are representative Services; each renders, with the static
// skeleton, into testdata/<name>.nft.
func goldenCases() []struct {
	name string
	svcs []*model.Service
} {
	affinity := world.Web(world.On("gw", world.Ready("10.180.0.1", 8080)), world.On("other", world.Ready("10.180.1.1", 8080)))
	affinity.Key = model.NewServiceKey(affinity.Key.Namespace(), "sticky")
	affinity.EditRare().AffinityTimeout = 600 * time.Second
	affinity.EditRare().SourceRanges = []netip.Prefix{world.Prefix("203.0.113.0/24"), world.Prefix("198.19.7.7/32")}

	local := world.Web(world.On("gw", world.Ready("10.180.0.2", 8080)), world.On("other", world.Ready("10.180.1.2", 8080)))
	local.Key = model.NewServiceKey(local.Key.Namespace(), "local")
	local.ClusterIPs = world.Addrs("172.30.0.42")
	local.EditRare().ExternalIPs = nil
	local.EditRare().LoadBalancerIPs = world.Addrs("198.51.100.2")
	local.Ports[0].NodePort = 30081
	local.ExternalLocal = true
	itp := &model.Service{Key: model.NewServiceKey("ns1", "itp"), Type: model.TypeClusterIP, InternalLocal: true,
		ClusterIPs: world.Addrs("172.30.0.43"),
		Ports:      []model.ServicePort{{Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{world.On("gw", world.Ready("10.180.0.3", 8080)), world.On("other", world.Ready("10.180.1.3", 8080))}}}}
	itpRemote := &model.Service{Key: model.NewServiceKey("ns1", "itp-remote"), Type: model.TypeClusterIP, InternalLocal: true,
		ClusterIPs: world.Addrs("172.30.0.44"),
		Ports:      []model.ServicePort{{Protocol: model.TCP, Port: 80, Endpoints: []model.Endpoint{world.On("other", world.Ready("10.180.1.4", 8080))}}}}

	dual := &model.Service{
		Key: model.NewServiceKey("ns1", "dual"), Type: model.TypeLoadBalancer,
		ClusterIPs: world.Addrs("172.30.0.60", "fd00:30::60"),
		Rare:       &model.Rare{LoadBalancerIPs: world.Addrs("198.51.100.6", "2001:db8:ff::6"), SourceRanges: []netip.Prefix{world.Prefix("203.0.113.0/24"), world.Prefix("2001:db8:9::/48")}, AffinityTimeout: time.Hour},
		Ports: []model.ServicePort{
			{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30060,
				Endpoints: []model.Endpoint{world.Ready("10.180.0.6", 8080), world.Ready("fd00:10::6", 8080), world.Ready("fd00:10:1::6", 8080)}},
			{Name: "dns", Protocol: model.UDP, Port: 53, Endpoints: []model.Endpoint{world.Ready("fd00:10::6", 53)}},
		},
	}

	return []struct {
		name string
		svcs []*model.Service
	}{
		{"clusterip", []*model.Service{{
			Key: model.NewServiceKey("ns1", "api"), Type: model.TypeClusterIP, ClusterIPs: world.Addrs("172.30.0.10"),
			Ports: []model.ServicePort{
				{Name: "https", Protocol: model.TCP, Port: 443, Endpoints: []model.Endpoint{world.Ready("10.180.0.10", 6443), world.Ready("10.180.1.10", 6443), world.Ready("10.180.2.10", 6443)}},
				{Name: "sig", Protocol: model.SCTP, Port: 3868, Endpoints: []model.Endpoint{world.Ready("10.180.0.10", 3868)}},
			},
		}}},
		{"loadbalancer-affinity-ranges", []*model.Service{affinity}},
		{"traffic-policy-local", []*model.Service{local, itp, itpRemote}},
		{"no-endpoints", []*model.Service{{
			Key: model.NewServiceKey("kube-system", "dns"), Type: model.TypeNodePort, ClusterIPs: world.Addrs("172.30.0.53"),
			Rare:  &model.Rare{ExternalIPs: world.Addrs("192.168.99.53")},
			Ports: []model.ServicePort{{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30053}},
		}}},
		{"dual-stack", []*model.Service{dual}},
		{"masquerade-addresses", []*model.Service{dual}},
		{"keep-client-address", []*model.Service{local, dual}},
	}
}

// goldenTunes change the golden configuration for the cases named.
var goldenTunes = map[string]func(*ruleset.Config){
	"masquerade-addresses": func(cfg *ruleset.Config) {
		cfg.MasqueradeAddresses = world.Addrs("198.51.100.200", "198.51.100.201", "198.51.100.202", "2001:db8:ff::200")
		cfg.DropMidstreamTCP = true
		cfg.MidstreamWait = 10 * time.Second
		cfg.MidstreamWaitPeerDead = 500 * time.Millisecond // the flag and the second waiting set
		cfg.MasqueradePortGroups = 2                       // the pick-up without the CPU's range
		cfg.UntranslatedEventsOff = true                   // with state sync, as DropMidstreamTCP
		cfg.LeanServiceEvents = true                       // its fewer events (conntrack_events = "lean")
		cfg.EchoRate, cfg.EchoSourceRate = 300, 50
		// Active-active peers: pools of one and two IPv4 addresses (the
		// homes map's modulus 2), and one IPv6 address.
		cfg.PeerMasquerade = [][]netip.Addr{world.Addrs("198.51.100.210"), world.Addrs("198.51.100.220", "198.51.100.221", "2001:db8:ff::220")}
	},
	"keep-client-address": func(cfg *ruleset.Config) { cfg.KeepClientAddress = true },
}

// renderText writes the static skeleton and the Services of every family
// the Services use (always ip) as one nft script.
func renderText(t *testing.T, cfg *ruleset.Config, svcs []*model.Service) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, f := range ruleset.Families {
		used := f == ruleset.IPv4
		for _, s := range svcs {
			r := ruleset.RenderService(cfg, s)
			used = used || !r.Of(f).Empty()
		}
		if !used {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		if err := ruleset.WriteTables(&b, f, ruleset.Layout(cfg, f, svcs)); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func goldenConfig(name string) *ruleset.Config {
	cfg := world.Config()
	cfg.NodePortAddresses = []netip.Prefix{world.Prefix("192.168.0.0/24"), world.Prefix("2001:db8:1::/64")}
	cfg.Shards = 2 // enough to show the layout, short enough to read
	if tune := goldenTunes[name]; tune != nil {
		tune(cfg)
	}
	return cfg
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			got := renderText(t, goldenConfig(tc.name), tc.svcs)
			path := filepath.Join("testdata", tc.name+".nft")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run `go test ./nft -run TestRenderGolden -update` to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the rendering (run with -update if the change is intended):\n%s", path, lineDiff(string(want), string(got)))
			}
		})
	}
}

// TestRenderDeterministic guards the golden files and the differ: the same
// Services render to the same text whatever the order they come in.
func TestRenderDeterministic(t *testing.T) {
	for _, tc := range goldenCases() {
		a := renderText(t, goldenConfig(tc.name), tc.svcs)
		rev := append([]*model.Service(nil), tc.svcs...)
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		if b := renderText(t, goldenConfig(tc.name), rev); !bytes.Equal(a, b) {
			t.Errorf("%s: rendering depends on Service order:\n%s", tc.name, lineDiff(string(a), string(b)))
		}
	}
}

// lineDiff lists the lines only in want (-) and only in got (+), in order:
// enough to read a golden mismatch without a diff tool.
func lineDiff(want, got string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	wc, gc := count(want), count(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if gc[l] > 0 {
			gc[l]--
			continue
		}
		fmt.Fprintf(&b, "-%s\n", l)
	}
	for _, l := range strings.Split(got, "\n") {
		if wc[l] > 0 {
			wc[l]--
			continue
		}
		fmt.Fprintf(&b, "+%s\n", l)
	}
	return b.String()
}

// TestRenderAcceptedByNft feeds the rendered text to the nft CLI, which
// parses it and has the kernel check the whole transaction without
// committing it, in a network namespace of the test's own.
func TestRenderAcceptedByNft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and talks to nf_tables")
	}
	nftBin, err := exec.LookPath("nft")
	if err != nil {
		t.Fatalf("the nft CLI is needed (Debian package nftables, `make deps`): %v", err)
	}
	ns := fmt.Sprintf("nftgate-render-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns, nftBin}, args...)...).CombinedOutput()
		return string(out), err
	}
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			text := renderText(t, goldenConfig(tc.name), tc.svcs)
			path := filepath.Join(dir, tc.name+".nft")
			if err := os.WriteFile(path, text, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := run("-c", "-f", path); err != nil {
				t.Fatalf("nft -c -f rejects the rendering: %v\n%s\n%s", err, out, numbered(text))
			}
		})
	}
	// The check above must be able to fail: a broken script is refused.
	bad := filepath.Join(dir, "bad.nft")
	os.WriteFile(bad, []byte("table ip nftgate {\n\tchain c {\n\t\tjump nowhere\n\t}\n}\n"), 0o644)
	if out, err := run("-c", "-f", bad); err == nil {
		t.Errorf("nft -c accepted a jump to a missing chain: %s", out)
	}
	// And nothing was committed by the checks.
	if out, err := run("list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("namespace ruleset after checks: %q, %v", out, err)
	}
}

func numbered(text []byte) string {
	var b strings.Builder
	for i, l := range strings.Split(string(text), "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, l)
	}
	return b.String()
}
