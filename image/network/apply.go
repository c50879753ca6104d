package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Apply sets the sysctls (below procSys, normally /proc/sys, as seen from
// the calling thread's network namespace) and configures the static
// interfaces through the netlink handle h. It waits, until ctx ends, for interfaces that the kernel has not
// registered yet: NIC drivers may still be probing when the appliance boots.
// Apply is idempotent: addresses and routes are replaced, not added twice.
func (c Config) Apply(ctx context.Context, h *netlink.Handle, procSys string) error {
	for _, s := range c.EffectiveSysctls() {
		p := procSys + "/" + SysctlPath(s.Name)[len("/proc/sys/"):]
		if err := os.WriteFile(p, []byte(s.Value+"\n"), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", s.Name, s.Value, err)
		}
	}
	for _, ifc := range c.Interfaces {
		if ifc.VLAN != nil {
			if err := ensureVLAN(ctx, h, ifc.Name, *ifc.VLAN); err != nil {
				return err
			}
		}
		link, err := waitForLink(ctx, h, ifc.Name)
		if err != nil {
			return err
		}
		if err := applyInterface(h, link, ifc); err != nil {
			return fmt.Errorf("interface %s: %w", ifc.Name, err)
		}
	}
	return nil
}

// ensureVLAN creates the VLAN interface name on v.Link, once the parent
// exists, and sets the parent up: a VLAN passes no traffic on a parent that
// is down, and the parent may have no settings of its own. An existing
// interface of that name must already be this VLAN.
func ensureVLAN(ctx context.Context, h *netlink.Handle, name string, v VLAN) error {
	parent, err := waitForLink(ctx, h, v.Link)
	if err != nil {
		return fmt.Errorf("VLAN %s: parent %w", name, err)
	}
	if err := h.LinkSetUp(parent); err != nil {
		return fmt.Errorf("VLAN %s: parent %s up: %w", name, v.Link, err)
	}
	existing, err := h.LinkByName(name)
	if err == nil {
		vl, ok := existing.(*netlink.Vlan)
		if !ok || vl.VlanId != v.ID || vl.Attrs().ParentIndex != parent.Attrs().Index {
			return fmt.Errorf("VLAN %s: an interface of that name exists and is not VLAN %d on %s", name, v.ID, v.Link)
		}
		return nil
	}
	var notFound netlink.LinkNotFoundError
	if !errors.As(err, &notFound) {
		return fmt.Errorf("VLAN %s: %w", name, err)
	}
	vl := &netlink.Vlan{
		LinkAttrs:    netlink.LinkAttrs{Name: name, ParentIndex: parent.Attrs().Index},
		VlanId:       v.ID,
		VlanProtocol: netlink.VLAN_PROTOCOL_8021Q,
	}
	if err := h.LinkAdd(vl); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("VLAN %s (id %d on %s): the kernel has no 802.1Q VLAN support (CONFIG_VLAN_8021Q; build the image with KERNEL=custom): %w", name, v.ID, v.Link, err)
		}
		return fmt.Errorf("VLAN %s (id %d on %s): %w", name, v.ID, v.Link, err)
	}
	return nil
}

func waitForLink(ctx context.Context, h *netlink.Handle, name string) (netlink.Link, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		link, err := h.LinkByName(name)
		if err == nil {
			return link, nil
		}
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return nil, fmt.Errorf("interface %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("interface %s did not appear: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

func applyInterface(h *netlink.Handle, link netlink.Link, ifc Interface) error {
	if ifc.MTU != 0 && link.Attrs().MTU != ifc.MTU {
		if err := h.LinkSetMTU(link, ifc.MTU); err != nil {
			return fmt.Errorf("mtu %d: %w", ifc.MTU, err)
		}
	}
	for _, a := range ifc.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
		if err := h.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
	}
	// The DHCP client brings its own interface up; static ones are ours.
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("link up: %w", err)
	}
	for _, r := range ifc.Routes {
		_, dst, err := net.ParseCIDR(r.To)
		if err != nil {
			return fmt.Errorf("route to %s: %w", r.To, err)
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst}
		if r.Via != "" {
			route.Gw = net.ParseIP(r.Via)
		} else {
			route.Scope = netlink.SCOPE_LINK
		}
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("route to %s via %q: %w", r.To, r.Via, err)
		}
	}
	return nil
}
