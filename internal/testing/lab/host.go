package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

// Host is one network namespace of a lab.
type Host struct {
	lab    *Lab // nil for hosts from OpenHost
	short  string
	nsName string
	ns     netns.NsHandle
	nl     *netlink.Handle

	mu       sync.Mutex
	ifaces   map[string]bool
	released bool
}

// OpenHost attaches to an existing named namespace (one in /run/netns), for
// instance one made by another process's lab. The Host works like a lab's own
// except that Close only releases the handles; the namespace stays.
func OpenHost(nsName string) (*Host, error) {
	ns, err := netns.GetFromName(nsName)
	if err != nil {
		return nil, fmt.Errorf("lab: open namespace %s: %w", nsName, err)
	}
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("lab: netlink handle in %s: %w", nsName, err)
	}
	return &Host{short: nsName, nsName: nsName, ns: ns, nl: nl, ifaces: map[string]bool{}}, nil
}

// Close releases the handles of a host from OpenHost. Hosts of a Lab are
// released by Lab.Close; calling Close on them early only drops the handles.
func (h *Host) Close() error {
	h.release()
	return nil
}

func (h *Host) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	if h.nl != nil {
		h.nl.Close()
	}
	h.ns.Close()
}

// Name is the namespace name, as `ip netns exec NAME` and /run/netns/NAME use.
func (h *Host) Name() string { return h.nsName }

// Path is the namespace file, /run/netns/<Name>.
func (h *Host) Path() string { return filepath.Join(NetnsDir, h.nsName) }

// FD is an open file descriptor of the namespace, valid until the lab is
// closed; pass it to nftables.WithNetNSFd or netlink.NewHandleAt.
func (h *Host) FD() int { return int(h.ns) }

// Netlink is a netlink handle inside the namespace, valid until the lab is
// closed, for link and address work the lab has no helper for.
func (h *Host) Netlink() *netlink.Handle { return h.nl }

// String is the host's short name within its lab ("client", "gateway").
func (h *Host) String() string { return h.short }

// Do runs fn with the calling goroutine's work moved into the namespace: fn
// runs on its own goroutine, locked to an OS thread that has entered the
// namespace, and Do waits for it. Sockets fn creates stay in the namespace
// after fn returns and may be used from anywhere; goroutines fn starts do not
// run in the namespace. A panic in fn is re-raised in the caller (see
// netnstest.Do).
func (h *Host) Do(fn func() error) error {
	return netnstest.Do(h.ns, fn)
}

// Command prepares name with args to run inside the namespace, through
// `ip netns exec` (which also mounts a /sys for the namespace). The process
// is killed when ctx is done or the lab is closed, whichever comes first;
// set Cmd.Cancel for a gentler stop. The caller starts and waits for it.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if h.lab != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		stop := context.AfterFunc(h.lab.ctx, cancel)
		// Release the watcher once the command's own context ends.
		context.AfterFunc(ctx, func() { stop() })
	}
	ipArgs := append([]string{"netns", "exec", h.nsName, name}, args...)
	return exec.CommandContext(ctx, "ip", ipArgs...)
}

// Sysctl writes value to the namespace's /proc/sys entry for key, given
// either dotted ("net.ipv4.ip_forward") or as a path below /proc/sys
// ("net/ipv4/conf/eth0.100/forwarding", for names with dots).
func (h *Host) Sysctl(key, value string) error {
	return h.Do(func() error { return writeSysctl(key, value) })
}

// ReadSysctl reads the namespace's value of key (see Sysctl), trimmed.
func (h *Host) ReadSysctl(key string) (string, error) {
	var v string
	err := h.Do(func() error {
		b, err := os.ReadFile(sysctlPath(key))
		if err != nil {
			return fmt.Errorf("lab: sysctl %s: %w", key, err)
		}
		v = strings.TrimSpace(string(b))
		return nil
	})
	return v, err
}

func sysctlPath(key string) string {
	if !strings.Contains(key, "/") {
		key = strings.ReplaceAll(key, ".", "/")
	}
	return filepath.Join("/proc/sys", filepath.Clean("/"+key))
}

// writeSysctl must run inside the target namespace: /proc/sys/net shows the
// namespace of the thread that opens it.
func writeSysctl(key, value string) error {
	if err := os.WriteFile(sysctlPath(key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("lab: sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// AddAddress adds addresses to the interface ifname of the host (IPv6 ones
// without duplicate address detection).
func (h *Host) AddAddress(ifname string, addrs ...netip.Prefix) error {
	link, err := h.nl.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("lab: %s: interface %q: %w", h.short, ifname, err)
	}
	return addAddrs(h.nl, h.short, link, addrs)
}

// AddRoute adds a route to dst via the gateway address via, which must be
// reachable on a connected network of the host.
func (h *Host) AddRoute(dst netip.Prefix, via netip.Addr) error {
	if !dst.IsValid() || !via.IsValid() || dst.Addr().Is4() != via.Unmap().Is4() {
		return fmt.Errorf("lab: %s: route %s via %s: want a valid prefix and gateway of the same family", h.short, dst, via)
	}
	r := &netlink.Route{Dst: prefixToIPNet(dst.Masked()), Gw: via.Unmap().AsSlice()}
	if err := h.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("lab: %s: route %s via %s: %w", h.short, dst, via, err)
	}
	return nil
}

// AddBlackholeRoute makes the host silently drop packets to dst that it
// forwards (locally sent packets fail at once with EINVAL instead). A
// blackhole on a router is how the lab makes a flow time out without
// nftables.
func (h *Host) AddBlackholeRoute(dst netip.Prefix) error {
	if !dst.IsValid() {
		return fmt.Errorf("lab: %s: blackhole route: invalid prefix %s", h.short, dst)
	}
	r := &netlink.Route{Dst: prefixToIPNet(dst.Masked()), Type: unix.RTN_BLACKHOLE}
	if dst.Addr().Is4() {
		r.Family = netlink.FAMILY_V4
	} else {
		r.Family = netlink.FAMILY_V6
	}
	if err := h.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("lab: %s: blackhole route %s: %w", h.short, dst, err)
	}
	return nil
}

// DialContext connects from inside the namespace, like net.Dialer.DialContext;
// it fits http.Transport.DialContext.
func (h *Host) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Listen opens a stream listener inside the namespace, like net.Listen.
func (h *Host) Listen(network, address string) (net.Listener, error) {
	var l net.Listener
	err := h.Do(func() error {
		var err error
		l, err = net.Listen(network, address)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket inside the namespace, like
// net.ListenPacket.
func (h *Host) ListenPacket(network, address string) (net.PacketConn, error) {
	var c net.PacketConn
	err := h.Do(func() error {
		var err error
		c, err = net.ListenPacket(network, address)
		return err
	})
	return c, err
}

// reserveIface picks a free interface name in h derived from want.
func (h *Host) reserveIface(want string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	base := want
	if len(base) > unix.IFNAMSIZ-1 {
		base = base[:unix.IFNAMSIZ-1]
	}
	name := base
	for i := 1; h.ifaces[name]; i++ {
		suffix := strconv.Itoa(i)
		b := base
		if len(b)+len(suffix) > unix.IFNAMSIZ-1 {
			b = b[:unix.IFNAMSIZ-1-len(suffix)]
		}
		name = b + suffix
	}
	h.ifaces[name] = true
	return name
}

func (h *Host) configureIface(name string, addrs []netip.Prefix) error {
	return configureIface(h.nl, h.short, name, addrs)
}

func configureIface(nl *netlink.Handle, hostName, name string, addrs []netip.Prefix) error {
	link, err := nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("lab: %s: find %s: %w", hostName, name, err)
	}
	if err := addAddrs(nl, hostName, link, addrs); err != nil {
		return err
	}
	if err := nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("lab: %s: set %s up: %w", hostName, name, err)
	}
	return nil
}

// linkReadyTimeout bounds the wait for a new veth end to carry traffic.
const linkReadyTimeout = 10 * time.Second

// waitLinkReady waits until the interface can carry traffic. Setting a veth
// up is not enough: the kernel turns its carrier on, attaches the real
// queueing discipline (packets sent before that are dropped) and starts IPv6
// on it asynchronously, in its link-watch worker. The last of these steps
// adds the link-local address, so an operationally up link with a usable
// link-local address is ready.
//
// With needIPv6 false only the operational state counts, for interfaces in
// the root namespace whose IPv6 settings the lab does not control.
func waitLinkReady(nl *netlink.Handle, hostName, name string, needIPv6 bool) error {
	deadline := time.Now().Add(linkReadyTimeout)
	delay := 500 * time.Microsecond
	for {
		ready, state, err := linkReady(nl, name, needIPv6)
		if err != nil {
			return fmt.Errorf("lab: %s: %s: %w", hostName, name, err)
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: %s: %s not ready after %v (%s)", hostName, name, linkReadyTimeout, state)
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

func linkReady(nl *netlink.Handle, name string, needIPv6 bool) (bool, string, error) {
	link, err := nl.LinkByName(name)
	if err != nil {
		return false, "", err
	}
	if st := link.Attrs().OperState; st != netlink.OperUp {
		return false, "operstate " + st.String(), nil
	}
	if !needIPv6 {
		return true, "", nil
	}
	addrs, err := nl.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		return false, "", err
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
			return true, "", nil
		}
	}
	return false, "no usable IPv6 link-local address yet", nil
}

func addAddrs(nl *netlink.Handle, hostName string, link netlink.Link, addrs []netip.Prefix) error {
	for _, p := range addrs {
		if !p.IsValid() {
			return fmt.Errorf("lab: %s: address %s on %s: invalid prefix", hostName, p, link.Attrs().Name)
		}
		a := &netlink.Addr{IPNet: prefixToIPNet(p)}
		if p.Addr().Is6() && !p.Addr().Is4In6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := nl.AddrAdd(link, a); err != nil {
			return fmt.Errorf("lab: %s: address %s on %s: %w", hostName, p, link.Attrs().Name, err)
		}
	}
	return nil
}

// prefixToIPNet keeps the host bits: 198.18.1.2/24 stays an address with
// its mask, as netlink.Addr wants.
func prefixToIPNet(p netip.Prefix) *net.IPNet {
	a := p.Addr().Unmap()
	bits := 32
	if a.Is6() {
		bits = 128
	}
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}
