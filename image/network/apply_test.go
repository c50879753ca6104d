package network

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// newTestNS creates a network namespace that is removed when the test ends.
func newTestNS(t *testing.T) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating network namespaces requires root")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	name := fmt.Sprintf("nftgate-netcfg-%d-%d", os.Getpid(), time.Now().UnixNano())
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	return ns
}

// inNS runs f on a thread that is inside ns.
func inNS(t *testing.T, ns netns.NsHandle, f func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is discarded rather than switched back: Go then
		// never reuses a thread left in the wrong namespace.
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

func TestApplyInNamespace(t *testing.T) {
	ns := newTestNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	c, err := Parse([]byte(`{
		"interfaces": [
			{"name": "gw0", "addresses": ["10.77.0.1/24"],
			 "routes": [{"to": "10.96.0.0/12", "via": "10.77.0.2"}, {"to": "192.0.2.0/24"}], "mtu": 1400}
		],
		"sysctls": {"net.ipv4.conf.all.rp_filter": "2"}
	}`))
	if err != nil {
		t.Fatal(err)
	}

	// Apply starts before gw0 exists, the way netconfig starts before a
	// slow NIC driver has registered its device.
	applied := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		applied <- inNS(t, ns, func() error { return c.Apply(ctx, h, "/proc/sys") })
	}()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "gw0"}, PeerName: "gw0peer"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := <-applied; err != nil {
		t.Fatal(err)
	}

	// A second run must succeed unchanged: gokrazy may start it again.
	if err := inNS(t, ns, func() error { return c.Apply(context.Background(), h, "/proc/sys") }); err != nil {
		t.Fatalf("second Apply: %v", err)
	}

	link, err := h.LinkByName("gw0")
	if err != nil {
		t.Fatal(err)
	}
	if link.Attrs().MTU != 1400 {
		t.Errorf("MTU = %d, want 1400", link.Attrs().MTU)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("gw0 is not up")
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.77.0.1/24" {
		t.Errorf("addresses = %v, want [10.77.0.1/24]", addrs)
	}
	routes, err := h.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range routes {
		if r.Dst != nil {
			got = append(got, fmt.Sprintf("%s via %v", r.Dst, r.Gw))
		}
	}
	for _, want := range []string{"10.96.0.0/12 via 10.77.0.2", "192.0.2.0/24 via <nil>"} {
		if !strings.Contains(strings.Join(got, ","), want) {
			t.Errorf("routes %v lack %q", got, want)
		}
	}

	for name, want := range map[string]string{
		"net.ipv4.ip_forward":          "1",
		"net.ipv6.conf.all.forwarding": "1",
		"net.ipv4.conf.all.rp_filter":  "2",
	} {
		var v []byte
		if err := inNS(t, ns, func() (err error) { v, err = os.ReadFile(SysctlPath(name)); return err }); err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(v)) != want {
			t.Errorf("%s = %q in the namespace, want %s", name, strings.TrimSpace(string(v)), want)
		}
	}
}

func TestApplyTimesOutOnMissingInterface(t *testing.T) {
	ns := newTestNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c := Config{Interfaces: []Interface{{Name: "absent0", Addresses: []string{"10.1.0.1/24"}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = inNS(t, ns, func() error { return c.Apply(ctx, h, "/proc/sys") })
	if err == nil || !strings.Contains(err.Error(), "interface absent0 did not appear") {
		t.Fatalf("Apply = %v, want an error naming absent0", err)
	}
}
