package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The proxiers compared, in the order they run at each size.
const (
	proxNftgate     = "nftgate"
	proxKPNFTables  = "kube-proxy-nftables"
	proxKPIPTables  = "kube-proxy-iptables"
	nftgateListen   = "127.0.0.1:9180"
	kpMetricsListen = "127.0.0.1:10249"
	kpHealthzListen = "127.0.0.1:10256"
)

var allProxiers = []string{proxNftgate, proxKPNFTables, proxKPIPTables}

// Proxier is one program that turns Services into kernel rules.
type Proxier struct {
	Name string
	// MetricPrefix starts its sync metrics: nftgate_ or kubeproxy_.
	MetricPrefix string
	// MetricsURL is its Prometheus endpoint inside the gateway namespace.
	MetricsURL string
	// ReadyURL answers 200 once its first sync is done.
	ReadyURL string

	bin        string
	args       func(dir string) ([]string, error)
	cleanupCmd func(dir string) ([]string, error)
}

func proxierByName(name string, e *Env) *Proxier {
	switch name {
	case proxNftgate, proxNftgateMaglev, proxNftgateNoCounters:
		var more []string
		switch name {
		case proxNftgateMaglev:
			more = append(more, maglevSetting)
		case proxNftgateNoCounters:
			more = append(more, countersOffSetting)
		}
		var source []string
		if e.Manifests != nil {
			source = []string{"--manifests", e.Manifests.Dir}
		} else {
			source = []string{"--kubeconfig", e.API.Kubeconfig()}
		}
		args := append(source, "--node-name", nodeName, "--listen", nftgateListen, "--cluster-cidr", clusterCIDR)
		args = append(args, e.Cfg.NftgateArgs...)
		return &Proxier{
			Name: name, MetricPrefix: "nftgate_", bin: e.Cfg.NftgateBin,
			MetricsURL: "http://" + nftgateListen + "/metrics", ReadyURL: "http://" + nftgateListen + "/readyz",
			args: func(dir string) ([]string, error) { return e.nftgateConfigArgs(dir, args, more...) },
			cleanupCmd: func(dir string) ([]string, error) {
				flags, err := e.nftgateConfigArgs(dir, nil, more...)
				return append([]string{e.Cfg.NftgateBin, "cleanup"}, flags...), err
			},
		}
	case proxKPNFTables, proxKPIPTables:
		mode := strings.TrimPrefix(name, "kube-proxy-")
		config := func(dir string) (string, error) {
			path := filepath.Join(dir, "kube-proxy-"+mode+".yaml")
			return path, os.WriteFile(path, []byte(kubeProxyConfig(mode, e.API.Kubeconfig())), 0o600)
		}
		return &Proxier{
			Name: name, MetricPrefix: "kubeproxy_", bin: e.Cfg.KubeProxyBin,
			MetricsURL: "http://" + kpMetricsListen + "/metrics", ReadyURL: "http://" + kpHealthzListen + "/healthz",
			args: func(dir string) ([]string, error) {
				path, err := config(dir)
				return []string{"--config", path, "--v", "1"}, err
			},
			cleanupCmd: func(dir string) ([]string, error) {
				path, err := config(dir)
				return []string{e.Cfg.KubeProxyBin, "--config", path, "--cleanup"}, err
			},
		}
	}
	panic("unknown proxier " + name)
}

// kubeProxyConfig is kube-proxy's configuration for the lab. Everything not
// set is kube-proxy's default, notably minSyncPeriod 1 s and syncPeriod
// 30 s. The conntrack settings are the ones it would write to sysctls that
// a network namespace does not let it change (nf_conntrack_max is
// read-only there): zero leaves them alone.
func kubeProxyConfig(mode, kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
metricsBindAddress: %s
healthzBindAddress: %s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, mode, kubeconfig, nodeName, clusterCIDR, kpMetricsListen, kpHealthzListen)
}

// Proc is a running proxier.
type Proc struct {
	cmd     *exec.Cmd
	Started time.Time
	LogPath string
	done    chan struct{}
	err     error
}

// Start runs the proxier in the gateway namespace, its output going to a
// log file in dir.
func (p *Proxier) Start(e *Env, dir string) (*Proc, error) {
	args, err := p.args(dir)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, p.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), p.bin, strings.Join(args, " "))
	cmd := e.Topo.Gateway.Command(context.Background(), p.bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// `ip netns exec` execs the program in place, so the pid is the
	// proxier's own and the signal reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr := &Proc{cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	pr.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	go func() {
		pr.err = cmd.Wait()
		close(pr.done)
	}()
	return pr, nil
}

// PID is the proxier's process id.
func (pr *Proc) PID() int { return pr.cmd.Process.Pid }

// Exited reports an error when the process has ended.
func (pr *Proc) Exited() error {
	select {
	case <-pr.done:
		return fmt.Errorf("exited (%v); log %s:\n%s", pr.err, pr.LogPath, tail(pr.LogPath, 30))
	default:
		return nil
	}
}

// Stop sends SIGTERM and kills the process if it has not exited after 20 s.
func (pr *Proc) Stop() {
	if pr.Exited() != nil {
		return
	}
	_ = pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.done:
	case <-time.After(20 * time.Second):
		_ = pr.cmd.Process.Kill()
		<-pr.done
	}
}

// Cleanup removes what the proxier programmed with its own cleanup
// command, then empties the gateway's ruleset and conntrack table so the
// next proxier starts from the same state.
func (p *Proxier) Cleanup(ctx context.Context, e *Env, dir string) error {
	argv, err := p.cleanupCmd(dir)
	if err != nil {
		return err
	}
	cmds := [][]string{argv, {"nft", "flush", "ruleset"}, {"conntrack", "-F"}}
	for _, c := range cmds {
		out, err := e.Topo.Gateway.Command(ctx, c[0], c[1:]...).CombinedOutput()
		// conntrack -F says what it flushed on stderr, and kube-proxy's
		// cleanup fails on rules of modes that were never set up.
		if err != nil && c[0] == "nft" {
			return fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	out, err := e.Topo.Gateway.Command(ctx, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft list ruleset: %v: %s", err, out)
	}
	if len(strings.TrimSpace(string(out))) != 0 {
		return fmt.Errorf("gateway ruleset not empty after cleanup:\n%.2000s", out)
	}
	return nil
}

// ProcStats is what the kernel accounts to a process.
type ProcStats struct {
	RSSKiB, HWMKiB int64
	// CPU is user plus system time of the process and of the children it
	// has reaped (kube-proxy runs nft, iptables-restore and friends).
	CPU time.Duration
}

var clockTick = 100 // USER_HZ: fixed at 100 on Linux for /proc

func readProcStats(pid int) (ProcStats, error) {
	var s ProcStats
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			s.RSSKiB, _ = strconv.ParseInt(f[0], 10, 64)
		case "VmHWM":
			s.HWMKiB, _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command name may hold spaces: the fields start after its ')'.
	rest := string(stat)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	fields := strings.Fields(rest)
	// After ')': state(3) ... utime(14) stime(15) cutime(16) cstime(17),
	// so utime is fields[11].
	if len(fields) < 15 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	var ticks int64
	for _, v := range fields[11:15] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/%d/stat: %q: %w", pid, v, err)
		}
		ticks += n
	}
	s.CPU = time.Duration(ticks) * time.Second / time.Duration(clockTick)
	return s, nil
}

// httpGet fetches url from inside the gateway namespace.
func httpGet(ctx context.Context, e *Env, url string) (int, string, error) {
	c := &http.Client{Transport: &http.Transport{DialContext: e.Topo.Gateway.DialContext, DisableKeepAlives: true},
		Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, string(body), err
}

// SyncMetrics are the proxier's own accounts of its syncs.
type SyncMetrics struct {
	Syncs              float64 `json:"syncs"`
	SyncSeconds        float64 `json:"sync_seconds"`
	ProgrammingCount   float64 `json:"programming_count"`
	ProgrammingSeconds float64 `json:"programming_seconds"`
}

func scrapeSyncMetrics(ctx context.Context, e *Env, p *Proxier) (SyncMetrics, error) {
	body, err := scrapeMetrics(ctx, e, p)
	if err != nil {
		return SyncMetrics{}, err
	}
	return SyncMetrics{
		Syncs:              metricSum(body, p.MetricPrefix+"sync_proxy_rules_duration_seconds_count"),
		SyncSeconds:        metricSum(body, p.MetricPrefix+"sync_proxy_rules_duration_seconds_sum"),
		ProgrammingCount:   metricSum(body, p.MetricPrefix+"network_programming_duration_seconds_count"),
		ProgrammingSeconds: metricSum(body, p.MetricPrefix+"network_programming_duration_seconds_sum"),
	}, nil
}

// scrapeMetrics returns p's /metrics page.
func scrapeMetrics(ctx context.Context, e *Env, p *Proxier) (string, error) {
	code, body, err := httpGet(ctx, e, p.MetricsURL)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d", p.MetricsURL, code)
	}
	return body, nil
}

// metricSum adds up the samples of a series in Prometheus text format.
func metricSum(body, name string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.eE+-]+)$`)
	total := 0.0
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		total += v
	}
	return total
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
