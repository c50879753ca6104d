package podroutes

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Mode is where the routes to pods come from.
type Mode string

// The modes of pod_routes.
const (
	// None installs no route: the network already routes pod addresses
	// to the gateway's next hop (or every flow is masqueraded onto an
	// address the pods reach anyway).
	None Mode = "none"
	// Node installs a route per Node spec.podCIDRs via the Node's
	// InternalIP of the same family.
	Node Mode = "node"
	// Endpoint installs a /32 or /128 per endpoint address via the
	// InternalIP of its EndpointSlice nodeName, for CNIs whose IPAM does
	// not follow podCIDRs (Calico's blocks, Cilium's cluster pool).
	Endpoint Mode = "endpoint"
	// BGP installs the pod routes the BGP peers announce (Calico,
	// Cilium and kube-router nodes announce theirs).
	BGP Mode = "bgp"
)

// Keys of the configuration file, named in errors.
const (
	ModeKey           = "pod_routes"
	TableKey          = "pod_routes_table"
	RepairIntervalKey = "pod_routes_repair_interval"
	NodesKey          = "pod_routes_nodes"
	// ClusterCIDRsKey is the key, of the binary's own configuration, of
	// the cluster's pod CIDRs that Compile is given.
	ClusterCIDRsKey = "cluster_cidrs"
)

// Defaults.
const (
	DefaultTable          = unix.RT_TABLE_MAIN
	DefaultRepairInterval = 10 * time.Second
	MinRepairInterval     = time.Second
	MaxRepairInterval     = time.Hour
)

// Config is what the configuration file says about routes to pods. Its
// keys are top-level keys of config.toml: the binary embeds it inline.
type Config struct {
	// Mode: none (the default), node, endpoint or bgp.
	Mode Mode `toml:"pod_routes"`
	// Table is the routing table the routes go to, 1 to 2³²-1 except the
	// kernel's default (253) and local (255) tables; 0: main (254).
	Table int64 `toml:"pod_routes_table"`
	// RepairInterval is the backstop period at which the kernel's routes
	// are compared with the desired ones, besides every route
	// notification; 0: DefaultRepairInterval.
	RepairInterval time.Duration `toml:"pod_routes_repair_interval"`
	// Nodes stand for the cluster's Nodes when there is no cluster
	// (manifests): the nodeName of an endpoint names one of them.
	Nodes []NodeConfig `toml:"pod_routes_nodes"`
}

// NodeConfig is a node of pod_routes_nodes: what the routes need of a Node.
type NodeConfig struct {
	Name        string   `toml:"name"`
	InternalIPs []string `toml:"internal_ips"`
	PodCIDRs    []string `toml:"pod_cidrs"`
}

// Policy is a validated Config.
type Policy struct {
	Mode           Mode
	Table          int
	RepairInterval time.Duration
	// ClusterCIDRs bound every route: a pod CIDR, an endpoint address or
	// a learned prefix outside them is not installed. Empty (not allowed
	// in bgp mode): no bound.
	ClusterCIDRs []netip.Prefix
	// Nodes are pod_routes_nodes, parsed.
	Nodes []NodeInfo
}

// Compile validates c. clusterCIDRs are the cluster's pod CIDRs
// (cluster_cidrs, already validated by the binary). Its errors name the
// key and the value, all of them at once.
func (c Config) Compile(clusterCIDRs []netip.Prefix) (*Policy, error) {
	var errs []error
	p := &Policy{Mode: c.Mode, Table: DefaultTable, RepairInterval: DefaultRepairInterval, ClusterCIDRs: clusterCIDRs}
	switch c.Mode {
	case "":
		p.Mode = None
	case None, Node, Endpoint:
	case BGP:
		if len(clusterCIDRs) == 0 {
			errs = append(errs, fmt.Errorf("%s = %q needs %s: a peer's routes are installed only inside the cluster's pod CIDRs, so that no peer can take over other traffic of the gateway", ModeKey, c.Mode, ClusterCIDRsKey))
		}
	default:
		errs = append(errs, fmt.Errorf("%s = %q: want %q, %q, %q or %q", ModeKey, c.Mode, None, Node, Endpoint, BGP))
	}
	switch {
	case c.Table == 0:
	case c.Table < 0 || c.Table > 1<<32-1:
		errs = append(errs, fmt.Errorf("%s = %d: want 1 to %d (0: main)", TableKey, c.Table, int64(1<<32-1)))
	case c.Table == unix.RT_TABLE_DEFAULT || c.Table == unix.RT_TABLE_LOCAL:
		errs = append(errs, fmt.Errorf("%s = %d: the kernel's %s table; choose another (0: main)", TableKey, c.Table,
			map[int64]string{unix.RT_TABLE_DEFAULT: "default", unix.RT_TABLE_LOCAL: "local"}[c.Table]))
	default:
		p.Table = int(c.Table)
	}
	switch {
	case c.RepairInterval == 0:
	case c.RepairInterval < MinRepairInterval || c.RepairInterval > MaxRepairInterval:
		errs = append(errs, fmt.Errorf("%s = %q: want %s to %s", RepairIntervalKey, c.RepairInterval, MinRepairInterval, MaxRepairInterval))
	default:
		p.RepairInterval = c.RepairInterval
	}
	names := map[string]bool{}
	for i, n := range c.Nodes {
		key := fmt.Sprintf("%s[%d]", NodesKey, i)
		if msgs := validation.IsDNS1123Subdomain(n.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s.name = %q: not a Kubernetes node name: %s", key, n.Name, strings.Join(msgs, "; ")))
		} else if names[n.Name] {
			errs = append(errs, fmt.Errorf("%s.name = %q: given twice", key, n.Name))
		}
		names[n.Name] = true
		info := NodeInfo{Name: n.Name}
		for j, v := range n.InternalIPs {
			a, err := netip.ParseAddr(v)
			if err != nil || a.Zone() != "" {
				errs = append(errs, fmt.Errorf("%s.internal_ips[%d] = %q: not an IP address", key, j, v))
				continue
			}
			info.InternalIPs = append(info.InternalIPs, a.Unmap())
		}
		for j, v := range n.PodCIDRs {
			pfx, err := netip.ParsePrefix(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.pod_cidrs[%d] = %q: not a CIDR", key, j, v))
				continue
			}
			info.PodCIDRs = append(info.PodCIDRs, pfx.Masked())
		}
		p.Nodes = append(p.Nodes, info)
	}
	for i, cidr := range clusterCIDRs {
		if !cidr.IsValid() || cidr.Masked() != cidr {
			errs = append(errs, fmt.Errorf("%s[%d] = %q: not a CIDR without host bits", ClusterCIDRsKey, i, cidr))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}
