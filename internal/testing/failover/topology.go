// Package failover is the harness that proves established connections
// survive the loss of a gateway: a topology of gateways between two
// Ethernet segments, a traffic generator of long-lived TCP connections and
// UDP flows that checks every echo, a failure injector (kill -9 of every
// process of a gateway and its links cut) and the result per protocol
// (flows lost, longest stall max and p99). The anchor (keepalived and
// conntrackd from Debian, anchor.go) and nftgate (nftgate.go) run in the
// same topology, so their figures compare.
//
//	          client 198.18.20.2                (ECMP: client ── router)
//	             │
//	upstream segment (bridge) 198.18.20.0/24, Service address .100
//	   │ .11         │ .12          │ .13
//	 gw-a          gw-b           gw-c (three-gateway variant)
//	   │ .11         │ .12          │ .13
//	cluster segment (bridge) 198.18.21.0/24, floating F .100
//	             │
//	     endpoints .50 and .51 (one namespace)
//
// gw-a and gw-b also share a dedicated link (198.18.22.0/30) for state
// sync. Everything needs root.
package failover

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// The address plan, inside 198.18.0.0/15 (benchmarking) like every lab.
var (
	UpstreamNet = netip.MustParsePrefix("198.18.20.0/24")
	ClusterNet  = netip.MustParsePrefix("198.18.21.0/24")
	SyncNet     = netip.MustParsePrefix("198.18.22.0/30")
	// RouterNet is the client's link to the router in the ECMP variant.
	RouterNet = netip.MustParsePrefix("198.18.23.0/24")

	ClientAddr = netip.MustParseAddr("198.18.20.2")
	// ServiceAddr is the Service address on the upstream segment
	// (active/backup: it floats between the gateways).
	ServiceAddr = netip.MustParseAddr("198.18.20.100")
	// ECMPServiceAddr is the Service address of the ECMP variant, routed
	// by the router to the gateways that announce it by BGP.
	ECMPServiceAddr = netip.MustParseAddr("198.19.60.1")
	// Floating is F, the masquerade address of active/backup.
	Floating = netip.MustParseAddr("198.18.21.100")
	// Endpoints are the Service's two endpoints, both in one namespace.
	Endpoints = []netip.Addr{netip.MustParseAddr("198.18.21.50"), netip.MustParseAddr("198.18.21.51")}
	// RouterAddr is the router's address on the upstream segment, and
	// RouterClientSide its address towards the client (ECMP variant).
	RouterAddr       = netip.MustParseAddr("198.18.20.1")
	RouterClientSide = netip.MustParseAddr("198.18.23.1")
	ECMPClientAddr   = netip.MustParseAddr("198.18.23.2")
)

// ServicePort is the Service's port; EndpointPort the endpoints'.
const (
	ServicePort  = 80
	EndpointPort = 8080
)

// GatewayNames are the gateways' names, in order.
var GatewayNames = []string{"gw-a", "gw-b", "gw-c"}

// GatewayAddr is gateway i's address on a segment (net UpstreamNet or
// ClusterNet): .11, .12, .13.
func GatewayAddr(net netip.Prefix, i int) netip.Addr {
	b := net.Addr().As4()
	b[3] = byte(11 + i)
	return netip.AddrFrom4(b)
}

// MasqueradeAddr is gateway i's own masquerade address in the ECMP
// variant (active/active): .101, .102, .103 on the cluster segment.
func MasqueradeAddr(i int) netip.Addr {
	b := ClusterNet.Addr().As4()
	b[3] = byte(101 + i)
	return netip.AddrFrom4(b)
}

// SyncAddr is gateway i's (0 or 1) address on the dedicated sync link.
func SyncAddr(i int) netip.Addr {
	b := SyncNet.Addr().As4()
	b[3] = byte(1 + i)
	return netip.AddrFrom4(b)
}

// Options shape the topology.
type Options struct {
	// Name labels the lab's namespaces.
	Name string
	// Gateways is 2 (active/backup) or 3 (the ECMP variant).
	Gateways int
	// Router puts the client behind a router on the upstream segment
	// (for BGP and ECMP) instead of on the segment itself.
	Router bool
}

// Topology is the lab built by New.
type Topology struct {
	*lab.Lab
	Client, Endpoints *lab.Host
	// Router is the upstream router with Options.Router, else nil.
	Router   *lab.Host
	Gateways []*lab.Host
	// Upstream[i] and Cluster[i] are gateway i's interfaces on the two
	// segments; Sync[i] its end of the sync link (gateways 0 and 1).
	Upstream, Cluster, Sync []string
	// ClientIface is the client's interface on the upstream segment (or
	// towards the router).
	ClientIface string
	// RouterUpstream is the router's interface on the upstream segment.
	RouterUpstream string
	// upstreamBridge and clusterBridge are the segments' bridges
	// (CutUpstream, CutCluster).
	upstreamBridge, clusterBridge *lab.Host
}

// New builds the topology. On error everything made so far is removed.
func New(o Options) (*Topology, error) {
	if o.Gateways < 2 || o.Gateways > len(GatewayNames) {
		return nil, fmt.Errorf("failover: %d gateways: want 2 or 3", o.Gateways)
	}
	l, err := lab.New(o.Name)
	if err != nil {
		return nil, err
	}
	t := &Topology{Lab: l}
	if err := t.build(o); err != nil {
		return nil, errors.Join(err, t.Close())
	}
	return t, nil
}

func pfx(a netip.Addr, net netip.Prefix) netip.Prefix { return netip.PrefixFrom(a, net.Bits()) }

func (t *Topology) build(o Options) error {
	var err error
	if t.Client, err = t.AddHost("client"); err != nil {
		return err
	}
	if t.Endpoints, err = t.AddHost("endpoints"); err != nil {
		return err
	}
	for i := range o.Gateways {
		h, err := t.AddHost(GatewayNames[i])
		if err != nil {
			return err
		}
		if err := h.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
		t.Gateways = append(t.Gateways, h)
	}
	up := []*lab.Host{}
	upAddrs := [][]netip.Prefix{}
	if o.Router {
		if t.Router, err = t.AddHost("router"); err != nil {
			return err
		}
		for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.fib_multipath_hash_policy", "1"}} {
			if err := t.Router.Sysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		v, err := t.Link(t.Client, []netip.Prefix{pfx(ECMPClientAddr, RouterNet)}, t.Router, []netip.Prefix{pfx(RouterClientSide, RouterNet)})
		if err != nil {
			return err
		}
		t.ClientIface = v.A
		if err := t.Client.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), RouterClientSide); err != nil {
			return err
		}
		up = append(up, t.Router)
		upAddrs = append(upAddrs, []netip.Prefix{pfx(RouterAddr, UpstreamNet)})
	} else {
		up = append(up, t.Client)
		upAddrs = append(upAddrs, []netip.Prefix{pfx(ClientAddr, UpstreamNet)})
	}
	for i, g := range t.Gateways {
		up = append(up, g)
		upAddrs = append(upAddrs, []netip.Prefix{pfx(GatewayAddr(UpstreamNet, i), UpstreamNet)})
	}
	br, ifs, err := t.Segment("upstream", up, upAddrs)
	if err != nil {
		return err
	}
	t.upstreamBridge = br
	if o.Router {
		t.RouterUpstream = ifs[0]
		for i := range t.Gateways {
			if err := t.addRoutes(i); err != nil {
				return err
			}
		}
	} else {
		t.ClientIface = ifs[0]
	}
	t.Upstream = ifs[1:]

	cl := []*lab.Host{t.Endpoints}
	clAddrs := [][]netip.Prefix{{pfx(Endpoints[0], ClusterNet), pfx(Endpoints[1], ClusterNet)}}
	for i, g := range t.Gateways {
		cl = append(cl, g)
		clAddrs = append(clAddrs, []netip.Prefix{pfx(GatewayAddr(ClusterNet, i), ClusterNet)})
	}
	if t.clusterBridge, ifs, err = t.Segment("cluster", cl, clAddrs); err != nil {
		return err
	}
	t.Cluster = ifs[1:]

	v, err := t.Link(t.Gateways[0], []netip.Prefix{pfx(SyncAddr(0), SyncNet)}, t.Gateways[1], []netip.Prefix{pfx(SyncAddr(1), SyncNet)})
	if err != nil {
		return err
	}
	t.Sync = []string{v.A, v.B}
	return nil
}

// addRoutes adds gateway i's static routes: with a router, the client's
// network through it.
func (t *Topology) addRoutes(i int) error {
	if t.Router == nil {
		return nil
	}
	return t.Gateways[i].AddRoute(RouterNet, RouterAddr)
}

// Fail kills gateway i as a dead box would die: SIGKILL to every process
// in its namespace, then every link of it down. It returns the moment the
// failure started, which the results are measured from.
func (t *Topology) Fail(i int) (time.Time, error) {
	h := t.Gateways[i]
	start := time.Now()
	err := KillNamespace(h)
	links, lerr := h.Netlink().LinkList()
	if lerr != nil {
		return start, errors.Join(err, lerr)
	}
	for _, l := range links {
		if l.Attrs().Name == "lo" {
			continue
		}
		if e := h.Netlink().LinkSetDown(l); e != nil {
			err = errors.Join(err, fmt.Errorf("failover: %s: %s down: %w", h, l.Attrs().Name, e))
		}
	}
	return start, err
}

// CutUpstream cuts gateway i's link to the upstream segment as a pulled
// cable or a dead switch port does (up false), or mends it (up true): the
// segment's end of the link goes down (up), so the gateway's interface
// loses (regains) its carrier while the gateway and its other links live
// on.
func (t *Topology) CutUpstream(i int, up bool) error {
	return t.setPort(t.upstreamBridge, i, t.Upstream[i], up)
}

// CutCluster is CutUpstream for gateway i's link to the cluster segment.
func (t *Topology) CutCluster(i int, up bool) error {
	return t.setPort(t.clusterBridge, i, t.Cluster[i], up)
}

// setPort sets bridge br's end of gateway i's link iface up or down.
func (t *Topology) setPort(br *lab.Host, i int, iface string, up bool) error {
	g := t.Gateways[i]
	l, err := g.Netlink().LinkByName(iface)
	if err != nil {
		return fmt.Errorf("failover: %s: %s: %w", g, iface, err)
	}
	// A veth's link index is its peer's, in the bridge's namespace.
	port, err := br.Netlink().LinkByIndex(l.Attrs().ParentIndex)
	if err != nil {
		return fmt.Errorf("failover: %s's port of %s %s: %w", br, g, iface, err)
	}
	if up {
		err = br.Netlink().LinkSetUp(port)
	} else {
		err = br.Netlink().LinkSetDown(port)
	}
	if err != nil {
		return fmt.Errorf("failover: %s's port %s of %s: %w", br, port.Attrs().Name, g, err)
	}
	return nil
}

// KillNamespace sends SIGKILL to every process whose network namespace
// is h's (never this process) and waits until they are gone.
func KillNamespace(h *lab.Host) error {
	pids, err := namespacePIDs(h)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return lab.EventuallyWithin(10*time.Second, func() error {
		left, err := namespacePIDs(h)
		if err != nil {
			return err
		}
		// A killed child of this process stays a zombie until reaped, and
		// its ns link is gone by then: what is listed is still running.
		if len(left) > 0 {
			return fmt.Errorf("failover: processes %v still in %s", left, h)
		}
		return nil
	})
}

// namespacePIDs lists the processes (thread group leaders) in h's network
// namespace.
func namespacePIDs(h *lab.Host) ([]int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(h.Path(), &want); err != nil {
		return nil, fmt.Errorf("failover: %s: %w", h.Path(), err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue // gone, or a kernel thread
		}
		if st.Ino == want.Ino && st.Dev == want.Dev {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Return brings gateway i back after Fail as a rebooted box comes back:
// its conntrack table and nftables ruleset are emptied (a reboot loses
// them; what the gateway holds again must come from its peers), then its
// links are up and its static routes back. Start the gateway's programs after it.
func (t *Topology) Return(i int) error {
	h := t.Gateways[i]
	ctx := context.Background()
	if out, err := h.Command(ctx, "conntrack", "-F").CombinedOutput(); err != nil {
		return fmt.Errorf("failover: %s: conntrack -F: %w: %s", h, err, out)
	}
	if out, err := h.Command(ctx, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		return fmt.Errorf("failover: %s: nft flush ruleset: %w: %s", h, err, out)
	}
	links, err := h.Netlink().LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if e := h.Netlink().LinkSetUp(l); e != nil {
			err = errors.Join(err, fmt.Errorf("failover: %s: %s up: %w", h, l.Attrs().Name, e))
		}
	}
	if err != nil {
		return err
	}
	// Its links down took its static routes with them.
	return t.addRoutes(i)
}
