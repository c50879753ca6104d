package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nftgate/nftgate/ruleset"
)

// The Maglev phase: nftgate measured twice at each size, with
// endpoint_selection "hash" (the nftgate row) and "maglev" (the
// nftgate-maglev row), side by side in maglev/results.md with the share
// of flows each choice moves when one endpoint goes.
const (
	proxNftgateMaglev = "nftgate-maglev"
	maglevSetting     = `endpoint_selection = "maglev"`
	maglevDir         = "maglev"
	maglevFlows       = 10000
)

// maglevDisruptionN are the endpoint counts of the disruption figures.
var maglevDisruptionN = []int{4, 10, 50}

// MaglevConfig is the Maglev phase.
type MaglevConfig struct {
	// On adds the nftgate-maglev row after nftgate and writes
	// maglev/results.md.
	On bool
	// Only measures nftgate and nftgate-maglev alone (no kube-proxy, no
	// data plane, no drift), every report under maglev/.
	Only bool
}

func maglevFlags(fs *flag.FlagSet, c *MaglevConfig) (check func(cfg *Config) error) {
	fs.BoolVar(&c.On, "maglev", false,
		`also run nftgate with endpoint_selection = "maglev" (row nftgate-maglev) after nftgate, and write maglev/results.md: cold sync, endpoint change, kernel memory and disruption, hash beside maglev`)
	fs.BoolVar(&c.Only, "maglev-only", false,
		"the Maglev comparison alone: only nftgate and nftgate-maglev, no data plane, no drift; every report under maglev/")
	return func(cfg *Config) error {
		c.On = c.On || c.Only
		if !c.On {
			return nil
		}
		if cfg.LoadOnly {
			return fmt.Errorf("--maglev with --load-only: nothing would be measured")
		}
		if c.Only {
			cfg.Proxiers = []string{proxNftgate}
			cfg.Dataplane.Duration, cfg.Drift.Repeats = 0, 0
			cfg.Out = filepath.Join(cfg.Out, maglevDir)
		}
		if i := slices.Index(cfg.Proxiers, proxNftgate); i >= 0 {
			cfg.Proxiers = slices.Insert(cfg.Proxiers, i+1, proxNftgateMaglev)
		} else {
			cfg.Proxiers = append(cfg.Proxiers, proxNftgateMaglev)
		}
		return nil
	}
}

// slabBytes is the kernel's slab memory (Slab in /proc/meminfo), where
// nf_tables keeps its tables, maps and elements. It is the whole
// machine's: other work moves it too.
func slabBytes() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Slab:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: Slab: %q: %w", rest, err)
			}
			return kib << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/meminfo has no Slab line")
}

// MaglevReport is maglev/results.json.
type MaglevReport struct {
	Machine  Machine  `json:"machine"`
	Started  string   `json:"started"`
	Finished string   `json:"finished"`
	Changes  int      `json:"changes"`
	Rows     []Result `json:"results"`
	// Disruption: removing one of N endpoints, the share of Flows flows
	// whose endpoint changes, Maglev beside hash mod N.
	Flows      int                  `json:"flows"`
	Disruption []ruleset.Disruption `json:"disruption"`
}

// maglevDisruption computes the disruption figures: the bench's own
// endpoint addresses, flows with uniform 32-bit hashes from a fixed
// random source, the default seed.
func maglevDisruption() []ruleset.Disruption {
	r := rand.New(rand.NewPCG(7, 11))
	flows := make([]uint32, maglevFlows)
	for i := range flows {
		flows[i] = r.Uint32()
	}
	var out []ruleset.Disruption
	for _, n := range maglevDisruptionN {
		var eps []netip.AddrPort
		a := netip.MustParseAddr("10.244.0.1")
		for range n {
			eps = append(eps, netip.AddrPortFrom(a, 8080))
			a = a.Next()
		}
		out = append(out, ruleset.MaglevDisruption(eps, flows, ruleset.DefaultHashSeed))
	}
	return out
}

// writeMaglev writes maglev/results.json and results.md under dir from the
// nftgate and nftgate-maglev rows of r.
func writeMaglev(cfg *Config, r *Report) error {
	m := &MaglevReport{Machine: r.Machine, Started: r.Started.Format(time.RFC3339), Finished: time.Now().UTC().Format(time.RFC3339),
		Changes: r.Changes, Flows: maglevFlows, Disruption: maglevDisruption(), Rows: variantRows(r, proxNftgateMaglev)}
	return writeResults(variantDir(cfg, cfg.Maglev.Only, maglevDir), "maglev", m, m.markdown)
}

func (m *MaglevReport) markdown() string {
	var b strings.Builder
	b.WriteString("# Maglev against hash: what consistent endpoint choice costs\n\n")
	fmt.Fprintf(&b, "Run %s to %s. Machine: %s. Load average (1 min) %.1f at the start, %.1f at the end.\n\n",
		m.Started, m.Finished, m.Machine.Summary(), m.Machine.LoadAvgStart, m.Machine.LoadAvgEnd)
	b.WriteString("nftgate measured twice at each size by the sizes phase, every Service with `endpoint_selection = \"hash\"` (row nftgate) and `\"maglev\"` (row nftgate-maglev, a Maglev table of 509 slots per Service port with 4 endpoints). ")
	variantTable(&b, m.Rows, m.Changes, variant{Column: "selection", Base: "hash", Alt: proxNftgateMaglev, AltLabel: "maglev"}, true)
	fmt.Fprintf(&b, "\n## Disruption\n\nRemoving one of N endpoints: the share of %s flows (uniform 32-bit flow hashes) whose endpoint changes, averaged over which endpoint goes (worst in brackets), from the tables before and after and the kernel's scaling of the hash (`ruleset.MaglevDisruption`); the goal is 1/N + 2 %%.\n\n", thousands(m.Flows))
	b.WriteString("| N | M | maglev | hash mod N | goal |\n|---:|---:|---:|---:|---:|\n")
	for _, d := range m.Disruption {
		fmt.Fprintf(&b, "| %d | %d | %.1f %% (%.1f) | %.1f %% (%.1f) | %.1f %% |\n", d.Endpoints, d.TableSize,
			100*d.Mean, 100*d.Worst, 100*d.ModNMean, 100*d.ModNWorst, 100*(1/float64(d.Endpoints)+0.02))
	}
	return b.String()
}

// variant names the second nftgate row of a side-by-side phase: the
// column telling the two apart, the default's label in it, the other
// row's proxier and label, and the word before the labels in the
// comparison line ("counters on against off").
type variant struct{ Column, Base, Alt, AltLabel, Lead string }

// variantRows are r's rows of nftgate's default and of the variant alt.
func variantRows(r *Report, alt string) []Result {
	var rows []Result
	for _, res := range r.Results {
		if res.Proxier == proxNftgate || res.Proxier == alt {
			rows = append(rows, res)
		}
	}
	return rows
}

// variantDir is where a side-by-side phase writes: the output directory
// when it ran alone (only), else its sub directory there.
func variantDir(cfg *Config, only bool, sub string) string {
	if only {
		return cfg.Out
	}
	return filepath.Join(cfg.Out, sub)
}

// variantTable writes the cold sync, endpoint change, kernel slab and RSS
// of nftgate's default (row nftgate) and a variant side by side, then a
// line per size comparing them: the variant against the default when
// altFirst, else the default against the variant.
func variantTable(b *strings.Builder, rows []Result, changes int, v variant, altFirst bool) {
	fmt.Fprintf(b, "Cold sync: from the process start until the probe Services are served. Endpoint change: %d EndpointSlice writes, each until a client reaches the new endpoint (p99 by nearest rank: of fewer than 100, the slowest). ", changes)
	b.WriteString("RSS: nftgate's resident memory after the run (its peak in brackets). Kernel slab: the growth of `Slab` in /proc/meminfo from before the start to the end of the cold sync (the whole machine's: other work moves it by tens of MiB).\n\n")
	fmt.Fprintf(b, "| Services | %s | cold sync | CPU in the cold sync | change p50 | change p99 | kernel slab | RSS |\n", v.Column)
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range rows {
		label := v.Base
		if res.Proxier == v.Alt {
			label = v.AltLabel
		}
		if res.TimedOut != "" {
			fmt.Fprintf(b, "| %s | %s | over %s (%s) | | | | | |\n", thousands(res.Services), label, seconds(res.ColdStartSeconds), res.TimedOut)
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.1f s | %s | %s | %.0f MiB | %.0f MiB (%.0f) |\n",
			thousands(res.Services), label, seconds(res.ColdStartSeconds), res.CPUColdSeconds, millis(res.ChangeP50Ms),
			millis(percentile(res.ChangeMs, 99)), res.SlabMiB, res.RSSMiB, res.HWMMiB)
	}
	for _, base := range rows {
		if base.Proxier != proxNftgate || base.TimedOut != "" {
			continue
		}
		for _, alt := range rows {
			if alt.Proxier != v.Alt || alt.Services != base.Services || alt.TimedOut != "" {
				continue
			}
			x, y, xl, yl := base, alt, v.Base, v.AltLabel
			if altFirst {
				x, y, xl, yl = alt, base, v.AltLabel, v.Base
			}
			fmt.Fprintf(b, "\nAt %s Services, %s%s against %s: cold sync %s, change p50 %s, kernel slab %s, RSS %s.\n",
				thousands(base.Services), v.Lead, xl, yl, times(x.ColdStartSeconds, y.ColdStartSeconds), times(x.ChangeP50Ms, y.ChangeP50Ms),
				times(x.SlabMiB, y.SlabMiB), times(x.RSSMiB, y.RSSMiB))
		}
	}
}

// times is a/b as "N×", or n/a.
func times(a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f×", a/b)
}

// rerenderMaglev writes maglev.md next to a maglev.json.
func rerenderMaglev(path string, data []byte) error {
	var m MaglevReport
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(filepath.Join(filepath.Dir(path), "maglev.md"), []byte(m.markdown()), 0o644)
}
