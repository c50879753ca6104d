//go:build customkernel

package vmtest

import (
	"bufio"
	"context"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// TestApplianceHalfClosedFINAgain: a client half-closes a connection
// through a Service (it has sent its request and reads the answer) and
// its FIN is sent again (held back at the backend for the first tries, as
// a late ACK makes it go out again); the backend answers a line, pauses
// 5 s and answers another. The connection carries both: conntrack keeps
// it half closed (the kernel patch 0004: a stock kernel takes the FIN sent
// again for the backend's, moves the entry to TIME_WAIT on the next ACK,
// and with nftgate's 2 s TIME_WAIT forgets it during the pause, so the
// second line is answered by the gateway's own stack with a reset).
func TestApplianceHalfClosedFINAgain(t *testing.T) {
	vm, client, cluster := bootFlowtableOff(t, "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	backend := net.JoinHostPort(clusterIP, flowPort)
	l, err := cluster.Listen("tcp", backend)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lab.ServeConns(l, func(c net.Conn) {
		r := bufio.NewReader(c)
		if _, err := r.ReadString('\n'); err != nil {
			return // waitDial's connections
		}
		if _, err := io.Copy(io.Discard, r); err != nil {
			return
		}
		io.WriteString(c, "a\n")
		time.Sleep(5 * time.Second)
		io.WriteString(c, "b\n")
	})
	service := net.JoinHostPort(flowServiceIP, flowPort)
	if err := waitDial(ctx, vm, client, service); err != nil {
		t.Fatalf("%s from the client namespace: %v", service, err)
	}

	// The backend drops the client's FINs until two have come: the FIN
	// and the same FIN sent again have both passed the gateway.
	const table = "half-closed-test"
	nft := func(script string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", cluster.Name, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft in %s: %v\n%s", cluster.Name, err, out)
		}
	}
	nft("table ip " + table + " {\n\tchain prerouting {\n\t\ttype filter hook prerouting priority raw; policy accept;\n" +
		"\t\ttcp dport " + flowPort + " tcp flags & fin == fin counter drop\n\t}\n}\n")
	dropped := func() int {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", cluster.Name, "nft", "list", "table", "ip", table).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list in %s: %v\n%s", cluster.Name, err, out)
		}
		m := regexp.MustCompile(`counter packets (\d+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no counter in:\n%s", out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}

	c, err := client.DialContext(ctx, "tcp", service)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	if _, err := io.WriteString(tc, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if err := tc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	for dropped() < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("the client's FIN was not sent again: %d dropped", dropped())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("the backend dropped the client's FIN %d times; now it lets it in", dropped())
	nft("delete table ip " + table + "\n")

	start := time.Now()
	_ = tc.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(tc)
	t.Logf("read %q in %v: %v", got, time.Since(start).Round(time.Millisecond), err)
	if string(got) != "a\nb\n" || err != nil {
		t.Errorf("the half-closed connection answered %q (%v), want %q and the backend's FIN", got, err, "a\nb\n")
	}
	out, _ := exec.CommandContext(ctx, "ip", "netns", "exec", cluster.Name, "nstat", "-az", "TcpExtTCPAbortOnData", "TcpAttemptFails", "TcpEstabResets", "TcpOutRsts").CombinedOutput()
	t.Logf("the backend's counters:\n%s", out)
}
