//go:build customkernel

package vmtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// TestApplianceReleaseResetUntracked: the resets with which nftgate
// releases a backend's TIME_WAIT pass the VM's conntrack untracked, as the
// copies they answer are: conntrack's `invalid` counter does not grow with
// the connections. The kernel attached an answer to an untracked packet
// (nf_send_reset's nf_ct_attach) as related to no entry, so conntrack
// looked each reset up as a packet of its own, allocated an entry for it,
// found that a reset opens no connection, counted it invalid and freed
// the entry: one for every masqueraded connection the backend closed
// first. The custom kernel carries the fix (image/kernel/patches/0003-*).
func TestApplianceReleaseResetUntracked(t *testing.T) {
	vm, client, cluster := bootFlowtableOff(t, "ss")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The backend writes a line and closes first: a TIME_WAIT for the
	// gateway to release.
	l, err := cluster.Listen("tcp", net.JoinHostPort(clusterIP, flowPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello\n")
			c.Close()
		}
	}()
	service := net.JoinHostPort(flowServiceIP, flowPort)
	if err := waitDial(ctx, vm, client, service); err != nil {
		t.Fatalf("%s from the client namespace: %v", service, err)
	}
	before, err := vmConntrackStats(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}

	// The client reads to the end before it closes: its FIN follows the
	// backend's, as the release needs.
	const conns = 50
	for i := range conns {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := client.DialContext(dctx, "tcp", service)
		cancel()
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, service, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, service, err)
		}
	}
	// The releases happened: the backend holds (almost) no TIME_WAIT
	// towards the VM. A crossed close (both ends at once) may leave one.
	var tw int
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		peers, err := timeWaitPeers(ctx, cluster)
		if err != nil {
			return err
		}
		if tw = peers[vmClusterAddr]; tw > conns/10 {
			return fmt.Errorf("the backend holds %d TIME_WAIT sockets towards the VM after %d connections: the release did not reset them", tw, conns)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	after, err := vmConntrackStats(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}
	invalid := after["invalid"] - min(after["invalid"], before["invalid"])
	t.Logf("%d connections via the Service, %d left in TIME_WAIT at the backend; conntrack invalid +%d", conns, tw, invalid)
	if invalid*5 > conns {
		t.Errorf("conntrack counted %d packets invalid in %d released connections: the release's resets were tracked", invalid, conns)
	}
}
