package nft

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// threeEndpoints is default/web with three endpoints and a NodePort: it
// chooses through the endpoint maps.
func threeEndpoints() *model.Service {
	svc := webService("198.18.2.10")
	svc.Type = model.TypeNodePort
	svc.Ports[0].NodePort = 30080
	for _, a := range []string{"198.18.2.11", "198.18.2.12"} {
		svc.Ports[0].Endpoints = append(svc.Ports[0].Endpoints, model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(netip.MustParseAddr(a)))
	}
	return svc
}

// endpointMaps returns the endpoint maps' text of svc's shard.
func endpointMaps(t *testing.T, ns string, p *Programmer, svc *model.Service) string {
	t.Helper()
	table := p.cfg.TableOf(svc.Key)
	var b strings.Builder
	for _, nodePort := range []bool{false, true} {
		for i := range 3 {
			b.WriteString(nftList(t, ns, "list", "map", "ip", table, ruleset.EndpointMap(nodePort, i)))
		}
	}
	return b.String()
}

// TestEndpointMapDriftRepaired: another program deletes, changes and adds
// elements of the endpoint maps; each is reported as a drift of the
// elements, and the repair (reading back just the shard's elements) puts
// the maps back as nftgate wrote them, without rendering the others.
func TestEndpointMapDriftRepaired(t *testing.T) {
	ns, p := testProgrammer(t)
	ch := watchDrifts(t, p)
	svc := threeEndpoints()
	services := map[model.ServiceKey]*model.Service{svc.Key: svc}
	if _, err := p.Full(services); err != nil {
		t.Fatal(err)
	}
	noDrift(t, p, ch, "the cold sync")
	want := endpointMaps(t, ns, p, svc)
	for _, ep := range []string{"198.18.2.10 . 8080", "198.18.2.11 . 8080", "198.18.2.12 . 8080"} {
		if strings.Count(want, ep) != 2 {
			t.Fatalf("endpoint %s is not in the maps once for the ClusterIP and once for the NodePort:\n%s", ep, want)
		}
	}
	table := p.cfg.TableOf(svc.Key)
	for _, edit := range [][]string{
		{"delete", "element", "ip", table, ruleset.EndpointMap(false, 1), "{ 198.19.0.10 . tcp . 80 }"},
		{"delete", "element", "ip", table, ruleset.EndpointMap(true, 2), "{ tcp . 30080 }"},
		{"add", "element", "ip", table, ruleset.EndpointMap(false, 0), "{ 198.19.0.99 . tcp . 80 : 198.18.2.99 . 80 }"},
	} {
		t.Run(strings.Join(edit[:2], " ")+" "+edit[4], func(t *testing.T) {
			nftList(t, ns, edit...)
			select {
			case d := <-ch:
				if d.Lost || len(d.Changes) == 0 {
					t.Fatalf("the edit reported as %+v, want a change", d)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the edit was not reported")
			}
			res, err := p.Full(services)
			if err != nil || res.ReadTables != 1 || len(res.Drift) == 0 {
				t.Fatalf("repair: %+v, %v; want the one table read back and the drift told", res, err)
			}
			if got := endpointMaps(t, ns, p, svc); got != want {
				t.Fatalf("endpoint maps after the repair:\n%s\nwant:\n%s", got, want)
			}
			noDrift(t, p, ch, "the repair")
		})
	}

	// A changed endpoint: replaced in the same batch, and a full read
	// back finds nothing to do.
	moved := threeEndpoints()
	moved.Ports[0].Endpoints[1].SetAddr(netip.MustParseAddr("198.18.2.21"))
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{svc.Key: moved}); err != nil {
		t.Fatal(err)
	}
	if got := endpointMaps(t, ns, p, svc); !strings.Contains(got, "198.18.2.21 . 8080") || strings.Contains(got, "198.18.2.11") {
		t.Fatalf("endpoint maps after the move:\n%s", got)
	}
	p.watch.update(p.watch.lost)
	res, err := p.Full(map[model.ServiceKey]*model.Service{svc.Key: moved})
	if err != nil || len(res.Drift) != 0 || res.Counts.Changes() != 0 {
		t.Fatalf("full sync after the move: %+v, %v; want no drift and no change", res, err)
	}
	// Fewer endpoints: the maps of the buckets no Service needs go.
	two := threeEndpoints()
	two.Ports[0].Endpoints = two.Ports[0].Endpoints[:2]
	if _, err := p.Partial(map[model.ServiceKey]*model.Service{svc.Key: two}); err != nil {
		t.Fatal(err)
	}
	out := nftList(t, ns, "list", "table", "ip", table)
	for _, gone := range []string{ruleset.EndpointMap(false, 2), ruleset.EndpointMap(true, 2), "pick-tcp-3", "pick-nodeport-tcp-3"} {
		if strings.Contains(out, gone+" {") {
			t.Errorf("%s is left after the Service went down to two endpoints:\n%s", gone, out)
		}
	}
	if !strings.Contains(out, "pick-tcp-2 {") || !strings.Contains(out, fmt.Sprintf("%s {", ruleset.EndpointMap(true, 1))) {
		t.Errorf("no chain and maps for two endpoints:\n%s", out)
	}
}
