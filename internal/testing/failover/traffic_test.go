package failover_test

import (
	"bufio"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/failover"
)

// TestTrafficCountsLosses: the generator counts a reset and a wrong byte
// as lost and keeps a flow that echoes correctly, with its stall.
func TestTrafficCountsLosses(t *testing.T) {
	client, server, addr := clientServer(t, "198.18.40.0/24")
	dst := netip.AddrPortFrom(addr, 8080)
	ln, err := server.Listen("tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// The first connection gets a wrong byte at its third line, the
	// second a reset, the third a pause of 700 ms at its fifth.
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn, k int32) {
				defer c.Close()
				r := bufio.NewReader(c)
				for i := 1; ; i++ {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					switch {
					case k == 0 && i == 3:
						line = "x" + line[1:]
					case k == 1 && i == 3:
						c.(*net.TCPConn).SetLinger(0)
						return
					case k == 2 && i == 5:
						time.Sleep(700 * time.Millisecond)
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}(c, n.Add(1)-1)
		}
	}()
	run, err := failover.Start(client, dst, failover.Traffic{TCP: 3, Survive: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Established(10 * time.Second); err != nil {
		run.Stop()
		t.Fatal(err)
	}
	run.Failed(time.Now())
	run.Settle()
	res := run.Stop()
	t.Logf("%s", res)
	if res.TCP.Lost != 2 || res.TCP.Reasons["wrong bytes"] != 1 || res.TCP.Reasons["reset"] != 1 {
		t.Errorf("lost %d %v, want a wrong byte and a reset", res.TCP.Lost, res.TCP.Reasons)
	}
	if res.TCP.StallMaxMs < 700 {
		t.Errorf("the kept flow's stall %.0f ms, want at least the 700 ms pause", res.TCP.StallMaxMs)
	}
}
