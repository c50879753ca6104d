package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The conntrack table is raised to conntrack_min or conntrack_max_per_cpu
// per CPU, whichever is more, with its hash table at a quarter of that;
// never lowered; left alone with conntrack_max_per_cpu 0.
func TestSetupConntrackMax(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		perCPU, min, cpus    int
		max, buckets         string
		wantMax, wantBuckets string
		wantLogged           []string
		wantLoggedNothing    bool
	}{
		{name: "a box of 1 GB", perCPU: defaultConntrackMaxPerCPU, min: defaultConntrackMin, cpus: 2, max: "8192\n", buckets: "8192\n",
			wantMax: "131072\n", wantBuckets: "32768\n", wantLogged: []string{"conntrack table raised", "from=8192 to=131072 buckets=32768"}},
		{name: "many CPUs", perCPU: defaultConntrackMaxPerCPU, min: defaultConntrackMin, cpus: 16, max: "65536\n", buckets: "65536\n",
			wantMax: "524288\n", wantBuckets: "131072\n", wantLogged: []string{"from=65536 to=524288"}},
		{name: "hash table already large", perCPU: 1000, min: 4000, cpus: 2, max: "1000\n", buckets: "5000\n",
			wantMax: "4000\n", wantBuckets: "5000\n", wantLogged: []string{"from=1000 to=4000 buckets=5000"}},
		{name: "larger already", perCPU: defaultConntrackMaxPerCPU, min: defaultConntrackMin, cpus: 2, max: "262144\n", buckets: "262144\n",
			wantMax: "262144\n", wantBuckets: "262144\n", wantLoggedNothing: true},
		{name: "left alone", perCPU: 0, min: defaultConntrackMin, cpus: 2, max: "8192\n", buckets: "8192\n",
			wantMax: "8192\n", wantBuckets: "8192\n", wantLoggedNothing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			maxPath, bucketsPath := filepath.Join(dir, "nf_conntrack_max"), filepath.Join(dir, "nf_conntrack_buckets")
			for p, v := range map[string]string{maxPath: tc.max, bucketsPath: tc.buckets} {
				if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg := defaults()
			cfg.ConntrackMaxPerCPU, cfg.ConntrackMin = tc.perCPU, tc.min
			var logged bytes.Buffer
			setupConntrackMax(&cfg, slog.New(slog.NewTextHandler(&logged, nil)), tc.cpus, maxPath, bucketsPath)
			if got, _ := os.ReadFile(maxPath); string(got) != tc.wantMax {
				t.Errorf("nf_conntrack_max %q, want %q", got, tc.wantMax)
			}
			if got, _ := os.ReadFile(bucketsPath); string(got) != tc.wantBuckets {
				t.Errorf("nf_conntrack_buckets %q, want %q", got, tc.wantBuckets)
			}
			for _, want := range tc.wantLogged {
				if !strings.Contains(logged.String(), want) {
					t.Errorf("log %q does not say %q", logged.String(), want)
				}
			}
			if tc.wantLoggedNothing && logged.Len() > 0 {
				t.Errorf("logged %q, want nothing", logged.String())
			}
		})
	}
}

// In a network namespace other than the first the kernel's own sysctls
// refuse the write, even to root: the gateway says what it could not do
// and what to set instead, and goes on.
func TestSetupConntrackMaxInANetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	have, err := readIntFile(conntrackMaxSysctl)
	if err != nil {
		t.Skipf("no conntrack here: %v", err)
	}
	if have >= 2*maxConntrackMaxPerCPU {
		t.Skipf("the table already holds %d", have)
	}
	var logged bytes.Buffer
	done := make(chan error, 1)
	go func() {
		// The thread stays in the new namespace and ends with this
		// goroutine (it is never unlocked).
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		cfg := defaults()
		cfg.ConntrackMaxPerCPU, cfg.ConntrackMin = maxConntrackMaxPerCPU, 0
		setupConntrackMax(&cfg, slog.New(slog.NewTextHandler(&logged, nil)), 2, conntrackMaxSysctl, conntrackBucketsSysctl)
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"conntrack table holds at most", "cannot be raised from here", "net.netfilter.nf_conntrack_max", "permission denied"} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log %q does not say %q", logged.String(), want)
		}
	}
	if now, _ := readIntFile(conntrackMaxSysctl); now != have {
		t.Errorf("nf_conntrack_max went from %d to %d", have, now)
	}
}
