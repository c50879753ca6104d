// Package hostaddr tells which addresses the gateway itself holds: those
// assigned to the interfaces of its network namespace, each with the prefix
// of its subnet, as they change at run time. NodePort cleanup and the
// choice of the external addresses the gateway serves both read them here.
package hostaddr

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// List returns the addresses assigned to interfaces of the network
// namespace behind fd (0: the current one), each with its prefix length,
// sorted and without duplicates.
func List(fd int) ([]netip.Prefix, error) {
	var h *netlink.Handle
	var err error
	if fd > 0 {
		h, err = netlink.NewHandleAt(netns.NsHandle(fd), unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, err
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, min(ones, ip.BitLen())))
	}
	slices.SortFunc(out, compare)
	return slices.Compact(out), nil
}

func compare(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Watch calls changed with the addresses of the network namespace behind
// fd (0: the current one) each time they differ from those last given
// (initially, from last), until ctx ends. It follows the kernel's address notifications; when
// they are lost (the socket's buffer overran) it subscribes again and
// lists the addresses anew, so no change goes unnoticed for long.
func Watch(ctx context.Context, fd int, last []netip.Prefix, changed func([]netip.Prefix), log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	retry := time.Duration(0)
	for ctx.Err() == nil {
		if retry > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
		}
		retry = min(max(2*retry, 100*time.Millisecond), 10*time.Second)
		ch := make(chan netlink.AddrUpdate, 64)
		done := make(chan struct{})
		opts := netlink.AddrSubscribeOptions{
			ErrorCallback: func(err error) { log.Debug("address notifications", "err", err) },
		}
		if fd > 0 {
			ns := netns.NsHandle(fd)
			opts.Namespace = &ns
		}
		err := netlink.AddrSubscribeWithOptions(ch, done, opts)
		if err != nil {
			close(done)
			log.Warn("cannot follow the gateway's addresses; retrying", "err", err, "retry_in", retry)
			continue
		}
		// Subscribed first, listed second: a change in between is both
		// listed and notified, never lost.
		last = relist(fd, last, changed, log)
		for open := true; open; {
			select {
			case <-ctx.Done():
				close(done)
				for range ch { // until the subscription's goroutine ends
				}
				return
			case _, open = <-ch:
				if open {
					retry = 0
					drain(ch)
					last = relist(fd, last, changed, log)
				}
			}
		}
		close(done)
		log.Debug("address notifications ended; subscribing again")
	}
}

// drain takes the notifications already queued: one listing covers them.
func drain(ch <-chan netlink.AddrUpdate) {
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

func relist(fd int, last []netip.Prefix, changed func([]netip.Prefix), log *slog.Logger) []netip.Prefix {
	now, err := List(fd)
	if err != nil {
		log.Warn("cannot list the gateway's addresses", "err", err)
		return last
	}
	if !slices.Equal(now, last) {
		changed(now)
	}
	return now
}
