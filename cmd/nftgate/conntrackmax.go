package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// The conntrack table's size: every connection the gateway forwards,
// translated or routed, takes an entry until it has closed and its
// TIME_WAIT (conntrack_tcp_time_wait) has passed, and when the table is
// full the kernel drops the first packet of a new connection (conntrack
// -S: drop, early_drop): a stall of a second or more for its client. The
// kernel sizes the table by the memory (8,192 entries on a box of 1 GB),
// which a gateway fills at a few thousand new connections a second.
const (
	defaultConntrackMaxPerCPU = 32768  // kube-proxy's conntrack.maxPerCore
	defaultConntrackMin       = 131072 // kube-proxy's conntrack.min
	maxConntrackMaxPerCPU     = 1 << 22
	maxConntrackMin           = 1 << 26
)

// The sysctls of the table's size and of its hash table's (both global:
// a network namespace other than the first reads them only).
const (
	conntrackMaxSysctl     = "/proc/sys/net/netfilter/nf_conntrack_max"
	conntrackBucketsSysctl = "/proc/sys/net/netfilter/nf_conntrack_buckets"
)

// conntrackMax is the table size the settings ask for on a box with cpus
// CPUs: conntrack_min or conntrack_max_per_cpu per CPU, whichever is more;
// 0 when conntrack_max_per_cpu is 0 (the table is left as it is).
func (c *Config) conntrackMax(cpus int) int {
	if c.ConntrackMaxPerCPU == 0 {
		return 0
	}
	return max(c.ConntrackMin, c.ConntrackMaxPerCPU*cpus)
}

// setupConntrackMax raises the conntrack table to the size the settings
// ask for where it is smaller (it never lowers it), and its hash table to
// a quarter of that, as kube-proxy does. Where that cannot be done (a
// network namespace other than the first cannot write them) it says so and
// goes on: the gateway works, with the table it has. It runs after the
// kernel check, which loads conntrack.
func setupConntrackMax(cfg *Config, log *slog.Logger, cpus int, maxPath, bucketsPath string) {
	want := cfg.conntrackMax(cpus)
	if want == 0 {
		return
	}
	have, err := readIntFile(maxPath)
	if err != nil {
		log.Warn("the conntrack table's size is unknown; left as it is", "err", err)
		return
	}
	if have >= want {
		return
	}
	if buckets, err := readIntFile(bucketsPath); err == nil && buckets < want/4 {
		if err := os.WriteFile(bucketsPath, []byte(strconv.Itoa(want/4)+"\n"), 0o644); err != nil {
			log.Warn("conntrack's hash table left as it is", "sysctl", bucketsPath, "buckets", buckets, "want", want/4, "err", err)
		}
	}
	if err := os.WriteFile(maxPath, []byte(strconv.Itoa(want)+"\n"), 0o644); err != nil {
		log.Warn(fmt.Sprintf("the conntrack table holds at most %d connections, fewer than conntrack_min and conntrack_max_per_cpu ask for (%d), and cannot be raised from here (a network namespace other than the first cannot): set net.netfilter.nf_conntrack_max where it can be; when the table is full, new connections are dropped", have, want),
			"sysctl", maxPath, "err", err)
		return
	}
	buckets, _ := readIntFile(bucketsPath)
	log.Info("conntrack table raised", "sysctl", maxPath, "from", have, "to", want, "buckets", buckets)
}

// readIntFile reads a file holding one decimal number.
func readIntFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}
