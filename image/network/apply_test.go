package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

// newTestNS creates a network namespace that is removed when the test ends.
func newTestNS(t *testing.T) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating network namespaces requires root")
	}
	return netnstest.Temp(t)
}

// inNS runs f on a thread that is inside ns.
func inNS(t *testing.T, ns netns.NsHandle, f func() error) error {
	t.Helper()
	return netnstest.Do(ns, f)
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

// TestApplyVLAN creates a VLAN on a veth. Where the kernel has no 802.1Q
// support (CONFIG_VLAN_8021Q, as on the stock gokrazy kernel) Apply must say
// so by name; which of the two applies is found out independently by
// creating a VLAN directly. The VM test of the custom kernel
// (internal/testing/vmtest/vlan_test.go) runs the supported case on the appliance.
func TestApplyVLAN(t *testing.T) {
	ns := newTestNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, name := range []string{"gw1", "probe0"} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
	}
	probe, err := h.LinkByName("probe0")
	if err != nil {
		t.Fatal(err)
	}
	probeErr := h.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "probe0.9", ParentIndex: probe.Attrs().Index}, VlanId: 9})
	kernelHasVLAN := probeErr == nil
	t.Logf("kernel supports VLAN interfaces: %v (%v)", kernelHasVLAN, probeErr)

	c, err := Parse([]byte(`{"interfaces": [
		{"name": "gw1.100", "vlan": {"link": "gw1", "id": 100}, "addresses": ["10.78.100.1/24"]}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	apply := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return inNS(t, ns, func() error { return c.Apply(ctx, h, "/proc/sys") })
	}
	err = apply()
	if !kernelHasVLAN {
		if err == nil || !errors.Is(err, unix.EOPNOTSUPP) ||
			!strings.Contains(err.Error(), "VLAN gw1.100 (id 100 on gw1): the kernel has no 802.1Q VLAN support (CONFIG_VLAN_8021Q") {
			t.Fatalf("Apply on a kernel without VLANs = %v, want an error naming gw1.100 and CONFIG_VLAN_8021Q", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	link, err := h.LinkByName("gw1.100")
	if err != nil {
		t.Fatal(err)
	}
	vl, ok := link.(*netlink.Vlan)
	if !ok || vl.VlanId != 100 {
		t.Fatalf("gw1.100 is %T %+v, want VLAN 100", link, link.Attrs())
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("gw1.100 is not up")
	}
	parent, err := h.LinkByName("gw1")
	if err != nil {
		t.Fatal(err)
	}
	if vl.ParentIndex != parent.Attrs().Index || parent.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("parent index %d (gw1 is %d), gw1 flags %v: want gw1, up", vl.ParentIndex, parent.Attrs().Index, parent.Attrs().Flags)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.78.100.1/24" {
		t.Errorf("addresses = %v, want [10.78.100.1/24]", addrs)
	}
}

// An interface that already has the VLAN's name but is something else is
// an error, not silently reused.
func TestApplyVLANNameTaken(t *testing.T) {
	ns := newTestNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, name := range []string{"gw2", "gw2.5"} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
	}
	c := Config{Interfaces: []Interface{{Name: "gw2.5", VLAN: &VLAN{Link: "gw2", ID: 5}}}}
	err = inNS(t, ns, func() error { return c.Apply(context.Background(), h, "/proc/sys") })
	if err == nil || !strings.Contains(err.Error(), "VLAN gw2.5: an interface of that name exists and is not VLAN 5 on gw2") {
		t.Fatalf("Apply = %v, want an error naming gw2.5", err)
	}
}
