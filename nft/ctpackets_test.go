package nft

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
	"github.com/nftgate/nftgate/ruleset"
)

// The packet count of the flowtable's offload rule (ruleset.Config.
// FlowtablePackets), as nftgate encodes it, in a kernel: on the output
// hook of a new namespace, one rule counts every packet and one only the
// packets of a connection past its Nth, both directions together, while
// TCP connections of different lengths run one after the other over the
// namespace's loopback. The longest passes 256 packets, where a count
// compared in the wrong byte order goes wrong; and nft reads the rule back
// as "ct packets > N".
func TestCtPacketsOverInKernel(t *testing.T) {
	name, fd := testNetNS(t)
	const over = 20
	const table = "nftgate-ct-packets"
	c := &ruleset.Chain{Name: "filter-output", Hook: &ruleset.Hook{Type: "filter", Hook: "output", Priority: ruleset.PrioFilter},
		Rules: []ruleset.Rule{
			{ruleset.MatchCtPacketsOver{N: over}, ruleset.Counter{}},
			{ruleset.Counter{}},
		}}
	programChains(t, fd, table, c)
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}

	listed := func() string {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", name, "nft", "list", "table", "ip", table).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list table: %v: %s", err, out)
		}
		return string(out)
	}
	counted := regexp.MustCompile(`(?m)^\s*(ct packets > (\d+) )?counter packets (\d+) bytes`)
	counts := func() (past, all int) {
		t.Helper()
		text := listed()
		m := counted.FindAllStringSubmatch(text, -1)
		if len(m) != 2 || m[0][1] == "" || m[0][2] != strconv.Itoa(over) || m[1][1] != "" {
			t.Fatalf("nft lists the chain as:\n%s\nwant a rule \"ct packets > %d counter\" and a bare counter", text, over)
		}
		past, _ = strconv.Atoi(m[0][3])
		all, _ = strconv.Atoi(m[1][3])
		return past, all
	}

	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var l net.Listener
	if err := netnstest.Do(h, func() (err error) {
		l, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lab.ServeConns(l, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
		}
	})

	for _, lines := range []int{1, 5, 40, 200} {
		pastBefore, allBefore := counts()
		if err := netnstest.Do(h, func() error {
			c, err := net.Dial("tcp4", l.Addr().String())
			if err != nil {
				return err
			}
			r := bufio.NewReader(c)
			for i := range lines {
				if _, err := fmt.Fprintf(c, "line %d\n", i); err != nil {
					c.Close()
					return err
				}
				if _, err := r.ReadString('\n'); err != nil {
					c.Close()
					return err
				}
			}
			// Close and wait for the server's close, so that every
			// packet of the connection has passed before counting.
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				c.Close()
				return err
			}
			if _, err := r.ReadString('\n'); err == nil {
				c.Close()
				return fmt.Errorf("a line after the close")
			}
			return c.Close()
		}); err != nil {
			t.Fatal(err)
		}
		// The last ACK of the close may still be on its way: count once
		// the connection's packets stop changing (the counters only grow).
		past, all := counts()
		for range 100 {
			p2, a2 := counts()
			if p2 == past && a2 == all {
				break
			}
			past, all = p2, a2
		}
		packets, gotPast := all-allBefore, past-pastBefore
		if want := max(0, packets-over); gotPast != want {
			t.Errorf("a connection of %d lines, %d packets: %d counted past the %dth, want %d", lines, packets, gotPast, over, want)
		}
		t.Logf("a connection of %d lines: %d packets, %d past the %dth", lines, packets, gotPast, over)
		if lines == 200 && packets <= 256 {
			t.Errorf("the longest connection passed %d packets, not past 256", packets)
		}
	}
}

// programChains creates the IPv4 table with the chains and their rules in
// the namespace fd, in one batch, as a sync encodes them.
func programChains(t *testing.T, fd int, table string, chains ...*ruleset.Chain) {
	t.Helper()
	var lastID atomic.Uint32
	w := newWire(16<<10, 64, false)
	w.marker(unix.NFNL_MSG_BATCH_BEGIN)
	e := newEncoder(w, &lastID, table, ruleset.IPv4)
	e.tableMessage(unix.NFT_MSG_NEWTABLE, flagsCreate|netlink.Excl, nil)
	for _, c := range chains {
		e.addChain(c)
		e.addRules(ruleset.PlanChain(ruleset.IPv4, c, nil))
	}
	if e.err != nil || w.err != nil {
		t.Fatalf("encoding: %v %v", e.err, w.err)
	}
	conn, err := dialBatch(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bt := &batch{parts: []*wire{w}}
	defer bt.release()
	if err := conn.send(bt, nil); err != nil {
		t.Fatalf("the kernel refused the rules: %v", err)
	}
}
