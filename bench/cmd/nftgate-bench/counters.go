package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The counters phase: nftgate measured twice at each size, with its
// default configuration (the nftgate row: counters on, the traffic sets
// counting every forwarded packet) and with `counters = false` (the
// nftgate-nocounters row), side by side in counters/results.md with the
// data plane of both when the data-plane phase runs.
const (
	proxNftgateNoCounters = "nftgate-nocounters"
	countersOffSetting    = `counters = false`
	countersDir           = "counters"
)

// CountersConfig is the counters phase.
type CountersConfig struct {
	// On adds the nftgate-nocounters row after nftgate and writes
	// counters/results.md.
	On bool
	// Only measures nftgate and nftgate-nocounters alone (no kube-proxy,
	// no drift; the data plane of both unless --dataplane-duration 0),
	// every report under counters/.
	Only bool
}

func countersFlags(fs *flag.FlagSet, c *CountersConfig) (check func(cfg *Config) error) {
	fs.BoolVar(&c.On, "counters", false,
		"also run nftgate with `counters = false` (row nftgate-nocounters) after nftgate, and write counters/results.md: cold sync, endpoint change, kernel memory and the data plane, with and without the counters")
	fs.BoolVar(&c.Only, "counters-only", false,
		"the counters comparison alone: only nftgate and nftgate-nocounters (and their data plane), no drift; every report under counters/")
	return func(cfg *Config) error {
		c.On = c.On || c.Only
		if !c.On {
			return nil
		}
		if cfg.LoadOnly {
			return fmt.Errorf("--counters with --load-only: nothing would be measured")
		}
		if c.Only {
			cfg.Proxiers = []string{proxNftgate}
			cfg.Drift.Repeats = 0
			cfg.Dataplane.Proxiers = []string{proxNftgate}
			cfg.Out = filepath.Join(cfg.Out, countersDir)
		}
		if i := slices.Index(cfg.Proxiers, proxNftgate); i >= 0 {
			cfg.Proxiers = slices.Insert(cfg.Proxiers, i+1, proxNftgateNoCounters)
		} else {
			cfg.Proxiers = append(cfg.Proxiers, proxNftgateNoCounters)
		}
		if slices.Contains(cfg.Dataplane.Proxiers, proxNftgate) {
			cfg.Dataplane.Proxiers = append(cfg.Dataplane.Proxiers, proxNftgateNoCounters)
		}
		return nil
	}
}

// CountersReport is counters/counters.json.
type CountersReport struct {
	Machine   Machine            `json:"machine"`
	Started   string             `json:"started"`
	Finished  string             `json:"finished"`
	Changes   int                `json:"changes"`
	Dataplane *DataplaneSettings `json:"dataplane,omitempty"`
	Rows      []Result           `json:"results"`
}

// writeCounters writes counters/counters.json and counters.md under the
// output directory from the nftgate and nftgate-nocounters rows of r.
func writeCounters(cfg *Config, r *Report) error {
	c := &CountersReport{Machine: r.Machine, Started: r.Started.Format(time.RFC3339), Finished: time.Now().UTC().Format(time.RFC3339),
		Changes: r.Changes, Dataplane: r.Dataplane, Rows: variantRows(r, proxNftgateNoCounters)}
	return writeResults(variantDir(cfg, cfg.Counters.Only, countersDir), "counters", c, c.markdown)
}

func (c *CountersReport) markdown() string {
	var b strings.Builder
	b.WriteString("# Traffic counters: what they cost\n\n")
	fmt.Fprintf(&b, "Run %s to %s. Machine: %s. Load average (1 min) %.1f at the start, %.1f at the end.\n\n",
		c.Started, c.Finished, c.Machine.Summary(), c.Machine.LoadAvgStart, c.Machine.LoadAvgEnd)
	b.WriteString("nftgate measured twice at each size by the sizes phase: with its defaults (row nftgate: `counters = true`, " +
		"a counter on every Service map element and the traffic sets counting every forwarded packet of a translated " +
		"connection, both ways) and with `counters = false` (row nftgate-nocounters). ")
	variantTable(&b, c.Rows, c.Changes, variant{Column: "counters", Base: "on", Alt: proxNftgateNoCounters, AltLabel: "off", Lead: "counters "}, false)
	dp := (&Report{Results: c.Rows, Dataplane: c.Dataplane}).DataplaneMarkdown()
	b.WriteString(dp)
	return b.String()
}

// rerenderCounters writes counters.md next to a counters.json.
func rerenderCounters(path string, data []byte) error {
	var c CountersReport
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(filepath.Join(filepath.Dir(path), "counters.md"), []byte(c.markdown()), 0o644)
}
