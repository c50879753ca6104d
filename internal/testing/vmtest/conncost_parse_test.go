package vmtest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// connResult is one run of connrate dial through the VM, and the VM's
// CPU meanwhile.
type connResult struct {
	Conns, Failed, Stalled int
	Rate                   float64
	// VMBusy and VMTotal are the VM's CPU time (all but idle and iowait)
	// and its whole time, in USER_HZ ticks, during the run.
	VMBusy, VMTotal float64
	// StallLines are the first of connrate's lines on stalled
	// connections.
	StallLines []string
}

// microsPerConn is the VM's busy CPU time a connection, in µs; with
// -icount shift=0 it is thousands of instructions a connection.
func (r connResult) microsPerConn() float64 { return r.VMBusy / 100 * 1e6 / float64(r.Conns) }

func (r connResult) String() string {
	return fmt.Sprintf("%d connections (%.0f/s, %d failed, %d stalled), VM CPU %.0f%% busy, %.1f µs of VM CPU a connection",
		r.Conns, r.Rate, r.Failed, r.Stalled, 100*r.VMBusy/r.VMTotal, r.microsPerConn())
}

// parseConnrate reads connrate dial's line, "conns=N rate=R/s failed=F
// stalled=S p50=… p99=… max=…".
func parseConnrate(out string) (connResult, error) {
	var r connResult
	line := strings.TrimSpace(out)
	if i := strings.LastIndex(line, "\n"); i >= 0 {
		line = line[i+1:]
	}
	if _, err := fmt.Sscanf(line, "conns=%d rate=%f/s failed=%d stalled=%d", &r.Conns, &r.Rate, &r.Failed, &r.Stalled); err != nil {
		return r, fmt.Errorf("connrate dial's output %q: %w", out, err)
	}
	return r, nil
}

// TestParseConnrate reads connrate dial's last line, after the stalls it
// reports on the lines before.
func TestParseConnrate(t *testing.T) {
	r, err := parseConnrate("stalled 10.0.0.1:4000 1.01s at 10:00:00.000000\nconns=12345 rate=1234/s failed=1 stalled=2 p50=1ms p99=5ms max=1.01s\n")
	if err != nil {
		t.Fatal(err)
	}
	if r.Conns != 12345 || r.Rate != 1234 || r.Failed != 1 || r.Stalled != 2 {
		t.Errorf("got %+v", r)
	}
	if _, err := parseConnrate("connrate: dial tcp: connection refused\n"); err == nil {
		t.Error("no error for a line without counts")
	}
}

// conntrackStats sums /proc/net/stat/nf_conntrack's columns over the CPUs
// (a header line, then one line of hexadecimal counters per CPU; "entries"
// is the same on every line and is taken once).
func conntrackStats(out string) (map[string]uint64, error) {
	var names []string
	sums := map[string]uint64{}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "entries" {
			names = f
			continue
		}
		if names == nil || len(f) != len(names) {
			continue
		}
		for i, s := range f {
			v, err := strconv.ParseUint(s, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/net/stat/nf_conntrack: %q: %w", line, err)
			}
			if names[i] == "entries" && rows > 0 {
				continue
			}
			sums[names[i]] += v
		}
		rows++
	}
	if rows == 0 {
		return nil, fmt.Errorf("/proc/net/stat/nf_conntrack: no counters in %q", out)
	}
	return sums, nil
}

// TestConntrackStats sums a two-CPU table as the kernel prints it.
func TestConntrackStats(t *testing.T) {
	out := "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n" +
		"000027ce  00000000 00000000 00000000 0000c058 00000000 00000000 00000000 00000000 00000001 000000b5 00000023 00000000  00000000 00000000 00000000 00000000\n" +
		"000027ce  00000000 00000000 00000000 00000002 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000000  00000000 00000000 00000000 00000000\n"
	s, err := conntrackStats(out)
	if err != nil {
		t.Fatal(err)
	}
	if s["entries"] != 0x27ce || s["invalid"] != 0xc05a || s["drop"] != 0xb6 || s["early_drop"] != 0x23 || s["insert_failed"] != 1 {
		t.Errorf("got %v", s)
	}
	if _, err := conntrackStats("entries drop\n"); err == nil {
		t.Error("no error without counters")
	}
}
