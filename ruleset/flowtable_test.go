package ruleset_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
	"github.com/nftgate/nftgate/internal/testing/world"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// With flowtable devices the main table of each family has the flowtable
// and the forward rule that fills it (and no shard has them), with the
// packet count when there is one; without, neither. The text is what
// nft reads: on a kernel without flowtables the kernel's refusal is all
// nft has to say about it.
func TestRenderFlowtable(t *testing.T) {
	svcs := []*model.Service{world.Web(world.Ready("10.180.0.1", 8080))}
	cfg := goldenConfig("")
	if text := string(renderText(t, cfg, svcs)); strings.Contains(text, "flowtable") || strings.Contains(text, "flow add") {
		t.Fatalf("flowtable without flowtable devices:\n%s", text)
	}
	cfg.FlowtableDevices = []string{"lo", "eth0"}
	text := renderText(t, cfg, svcs)
	mains := 1 + bytes.Count(text, []byte("table ip6 nftgate {"))
	for _, want := range []string{
		"\tflowtable established {\n\t\thook ingress priority 0\n\t\tdevices = { \"lo\", \"eth0\" }\n\t\tcounter\n\t}\n",
		"\t\tct state established ct status dnat flow add @established\n",
	} {
		if n := bytes.Count(text, []byte(want)); n != mains {
			t.Errorf("%q appears %d times, want once in each of the %d main tables:\n%s", want, n, mains, numbered(text))
		}
	}

	// With a packet count the rule waits for it; the flowtable is the same.
	cfg.FlowtablePackets = 20
	text = renderText(t, cfg, svcs)
	for _, want := range []string{
		"\tflowtable established {\n",
		"\t\tct state established ct status dnat ct packets > 20 flow add @established\n",
	} {
		if n := bytes.Count(text, []byte(want)); n != mains {
			t.Errorf("%q appears %d times, want once in each of the %d main tables:\n%s", want, n, mains, numbered(text))
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("needs root to have nft check the script in a namespace")
	}
	nftBin, err := exec.LookPath("nft")
	if err != nil {
		t.Fatalf("the nft CLI is needed (Debian package nftables, `make deps`): %v", err)
	}
	cfg.FlowtableDevices = []string{"lo"} // the one interface of a new namespace
	path := filepath.Join(t.TempDir(), "flowtable.nft")
	if err := os.WriteFile(path, renderText(t, cfg, svcs), 0o644); err != nil {
		t.Fatal(err)
	}
	var out []byte
	err = netnstest.Do(netnstest.Temp(t), func() error {
		var err error
		out, err = exec.Command(nftBin, "-c", "-f", path).CombinedOutput()
		return err
	})
	has := netnstest.KernelHas(t, "CONFIG_NF_FLOW_TABLE", "CONFIG_NF_FLOW_TABLE_INET", "CONFIG_NFT_FLOW_OFFLOAD")
	switch {
	case has && err != nil:
		t.Fatalf("nft -c -f rejects the rendering: %v\n%s", err, out)
	case !has && (err == nil || !strings.Contains(string(out), "No such file or directory") || strings.Contains(string(out), "syntax error")):
		t.Fatalf("nft -c -f on a kernel without flowtables: %v, want only the kernel's refusal:\n%s", err, out)
	}
	t.Logf("nft -c -f: %v %s", err, out)
}

// Planning the flowtable: added with the table, recreated (and every chain
// of its table rewritten, so that the rule using it lets go first) when
// its devices change, deleted when the setting goes off, and reported as
// drift when the kernel's differs.
func TestPlanFlowtable(t *testing.T) {
	svcs := map[model.ServiceKey]*model.Service{}
	for _, s := range []*model.Service{world.Web(world.Ready("10.180.0.1", 8080))} {
		svcs[s.Key] = s
	}
	plan := func(cfg *ruleset.Config, state []*ruleset.TableState) (*ruleset.Tables, []*ruleset.Ops) {
		ts := ruleset.NewTables(cfg)
		ops, _, _ := ruleset.PlanFull(cfg, ts, state, svcs)
		for i, o := range ops {
			state[i].Apply(o)
		}
		return ts, ops
	}
	cfg := goldenConfig("")
	cfg.FlowtableDevices = []string{"eth0"}
	ts := ruleset.NewTables(cfg)
	state := make([]*ruleset.TableState, len(ts.Refs))
	for i := range state {
		state[i] = ruleset.NewTableState()
	}
	_, ops := plan(cfg, state)
	for slot, o := range ops {
		main := slot == ts.Main(ts.Refs[slot].Family)
		if got := len(o.AddFlowtables); got != map[bool]int{true: 1, false: 0}[main] {
			t.Errorf("cold sync, %s %s: %d flowtables added", ts.Refs[slot].Family, ts.Refs[slot].Name, got)
		}
	}

	moved := *cfg
	moved.FlowtableDevices = []string{"eth0", "eth1"}
	_, ops = plan(&moved, state)
	for slot, o := range ops {
		if slot != ts.Main(ts.Refs[slot].Family) {
			if !o.Empty() {
				t.Errorf("devices changed: shard %s planned %+v", ts.Refs[slot].Name, o)
			}
			continue
		}
		if len(o.RecreateFlowtables) != 1 || len(o.RewriteChains) != len(state[slot].Chains) {
			t.Errorf("devices changed: %s main table recreates %d flowtables and rewrites %d of %d chains",
				ts.Refs[slot].Family, len(o.RecreateFlowtables), len(o.RewriteChains), len(state[slot].Chains))
		}
	}

	want := state[ts.Main(ruleset.IPv4)]
	got := *want
	got.Flowtables = map[string]ruleset.FlowtableDef{ruleset.FlowtableName: ruleset.FlowtableDefFrom(0, []string{"eth0"}, true)}
	if d := ruleset.CompareStates(ts.Refs[ts.Main(ruleset.IPv4)], want, &got); len(d) != 1 || !strings.Contains(d[0], "flowtable established has devices") {
		t.Errorf("drift of the flowtable's devices reported as %q", d)
	}
	got.Flowtables = map[string]ruleset.FlowtableDef{ruleset.FlowtableName: ruleset.FlowtableDefFrom(0, []string{"eth0", "eth1"}, false)}
	if d := ruleset.CompareStates(ts.Refs[ts.Main(ruleset.IPv4)], want, &got); len(d) != 1 || !strings.Contains(d[0], "flowtable established has counter false, want true") {
		t.Errorf("drift of the flowtable's counter flag reported as %q", d)
	}

	off := *cfg
	off.FlowtableDevices = nil
	_, ops = plan(&off, state)
	for slot, o := range ops {
		main := slot == ts.Main(ts.Refs[slot].Family)
		if got := len(o.DelFlowtables); got != map[bool]int{true: 1, false: 0}[main] {
			t.Errorf("setting off, %s %s: %d flowtables deleted", ts.Refs[slot].Family, ts.Refs[slot].Name, got)
		}
		if main && len(o.RewriteChains) != 1 || main && o.RewriteChains[0].Chain.Name != "filter-forward" {
			t.Errorf("setting off: %s main table rewrites %d chains, want filter-forward alone", ts.Refs[slot].Family, len(o.RewriteChains))
		}
		if main && state[slot].Flowtables[ruleset.FlowtableName] != (ruleset.FlowtableDef{}) {
			t.Errorf("setting off: the state still has the flowtable")
		}
	}
}
