package vmtest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// The Service of testdata/flowtable/manifests, and the two iperf3 servers
// on the cluster namespace's address: the Service's endpoint, and one
// reached directly (routed through the VM, not translated).
const (
	flowServiceIP  = "10.96.0.20"
	flowPort       = "5201" // the Service's port and its endpoint's
	flowDirectPort = "5202"
	flowUDPPort    = "5353" // the Service's UDP port and its endpoint's
)

// offloadCount is what countOffloaded found: established connections to
// the Service and direct, and how many of each are offloaded.
type offloadCount struct{ svc, svcOffloaded, dir, dirOffloaded int }

func (c offloadCount) String() string {
	return fmt.Sprintf("service connections %d (offloaded %d), direct %d (offloaded %d)", c.svc, c.svcOffloaded, c.dir, c.dirOffloaded)
}

// countOffloaded reads lines of /proc/net/nf_conntrack. An offloaded TCP
// entry shows [OFFLOAD] and neither its timeout nor its state (Linux 6.12
// tcp_print_conntrack prints no state for it); the flowtable takes only
// established ones. Any other counts when ESTABLISHED.
func countOffloaded(table string) offloadCount {
	var c offloadCount
	for _, line := range strings.Split(table, "\n") {
		off := strings.Contains(line, "[OFFLOAD]")
		if !off && !strings.Contains(line, " ESTABLISHED ") {
			continue
		}
		switch {
		case strings.Contains(line, "dst="+flowServiceIP+" ") && strings.Contains(line, "dport="+flowPort+" "):
			c.svc++
			if off {
				c.svcOffloaded++
			}
		case strings.Contains(line, "dst="+clusterIP+" ") && strings.Contains(line, "dport="+flowDirectPort+" "):
			c.dir++
			if off {
				c.dirOffloaded++
			}
		}
	}
	return c
}

// TestCountOffloaded reads lines the VM's /proc/net/nf_conntrack showed
// with Linux 6.12 while the flowtable test's transfers ran.
func TestCountOffloaded(t *testing.T) {
	table := `ipv4     2 tcp      6 6 CLOSE src=10.123.1.2 dst=10.96.0.20 sport=59546 dport=5201 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59546 [ASSURED] mark=0 use=2
ipv4     2 tcp      6 src=10.123.1.2 dst=10.96.0.20 sport=59558 dport=5201 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59558 [OFFLOAD] mark=0 use=3
ipv4     2 tcp      6 src=10.123.1.2 dst=10.96.0.20 sport=59564 dport=5201 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59564 [OFFLOAD] mark=0 use=3
ipv4     2 tcp      6 431998 ESTABLISHED src=10.123.1.2 dst=10.96.0.20 sport=59570 dport=5201 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59570 [ASSURED] mark=0 use=2
ipv4     2 tcp      6 431999 ESTABLISHED src=10.123.1.2 dst=10.123.2.2 sport=36202 dport=5202 src=10.123.2.2 dst=10.123.1.2 sport=5202 dport=36202 [ASSURED] mark=0 use=2
ipv4     2 tcp      6 src=10.123.1.2 dst=10.123.2.2 sport=36214 dport=5202 src=10.123.2.2 dst=10.123.1.2 sport=5202 dport=36214 [OFFLOAD] mark=0 use=3
ipv4     2 udp      17 27 src=127.0.0.1 dst=127.0.0.1 sport=41694 dport=53 [UNREPLIED] src=127.0.0.1 dst=127.0.0.1 sport=53 dport=41694 mark=0 use=2`
	got := countOffloaded(table)
	want := offloadCount{svc: 3, svcOffloaded: 2, dir: 2, dirOffloaded: 1}
	if got != want {
		t.Errorf("countOffloaded: %v, want %v", got, want)
	}
}

// offloadedUDP counts the UDP flows to the Service's UDP port in lines of
// /proc/net/nf_conntrack, and how many of them are offloaded.
func offloadedUDP(table string) (flows, offloaded int) {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "udp" || !strings.Contains(line, "dst="+flowServiceIP+" ") ||
			!strings.Contains(line, "dport="+flowUDPPort+" ") {
			continue
		}
		flows++
		if strings.Contains(line, "[OFFLOAD]") {
			offloaded++
		}
	}
	return flows, offloaded
}

// offloadedBytes sums the bytes, both directions, of the offloaded
// connections to the Service in lines of /proc/net/nf_conntrack, and tells
// whether they carried counts at all (they do while nf_conntrack_acct is
// on: "packets=P bytes=B" after each direction's tuple).
func offloadedBytes(table string) (uint64, bool) {
	var sum uint64
	counted := false
	for _, line := range strings.Split(table, "\n") {
		if !strings.Contains(line, "[OFFLOAD]") || !strings.Contains(line, "dst="+flowServiceIP+" ") ||
			!strings.Contains(line, "dport="+flowPort+" ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "bytes="); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				if err == nil {
					sum += n
					counted = true
				}
			}
		}
	}
	return sum, counted
}

// TestOffloadedUDP reads lines in the shape Linux 6.12 shows UDP flows,
// offloaded and not.
func TestOffloadedUDP(t *testing.T) {
	table := `ipv4     2 udp      17 src=10.123.1.2 dst=10.96.0.20 sport=40000 dport=5353 packets=1 bytes=40 src=10.123.2.2 dst=10.123.2.1 sport=5353 dport=40000 packets=1 bytes=40 [OFFLOAD] mark=0 use=3
ipv4     2 udp      17 28 src=10.123.1.2 dst=10.96.0.20 sport=40002 dport=5353 packets=1 bytes=40 src=10.123.2.2 dst=10.123.2.1 sport=5353 dport=40002 packets=1 bytes=40 mark=0 use=2
ipv4     2 udp      17 29 src=127.0.0.1 dst=127.0.0.1 sport=41694 dport=53 [UNREPLIED] src=127.0.0.1 dst=127.0.0.1 sport=53 dport=41694 mark=0 use=2
ipv4     2 tcp      6 src=10.123.1.2 dst=10.96.0.20 sport=59558 dport=5201 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59558 [OFFLOAD] mark=0 use=3`
	if flows, off := offloadedUDP(table); flows != 2 || off != 1 {
		t.Errorf("offloadedUDP: %d flows, %d offloaded, want 2 and 1", flows, off)
	}
}

// TestOffloadedBytes reads lines in the shape Linux 6.12 shows them with
// nf_conntrack_acct on.
func TestOffloadedBytes(t *testing.T) {
	table := `ipv4     2 tcp      6 src=10.123.1.2 dst=10.96.0.20 sport=59558 dport=5201 packets=40 bytes=2000 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59558 packets=30 bytes=1000000 [OFFLOAD] mark=0 use=3
ipv4     2 tcp      6 431998 ESTABLISHED src=10.123.1.2 dst=10.96.0.20 sport=59570 dport=5201 packets=3 bytes=180 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59570 packets=2 bytes=120 [ASSURED] mark=0 use=2
ipv4     2 tcp      6 src=10.123.1.2 dst=10.123.2.2 sport=36214 dport=5202 packets=9 bytes=900 src=10.123.2.2 dst=10.123.1.2 sport=5202 dport=36214 packets=9 bytes=900 [OFFLOAD] mark=0 use=3`
	if got, ok := offloadedBytes(table); got != 1002000 || !ok {
		t.Errorf("offloadedBytes: %d %v, want 1002000 true", got, ok)
	}
	if got, ok := offloadedBytes("ipv4     2 tcp      6 src=10.123.1.2 dst=10.96.0.20 sport=59558 dport=5201 src=10.123.2.2 dst=10.123.2.1 sport=5201 dport=59558 [OFFLOAD] mark=0 use=3"); got != 0 || ok {
		t.Errorf("offloadedBytes without accounting: %d %v, want 0 false", got, ok)
	}
}
