// Package vmtest boots the nftgate appliance image in QEMU and talks to it
// over tap devices that live in network namespaces the test creates, so the
// VM never touches the host's own networks.
package vmtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

var nsSeq atomic.Int64

// Netns is a named network namespace created for a test.
type Netns struct {
	Name   string
	handle netns.NsHandle
	nl     *netlink.Handle
}

// NewNetns creates a named namespace (visible to `ip netns`) whose name
// carries the role, the pid and a sequence number, so parallel test
// processes never collide. Close removes it.
func NewNetns(role string) (*Netns, error) {
	name := fmt.Sprintf("nftgate-vm-%s-%d-%d", role, os.Getpid(), nsSeq.Add(1))
	h, err := netnstest.NewNamed(name)
	if err != nil {
		return nil, err
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		netns.DeleteNamed(name)
		return nil, fmt.Errorf("netlink handle in %s: %w", name, err)
	}
	n := &Netns{Name: name, handle: h, nl: nl}
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("bringing up lo in %s: %w", name, err)
	}
	return n, nil
}

// Close deletes the namespace; the kernel removes its links with it.
func (n *Netns) Close() error {
	n.nl.Close()
	n.handle.Close()
	return netns.DeleteNamed(n.Name)
}

// Netlink returns a netlink handle operating inside the namespace.
func (n *Netns) Netlink() *netlink.Handle { return n.nl }

// Do runs f on an OS thread inside the namespace. Sockets f creates stay in
// the namespace and may be used from any goroutine afterwards.
func (n *Netns) Do(f func() error) error {
	return netnstest.Do(n.handle, f)
}

// AddrAdd assigns a CIDR address to a link in the namespace and sets it up.
func (n *Netns) AddrAdd(link, cidr string) error {
	l, err := n.nl.LinkByName(link)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", link, n.Name, err)
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := n.nl.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s in %s: %w", cidr, link, n.Name, err)
	}
	return n.nl.LinkSetUp(l)
}

// RouteAdd adds a route to dst (CIDR) via gw inside the namespace.
func (n *Netns) RouteAdd(dst, gw string) error {
	_, d, err := net.ParseCIDR(dst)
	if err != nil {
		return err
	}
	if err := n.nl.RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(gw)}); err != nil {
		return fmt.Errorf("route %s via %s in %s: %w", dst, gw, n.Name, err)
	}
	return nil
}

// Listen opens a listener inside the namespace.
func (n *Netns) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// DialContext connects from inside the namespace.
func (n *Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// HTTPClient returns a client whose connections originate in the namespace.
func (n *Netns) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:       n.DialContext,
			DisableKeepAlives: true,
			Proxy:             nil,
		},
	}
}

// openTap creates a tap device inside the namespace and returns the queue
// file QEMU attaches to. The device is not persistent: it disappears when
// the last holder of the file (QEMU) closes it.
func (n *Netns) openTap(name string) (*os.File, error) {
	tap := &netlink.Tuntap{
		LinkAttrs:  netlink.LinkAttrs{Name: name},
		Mode:       netlink.TUNTAP_MODE_TAP,
		Flags:      netlink.TUNTAP_NO_PI,
		Queues:     1,
		NonPersist: true,
	}
	// TUNSETIFF creates the device in the calling thread's namespace, so
	// the whole creation runs inside it.
	if err := n.Do(func() error { return netlink.LinkAdd(tap) }); err != nil {
		return nil, fmt.Errorf("tap %s in %s: %w", name, n.Name, err)
	}
	if len(tap.Fds) != 1 {
		return nil, fmt.Errorf("tap %s in %s: got %d queue files, want 1", name, n.Name, len(tap.Fds))
	}
	l, err := n.nl.LinkByName(name)
	if err == nil {
		err = n.nl.LinkSetUp(l)
	}
	if err != nil {
		tap.Fds[0].Close()
		return nil, fmt.Errorf("tap %s in %s: %w", name, n.Name, err)
	}
	return tap.Fds[0], nil
}

// AddBridge creates a bridge in the namespace, sets it up and gives it the
// CIDR addresses. Servers can bind those addresses at once; a VM's tap
// joins later (NIC.Bridge).
func (n *Netns) AddBridge(name string, cidrs ...string) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := n.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge %s in %s: %w", name, n.Name, err)
	}
	for _, c := range cidrs {
		if err := n.AddrAdd(name, c); err != nil {
			return err
		}
	}
	l, err := n.nl.LinkByName(name)
	if err == nil {
		err = n.nl.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("bridge %s in %s: %w", name, n.Name, err)
	}
	return nil
}

// SetMaster makes link a port of bridge.
func (n *Netns) SetMaster(link, bridge string) error {
	l, err := n.nl.LinkByName(link)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", link, n.Name, err)
	}
	br, err := n.nl.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", bridge, n.Name, err)
	}
	if err := n.nl.LinkSetMaster(l, br); err != nil {
		return fmt.Errorf("%s into bridge %s in %s: %w", link, bridge, n.Name, err)
	}
	return nil
}

// AddVeth creates a veth pair, name in this namespace and peerName in
// peer, each with the CIDR addresses given, and sets both ends up.
func (n *Netns) AddVeth(name string, cidrs []string, peer *Netns, peerName string, peerCIDRs []string) error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(int(peer.handle)),
	}
	if err := n.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s in %s to %s in %s: %w", name, n.Name, peerName, peer.Name, err)
	}
	for _, end := range []struct {
		ns    *Netns
		link  string
		cidrs []string
	}{{n, name, cidrs}, {peer, peerName, peerCIDRs}} {
		l, err := end.ns.nl.LinkByName(end.link)
		if err == nil {
			err = end.ns.nl.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("veth %s in %s: %w", end.link, end.ns.Name, err)
		}
		for _, c := range end.cidrs {
			if err := end.ns.AddrAdd(end.link, c); err != nil {
				return err
			}
		}
	}
	return nil
}
