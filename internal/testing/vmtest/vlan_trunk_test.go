package vmtest

import (
	"context"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestVLANTrunk checks the relay that TestApplianceVLAN (build tag
// customkernel) puts in front of the VM, without a VM: two relays face
// each other over a veth pair that carries only tagged frames, and TCP
// between their access namespaces works on the same VLAN id and not on
// different ones.
func TestVLANTrunk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and tap devices")
	}
	left := newNetns(t, "vl-left")
	right := newNetns(t, "vl-right")
	wire := newNetns(t, "vl-wire")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "trunk-l"}, PeerName: "trunk-r"}
	if err := wire.Netlink().LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"trunk-l", "trunk-r"} {
		l, err := wire.Netlink().LinkByName(name)
		if err == nil {
			err = wire.Netlink().LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	start := func(ns *Netns, trunkLink, cidr string, vid uint16) *VLANTrunk {
		v, err := StartVLANTrunk(ns, "vl-access", wire, trunkLink, vid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := v.Close(); err != nil {
				t.Errorf("relay on %s: %v", trunkLink, err)
			}
		})
		if err := ns.AddrAdd("vl-access", cidr); err != nil {
			t.Fatal(err)
		}
		return v
	}
	l := start(left, "trunk-l", "10.124.7.1/24", 7)
	r := start(right, "trunk-r", "10.124.7.2/24", 7)

	ln, err := right.Listen("tcp", "10.124.7.2:7070")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, c.RemoteAddr().String())
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := dialAndRead(ctx, left, "10.124.7.2:7070")
	if err != nil {
		t.Fatalf("TCP over VLAN 7: %v", err)
	}
	if host, _, _ := net.SplitHostPort(got); host != "10.124.7.1" {
		t.Errorf("server saw %q, want 10.124.7.1", got)
	}
	if l.Tagged.Load() == 0 || r.Untagged.Load() == 0 || r.Tagged.Load() == 0 || l.Untagged.Load() == 0 {
		t.Errorf("frames left tagged/untagged %d/%d, right %d/%d: want traffic both ways through both relays",
			l.Tagged.Load(), l.Untagged.Load(), r.Tagged.Load(), r.Untagged.Load())
	}

	// The right side moves to VLAN 8: the left side's frames, still on
	// VLAN 7, are no longer delivered.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	start(right, "trunk-r", "10.124.7.2/24", 8)
	ln2, err := right.Listen("tcp", "10.124.7.2:7071")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	short, cancelShort := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancelShort()
	if got, err := dialAndRead(short, left, "10.124.7.2:7071"); err == nil {
		t.Errorf("TCP from VLAN 7 to a host on VLAN 8 succeeded (%q)", got)
	}
}

// dialAndRead connects from ns to addr, retrying until ctx ends (ARP and
// the taps coming up take a moment), and returns what the server wrote.
func dialAndRead(ctx context.Context, ns *Netns, addr string) (string, error) {
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := ns.DialContext(attempt, "tcp", addr)
		cancel()
		if err == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(c)
			c.Close()
			if err == nil && len(b) > 0 {
				return string(b), nil
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
