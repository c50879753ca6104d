package hostaddr_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/nftgate/nftgate/hostaddr"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// The addresses of a namespace, listed and then followed as they change.
func TestListAndWatch(t *testing.T) {
	l := labtest.New(t)
	h, err := l.AddHost("box")
	if err != nil {
		t.Fatal(err)
	}
	added := netip.MustParsePrefix("192.0.2.7/24")
	if err := h.AddAddress("lo", added); err != nil {
		t.Fatal(err)
	}
	got, err := hostaddr.List(h.FD())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128"), added} {
		if !slices.Contains(got, want) {
			t.Errorf("List = %v, want %v in it", got, want)
		}
	}

	changes := make(chan []netip.Prefix, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		hostaddr.Watch(ctx, h.FD(), got, func(p []netip.Prefix) { changes <- p }, nil)
		close(done)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Watch did not end with its context")
		}
	}()
	// await waits for a change that satisfies ok.
	await := func(what string, ok func([]netip.Prefix) bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case p := <-changes:
				if ok(p) {
					return
				}
			case <-deadline:
				t.Fatalf("never told: %s", what)
			}
		}
	}
	later := netip.MustParsePrefix("198.51.100.9/32")
	if err := h.AddAddress("lo", later); err != nil {
		t.Fatal(err)
	}
	await("address added", func(p []netip.Prefix) bool { return slices.Contains(p, later) && slices.Contains(p, added) })

	link, err := h.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	del := &netlink.Addr{IPNet: &net.IPNet{IP: added.Addr().AsSlice(), Mask: net.CIDRMask(added.Bits(), 32)}}
	if err := h.Netlink().AddrDel(link, del); err != nil {
		t.Fatal(err)
	}
	await("address removed", func(p []netip.Prefix) bool { return !slices.Contains(p, added) && slices.Contains(p, later) })
}
