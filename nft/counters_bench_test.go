package nft

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/ruleset"
)

// BenchmarkKernelCountersReadFullTraffic reads the counters of 10,000
// Services with both IPv4 traffic sets full (benchTrafficElements elements
// each, every one a real Service destination and one of its endpoints):
// the reading the page, the API, the history and a scrape ask for when the
// gateway is busy, and what it allocates.
//
//	go test -run '^$' -bench KernelCountersReadFullTraffic -benchtime 5x ./nft/
func BenchmarkKernelCountersReadFullTraffic(b *testing.B) {
	const n = 10_000
	cfg := scaleConfig()
	cfg.Counters = true
	cfg.TrafficElements = benchTrafficElements
	p, ns, c := countedCluster(b, n, cfg)
	fillTrafficSets(b, ns, &cfg, c, benchTrafficElements)
	b.ReportAllocs()
	b.ResetTimer()
	benchCountersReads(b, p, func(rd *Reading) bool { return len(rd.Endpoints) > 0 })
	b.StopTimer()
	var traffic int
	for _, pc := range p.counters.last.Ports() {
		if pc.Traffic.In.Packets > 0 {
			traffic++
		}
	}
	b.ReportMetric(float64(len(p.counters.seen)), "elements")
	b.ReportMetric(float64(traffic), "ports-with-traffic")
}

// fillTrafficSets writes elems elements into each IPv4 traffic set of
// cfg's main table, as the forward path would have made them: each a
// Service address and port of the cluster (ClusterIP, external or
// LoadBalancer IP) and one of its endpoints (every endpoint of every
// port, then endpoints the ports no longer have), with a count.
func fillTrafficSets(tb testing.TB, ns string, cfg *ruleset.Config, c *scaleCluster, elems int) {
	tb.Helper()
	type pair struct{ dest, ep string }
	var pairs []pair
	keys := slices.Clone(c.Keys)
	for round := 0; len(pairs) < elems; round++ {
		for _, k := range keys {
			s := c.Services[k]
			for _, ip := range slices.Concat(s.ClusterIPs, s.ExternalIPs(), s.LoadBalancerIPs()) {
				if !ip.Is4() {
					continue
				}
				for _, sp := range s.Ports {
					if len(pairs) == elems {
						break
					}
					// Past the port's endpoints, ones it had before
					// (a rollout's), whose elements have not expired.
					ep := fmt.Sprintf("%s . 8080", addrPlus(scaleReplaceBase, uint32(len(pairs))))
					if round < len(sp.Endpoints) {
						e := sp.Endpoints[round]
						ep = fmt.Sprintf("%s . %d", e.Addr(), e.Port)
					}
					pairs = append(pairs, pair{
						dest: fmt.Sprintf("%s . %s . %d", ip, strings.ToLower(sp.Protocol.KubeName()), sp.Port),
						ep:   ep,
					})
				}
			}
		}
	}
	var sb strings.Builder
	for _, set := range []string{ruleset.SetTrafficIn, ruleset.SetTrafficOut} {
		for i := 0; i < len(pairs); i += 4096 {
			fmt.Fprintf(&sb, "add element ip %s %s {", cfg.Table, set)
			for j, pr := range pairs[i:min(i+4096, len(pairs))] {
				if j > 0 {
					sb.WriteString(",")
				}
				fmt.Fprintf(&sb, " %s . %s counter packets %d bytes %d", pr.dest, pr.ep, 10+j%7, 1500*(10+j%7))
			}
			sb.WriteString(" }\n")
		}
	}
	f := filepath.Join(tb.TempDir(), "traffic.nft")
	if err := os.WriteFile(f, []byte(sb.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-f", f).CombinedOutput(); err != nil {
		tb.Fatalf("nft -f %s: %v: %.2000s", f, err, out)
	}
}
