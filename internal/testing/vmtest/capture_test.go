package vmtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lockedbuf"
)

// capture records the packets on a tap device (the VM's side of a link,
// seen from the namespace that holds it) into a pcap file while the test
// runs. Summary prints them, with their checksums verified.
type capture struct {
	ns, dev, file string
	cmd           *exec.Cmd
	out           lockedbuf.Buffer
}

// startCapture starts tcpdump on dev in ns, keeping the first count
// packets that match filter (a pcap expression), and stops it when the
// test ends.
func startCapture(ctx context.Context, t *testing.T, ns *Netns, dev string, count int, filter string) *capture {
	t.Helper()
	c := &capture{ns: ns.Name, dev: dev, file: filepath.Join(t.TempDir(), dev+".pcap")}
	// -U writes each packet as it comes, so the file is complete up to
	// the moment it is read; -s 200 keeps the headers and some payload.
	c.cmd = exec.Command("ip", "netns", "exec", ns.Name, "tcpdump", "-i", dev, "-n", "-U", "-s", "200", "-c", strconv.Itoa(count), "-w", c.file, filter)
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("tcpdump on %s in %s: %v", dev, ns.Name, err)
	}
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
	// tcpdump writes the file's header once it captures.
	for {
		if st, err := os.Stat(c.file); err == nil && st.Size() > 0 {
			return c
		}
		select {
		case <-ctx.Done():
			t.Fatalf("tcpdump on %s in %s never started: %v\n%s", dev, ns.Name, ctx.Err(), c.out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Summary is the capture so far, one line per packet with checksums
// verified (tcpdump -vv), at most the last lines given.
func (c *capture) Summary(lines int) string {
	out, err := exec.Command("tcpdump", "-r", c.file, "-n", "-vv", "-tt").CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		s += "\n(tcpdump -r: " + err.Error() + ")"
	}
	// -vv puts the TCP line of an IPv4 packet on a second line.
	s = strings.ReplaceAll(s, ")\n    ", ") ")
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = append([]string{"..."}, l[len(l)-lines:]...)
	}
	return c.dev + " in " + c.ns + ":\n" + strings.Join(l, "\n")
}

// vmNetState is what the VM's kernel tells about forwarding: its
// connection table, conntrack and IP/TCP counters, and the interfaces'
// packet and drop counts.
func vmNetState(ctx context.Context, vm *VM) string {
	out, err := vm.Shell(ctx, "cat /proc/net/nf_conntrack; echo; cat /proc/net/stat/nf_conntrack; echo; cat /proc/net/dev; echo; cat /proc/net/snmp")
	if err != nil {
		return "the VM's state: " + err.Error()
	}
	return out
}
