//go:build customkernel

// TestApplianceFlowtable needs two images with the kernel of `make kernel`
// (the stock gokrazy kernel has no flowtables); `make vmtest-flowtable`
// builds them and runs it with the build tag customkernel.

package vmtest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// bulkResult is one iperf3 transfer through the VM, and the VM's CPU
// meanwhile.
type bulkResult struct {
	Bytes, Seconds float64
	// VMBusy and VMTotal are the VM's CPU time (all but idle and iowait)
	// and its whole time, in USER_HZ ticks, during the transfer.
	VMBusy, VMTotal float64
}

func (r bulkResult) mbps() float64 { return r.Bytes * 8 / r.Seconds / 1e6 }

// cpuSecondsPerGB is the VM's busy CPU time per gigabyte carried.
func (r bulkResult) cpuSecondsPerGB() float64 { return r.VMBusy / 100 / (r.Bytes / 1e9) }

func (r bulkResult) String() string {
	return fmt.Sprintf("%.0f Mbit/s, VM CPU %.0f%% busy, %.2f VM CPU-s per GB", r.mbps(), 100*r.VMBusy/r.VMTotal, r.cpuSecondsPerGB())
}

// TestApplianceFlowtable boots the image with nftgate's flowtable off and
// then the one with it on, and in each runs iperf3 from the client
// namespace through the VM to the cluster namespace: to the Service
// (DNATed and masqueraded) and directly (only routed). With the flowtable
// on, the Service's connections show [OFFLOAD] in the VM's conntrack table
// and the direct one does not (nftgate offloads only what it translates);
// with it off, nothing is offloaded. Throughput and the VM's CPU are
// logged for both, with their ratio: under emulation the absolute numbers
// say little about hardware, and nothing here is asserted on them. With
// NFTGATE_VMTEST_ICOUNT (e.g. "shift=0,sleep=on") the VM's clock counts
// its instructions while it runs, so its CPU time per gigabyte is its
// instructions per byte (times 2^shift ns), which the host's load does not
// move; the direct path, which the setting does not touch, shows how
// closely.
func TestApplianceFlowtable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and tap devices")
	}
	for _, tool := range []string{"qemu-system-x86_64", "iperf3", "tcpdump", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (make vmtest-flowtable installs what it needs): %v", tool, err)
		}
	}
	images := map[string]string{"off": os.Getenv("NFTGATE_VMTEST_FLOWTABLE_OFF"), "on": os.Getenv("NFTGATE_VMTEST_FLOWTABLE_ON")}
	for mode, img := range images {
		if img == "" {
			t.Fatalf("no image for flowtable %s: run make vmtest-flowtable, which builds the kernel and both images", mode)
		}
	}
	results := map[string]map[string]bulkResult{}
	for _, mode := range []string{"off", "on"} {
		t.Run(mode, func(t *testing.T) {
			results[mode] = flowtableRun(t, images[mode], mode == "on")
		})
	}
	off, on := results["off"], results["on"]
	if off == nil || on == nil {
		return
	}
	for _, path := range []string{"service", "direct"} {
		t.Logf("%s: flowtable off %v; on %v; throughput on/off %.2f, VM CPU-s per GB on/off %.2f (%s)",
			path, off[path], on[path], on[path].mbps()/off[path].mbps(), on[path].cpuSecondsPerGB()/off[path].cpuSecondsPerGB(), vmCPUClock())
	}
}

// vmCPUClock says what the VM's CPU time counts: host time, or with
// NFTGATE_VMTEST_ICOUNT its instructions.
func vmCPUClock() string {
	if ic := os.Getenv("NFTGATE_VMTEST_ICOUNT"); ic != "" {
		return "the VM's CPU counts its instructions (-icount " + ic + ")"
	}
	return "the VM's CPU is host time"
}

// flowtableRun boots one image, checks which flows are offloaded, and
// measures a transfer to the Service and one direct.
func flowtableRun(t *testing.T, image string, offload bool) map[string]bulkResult {
	client := newNetns(t, "client")
	cluster := newNetns(t, "cluster")
	vm := bootVM(t, image, client, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	for _, port := range []string{flowPort, flowDirectPort} {
		startIperfServer(ctx, t, cluster, port)
	}
	startUDPEcho(t, cluster, net.JoinHostPort(clusterIP, flowUDPPort))
	// When it fails: the packets of both ports on both of the VM's links
	// (all but bulk data and pure acknowledgements, so that iperf3's
	// control connections are kept whole), and the VM's counters.
	var captures []*capture
	for _, c := range []struct {
		ns  *Netns
		dev string
	}{{client, "vm-eth0"}, {cluster, "vm-eth1"}} {
		captures = append(captures, startCapture(ctx, t, c.ns, c.dev, 4000, flowCaptureFilter))
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		t.Logf("the VM's connections and counters:\n%s", vmNetState(ctx, vm))
		for _, c := range captures {
			t.Logf("%s", c.Summary(150))
		}
	})
	service := net.JoinHostPort(flowServiceIP, flowPort)
	direct := net.JoinHostPort(clusterIP, flowDirectPort)
	// The Service answers once nftgate has programmed it; the direct
	// path once netconfig has set up forwarding.
	for _, addr := range []string{service, direct} {
		if err := waitDial(ctx, vm, client, addr); err != nil {
			t.Fatalf("%s from the client namespace: %v", addr, err)
		}
	}

	// Both transfers at once, long enough to read the VM's connection
	// table while they run; stopped as soon as it has been read.
	bg, stop := context.WithCancel(ctx)
	for _, addr := range []string{service, direct} {
		cmd := iperfClient(bg, client, addr, 120)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() { stop(); <-done })
	}
	checkOffloaded(ctx, t, vm, offload)
	stop()

	checkUDPRequests(ctx, t, vm, client)

	// The two paths take turns, so that a change in the host's load
	// meanwhile falls on both; each path's median run is kept.
	runs := map[string][]bulkResult{}
	for round := range bulkRounds {
		for _, p := range []struct{ name, addr string }{{"direct", direct}, {"service", service}} {
			r, err := measureBulk(ctx, vm, client, p.addr)
			if err != nil {
				t.Fatalf("%s transfer to %s: %v", p.name, p.addr, err)
			}
			t.Logf("flowtable %v, round %d, %s (%s): %v", offload, round+1, p.name, p.addr, r)
			runs[p.name] = append(runs[p.name], r)
		}
	}
	res := map[string]bulkResult{}
	for name, rs := range runs {
		slices.SortFunc(rs, func(a, b bulkResult) int { return cmp.Compare(a.mbps(), b.mbps()) })
		res[name] = rs[len(rs)/2]
	}
	t.Logf("flowtable %v, medians: service %v; direct %v; service/direct throughput %.2f",
		offload, res["service"], res["direct"], res["service"].mbps()/res["direct"].mbps())
	return res
}

// flowCaptureFilter keeps the packets of both iperf3 ports that open or
// close a connection or carry up to 300 bytes of data: iperf3's control
// messages, not its bulk data nor pure acknowledgements.
const flowCaptureFilter = "tcp and (port " + flowPort + " or port " + flowDirectPort + ") and " +
	"(tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0 or " +
	"(ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2) > 0 and less 400))"

// bulkRounds is the number of transfers per path and image.
const bulkRounds = 3

// checkOffloaded waits until the VM's conntrack table shows both
// transfers established, and then, with the flowtable on, until the
// Service's connections are offloaded; the direct one never is, nor is
// anything with the flowtable off. It gives up after offloadWait.
func checkOffloaded(ctx context.Context, t *testing.T, vm *VM, offload bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, offloadWait)
	defer cancel()
	var last string
	var c offloadCount
	for {
		out, err := vm.Shell(ctx, "grep -E 'dport=("+flowPort+"|"+flowDirectPort+") ' /proc/net/nf_conntrack")
		if err != nil {
			t.Fatalf("the VM's conntrack table: %v (last read:\n%s)", err, last)
		}
		if out != "" {
			last = out
		}
		c = countOffloaded(out)
		if c.dirOffloaded > 0 || (!offload && c.svcOffloaded > 0) {
			t.Fatalf("flowtable %v: offloaded connections that must not be (%v):\n%s", offload, c, out)
		}
		if c.svc > 0 && c.dir > 0 && (!offload || c.svcOffloaded > 0) {
			t.Logf("flowtable %v: %v:\n%s", offload, c, out)
			if offload {
				checkOffloadedCounted(ctx, t, vm, out)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("flowtable %v: the transfers never showed as expected within %v (%v); last read:\n%s",
				offload, offloadWait, c, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// checkOffloadedCounted waits until the offloaded Service connections'
// bytes in conntrack have grown by a MiB past what table showed: the
// flowtable counts what it forwards (its counter flag), in the counters
// that its packet count turned on (nf_conntrack_acct). Without the flag
// they stop where the connection was offloaded.
func checkOffloadedCounted(ctx context.Context, t *testing.T, vm *VM, table string) {
	t.Helper()
	first, ok := offloadedBytes(table)
	if !ok {
		t.Fatalf("the offloaded connections carry no byte counts: conntrack's accounting is off:\n%s", table)
	}
	last := first
	for last < first+1<<20 {
		select {
		case <-ctx.Done():
			t.Fatalf("the offloaded connections' bytes went from %d to %d, not a MiB further, within %v: the flowtable does not count what it forwards",
				first, last, offloadWait)
		case <-time.After(500 * time.Millisecond):
		}
		out, err := vm.Shell(ctx, "grep -E 'dport="+flowPort+" ' /proc/net/nf_conntrack")
		if err != nil {
			t.Fatalf("the VM's conntrack table: %v", err)
		}
		if b, ok := offloadedBytes(out); ok {
			last = b
		}
	}
	t.Logf("the offloaded connections' bytes in conntrack: %d, then %d", first, last)
}

// udpRequests is how many UDP requests checkUDPRequests sends.
const udpRequests = 50

// checkUDPRequests sends udpRequests UDP requests to the Service from the
// client namespace, each from a port of its own and answered once, and
// requires that the VM's conntrack holds a flow for each and offloaded
// none: a request and its answer are 2 packets, and the flowtable takes a
// connection only past flowtable_packets (20, the image's default).
// Offloaded at once, each would stay in the flowtable until its timeout.
func checkUDPRequests(ctx context.Context, t *testing.T, vm *VM, client *Netns) {
	t.Helper()
	addr := net.JoinHostPort(flowServiceIP, flowUDPPort)
	for i := range udpRequests {
		if err := udpExchange(ctx, client, addr, fmt.Sprintf("request %d", i)); err != nil {
			t.Fatalf("UDP request %d to %s: %v", i, addr, err)
		}
	}
	out, err := vm.Shell(ctx, "grep -E 'dport="+flowUDPPort+" ' /proc/net/nf_conntrack")
	if err != nil {
		t.Fatalf("the VM's conntrack table: %v", err)
	}
	flows, offloaded := offloadedUDP(out)
	if flows < udpRequests || offloaded != 0 {
		t.Fatalf("after %d UDP requests to the Service: %d flows in conntrack, %d offloaded; want %d, none offloaded:\n%s",
			udpRequests, flows, offloaded, udpRequests, out)
	}
	t.Logf("%d UDP requests to the Service: %d flows in conntrack, none offloaded", udpRequests, flows)
}

// udpExchange sends one datagram from ns to addr, from a new port, and
// waits for its echo.
func udpExchange(ctx context.Context, ns *Netns, addr, msg string) error {
	c, err := ns.DialContext(ctx, "udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	// A datagram lost under emulation is sent again.
	buf := make([]byte, 64)
	for range 5 {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return err
		}
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) == msg {
			return nil
		}
		if err == nil {
			return fmt.Errorf("answered %q, want %q", buf[:n], msg)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("no answer to 5 tries")
}

// startUDPEcho answers every datagram on addr in ns with itself until the
// test ends.
func startUDPEcho(t *testing.T, ns *Netns, addr string) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatalf("UDP echo on %s: %v", addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	lab.ServeDatagrams(pc, func(req []byte) []byte { return req })
}

// offloadWait is how long checkOffloaded waits, well past the time the
// transfers take to start under emulation on a loaded host.
const offloadWait = 3 * time.Minute

// startIperfServer runs an iperf3 server on the cluster namespace's
// address and port until the test ends.
func startIperfServer(ctx context.Context, t *testing.T, ns *Netns, port string) {
	t.Helper()
	// waitDial's connections, closed before a test began, show in its log
	// as "unable to receive parameters from client".
	startServer(ctx, t, ns, port, "iperf3 server", "iperf3", "--server", "--bind", clusterIP, "--port", port)
}

// startServer runs argv in ns until the test ends, once a connection to
// the cluster namespace's address and port from ns itself succeeds; its
// output is logged when the test fails.
func startServer(ctx context.Context, t *testing.T, ns *Netns, port, what string, argv ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name}, argv...)...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s on port %s:\n%s", what, port, out)
		}
	})
	if err := waitDial(ctx, nil, ns, net.JoinHostPort(clusterIP, port)); err != nil {
		t.Fatalf("%s on port %s: %v\n%s", what, port, err, out)
	}
}

// waitDial connects from ns to addr until a connection succeeds, ctx ends
// or the VM (when given) stops.
func waitDial(ctx context.Context, vm *VM, ns *Netns, addr string) error {
	var done <-chan struct{}
	if vm != nil {
		done = vm.Done()
	}
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := ns.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no connection: %w (last attempt: %v)", ctx.Err(), err)
		case <-done:
			return fmt.Errorf("QEMU exited before %s answered (last attempt: %v)", addr, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// iperfClient is an iperf3 client in ns sending to addr for seconds, its
// report in JSON.
func iperfClient(ctx context.Context, ns *Netns, addr string, seconds int) *exec.Cmd {
	host, port, _ := net.SplitHostPort(addr)
	return exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, "iperf3", "--client", host, "--port", port,
		"--time", strconv.Itoa(seconds), "--json")
}

// measureBulk runs a 10-second iperf3 transfer from ns to addr and reads
// the VM's CPU times just before and after it.
func measureBulk(ctx context.Context, vm *VM, ns *Netns, addr string) (bulkResult, error) {
	before, err := vmCPU(ctx, vm)
	if err != nil {
		return bulkResult{}, err
	}
	var out []byte
	for {
		// The server may still be finishing the test stopped before.
		out, err = iperfClient(ctx, ns, addr, 10).Output()
		if err == nil {
			break
		}
		if !strings.Contains(string(out), "busy") || ctx.Err() != nil {
			return bulkResult{}, fmt.Errorf("iperf3: %w\n%s", err, out)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
		if before, err = vmCPU(ctx, vm); err != nil {
			return bulkResult{}, err
		}
	}
	after, err := vmCPU(ctx, vm)
	if err != nil {
		return bulkResult{}, err
	}
	var rep struct {
		End struct {
			SumReceived struct {
				Bytes   float64 `json:"bytes"`
				Seconds float64 `json:"seconds"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return bulkResult{}, fmt.Errorf("iperf3 report: %w\n%s", err, out)
	}
	r := bulkResult{Bytes: rep.End.SumReceived.Bytes, Seconds: rep.End.SumReceived.Seconds,
		VMBusy: after[0] - before[0], VMTotal: after[1] - before[1]}
	if r.Bytes == 0 || r.Seconds == 0 || r.VMTotal <= 0 {
		return r, fmt.Errorf("nothing measured: %+v\n%s", r, out)
	}
	return r, nil
}

// vmCPU reads the VM's CPU times from /proc/stat: busy (all but idle and
// iowait) and total, in USER_HZ ticks.
func vmCPU(ctx context.Context, vm *VM) ([2]float64, error) {
	out, err := vm.Shell(ctx, "head -1 /proc/stat")
	if err != nil {
		return [2]float64{}, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			continue
		}
		var busy, total float64
		for i, s := range f[1:9] { // user nice system idle iowait irq softirq steal
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return [2]float64{}, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			total += v
			if i != 3 && i != 4 {
				busy += v
			}
		}
		return [2]float64{busy, total}, nil
	}
	return [2]float64{}, fmt.Errorf("/proc/stat: no cpu line in %q", out)
}
