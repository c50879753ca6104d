package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
)

// nftgate in the same topologies: every gateway serves one LoadBalancer
// Service (its externalIP the Service address, its two endpoints on the
// cluster segment) from manifests, runs the gateway set ([gateways], a
// shared key, the channel over every link) with state sync on (the
// default with [gateways]), and answers ARP ([l2]) on both segments.
//
// Active/backup (two gateways, mode "active-backup", the default): the
// Service address on the upstream segment and F on the cluster segment,
// F the masquerade address of both. ECMP (three gateways, mode
// "active-active"): each announces the Service address to the router
// (BIRD) by BGP with BFD, masquerades to its own address, and lists its
// peers' so that a survivor takes them over.

// BGP numbers of the ECMP variant.
const (
	RouterASN  = 64512
	GatewayASN = 64513
	// BFDInterval is the router's and the gateways' BFD interval.
	BFDInterval = 100 * time.Millisecond
)

// NftgateOptions tune the nftgate configurations.
type NftgateOptions struct {
	// ECMP: three gateways behind BIRD, active/active.
	ECMP bool
	// DeadAfter is [gateways] dead_after; 0 leaves nftgate's default.
	DeadAfter int
	// NoStateSync sets [gateways] state_sync = false.
	NoStateSync bool
	// SyncQueue is [gateways] sync_queue; 0 leaves nftgate's default.
	SyncQueue int
	// ReadyTimeout is [gateways] ready_timeout; 0 leaves nftgate's
	// default.
	ReadyTimeout time.Duration
	// SyncBatchInterval is [gateways] sync_batch_interval; 0 leaves
	// nftgate's default.
	SyncBatchInterval time.Duration
	// MidstreamTCP is [gateways] midstream_tcp; empty leaves nftgate's
	// default.
	MidstreamTCP string
	// MidstreamTCPWait is [gateways] midstream_tcp_wait; 0 leaves
	// nftgate's default.
	MidstreamTCPWait time.Duration
	// MidstreamTCPWaitPeerDead is [gateways]
	// midstream_tcp_wait_peer_dead; 0 leaves nftgate's default.
	MidstreamTCPWaitPeerDead time.Duration
	// PortsByCPUOff sets masquerade_ports_by_cpu = false: the masquerade
	// keeps a client's port wherever it is free.
	PortsByCPUOff bool
	// ConntrackEvents is [gateways] conntrack_events; empty leaves
	// nftgate's default.
	ConntrackEvents string
	// NoTrack sets track_interfaces = []: no link is tracked (by
	// default the [l2] interfaces are).
	NoTrack bool
	// TrackUpAfter is [gateways] track_up_after; 0 leaves nftgate's
	// default.
	TrackUpAfter time.Duration
	// BFDMultiplier is the BFD sessions' detection multiplier on the
	// gateways (bfd_multiplier) and, given to StartRouter, the router;
	// 0 leaves the default, 3.
	BFDMultiplier int
}

// NftgateConfig is the configuration and manifests of every gateway,
// written by WriteNftgate.
type NftgateConfig struct {
	// Args[i] are gateway i's flags (--config, --manifests, --listen,
	// --node-name).
	Args [][]string
	// Configs[i] is gateway i's configuration file.
	Configs []string
	// Dst is where the client sends.
	Dst netip.AddrPort
}

// NftgateListen is where each gateway's HTTP server listens, in its own
// namespace.
const NftgateListen = gatewaytest.Listen

// WriteNftgate writes each gateway's configuration and manifests and the
// shared key under dir.
func WriteNftgate(topo *Topology, dir string, o NftgateOptions) (*NftgateConfig, error) {
	key := filepath.Join(dir, "gateways.key")
	if err := os.WriteFile(key, []byte("the failover harness's gateway set key, 32+ bytes\n"), 0o600); err != nil {
		return nil, err
	}
	svcAddr := ServiceAddr
	if o.ECMP {
		svcAddr = ECMPServiceAddr
	}
	svc := gatewaytest.Service("default", "web", "LoadBalancer", []string{"198.19.0.10"},
		gatewaytest.Port{Name: "tcp", Port: ServicePort}, gatewaytest.Port{Name: "udp", Protocol: "UDP", Port: ServicePort})
	svc.Spec.ExternalIPs = []string{svcAddr.String()}
	var eps []gatewaytest.Endpoint
	for _, e := range Endpoints {
		eps = append(eps, gatewaytest.Endpoint{Addr: e.String()})
	}
	var manifest bytes.Buffer
	for _, obj := range []any{svc, gatewaytest.Slice("default", "web-tcp", "web", "tcp", "TCP", EndpointPort, eps...),
		gatewaytest.Slice("default", "web-udp", "web", "udp", "UDP", EndpointPort, eps...)} {
		y, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		manifest.WriteString("---\n")
		manifest.Write(y)
	}
	q := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	masq := func(i int) netip.Addr {
		if o.ECMP {
			return MasqueradeAddr(i)
		}
		return Floating
	}
	c := &NftgateConfig{Dst: netip.AddrPortFrom(svcAddr, ServicePort)}
	for i := range topo.Gateways {
		name := GatewayNames[i]
		mdir := filepath.Join(dir, name+"-manifests")
		if err := os.MkdirAll(mdir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(mdir, "web.yaml"), manifest.Bytes(), 0o644); err != nil {
			return nil, err
		}
		l2 := []string{topo.Cluster[i]}
		if !o.ECMP {
			l2 = append([]string{topo.Upstream[i]}, l2...)
		}
		text := fmt.Sprintf("external_ip_cidrs = [%q]\nhash_seed = 4242\nmasquerade_addresses = [%q]\n",
			netip.PrefixFrom(svcAddr, 32).String(), masq(i))
		if o.PortsByCPUOff {
			text += "masquerade_ports_by_cpu = false\n"
		}
		text += fmt.Sprintf("\n[l2]\ninterfaces = %s\ngratuitous_interval = \"100ms\"\n", q(l2))
		if o.ECMP {
			text += fmt.Sprintf("\n[bgp]\nasn = %d\nrouter_id = %q\nlisten_port = -1\nrestart_deferral = \"1s\"\n"+
				"\n[[bgp.peer]]\naddress = %q\nasn = %d\nhold_time = \"9s\"\nconnect_retry = \"1s\"\nbfd = true\nbfd_interval = %q\n",
				GatewayASN, GatewayAddr(UpstreamNet, i), RouterAddr, RouterASN, BFDInterval.String())
			if o.BFDMultiplier != 0 {
				text += fmt.Sprintf("bfd_multiplier = %d\n", o.BFDMultiplier)
			}
		}
		mode := "active-backup"
		if o.ECMP {
			mode = "active-active"
		}
		text += fmt.Sprintf("\n[gateways]\nname = %q\nkey_file = %q\nlisten = \":7480\"\nmode = %q\n",
			name, key, mode)
		if o.DeadAfter > 0 {
			text += fmt.Sprintf("dead_after = %d\n", o.DeadAfter)
		}
		if o.NoStateSync {
			text += "state_sync = false\n"
		}
		if o.SyncQueue > 0 {
			text += fmt.Sprintf("sync_queue = %d\n", o.SyncQueue)
		}
		if o.ReadyTimeout > 0 {
			text += fmt.Sprintf("ready_timeout = %q\n", o.ReadyTimeout.String())
		}
		if o.SyncBatchInterval > 0 {
			text += fmt.Sprintf("sync_batch_interval = %q\n", o.SyncBatchInterval.String())
		}
		if o.MidstreamTCP != "" {
			text += fmt.Sprintf("midstream_tcp = %q\n", o.MidstreamTCP)
		}
		if o.MidstreamTCPWait > 0 {
			text += fmt.Sprintf("midstream_tcp_wait = %q\n", o.MidstreamTCPWait.String())
		}
		if o.MidstreamTCPWaitPeerDead > 0 {
			text += fmt.Sprintf("midstream_tcp_wait_peer_dead = %q\n", o.MidstreamTCPWaitPeerDead.String())
		}
		if o.ConntrackEvents != "" {
			text += fmt.Sprintf("conntrack_events = %q\n", o.ConntrackEvents)
		}
		if o.NoTrack {
			text += "track_interfaces = []\n"
		}
		if o.TrackUpAfter > 0 {
			text += fmt.Sprintf("track_up_after = %q\n", o.TrackUpAfter.String())
		}
		for j := range topo.Gateways {
			if j == i {
				continue
			}
			addrs := []string{}
			if i < 2 && j < 2 {
				addrs = append(addrs, netip.AddrPortFrom(SyncAddr(j), 7480).String())
			}
			addrs = append(addrs, netip.AddrPortFrom(GatewayAddr(UpstreamNet, j), 7480).String(),
				netip.AddrPortFrom(GatewayAddr(ClusterNet, j), 7480).String())
			text += fmt.Sprintf("\n[[gateways.peers]]\nname = %q\naddresses = %s\n", GatewayNames[j], q(addrs))
			if o.ECMP {
				text += fmt.Sprintf("masquerade_addresses = [%q]\n", MasqueradeAddr(j))
			}
		}
		cfg := filepath.Join(dir, name+".toml")
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			return nil, err
		}
		c.Configs = append(c.Configs, cfg)
		c.Args = append(c.Args, []string{"--config", cfg, "--manifests", mdir, "--listen", gatewaytest.Listen, "--node-name", name})
	}
	return c, nil
}

// NftgateSupports tells whether the nftgate binary bin accepts cfg (a
// configuration WriteNftgate wrote): a binary without state sync refuses
// the [gateways] keys it does not know, and the error says which.
func NftgateSupports(bin, cfg string) error {
	out, _ := exec.Command(bin, "--config", cfg, "--help").CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	if _, why, found := strings.Cut(first, "config "+cfg+": "); found {
		return fmt.Errorf("this nftgate lacks the gateway set's state sync and floating masquerade addresses (%s)", why)
	}
	return nil
}

// StartRouter starts BIRD in the ECMP variant's router, with a BGP session
// and BFD to each gateway (bfdMultiplier as NftgateOptions.BFDMultiplier),
// its files in dir.
func StartRouter(topo *Topology, dir string, bfdMultiplier int) (*bird.Router, error) {
	var gws []netip.Addr
	for i := range topo.Gateways {
		gws = append(gws, GatewayAddr(UpstreamNet, i))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return bird.Launch(topo.Router, bird.Several(RouterAddr, RouterASN, gws, GatewayASN, BFDInterval, bfdMultiplier), dir)
}

// ECMPRoutes waits until the router has want routes to the ECMP variant's
// Service address: one per gateway that announces it.
func ECMPRoutes(router *bird.Router, want int, timeout time.Duration) error {
	return lab.EventuallyWithin(timeout, func() error {
		routes, err := router.Routes(netip.PrefixFrom(ECMPServiceAddr, 32))
		if err != nil {
			return err
		}
		if len(routes) != want {
			return fmt.Errorf("BIRD has %d routes to %v, want %d", len(routes), ECMPServiceAddr, want)
		}
		return nil
	})
}

// Replicated waits until every gateway in hosts holds at least n conntrack
// entries to dst: the flows reached them before the failure.
func Replicated(hosts []*lab.Host, dst netip.Addr, n int, timeout time.Duration) error {
	return lab.EventuallyWithin(timeout, func() error {
		for _, h := range hosts {
			out, err := h.Command(context.Background(), "conntrack", "-L", "-d", dst.String()).Output()
			if err != nil {
				return fmt.Errorf("%s: conntrack -L: %w", h, err)
			}
			if got := strings.Count(string(out), "\n"); got < n {
				return fmt.Errorf("%s holds %d entries to %v, want %d", h, got, dst, n)
			}
		}
		return nil
	})
}

// Nftgate is one nftgate process in a gateway of the topology.
type Nftgate struct {
	Host *lab.Host
	cmd  *exec.Cmd
	done chan struct{}
	logs lockedBuffer
	buf  bytes.Buffer
	err  error // the process's exit, once done is closed
}

// StartNftgate runs bin with args in h. It is killed with the lab, or by
// KillNamespace (Topology.Fail).
func StartNftgate(h *lab.Host, bin string, args []string) (*Nftgate, error) {
	n := &Nftgate{Host: h, done: make(chan struct{})}
	n.logs = lockedBuffer{mu: &sync.Mutex{}, b: &n.buf}
	n.cmd = h.Command(context.Background(), bin, args...)
	n.cmd.Stdout, n.cmd.Stderr = &n.logs, &n.logs
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("failover: %s: start nftgate: %w", h, err)
	}
	go func() { n.err = n.cmd.Wait(); close(n.done) }()
	return n, nil
}

// WaitReady waits until /readyz answers 200.
func (n *Nftgate) WaitReady(timeout time.Duration) error {
	err := gatewaytest.WaitReady(n.Host, n.done, timeout)
	select {
	case <-n.done:
		return fmt.Errorf("%w:\n%s", err, n.Logs())
	default:
		return err
	}
}

// Exited waits until the process has exited and returns its exit error
// (nil: status 0); an error also when it still runs after timeout.
func (n *Nftgate) Exited(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-n.done:
		if n.err != nil {
			return fmt.Errorf("nftgate in %s: %w", n.Host, n.err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("nftgate in %s still runs after %s", n.Host, timeout)
	}
}

// Drain runs `nftgate drain` (bin, the gateway's configuration cfg) in
// the gateway against its HTTP server, without following the drain.
func (n *Nftgate) Drain(bin, cfg string) error {
	out, err := n.Host.Command(context.Background(), bin, "drain", "--config", cfg, "--url", "http://"+gatewaytest.Listen, "--wait=false").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: nftgate drain: %w: %s", n.Host, err, out)
	}
	return nil
}

// PID is the nftgate process's id.
func (n *Nftgate) PID() int { return n.cmd.Process.Pid }

// Ended tells whether the process has ended.
func (n *Nftgate) Ended() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// Get fetches path from the gateway's HTTP server.
func (n *Nftgate) Get(path string) (int, string, error) { return gatewaytest.Get(n.Host, path) }

// Holds is what the gateway's /api/v1/gateways says it holds.
func (n *Nftgate) Holds() ([]netip.Addr, error) {
	_, body, err := n.Get("/api/v1/gateways")
	if err != nil {
		return nil, err
	}
	var st gateways.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return nil, fmt.Errorf("%s: /api/v1/gateways: %w", n.Host, err)
	}
	return st.Holds, nil
}

// Logs is everything the process wrote.
func (n *Nftgate) Logs() string {
	n.logs.mu.Lock()
	defer n.logs.mu.Unlock()
	return n.buf.String()
}
