// Package lab builds small networks out of Linux network namespaces and veth
// pairs, with echo servers and probing clients, so that nftgate can be tested
// against real kernel forwarding, NAT and conntrack.
//
// A Lab owns everything it creates: namespaces (named under /run/netns so that
// `ip netns exec` and nftables tools can reach them), links in the root
// namespace, echo servers and processes started with Host.Command. Close
// removes all of it. Namespace names carry the creating process id, so labs of
// parallel test processes never collide and RemoveStale can find what a dead
// process left behind.
//
// Everything here needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

// NetnsDir is where named network namespaces are bind-mounted, the same
// directory iproute2 uses.
const NetnsDir = "/run/netns"

// namePrefix starts every namespace name this package creates:
// nftg-<pid>-<seq>-<lab>-<host>.
const namePrefix = "nftg-"

// rootLinkPrefix starts every link this package creates in the root
// namespace: nftg<pid>h<seq>, which fits IFNAMSIZ for any pid.
const rootLinkPrefix = "nftg"

var (
	labSeq  atomic.Uint64
	linkSeq atomic.Uint64

	validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)
)

const maxNameLen = 40

// Lab is a set of network namespaces and the links, servers and processes
// living in them.
type Lab struct {
	name   string
	prefix string // namespace name prefix, nftg-<pid>-<seq>-<name>-

	ctx    context.Context // cancelled by Close; kills processes from Host.Command
	cancel context.CancelFunc

	mu        sync.Mutex
	hosts     []*Host
	rootLinks []string
	closers   []io.Closer
	closed    bool
	closeErr  error
}

// New starts an empty lab. name is a short label (letters, digits, '-' and
// '_') that appears in namespace names so an admin can tell labs apart.
func New(name string) (*Lab, error) {
	if !validName.MatchString(name) || len(name) > maxNameLen {
		return nil, fmt.Errorf("lab: name %q: want 1-%d letters, digits, '-' or '_', starting with a letter or digit", name, maxNameLen)
	}
	if err := ensureNetnsDir(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Lab{
		name:   name,
		prefix: fmt.Sprintf("%s%d-%d-%s-", namePrefix, os.Getpid(), labSeq.Add(1), name),
		ctx:    ctx,
		cancel: cancel,
	}, nil
}

// Name returns the label given to New.
func (l *Lab) Name() string { return l.name }

// Hosts returns the lab's hosts in creation order.
func (l *Lab) Hosts() []*Host {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Host(nil), l.hosts...)
}

// AddHost creates a network namespace named <prefix><name>, brings its
// loopback up and applies the lab's base settings: IPv6 duplicate address
// detection off (addresses are usable at once), ICMP error rate limiting off
// (so rejected flows are seen on every attempt, not once a second) and
// reverse-path filtering off.
func (l *Lab) AddHost(name string) (*Host, error) {
	if !validName.MatchString(name) || len(name) > maxNameLen {
		return nil, fmt.Errorf("lab: host name %q: want 1-%d letters, digits, '-' or '_', starting with a letter or digit", name, maxNameLen)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("lab %s: closed", l.name)
	}
	for _, h := range l.hosts {
		if h.short == name {
			l.mu.Unlock()
			return nil, fmt.Errorf("lab %s: host %q already exists", l.name, name)
		}
	}
	l.mu.Unlock()

	nsName := l.prefix + name
	ns, err := createNamedNetns(nsName)
	if err != nil {
		return nil, err
	}
	h := &Host{lab: l, short: name, nsName: nsName, ns: ns, ifaces: map[string]bool{"lo": true}}
	// Register before configuring so that Close cleans up a half-made host.
	l.mu.Lock()
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()

	h.nl, err = netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("lab: netlink handle in %s: %w", nsName, err)
	}
	lo, err := h.nl.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("lab: %s: find lo: %w", nsName, err)
	}
	if err := h.nl.LinkSetUp(lo); err != nil {
		return nil, fmt.Errorf("lab: %s: set lo up: %w", nsName, err)
	}
	err = h.Do(func() error {
		for _, kv := range baseSysctls {
			if err := writeSysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lab: %s: %w", nsName, err)
	}
	return h, nil
}

// baseSysctls are written in every new namespace before any link exists, so
// the "default" values reach every interface created later.
var baseSysctls = [][2]string{
	{"net.ipv6.conf.all.accept_dad", "0"},
	{"net.ipv6.conf.default.accept_dad", "0"},
	{"net.ipv4.icmp_ratelimit", "0"},
	{"net.ipv6.icmp.ratelimit", "0"},
	{"net.ipv4.conf.all.rp_filter", "0"},
	{"net.ipv4.conf.default.rp_filter", "0"},
}

// Veth names the two ends of a link made by Lab.Link or Lab.LinkRoot.
type Veth struct {
	A, B string // interface names: A in the first host, B in the second
}

// Link connects hosts a and b with a veth pair, brings both ends up and
// assigns the addresses. Each end is named after the host on the other side
// (the client's end towards the gateway is called "gateway"), with a digit
// appended if that name is taken. IPv6 addresses are added without duplicate
// address detection, so they work at once.
func (l *Lab) Link(a *Host, aAddrs []netip.Prefix, b *Host, bAddrs []netip.Prefix) (Veth, error) {
	if a == nil || b == nil || a.lab != l || b.lab != l {
		return Veth{}, fmt.Errorf("lab %s: Link needs two hosts of this lab", l.name)
	}
	if a == b {
		return Veth{}, fmt.Errorf("lab %s: cannot link host %s to itself", l.name, a.short)
	}
	if err := l.checkOpen(); err != nil {
		return Veth{}, err
	}
	aName := a.reserveIface(b.short)
	bName := b.reserveIface(a.short)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(int(b.ns)),
	}
	// Created from a's namespace with the peer placed straight into b's, so
	// no name is ever taken in the root namespace.
	if err := a.nl.LinkAdd(veth); err != nil {
		return Veth{}, fmt.Errorf("lab: veth %s/%s <-> %s/%s: %w", a.short, aName, b.short, bName, err)
	}
	if err := a.configureIface(aName, aAddrs); err != nil {
		return Veth{}, err
	}
	if err := b.configureIface(bName, bAddrs); err != nil {
		return Veth{}, err
	}
	if err := waitLinkReady(a.nl, a.short, aName, true); err != nil {
		return Veth{}, err
	}
	if err := waitLinkReady(b.nl, b.short, bName, true); err != nil {
		return Veth{}, err
	}
	return Veth{A: aName, B: bName}, nil
}

// LinkRoot connects the root network namespace (the machine itself) with
// host h. The root end is named nftg<pid>h<n> and removed by Close. Use it
// sparingly: addresses given in rootAddrs are added to the machine.
func (l *Lab) LinkRoot(rootAddrs []netip.Prefix, h *Host, hAddrs []netip.Prefix) (Veth, error) {
	if h == nil || h.lab != l {
		return Veth{}, fmt.Errorf("lab %s: LinkRoot needs a host of this lab", l.name)
	}
	if err := l.checkOpen(); err != nil {
		return Veth{}, err
	}
	rootName := fmt.Sprintf("%s%dh%d", rootLinkPrefix, os.Getpid(), linkSeq.Add(1))
	if len(rootName) >= unix.IFNAMSIZ {
		return Veth{}, fmt.Errorf("lab: root link name %q longer than %d bytes", rootName, unix.IFNAMSIZ-1)
	}
	hName := h.reserveIface("host")
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: rootName},
		PeerName:      hName,
		PeerNamespace: netlink.NsFd(int(h.ns)),
	}
	root, err := rootHandle()
	if err != nil {
		return Veth{}, err
	}
	defer root.Close()
	if err := root.LinkAdd(veth); err != nil {
		return Veth{}, fmt.Errorf("lab: veth root/%s <-> %s/%s: %w", rootName, h.short, hName, err)
	}
	l.mu.Lock()
	l.rootLinks = append(l.rootLinks, rootName)
	l.mu.Unlock()
	// Only this interface's setting: the machine's defaults stay as they are.
	err = netnstest.Do(rootNS, func() error {
		return writeSysctl("net/ipv6/conf/"+rootName+"/accept_dad", "0")
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) { // no IPv6 on the machine
		return Veth{}, err
	}
	if err := configureIface(root, "root", rootName, rootAddrs); err != nil {
		return Veth{}, err
	}
	if err := h.configureIface(hName, hAddrs); err != nil {
		return Veth{}, err
	}
	if err := waitLinkReady(root, "root", rootName, false); err != nil {
		return Veth{}, err
	}
	if err := waitLinkReady(h.nl, h.short, hName, true); err != nil {
		return Veth{}, err
	}
	return Veth{A: rootName, B: hName}, nil
}

// track registers c to be closed by Close. It reports false (and does not
// register) when the lab is already closed.
func (l *Lab) track(c io.Closer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.closers = append(l.closers, c)
	return true
}

func (l *Lab) checkOpen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("lab %s: closed", l.name)
	}
	return nil
}

// Close kills the processes started with Host.Command, stops the echo servers,
// deletes the root-namespace links and removes every namespace. It is safe to
// call more than once; later calls return the first call's result.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return l.closeErr
	}
	l.closed = true
	hosts, rootLinks, closers := l.hosts, l.rootLinks, l.closers
	l.mu.Unlock()

	l.cancel()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(rootLinks) > 0 {
		if root, err := rootHandle(); err != nil {
			errs = append(errs, err)
		} else {
			for _, name := range rootLinks {
				if err := deleteLinkByName(root, name); err != nil {
					errs = append(errs, err)
				}
			}
			root.Close()
		}
	}
	for _, h := range hosts {
		h.release()
		if err := netns.DeleteNamed(h.nsName); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("lab: delete namespace %s: %w", h.nsName, err))
		}
	}
	l.mu.Lock()
	l.closeErr = errors.Join(errs...)
	l.mu.Unlock()
	return l.closeErr
}

// Namespaces lists the namespace names under /run/netns that belong to this
// lab. After Close it should be empty; tests use it to prove nothing leaked.
func (l *Lab) Namespaces() ([]string, error) {
	return namespacesWithPrefix(l.prefix)
}

func namespacesWithPrefix(prefix string) ([]string, error) {
	entries, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// RootLinks lists the links in the root namespace that this lab created and
// that still exist.
func (l *Lab) RootLinks() ([]string, error) {
	l.mu.Lock()
	names := append([]string(nil), l.rootLinks...)
	l.mu.Unlock()
	root, err := rootHandle()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	links, err := root.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, link := range links {
		for _, n := range names {
			if link.Attrs().Name == n {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

var (
	staleNetnsName = regexp.MustCompile(`^` + namePrefix + `([0-9]+)-`)
	staleLinkName  = regexp.MustCompile(`^` + rootLinkPrefix + `([0-9]+)h[0-9]+$`)
)

// RemoveStale deletes namespaces and root-namespace links that labs of
// processes no longer running left behind (a test binary killed by a
// timeout, say). It returns the names it removed.
func RemoveStale() ([]string, error) {
	var removed []string
	var errs []error
	names, err := namespacesWithPrefix(namePrefix)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if !ownerGone(staleNetnsName, name) {
			continue
		}
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("lab: delete stale namespace %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	root, err := rootHandle()
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	defer root.Close()
	links, err := root.LinkList()
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	for _, link := range links {
		name := link.Attrs().Name
		if !ownerGone(staleLinkName, name) {
			continue
		}
		if err := root.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("lab: delete stale link %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// ownerGone reports whether name matches re and the pid it carries is not a
// running process.
func ownerGone(re *regexp.Regexp, name string) bool {
	m := re.FindStringSubmatch(name)
	if m == nil {
		return false
	}
	pid, err := strconv.Atoi(m[1])
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

var netnsDirOnce sync.Mutex

// ensureNetnsDir makes /run/netns a shared mount point, as `ip netns add`
// does, so that removing a namespace file also unmounts it in the mount
// namespaces of processes started with `ip netns exec`, and so that a later
// `ip netns add` does not remount the directory over our namespaces.
func ensureNetnsDir() error {
	netnsDirOnce.Lock()
	defer netnsDirOnce.Unlock()
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("lab: make %s shared: %w", NetnsDir, err)
	}
	// EINVAL: not a mount point yet. Bind it onto itself (recursively, so
	// namespaces already mounted there stay visible) and retry.
	if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("lab: bind %s onto itself: %w", NetnsDir, err)
	}
	if err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("lab: make %s shared: %w", NetnsDir, err)
	}
	return nil
}

// createNamedNetns creates a namespace bind-mounted at /run/netns/<name> and
// returns an open handle to it.
func createNamedNetns(name string) (netns.NsHandle, error) {
	if _, err := os.Lstat(filepath.Join(NetnsDir, name)); err == nil {
		return netns.None(), fmt.Errorf("lab: namespace %s already exists", name)
	}
	ns, err := netnstest.NewNamed(name)
	if err != nil {
		return netns.None(), fmt.Errorf("lab: %w", err)
	}
	return ns, nil
}

// rootNS is the namespace the process started in, taken while package
// initialisation runs, before any thread can have been moved.
var rootNS, rootNSErr = netns.Get()

// rootHandle opens a netlink handle in the process's own namespace.
func rootHandle() (*netlink.Handle, error) {
	if rootNSErr != nil {
		return nil, fmt.Errorf("lab: root namespace: %w", rootNSErr)
	}
	h, err := netlink.NewHandleAt(rootNS)
	if err != nil {
		return nil, fmt.Errorf("lab: netlink handle in root namespace: %w", err)
	}
	return h, nil
}

func deleteLinkByName(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil
		}
		return fmt.Errorf("lab: find link %s: %w", name, err)
	}
	if err := h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("lab: delete link %s: %w", name, err)
	}
	return nil
}
