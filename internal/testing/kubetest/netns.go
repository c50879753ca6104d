package kubetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

// netnsPath turns Options.NetNS into the path of a namespace file: a bare
// name is looked up where `ip netns add` creates it.
func netnsPath(name string) (string, error) {
	if name == "" {
		return "", nil
	}
	p := name
	if !strings.ContainsRune(name, '/') {
		p = filepath.Join("/run/netns", name)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kubetest: Options.NetNS %q: %w", name, err)
	}
	return p, nil
}

// inNetNS runs fn on an OS thread that has entered the network namespace at
// path (the caller's namespace when path is empty). Sockets fn creates stay
// in that namespace after fn returns.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()

	return netnstest.Do(target, fn)
}

// dialer returns a DialContext that connects from inside the network
// namespace at path, so that this process can reach a server listening only
// there.
func dialer(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if path == "" {
		return d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNetNS(path, func() error {
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// setLoopbackUp brings up lo in the namespace at path: etcd listens on
// 127.0.0.1 there, and a freshly created namespace has lo down.
func setLoopbackUp(path string) error {
	if path == "" {
		return nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo in %s: %w", path, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in %s: %w", path, err)
	}
	return nil
}

// freePorts asks the kernel for n distinct free TCP ports on ip in the
// namespace at path. All listeners are open at once so the ports differ;
// they are closed before the servers bind, and a lost race shows up as a
// bind error that Start retries.
func freePorts(path string, ip net.IP, n int) ([]int, error) {
	ports := make([]int, 0, n)
	err := inNetNS(path, func() error {
		var ls []net.Listener
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for range n {
			l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
			if err != nil {
				return err
			}
			ls = append(ls, l)
			_, p, _ := net.SplitHostPort(l.Addr().String())
			port, err := strconv.Atoi(p)
			if err != nil {
				return err
			}
			ports = append(ports, port)
		}
		return nil
	})
	return ports, err
}
