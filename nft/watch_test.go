package nft

import (
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Another program's transaction stays known as one after nftgate commits
// its own: the next full sync reads the tables back and repairs them.
func TestFullReadsBackAfterOthersCommitBeforeAPartial(t *testing.T) {
	ns, p := testProgrammer(t)
	svc := webService("198.18.2.10")
	other := webService("198.18.2.20")
	other.Key.Name, other.ClusterIPs[0] = "other", other.ClusterIPs[0].Next()
	services := map[model.ServiceKey]*model.Service{svc.Key: svc, other.Key: other}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	table := p.cfg.TableOf(svc.Key)
	nftList(t, ns, "delete", "element", "ip", table, ruleset.MapServiceIPs, "{ 198.19.0.10 . tcp . 80 }")
	moved := webService("198.18.2.11")
	moved.Key, moved.ClusterIPs = other.Key, other.ClusterIPs
	services[other.Key] = moved
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{other.Key: moved}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Full(services)
	if err != nil || !res.ReadBack || len(res.Drift) == 0 {
		t.Fatalf("full sync after another program's edit and a partial sync: %+v, %v; want a read-back that finds drift", res, err)
	}
	if out := nftList(t, ns, "list", "map", "ip", table, ruleset.MapServiceIPs); !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("the edit was not repaired:\n%s", out)
	}
}
