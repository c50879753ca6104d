package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Machine        Machine   `json:"machine"`
	Started        time.Time `json:"started"`
	Finished       time.Time `json:"finished,omitzero"`
	Endpoints      int       `json:"endpoints_per_service"`
	Changes        int       `json:"changes"`
	ChangeGap      string    `json:"change_gap"`
	LatencySamples int       `json:"latency_samples"`
	// LoadWorkers is how many API writes the loading and the churn phase
	// keep in flight.
	LoadWorkers int        `json:"load_workers,omitempty"`
	LoadSeconds []LoadTime `json:"load_seconds"`
	Results     []Result   `json:"results"`
	// Source is where the Services were: "api" (also when empty, as in
	// runs from before manifests) or "manifests".
	Source           string `json:"source,omitempty"`
	ManifestsPerFile int    `json:"manifest_services_per_file,omitempty"`
	// Dataplane: the data-plane phase's settings, when it ran.
	Dataplane *DataplaneSettings `json:"dataplane,omitempty"`
}

// LoadTime is how long loading the Services up to a size took.
type LoadTime struct {
	Services int     `json:"services"`
	Seconds  float64 `json:"seconds"`
	// CPU time the servers spent meanwhile, which other work on the
	// machine does not inflate as it does the wall time.
	APIServerCPUSeconds float64 `json:"apiserver_cpu_seconds,omitempty"`
	EtcdCPUSeconds      float64 `json:"etcd_cpu_seconds,omitempty"`
}

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs      int    `json:"nproc"`
	CPUModel  string `json:"cpu_model"`
	Kernel    string `json:"kernel"`
	MemoryMiB int64  `json:"memory_mib"`
	Go        string `json:"go"`
	Nftgate   string `json:"nftgate"`
	KubeProxy string `json:"kube_proxy"`
	Nft       string `json:"nft"`
	IPTables  string `json:"iptables"`
	// LoadAvg is /proc/loadavg's 1-minute figure when the run started and
	// ended: the machine may be shared, and other work skews the numbers.
	LoadAvgStart float64 `json:"loadavg_start"`
	LoadAvgEnd   float64 `json:"loadavg_end,omitempty"`
}

func loadAvg() float64 {
	var l float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscanf(string(b), "%f", &l)
	}
	return l
}

// Summary is the machine in one line.
func (m Machine) Summary() string {
	return fmt.Sprintf("%d CPUs (%s), %d MiB RAM, Linux %s; %s; %s; %s, %s",
		m.CPUs, m.CPUModel, m.MemoryMiB, m.Kernel, m.Nftgate, m.KubeProxy, m.Nft, m.IPTables)
}

func describeMachine(cfg *Config) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadAvgStart: loadAvg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kib int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kib); err == nil {
			m.MemoryMiB = kib / 1024
		}
	}
	first := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			return name + " (unknown version)"
		}
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return line
	}
	m.Nftgate = first(cfg.NftgateBin, "version")
	m.KubeProxy = "kube-proxy " + strings.TrimPrefix(first(cfg.KubeProxyBin, "--version"), "Kubernetes ")
	m.Nft = first("nft", "--version")
	m.IPTables = first("iptables", "--version")
	return m
}

// percentile is the nearest-rank percentile p (0-100] of xs; 0 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// writeResults stores v as <name>.json and markdown() as <name>.md in dir,
// creating dir.
func writeResults(dir, name string, v any, markdown func() string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".md"), []byte(markdown()), 0o644)
}

// Write stores results.json, results.md and results.png in dir.
func (r *Report) Write(dir string) error {
	if err := writeResults(dir, "results", r, r.Markdown); err != nil {
		return err
	}
	if err := r.PlotDrift(filepath.Join(dir, "drift.png")); err != nil {
		return err
	}
	if err := r.PlotChurn(filepath.Join(dir, "churn.png")); err != nil {
		return err
	}
	return r.Plot(filepath.Join(dir, "results.png"))
}

// Markdown renders the table, the ratios and the machine.
func (r *Report) Markdown() string {
	var b bytes.Buffer
	if r.Source == sourceManifests {
		fmt.Fprintf(&b, "# nftgate fed from manifests\n\n")
	} else {
		fmt.Fprintf(&b, "# nftgate vs kube-proxy\n\n")
	}
	end := fmt.Sprintf("%.1f at the end", r.Machine.LoadAvgEnd)
	if r.Finished.IsZero() {
		// Written after each proxier: a run stopped half way has no end.
		end = "the run stopped before its last size"
	}
	fmt.Fprintf(&b, "Run %s. Machine: %s. Load average (1 min) %.1f at the start, %s.\n\n",
		r.Started.Format("2006-01-02 15:04 MST"), r.Machine.Summary(), r.Machine.LoadAvgStart, end)
	if r.Dataplane != nil && r.Dataplane.Only {
		fmt.Fprintf(&b, "Source: %s. Run with `--dataplane-only`: cold start and the data plane; no endpoint changes, no latency samples.\n",
			cmp.Or(r.Source, sourceAPI))
		b.WriteString(r.DataplaneMarkdown())
		b.WriteString(r.DriftMarkdown())
		b.WriteString(r.ChurnMarkdown())
		return b.String()
	}
	if r.Source == sourceManifests {
		fmt.Fprintf(&b, "Source: **manifests**. N Services × %d endpoints as manifest files that nftgate reads with `--manifests` "+
			"(JSON documents separated by `---`, %s bulk Services with their EndpointSlices per file; the canary and the changed "+
			"Service in files of their own); no kube-apiserver runs. "+
			"Endpoint change: %d rewrites of the changed Service's file (written beside it and renamed in), from the rename until "+
			"a client's new connection reaches the new endpoints (%s between changes). ",
			r.Endpoints, thousands(r.ManifestsPerFile), r.Changes, r.ChangeGap)
	} else {
		fmt.Fprintf(&b, "Source: the API. N Services × %d endpoints in a real kube-apiserver; each proxier in turn in the same gateway "+
			"network namespace. Endpoint change: %d EndpointSlice writes, from the write until a client's new connection reaches "+
			"the new endpoints (%s between changes). ", r.Endpoints, r.Changes, r.ChangeGap)
	}
	fmt.Fprintf(&b, "Latency: median of %d TCP exchanges (connect, one line each way, close) from the client, "+
		"through the ClusterIP vs straight to the backend. RSS after the run; CPU = user+system of the proxier and the "+
		"programs it ran (nft, iptables-restore), until the cold start was over / per endpoint change.\n\n", r.LatencySamples)
	b.WriteString(r.Table())
	if ratios := r.Ratios(); ratios != "" {
		b.WriteString("\n" + ratios)
	}
	b.WriteString("\nWhere the time goes (the proxiers' own metrics over the whole run):\n\n")
	b.WriteString("| Proxier | N | syncs | mean sync | mean network programming |\n|---|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		m := res.Metrics
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s |\n", res.Proxier, thousands(res.Services), m.Syncs,
			meanMs(m.SyncSeconds, m.Syncs), meanMs(m.ProgrammingSeconds, m.ProgrammingCount))
	}
	b.WriteString("\nnftgate's network programming histogram also counts the objects it finds when it starts (from their " +
		"EndpointSlice trigger time, set when the benchmark loaded them); kube-proxy's counts only changes after its start.\n")
	for _, res := range r.Results {
		if res.TimedOut != "" {
			fmt.Fprintf(&b, "\n%s at N=%s: %s.\n", res.Proxier, thousands(res.Services), res.TimedOut)
		}
	}
	if len(r.LoadSeconds) > 0 {
		if r.Source == sourceManifests {
			b.WriteString("\nWriting the manifest files took")
		} else {
			b.WriteString("\nLoading the Services through the API took")
		}
		for i, l := range r.LoadSeconds {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&b, "%s %.0f s (up to %s", sep, l.Seconds, thousands(l.Services))
			if l.APIServerCPUSeconds > 0 {
				fmt.Fprintf(&b, "; kube-apiserver CPU %.0f s, etcd %.0f s", l.APIServerCPUSeconds, l.EtcdCPUSeconds)
			}
			b.WriteString(")")
		}
		b.WriteString(".\n")
	}
	b.WriteString(r.DataplaneMarkdown())
	b.WriteString(r.DriftMarkdown())
	b.WriteString(r.ChurnMarkdown())
	return b.String()
}

// Table is the main markdown table.
func (r *Report) Table() string {
	var b bytes.Buffer
	b.WriteString("| Proxier | N | cold start | change p50 | change p90 | change max | RSS | CPU cold start | CPU per change | exchange via ClusterIP | direct | overhead | failed via ClusterIP |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		if res.TimedOut != "" {
			fmt.Fprintf(&b, "| %s | %s | > %s | – | – | – | %.0f MiB | > %.0f s | – | – | – | – | – |\n",
				res.Proxier, thousands(res.Services), seconds(res.ColdStartSeconds), res.RSSMiB, res.CPUColdSeconds)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.0f MiB | %.2f s | %.0f ms | %.0f µs | %.0f µs | %+.0f µs | %d of %d |\n",
			res.Proxier, thousands(res.Services), seconds(res.ColdStartSeconds), millis(res.ChangeP50Ms),
			millis(res.ChangeP90Ms), millis(res.ChangeMaxMs), res.RSSMiB, res.CPUColdSeconds, res.CPUPerChangeMs,
			res.Service.ExchangeP50us, res.Direct.ExchangeP50us, res.Service.ExchangeP50us-res.Direct.ExchangeP50us,
			res.Service.Failed, res.Service.Failed+r.LatencySamples)
	}
	return b.String()
}

// Ratios compares nftgate with each kube-proxy mode at each size.
func (r *Report) Ratios() string {
	var b bytes.Buffer
	for _, ng := range r.Results {
		if ng.Proxier != proxNftgate {
			continue
		}
		for _, kp := range r.Results {
			if kp.Services != ng.Services || strings.HasPrefix(kp.Proxier, proxNftgate) || ng.TimedOut != "" {
				continue
			}
			if kp.TimedOut != "" {
				fmt.Fprintf(&b, "- N=%s, nftgate vs %s: %s did not finish its cold start in %s; nftgate took %s.\n",
					thousands(ng.Services), kp.Proxier, kp.Proxier, seconds(kp.ColdStartSeconds), seconds(ng.ColdStartSeconds))
				continue
			}
			fmt.Fprintf(&b, "- N=%s, nftgate vs %s: cold start %s faster, endpoint change p50 %s faster, RSS %s smaller, CPU per change %s less.\n",
				thousands(ng.Services), kp.Proxier, ratio(kp.ColdStartSeconds, ng.ColdStartSeconds),
				ratio(kp.ChangeP50Ms, ng.ChangeP50Ms), ratio(kp.RSSMiB, ng.RSSMiB), ratio(kp.CPUPerChangeMs, ng.CPUPerChangeMs))
		}
	}
	return b.String()
}

func ratio(theirs, ours float64) string {
	if ours <= 0 {
		return "n/a"
	}
	x := theirs / ours
	if x >= 10 {
		return fmt.Sprintf("%.0f×", x)
	}
	return fmt.Sprintf("%.1f×", x)
}

func seconds(s float64) string {
	if s < 10 {
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.1f s", s)
}

func millis(ms float64) string {
	switch {
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 10_000:
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f s", ms/1000)
}

func meanMs(sum, count float64) string {
	if count == 0 {
		return "–"
	}
	return millis(sum / count * 1000)
}

// thousands writes n with comma separators: 10000 -> 10,000.
func thousands(n int) string {
	s := fmt.Sprint(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
