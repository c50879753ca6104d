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
)

// With flowtable devices the main table of each family has the flowtable
// and the forward rule that fills it (and no shard has them); without,
// neither. The text is what
// nft reads: on a kernel without flowtables the kernel's refusal is all
// nft has to say about it.
func TestRenderFlowtable(t *testing.T) {
	svcs := []*model.Service{world.Web(world.Ready("10.180.0.1", 8080))}
	cfg := goldenConfig()
	if text := string(renderText(t, cfg, svcs)); strings.Contains(text, "flowtable") || strings.Contains(text, "flow add") {
		t.Fatalf("flowtable without flowtable devices:\n%s", text)
	}
	cfg.FlowtableDevices = []string{"lo", "eth0"}
	text := renderText(t, cfg, svcs)
	mains := 1 + bytes.Count(text, []byte("table ip6 nftgate {"))
	for _, want := range []string{
		"\tflowtable established {\n\t\thook ingress priority 0\n\t\tdevices = { \"lo\", \"eth0\" }\n\t}\n",
		"\t\tct state established ct status dnat flow add @established\n",
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
