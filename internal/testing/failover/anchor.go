package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// The anchor is the classic answer in the active/backup topology (gw-a
// and gw-b): keepalived holds the Service address on the upstream segment
// and F on the cluster segment in one VRRP sync group (advert every
// 100 ms), and conntrackd replicates the conntrack table in FTFW mode
// over the dedicated sync link; keepalived's notify runs Debian's
// primary-backup.sh, which commits conntrackd's external cache into the
// kernel when a gateway becomes primary. Both gateways hold the same
// static nftables ruleset: DNAT of the Service to its two endpoints,
// chosen at random per new flow as kube-proxy's nftables mode does, and
// SNAT to F. Without conntrackd (the floor) keepalived alone moves the
// addresses and nothing else.
//
// Both gateways set nf_conntrack_tcp_loose = 0 and drop conntrack's
// invalid packets, as stateful firewalls do: a TCP segment that no entry
// knows is never taken for a new flow (which would pick an endpoint
// again), so only a replicated entry carries a connection over.

// PrimaryBackupScript is Debian's notify script for keepalived, which the
// anchor uses with its paths replaced.
const PrimaryBackupScript = "/usr/share/doc/conntrackd/examples/sync/primary-backup.sh"

// anchorRuleset is the static ruleset, for the cluster interface %s.
const anchorRuleset = `table ip anchor {
	chain drop_invalid {
		type filter hook prerouting priority mangle; policy accept;
		ct state invalid drop
	}
	chain service {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %s meta l4proto { tcp, udp } th dport %d dnat to numgen random mod 2 map { 0 : %s, 1 : %s } : %d
	}
	chain to_floating {
		type nat hook postrouting priority srcnat; policy accept;
		ct status dnat oifname %q snat to %s
	}
}
`

// Anchor is keepalived (and conntrackd) running in gw-a and gw-b.
type Anchor struct {
	topo *Topology
	dir  string
	sync bool
	mu   sync.Mutex
	out  []*bytes.Buffer
	cmds []*exec.Cmd
}

// StartAnchor starts the anchor in topo's first two gateways, with its
// files (configurations, pid files, conntrackd's lock and socket) under
// dir; withSync false leaves conntrackd out (the floor). It waits until
// gw-a holds both addresses. Close stops it.
func StartAnchor(topo *Topology, dir string, withSync bool) (*Anchor, error) {
	for _, bin := range []string{"keepalived", "conntrackd", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("failover: %s not installed (the Makefile's failover-deps installs conntrackd and keepalived): %w", bin, err)
		}
	}
	a := &Anchor{topo: topo, dir: dir, sync: withSync}
	if err := a.start(); err != nil {
		return nil, errors.Join(err, a.Close())
	}
	return a, nil
}

func (a *Anchor) gwDir(i int) string { return filepath.Join(a.dir, GatewayNames[i]) }

// conntrackdConf is gateway i's conntrackd configuration file.
func (a *Anchor) conntrackdConf(i int) string { return filepath.Join(a.gwDir(i), "conntrackd.conf") }

func (a *Anchor) start() error {
	for i := range 2 {
		h := a.topo.Gateways[i]
		if err := os.MkdirAll(a.gwDir(i), 0o700); err != nil {
			return err
		}
		if err := h.Sysctl("net.netfilter.nf_conntrack_tcp_loose", "0"); err != nil {
			return err
		}
		rules := filepath.Join(a.gwDir(i), "ruleset.nft")
		text := fmt.Sprintf(anchorRuleset, ServiceAddr, ServicePort, Endpoints[0], Endpoints[1], EndpointPort, a.topo.Cluster[i], Floating)
		if err := os.WriteFile(rules, []byte(text), 0o600); err != nil {
			return err
		}
		if out, err := h.Command(context.Background(), "nft", "-f", rules).CombinedOutput(); err != nil {
			return fmt.Errorf("failover: %s: nft -f %s: %v\n%s", h, rules, err, out)
		}
		notify := ""
		if a.sync {
			if err := a.startConntrackd(i); err != nil {
				return err
			}
			script, err := a.writeScript(i)
			if err != nil {
				return err
			}
			notify = fmt.Sprintf("  notify_master \"%s primary\"\n  notify_backup \"%s backup\"\n  notify_fault \"%s fault\"\n", script, script, script)
		}
		if err := a.startKeepalived(i, notify); err != nil {
			return err
		}
	}
	return lab.EventuallyWithin(20*time.Second, func() error {
		for i, want := range []bool{true, false} {
			for _, side := range []struct {
				iface string
				addr  netip.Addr
			}{{a.topo.Upstream[i], ServiceAddr}, {a.topo.Cluster[i], Floating}} {
				has, err := hasAddr(a.topo.Gateways[i], side.iface, side.addr)
				if err != nil {
					return err
				}
				if has != want {
					return fmt.Errorf("%s holds %v: %v, want %v", GatewayNames[i], side.addr, has, want)
				}
			}
		}
		return nil
	})
}

// hasAddr tells whether interface iface of h holds a.
func hasAddr(h *lab.Host, iface string, a netip.Addr) (bool, error) {
	l, err := h.Netlink().LinkByName(iface)
	if err != nil {
		return false, err
	}
	addrs, err := h.Netlink().AddrList(l, 0)
	if err != nil {
		return false, err
	}
	for _, x := range addrs {
		if y, ok := netip.AddrFromSlice(x.IP); ok && y.Unmap() == a {
			return true, nil
		}
	}
	return false, nil
}

func (a *Anchor) run(i int, name string, args ...string) error {
	var out bytes.Buffer
	cmd := a.topo.Gateways[i].Command(context.Background(), name, args...)
	cmd.Stdout, cmd.Stderr = &lockedBuffer{mu: &a.mu, b: &out}, &lockedBuffer{mu: &a.mu, b: &out}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failover: %s: %s: %w", GatewayNames[i], name, err)
	}
	a.mu.Lock()
	a.cmds = append(a.cmds, cmd)
	a.out = append(a.out, &out)
	a.mu.Unlock()
	go func() { _ = cmd.Wait() }()
	return nil
}

type lockedBuffer struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (a *Anchor) startConntrackd(i int) error {
	d := a.gwDir(i)
	var ignore strings.Builder
	for _, x := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), GatewayAddr(UpstreamNet, i), GatewayAddr(ClusterNet, i), SyncAddr(i)} {
		fmt.Fprintf(&ignore, "\t\t\tIPv4_address %s\n", x)
	}
	conf := fmt.Sprintf(`Sync {
	Mode FTFW {
		DisableExternalCache Off
	}
	UDP {
		IPv4_address %s
		IPv4_Destination_Address %s
		Port 3780
		Interface %s
		SndSocketBuffer 1249280
		RcvSocketBuffer 1249280
		Checksum on
	}
}
General {
	HashSize 32768
	HashLimit 131072
	LogFile %s
	Syslog off
	LockFile %s
	UNIX {
		Path %s
	}
	NetlinkBufferSize 2097152
	NetlinkBufferSizeMaxGrowth 8388608
	Filter From Userspace {
		Protocol Accept {
			TCP
			UDP
		}
		Address Ignore {
%s		}
	}
}
`, SyncAddr(i), SyncAddr(1-i), a.topo.Sync[i], filepath.Join(d, "conntrackd.log"), filepath.Join(d, "conntrackd.lock"),
		filepath.Join(d, "conntrackd.ctl"), ignore.String())
	if err := os.WriteFile(a.conntrackdConf(i), []byte(conf), 0o600); err != nil {
		return err
	}
	if err := a.run(i, "conntrackd", "-C", a.conntrackdConf(i)); err != nil {
		return err
	}
	return lab.EventuallyWithin(10*time.Second, func() error {
		_, err := a.Conntrackd(i, "-s")
		return err
	})
}

// Conntrackd runs conntrackd's client against gateway i's daemon.
func (a *Anchor) Conntrackd(i int, args ...string) (string, error) {
	out, err := a.topo.Gateways[i].Command(context.Background(), "conntrackd", append([]string{"-C", a.conntrackdConf(i)}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("failover: %s: conntrackd %s: %v: %s", GatewayNames[i], strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

var scriptVar = regexp.MustCompile(`(?m)^(CONNTRACKD_LOCK|CONNTRACKD_CONFIG)=.*$`)

// writeScript writes Debian's primary-backup.sh for gateway i, with its
// conntrackd configuration and lock file.
func (a *Anchor) writeScript(i int) (string, error) {
	src, err := os.ReadFile(PrimaryBackupScript)
	if err != nil {
		return "", fmt.Errorf("failover: keepalived's notify script: %w (Debian's conntrackd package ships it)", err)
	}
	if n := len(scriptVar.FindAll(src, -1)); n != 2 {
		return "", fmt.Errorf("failover: %s: %d of CONNTRACKD_LOCK= and CONNTRACKD_CONFIG= found, want both", PrimaryBackupScript, n)
	}
	text := scriptVar.ReplaceAllFunc(src, func(m []byte) []byte {
		if bytes.HasPrefix(m, []byte("CONNTRACKD_LOCK=")) {
			return []byte("CONNTRACKD_LOCK=" + filepath.Join(a.gwDir(i), "conntrackd.lock"))
		}
		return []byte("CONNTRACKD_CONFIG=" + a.conntrackdConf(i))
	})
	path := filepath.Join(a.gwDir(i), "primary-backup.sh")
	return path, os.WriteFile(path, text, 0o700)
}

// startKeepalived runs keepalived's VRRP process in gateway i: gw-a with
// the higher priority, so it is master while alive.
func (a *Anchor) startKeepalived(i int, notify string) error {
	d := a.gwDir(i)
	prio := []int{150, 100}[i]
	conf := fmt.Sprintf(`global_defs {
  router_id %s
  script_user root
  vrrp_version 3
}
vrrp_sync_group service {
  group {
    upstream
    cluster
  }
%s}
vrrp_instance upstream {
  interface %s
  state BACKUP
  virtual_router_id 51
  priority %d
  advert_int 0.1
  virtual_ipaddress {
    %s/%d dev %s
  }
}
vrrp_instance cluster {
  interface %s
  state BACKUP
  virtual_router_id 52
  priority %d
  advert_int 0.1
  virtual_ipaddress {
    %s/%d dev %s
  }
}
`, GatewayNames[i], notify, a.topo.Upstream[i], prio, ServiceAddr, UpstreamNet.Bits(), a.topo.Upstream[i],
		a.topo.Cluster[i], prio, Floating, ClusterNet.Bits(), a.topo.Cluster[i])
	path := filepath.Join(d, "keepalived.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return err
	}
	return a.run(i, "keepalived", "--dont-fork", "--log-console", "--log-detail", "--vrrp", "-f", path,
		"-p", filepath.Join(d, "keepalived.pid"), "-r", filepath.Join(d, "vrrp.pid"), "-c", filepath.Join(d, "checkers.pid"))
}

// Synced waits until gw-b's conntrackd holds at least n flows to the
// Service address in its external cache.
func (a *Anchor) Synced(n int, timeout time.Duration) error {
	if !a.sync {
		return nil
	}
	return lab.EventuallyWithin(timeout, func() error {
		out, err := a.Conntrackd(1, "-e")
		if err != nil {
			return err
		}
		got := strings.Count(out, "dst="+ServiceAddr.String()+" ")
		if got < n {
			return fmt.Errorf("gw-b's external cache holds %d flows to %v, want %d", got, ServiceAddr, n)
		}
		return nil
	})
}

// Logs is what keepalived and conntrackd wrote (conntrackd's log files
// included).
func (a *Anchor) Logs() string {
	a.mu.Lock()
	var b strings.Builder
	for _, o := range a.out {
		b.Write(o.Bytes())
	}
	a.mu.Unlock()
	for i := range 2 {
		if log, err := os.ReadFile(filepath.Join(a.gwDir(i), "conntrackd.log")); err == nil {
			fmt.Fprintf(&b, "--- %s conntrackd.log\n%s", GatewayNames[i], log)
		}
	}
	return b.String()
}

// Close kills every process of the anchor in the gateways that still run
// (keepalived forks a VRRP child, the notify script runs conntrackd) and
// removes its pid, lock and socket files.
func (a *Anchor) Close() error {
	var errs []error
	for i := range 2 {
		errs = append(errs, KillNamespace(a.topo.Gateways[i]))
	}
	return errors.Join(append(errs, os.RemoveAll(a.dir))...)
}
