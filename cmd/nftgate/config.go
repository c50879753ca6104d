package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/BurntSushi/toml"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nftgate/nftgate/announce/bgp"
	"github.com/nftgate/nftgate/announce/l2"
	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/ipam"
	"github.com/nftgate/nftgate/podroutes"
	"github.com/nftgate/nftgate/proxy"
	"github.com/nftgate/nftgate/ruleset"
	"github.com/nftgate/nftgate/source"
)

// Config is nftgate's configuration: config.toml at the repository root
// documents every key and its default. Flags override the file.
type Config struct {
	NodeName          string   `toml:"node_name"`
	Zone              string   `toml:"zone"`
	Table             string   `toml:"table"`
	Kubeconfig        string   `toml:"kubeconfig"`
	Manifests         string   `toml:"manifests"`
	Listen            string   `toml:"listen"`
	ClusterCIDRs      []string `toml:"cluster_cidrs"`
	NodePortAddresses []string `toml:"nodeport_addresses"`
	ExternalIPCIDRs   []string `toml:"external_ip_cidrs"`
	ProxyName         string   `toml:"proxy_name"`
	ExternalOnly      bool     `toml:"external_only"`
	MinSyncInterval   Duration `toml:"min_sync_interval"`
	ReconcileInterval Duration `toml:"reconcile_interval"`
	MinRepairInterval Duration `toml:"min_repair_interval"`
	HealthzMaxAge     Duration `toml:"healthz_max_sync_age"`
	MasqueradeBit     uint32   `toml:"masquerade_bit"`
	HashSeed          uint32   `toml:"hash_seed"`
	EndpointSelection string   `toml:"endpoint_selection"`
	// UnservedServiceTraffic is what becomes of a packet to a LoadBalancer
	// or external IP that no Service port translates: "reject" (the
	// default), "drop" or "route" (cmd/nftgate/unserved.go).
	UnservedServiceTraffic string `toml:"unserved_service_traffic"`
	// AnswerServiceAddressPing: the gateway answers an ICMP echo request
	// to a LoadBalancer or external IP itself (ruleset/unserved.go).
	AnswerServiceAddressPing bool `toml:"answer_service_address_ping"`
	// ServicePingRate and ServicePingSourceRate bound the echo flows it
	// answers a second, from all sources and from one.
	ServicePingRate       int    `toml:"answer_service_address_ping_rate"`
	ServicePingSourceRate int    `toml:"answer_service_address_ping_source_rate"`
	Shards                Shards `toml:"shards"`
	// ProxyProtocolPort is where the PROXY protocol proxy listens (0:
	// off); the other two keys bound it (see cmd/nftgate/proxy.go).
	ProxyProtocolPort           uint16   `toml:"proxy_protocol_port"`
	ProxyProtocolMaxConnections int      `toml:"proxy_protocol_max_connections"`
	ProxyProtocolDialTimeout    Duration `toml:"proxy_protocol_dial_timeout"`
	Flowtable                   bool     `toml:"flowtable"`
	FlowtableDevices            []string `toml:"flowtable_devices"`
	FlowtablePackets            int64    `toml:"flowtable_packets"`
	Counters                    bool     `toml:"counters"`
	CountersTrafficElements     int      `toml:"counters_traffic_elements"`
	MetricsPerService           bool     `toml:"metrics_per_service"`
	TrafficHistoryStep          Duration `toml:"traffic_history_step"`
	TrafficHistoryPoints        int      `toml:"traffic_history_points"`
	TrafficHistoryPorts         int      `toml:"traffic_history_ports"`
	TimelineEvents              int      `toml:"timeline_events"`
	LogLevel                    string   `toml:"log_level"`
	LogFormat                   string   `toml:"log_format"`
	AuthUser                    string   `toml:"auth_user"`
	AuthPasswordFile            string   `toml:"auth_password_file"`
	Pprof                       bool     `toml:"pprof"`
	HTTPAllowedHosts            []string `toml:"http_allowed_hosts"`
	TLSCertFile                 string   `toml:"tls_cert_file"`
	TLSKeyFile                  string   `toml:"tls_key_file"`
	TLSSelfSignedDir            string   `toml:"tls_self_signed_dir"`
	MemoryLimit                 ByteSize `toml:"memory_limit"`
	// ManifestMaxFileSize is the largest manifest file read.
	ManifestMaxFileSize ByteSize `toml:"manifest_max_file_size"`
	// DrainOnStop withdraws every BGP route and stops answering ARP/NDP
	// when nftgate stops, instead of leaving the routes to graceful
	// restart.
	DrainOnStop bool `toml:"drain_on_stop"`
	// DrainPeriod bounds a drain (drain.go): how long open flows are
	// waited for after the announcements are withdrawn.
	DrainPeriod Duration `toml:"drain_period"`
	// MasqueradeAddresses and KeepClientAddress: what clients outside
	// cluster_cidrs are masqueraded to, if at all (masquerade.go).
	MasqueradeAddresses []string `toml:"masquerade_addresses"`
	KeepClientAddress   bool     `toml:"keep_client_address"`
	// ReleaseTimeWait: the endpoints' TIME_WAIT of masqueraded TCP
	// connections is reset once both ends closed (ruleset/release.go).
	ReleaseTimeWait bool `toml:"release_time_wait"`
	// AnswerRefusedSYNs: an endpoint's refusal of a masqueraded
	// connection's SYN is answered with the reset that ends its TIME_WAIT
	// (ruleset/refused.go).
	AnswerRefusedSYNs bool `toml:"answer_refused_syns"`
	// ConntrackTCPTimeWait, with ReleaseTimeWait or AnswerRefusedSYNs, is
	// set as the namespace's conntrack TIME_WAIT timeout (0: left as it
	// is).
	ConntrackTCPTimeWait Duration `toml:"conntrack_tcp_time_wait"`
	// ConntrackMaxPerCPU and ConntrackMin size the conntrack table
	// (conntrackmax.go): at start it is raised to ConntrackMin or
	// ConntrackMaxPerCPU per CPU, whichever is more, where it is smaller
	// (0 per CPU: left as it is).
	ConntrackMaxPerCPU int `toml:"conntrack_max_per_cpu"`
	ConntrackMin       int `toml:"conntrack_min"`
	// MasqueradePortsByCPU gives each group of CPUs its own share of the
	// masquerade ports for TCP (ruleset/cpuports.go).
	MasqueradePortsByCPU bool `toml:"masquerade_ports_by_cpu"`
	// LoadBalancerClass and Pools are the address allocation (package
	// ipam); BGP and L2 the announcement (packages announce/bgp and
	// announce/l2). Nil: that announcement is off.
	LoadBalancerClass string            `toml:"load_balancer_class"`
	Pools             []ipam.PoolConfig `toml:"pools"`
	BGP               *bgp.Config       `toml:"bgp"`
	L2                *l2.Config        `toml:"l2"`
	// Gateways is the gateway set (package gateways): with it, the L2
	// announcement answers only for the addresses this gateway owns.
	Gateways *gateways.Config `toml:"gateways"`
	// The routes to pods: pod_routes and its keys (package podroutes).
	podroutes.Config

	// Parsed forms, filled by validate.
	ipamPolicy *ipam.Policy
	podRoutes  *podroutes.Policy
	// trackDefault: [gateways] track_interfaces was not given; the links
	// towards the BGP peers are tracked too (startGateways).
	trackDefault      bool
	clusterCIDRs      []netip.Prefix
	nodePortAddresses []netip.Prefix
	externalIPCIDRs   []netip.Prefix
	masqueradeAddrs   []netip.Addr
	// peerMasquerade: the other gateways' masquerade addresses
	// (active-active mode), announced while this gateway holds them.
	peerMasquerade []netip.Addr
}

// DefaultManifests is where the gateway looks for manifests when no cluster
// is configured.
const DefaultManifests = "/etc/nftgate/manifests"

func defaults() Config {
	return Config{
		Table:                       "nftgate",
		Listen:                      "127.0.0.1:9180",
		MinSyncInterval:             Duration(50 * time.Millisecond),
		ReconcileInterval:           Duration(time.Minute),
		MinRepairInterval:           Duration(time.Second),
		HealthzMaxAge:               Duration(2 * time.Minute),
		DrainPeriod:                 Duration(DefaultDrainPeriod),
		MasqueradeBit:               0x4000,
		ReleaseTimeWait:             true,
		AnswerRefusedSYNs:           true,
		MasqueradePortsByCPU:        true,
		ConntrackTCPTimeWait:        Duration(defaultConntrackTCPTimeWait),
		ConntrackMaxPerCPU:          defaultConntrackMaxPerCPU,
		ConntrackMin:                defaultConntrackMin,
		Shards:                      ShardsAuto,
		EndpointSelection:           defaultSelection,
		UnservedServiceTraffic:      unservedReject,
		AnswerServiceAddressPing:    true,
		ServicePingRate:             ruleset.DefaultEchoRate,
		ServicePingSourceRate:       ruleset.DefaultEchoSourceRate,
		ProxyProtocolPort:           proxy.DefaultPort,
		ProxyProtocolMaxConnections: proxy.DefaultMaxConnections,
		ProxyProtocolDialTimeout:    Duration(proxy.DefaultDialTimeout),
		Counters:                    true,
		CountersTrafficElements:     defaultTrafficElements,
		FlowtablePackets:            defaultFlowtablePackets,
		TrafficHistoryStep:          Duration(appliance.DefaultHistoryStep),
		TrafficHistoryPoints:        appliance.DefaultHistoryPoints,
		TrafficHistoryPorts:         appliance.DefaultHistoryPorts,
		TimelineEvents:              appliance.DefaultEventsSize,
		LogLevel:                    "info",
		LogFormat:                   "text",
		MemoryLimit:                 DefaultMemoryLimit,
		ManifestMaxFileSize:         source.DefaultMaxFileSize,
	}
}

// DefaultMemoryLimit is memory_limit's default: see config.toml for why.
const DefaultMemoryLimit = 40 << 20

// Bounds of manifest_max_file_size: a file smaller than a few Services is
// no use, and decoding a manifest takes several times its size in memory.
const (
	minManifestFileSize = 4 << 10
	maxManifestFileSize = 1 << 30
)

// Duration is a time.Duration written as "10ms", "1m" in TOML.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (like 10ms, 30s, 1m)", b)
	}
	*d = Duration(v)
	return nil
}

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements encoding.TextMarshaler: a config written back
// reads the same.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Set implements flag.Value.
func (d *Duration) Set(s string) error { return d.UnmarshalText([]byte(s)) }

// ByteSize is an amount of memory written as "96MiB", "1GiB", "65536" (bytes)
// in TOML and on the command line.
type ByteSize int64

var byteUnits = []struct {
	suffix string
	size   int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *ByteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	num, unit := s, int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, unit = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.size
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/unit {
		return fmt.Errorf("%q is not a size (like 96MiB or 1GiB; 0 for none)", text)
	}
	*b = ByteSize(n * unit)
	return nil
}

func (b ByteSize) String() string {
	for _, u := range byteUnits[:3] { // the largest unit that divides it
		if b != 0 && int64(b)%u.size == 0 {
			return strconv.FormatInt(int64(b)/u.size, 10) + u.suffix
		}
	}
	if b == 0 {
		return "0"
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// MarshalText implements encoding.TextMarshaler: a config written back
// reads the same.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// Set implements flag.Value.
func (b *ByteSize) Set(s string) error { return b.UnmarshalText([]byte(s)) }

// Shards is the shards setting: a shard count, or ShardsAuto for "auto"
// (ruleset.AutoShardCount at each start). It is read from TOML as a number
// or "auto", and from a flag as either.
type Shards int

// ShardsAuto is the setting "auto".
const ShardsAuto Shards = -1

// UnmarshalTOML implements toml.Unmarshaler.
func (s *Shards) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case int64:
		if v < 1 || v > ruleset.MaxShards {
			return fmt.Errorf("%d is not between 1 and %d, nor auto", v, ruleset.MaxShards)
		}
		*s = Shards(v)
		return nil
	case string:
		return s.Set(v)
	}
	return fmt.Errorf("%v is not a number of shards nor \"auto\"", v)
}

// MarshalTOML implements toml.Marshaler: "auto" or the number, as the
// file takes them.
func (s Shards) MarshalTOML() ([]byte, error) {
	if s == ShardsAuto {
		return []byte(`"auto"`), nil
	}
	return strconv.AppendInt(nil, int64(s), 10), nil
}

// Set implements flag.Value.
func (s *Shards) Set(v string) error {
	if v == "auto" {
		*s = ShardsAuto
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%q is not a number of shards nor \"auto\"", v)
	}
	*s = Shards(n)
	return nil
}

func (s *Shards) String() string {
	if s == nil || *s == ShardsAuto {
		return "auto"
	}
	return strconv.Itoa(int(*s))
}

// chooseShards is the Programmer's choice of the shard count: nil for a
// count set by hand.
func (s Shards) chooseShards() func(services, inPlace int) int {
	if s == ShardsAuto {
		return ruleset.AutoShardCount
	}
	return nil
}

// count is the count set by hand, or zero for auto.
func (s Shards) count() int { return max(int(s), 0) }

// listFlag is a repeatable flag; the first use replaces the file's list.
type listFlag struct {
	dst *[]string
	set bool
}

func (l *listFlag) String() string {
	if l.dst == nil {
		return ""
	}
	return strings.Join(*l.dst, ",")
}

func (l *listFlag) Set(s string) error {
	if !l.set {
		*l.dst, l.set = nil, true
	}
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l.dst = append(*l.dst, v)
		}
	}
	return nil
}

// loadConfig reads the config file named by --config (if any), then applies
// the other flags over it, and checks every value. Nothing touches the
// kernel before this succeeds.
func loadConfig(name string, args []string) (*Config, *flag.FlagSet, error) {
	// The file comes first, so that flags override it: find --config in a
	// first pass.
	path := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--config" || a == "-config":
			if i+1 < len(args) {
				path = args[i+1]
			}
		case strings.HasPrefix(a, "--config=") || strings.HasPrefix(a, "-config="):
			path = a[strings.Index(a, "=")+1:]
		}
	}
	cfg := defaults()
	if path != "" {
		md, err := toml.DecodeFile(path, &cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("config %s: %w", path, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			keys := make([]string, len(und))
			for i, k := range und {
				keys[i] = k.String()
			}
			return nil, nil, fmt.Errorf("config %s: unknown key %s", path, strings.Join(keys, ", "))
		}
	}

	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.String("config", path, "TOML configuration `file` (see config.toml for every key)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", cfg.Kubeconfig, "kubeconfig `path` of the cluster to serve (default: $KUBECONFIG, then in-cluster)")
	fs.StringVar(&cfg.Manifests, "manifests", cfg.Manifests, "`directory` of Service and EndpointSlice manifests to serve instead of a cluster")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "this gateway's node `name`, for traffic policy Local (default: hostname)")
	fs.StringVar(&cfg.Zone, "zone", cfg.Zone, "this gateway's topology `zone`, for topology hints")
	fs.Var(&listFlag{dst: &cfg.ClusterCIDRs}, "cluster-cidr", "`CIDR` of the cluster's pods; traffic from elsewhere is masqueraded (repeatable)")
	fs.Var(&listFlag{dst: &cfg.NodePortAddresses}, "nodeport-addresses", "`CIDR` limiting which local addresses serve NodePorts (repeatable)")
	fs.Var(&listFlag{dst: &cfg.MasqueradeAddresses}, "masquerade-address", "`address or CIDR` clients outside the cluster are masqueraded to, chosen per client (repeatable)")
	fs.BoolVar(&cfg.KeepClientAddress, "keep-client-address", cfg.KeepClientAddress, "masquerade no client: replies from the pods come back through this gateway")
	fs.BoolVar(&cfg.MasqueradePortsByCPU, "masquerade-ports-by-cpu", cfg.MasqueradePortsByCPU, "give each group of CPUs its own share of the ports TCP is masqueraded to, so that no two new connections clash")
	fs.BoolVar(&cfg.ReleaseTimeWait, "release-time-wait", cfg.ReleaseTimeWait, "reset the endpoints' TIME_WAIT of masqueraded TCP connections once both ends closed")
	fs.BoolVar(&cfg.AnswerRefusedSYNs, "answer-refused-syns", cfg.AnswerRefusedSYNs, "answer an endpoint's refusal of a masqueraded TCP connection's SYN with the reset that ends its TIME_WAIT")
	fs.Var(&listFlag{dst: &cfg.ExternalIPCIDRs}, "external-ip-cidr", "`CIDR` where Services' externalIPs are served; none by default (repeatable)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "`host:port` of the status page, API, health and metrics")
	fs.StringVar(&cfg.Table, "table", cfg.Table, "`name` of nftgate's nftables tables")
	fs.Var(&cfg.Shards, "shards", "`number` of service shard tables per family, or auto (see config.toml)")
	flowtableFlags(fs, &cfg)
	trafficFlags(fs, &cfg)
	pageFlags(fs, &cfg)
	selectionFlags(fs, &cfg)
	unservedFlags(fs, &cfg)
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	fs.Var(&cfg.MinSyncInterval, "min-sync-interval", "least `time` between two syncs; changes meanwhile are coalesced")
	fs.BoolVar(&cfg.Pprof, "pprof", cfg.Pprof, "serve Go's profiler under /debug/pprof/ on the listen address")
	fs.Var(&listFlag{dst: &cfg.HTTPAllowedHosts}, "http-allowed-host", "host `name` the status server answers to without auth, besides IP addresses and localhost (repeatable)")
	fs.Var(&cfg.MemoryLimit, "memory-limit", "soft limit of the Go runtime's memory (`size` like 128MiB; 0 for none)")
	fs.Var(&cfg.ManifestMaxFileSize, "manifest-max-file-size", "largest manifest file read (`size` like 32MiB); a larger one is refused, its previous content kept")
	fs.Var(&cfg.ReconcileInterval, "reconcile-interval", "how often the kernel is read back and drift repaired (`duration`, 0 disables)")
	if err := fs.Parse(args); err != nil {
		return nil, fs, flagError{err}
	}
	if fs.NArg() > 0 {
		return nil, fs, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.validate(); err != nil {
		return nil, fs, configSource(path, fs, err)
	}
	return &cfg, fs, nil
}

// configSource names where a configuration that failed validation came
// from: the file, and the flags given beside it (which override its keys).
// Without a file, the error names the key and the value alone.
func configSource(path string, fs *flag.FlagSet, err error) error {
	if path == "" {
		return err
	}
	var flags []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "config" {
			flags = append(flags, "--"+f.Name)
		}
	})
	if len(flags) > 0 {
		return fmt.Errorf("config %s with flags %s: %w", path, strings.Join(flags, " "), err)
	}
	return fmt.Errorf("config %s: %w", path, err)
}

// Bounds of the configuration's values; config.toml documents them.
const (
	// maxTableName leaves room within the kernel's 255 bytes for the
	// shard tables' suffix ("-services-255"), and keeps names readable.
	maxTableName      = 64
	minSyncInterval   = time.Millisecond
	maxSyncInterval   = time.Minute
	minReconcile      = time.Second
	maxReconcile      = 24 * time.Hour
	maxRepairInterval = time.Hour
	minHealthzMaxAge  = time.Second
	maxHealthzMaxAge  = 24 * time.Hour
	minMemoryLimit    = 16 << 20
	maxMemoryLimit    = 1 << 40
	maxCIDRs          = 256
	maxAuthUserLength = 64
)

// tableNamePattern is what a table name may be: an nft identifier of
// letters, digits, '_' and '-', starting with a letter, so that it reads
// the same in `nft list ruleset` and in the script `nftgate render` prints.
var tableNamePattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

func (c *Config) validate() error {
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			bad("node_name", "empty, and the hostname is unknown: %v", err)
		}
		// As the kubelet names its Node after the hostname.
		c.NodeName = strings.ToLower(h)
	}
	if msgs := validation.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
		bad("node_name", "%q is not a Kubernetes node name: %s", c.NodeName, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(c.Zone); len(msgs) > 0 {
		bad("zone", "%q is not a topology zone (a label value): %s", c.Zone, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(c.ProxyName); len(msgs) > 0 {
		bad("proxy_name", "%q is not a service-proxy-name (a label value): %s", c.ProxyName, strings.Join(msgs, "; "))
	}
	switch {
	case len(c.Table) > maxTableName:
		bad("table", "%q is %d bytes long; at most %d", c.Table, len(c.Table), maxTableName)
	case !tableNamePattern.MatchString(c.Table):
		bad("table", "%q is not a usable table name: letters, digits, '_' and '-', starting with a letter", c.Table)
	}
	if c.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Listen); err != nil {
			bad("listen", "%q is not host:port", c.Listen)
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
			bad("listen", "%q: port %q is not a number from 0 to 65535", c.Listen, port)
		}
	}
	parse := func(key string, vals []string) []netip.Prefix {
		if len(vals) > maxCIDRs {
			bad(key, "%d CIDRs; at most %d", len(vals), maxCIDRs)
			return nil
		}
		var out []netip.Prefix
		for i, v := range vals {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				if a, aerr := netip.ParseAddr(v); aerr == nil && a.Zone() == "" {
					p = netip.PrefixFrom(a, a.BitLen())
				} else {
					bad(fmt.Sprintf("%s[%d]", key, i), "%q is not a CIDR", v)
					continue
				}
			}
			out = append(out, p.Masked())
		}
		return out
	}
	c.clusterCIDRs = parse("cluster_cidrs", c.ClusterCIDRs)
	c.nodePortAddresses = parse("nodeport_addresses", c.NodePortAddresses)
	c.externalIPCIDRs = parse("external_ip_cidrs", c.ExternalIPCIDRs)
	within := func(key string, d Duration, lo, hi time.Duration, zero string) {
		if d == 0 && zero != "" {
			return
		}
		if time.Duration(d) < lo || time.Duration(d) > hi {
			msg := "%s is not between %s and %s"
			if zero != "" {
				msg += " (or 0s: " + zero + ")"
			}
			bad(key, msg, d, lo, hi)
		}
	}
	within("min_sync_interval", c.MinSyncInterval, minSyncInterval, maxSyncInterval, "")
	within("reconcile_interval", c.ReconcileInterval, minReconcile, maxReconcile, "off")
	if c.MinRepairInterval < 0 || time.Duration(c.MinRepairInterval) > maxRepairInterval {
		bad("min_repair_interval", "%s is not between 0s and %s", c.MinRepairInterval, maxRepairInterval)
	}
	within("healthz_max_sync_age", c.HealthzMaxAge, minHealthzMaxAge, maxHealthzMaxAge, "off")
	if c.HealthzMaxAge > 0 && c.ReconcileInterval > 0 && c.HealthzMaxAge < c.ReconcileInterval {
		bad("healthz_max_sync_age", "%s is shorter than reconcile_interval (%s): /healthz would fail between the syncs of a quiet cluster", c.HealthzMaxAge, c.ReconcileInterval)
	}
	if d := time.Duration(c.ConntrackTCPTimeWait); d != 0 && (d < time.Second || d > maxConntrackTCPTimeWait || d%time.Second != 0) {
		bad("conntrack_tcp_time_wait", "%s is not 0s or whole seconds between 1s and %s", c.ConntrackTCPTimeWait, Duration(maxConntrackTCPTimeWait))
	}
	if c.ConntrackMaxPerCPU < 0 || c.ConntrackMaxPerCPU > maxConntrackMaxPerCPU {
		bad("conntrack_max_per_cpu", "%d is not between 0 and %d", c.ConntrackMaxPerCPU, maxConntrackMaxPerCPU)
	}
	if c.ConntrackMin < 0 || c.ConntrackMin > maxConntrackMin {
		bad("conntrack_min", "%d is not between 0 and %d", c.ConntrackMin, maxConntrackMin)
	}
	if c.DrainPeriod < 0 || time.Duration(c.DrainPeriod) > maxDrainPeriod {
		bad("drain_period", "%s is not between 0s and %s", c.DrainPeriod, maxDrainPeriod)
	}
	if c.ManifestMaxFileSize < minManifestFileSize || c.ManifestMaxFileSize > maxManifestFileSize {
		bad("manifest_max_file_size", "%s is not between %s and %s", c.ManifestMaxFileSize, ByteSize(minManifestFileSize), ByteSize(maxManifestFileSize))
	}
	if c.Shards != ShardsAuto && (c.Shards < 1 || c.Shards > ruleset.MaxShards) {
		bad("shards", "%d is not between 1 and %d, nor auto", c.Shards, ruleset.MaxShards)
	}
	c.validateProxy(bad)
	c.validatePage(bad)
	c.validateTraffic(bad)
	c.validateFlowtable(bad)
	c.validateSelection(bad)
	c.validateUnserved(bad)
	if c.MasqueradeBit == 0 || c.MasqueradeBit&(c.MasqueradeBit-1) != 0 {
		bad("masquerade_bit", "%#x is not a single bit", c.MasqueradeBit)
	}
	if c.MemoryLimit != 0 && (c.MemoryLimit < minMemoryLimit || c.MemoryLimit > maxMemoryLimit) {
		bad("memory_limit", "%s is not between %s and %s (or 0: none)", c.MemoryLimit, ByteSize(minMemoryLimit), ByteSize(maxMemoryLimit))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "%q is not debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad("log_format", "%q is not text or json", c.LogFormat)
	}
	if (c.AuthUser == "") != (c.AuthPasswordFile == "") {
		bad("auth_user", "auth_user and auth_password_file go together")
	}
	if len(c.AuthUser) > maxAuthUserLength || strings.ContainsFunc(c.AuthUser, func(r rune) bool { return r == ':' || unicode.IsControl(r) }) {
		bad("auth_user", "%q is not a user name: at most %d bytes, no ':' or control characters", c.AuthUser, maxAuthUserLength)
	}
	if c.Pprof && c.AuthUser == "" && c.Listen != "" && !loopbackListen(c.Listen) {
		bad("pprof", "the profiler would be open to anyone on listen %q, which is not a loopback address: set auth_user and auth_password_file, or listen on 127.0.0.1 or [::1]", c.Listen)
	}
	for i, h := range c.HTTPAllowedHosts {
		if h == "" || len(h) > 253 || strings.ContainsAny(h, " \t\r\n/:[]@") {
			bad(fmt.Sprintf("http_allowed_hosts[%d]", i), "%q is not a host name", h)
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("tls_cert_file", "tls_cert_file and tls_key_file go together")
	}
	if c.TLSSelfSignedDir != "" && c.TLSCertFile != "" {
		bad("tls_self_signed_dir", "%q and tls_cert_file %q are both given; choose one certificate", c.TLSSelfSignedDir, c.TLSCertFile)
	}
	if c.BGP != nil {
		b := c.BGP.WithDefaults()
		if err := b.Validate(); err != nil {
			errs = append(errs, err)
		} else {
			c.BGP = &b
		}
	}
	if c.L2 != nil {
		l := c.L2.WithDefaults()
		if err := l.Validate(); err != nil {
			errs = append(errs, err)
		} else {
			c.L2 = &l
		}
	}
	if c.Gateways != nil {
		g := c.Gateways.WithDefaults()
		if c.Gateways.TrackInterfaces == nil {
			// The links the addresses are answered on, and (at the
			// start) those towards the BGP peers: cut, this gateway
			// cannot carry what it holds.
			c.trackDefault = true
			if c.L2 != nil {
				g.TrackInterfaces = slices.Clone(c.L2.Interfaces)
			}
		}
		if err := g.Validate(); err != nil {
			errs = append(errs, err)
		} else {
			c.Gateways = &g
		}
	}
	if pol, err := (ipam.Config{Pools: c.Pools, LoadBalancerClass: c.LoadBalancerClass}).Compile(); err != nil {
		errs = append(errs, err)
	} else {
		c.ipamPolicy = pol
	}
	if pol, err := c.Config.Compile(c.clusterCIDRs); err != nil {
		errs = append(errs, err)
	} else {
		c.podRoutes = pol
		if pol.Mode == podroutes.BGP && c.BGP == nil {
			bad(podroutes.ModeKey, "%q needs a [bgp] section: the routes come from its peers", pol.Mode)
		}
	}
	c.validateMasquerade(bad)
	if c.Kubeconfig != "" && c.Manifests != "" {
		bad("manifests", "both a kubeconfig (%s) and a manifests directory (%s) are given; choose one source", c.Kubeconfig, c.Manifests)
	}
	return errors.Join(errs...)
}

// loopbackListen reports whether the listen address host:port is bound to
// loopback only.
func loopbackListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// flagError is a command line the flag package already reported, with usage.
type flagError struct{ error }

func (e flagError) Unwrap() error { return e.error }
