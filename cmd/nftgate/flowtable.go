package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/nftgate/nftgate/ruleset"
)

// maxFlowtableDevices is the kernel's limit on a flowtable's devices
// (NFT_NETDEVICE_MAX).
const maxFlowtableDevices = 256

// defaultFlowtablePackets: a connection is offloaded once it has passed
// more than 20 packets, both directions, as kube-proxy's proposal (KEP-4963)
// chose: a connection that opens, exchanges a request and a response and
// closes passes 10 to 18, so making and deleting a flow for it buys
// nothing, and a UDP request and its answer would leave a flow in the
// flowtable until its timeout (README "Established flows").
// maxFlowtablePackets bounds it.
const (
	defaultFlowtablePackets = 20
	maxFlowtablePackets     = 1 << 32
)

// flowtableFlags registers the flowtable's flags.
func flowtableFlags(fs *flag.FlagSet, cfg *Config) {
	fs.BoolVar(&cfg.Flowtable, "flowtable", cfg.Flowtable, "forward established Service connections through an nftables flowtable (see config.toml)")
	fs.Var(&listFlag{dst: &cfg.FlowtableDevices}, "flowtable-device", "network `interface` the flowtable hooks: where Service traffic comes in and goes out (repeatable)")
	fs.Int64Var(&cfg.FlowtablePackets, "flowtable-packets", cfg.FlowtablePackets, "a Service connection is offloaded once it has passed more than this many `packets`, both directions; 0: as soon as it is established (see config.toml)")
}

// validateFlowtable checks flowtable_packets, and flowtable_devices when
// the flowtable is on.
func (c *Config) validateFlowtable(bad func(key, format string, args ...any)) {
	if c.FlowtablePackets < 0 || c.FlowtablePackets > maxFlowtablePackets {
		bad("flowtable_packets", "%d is not between 0 (offload once established) and %d", c.FlowtablePackets, int64(maxFlowtablePackets))
	}
	if !c.Flowtable {
		return
	}
	if len(c.FlowtableDevices) == 0 {
		bad("flowtable_devices", "empty, and flowtable = true needs the interfaces Service traffic comes in and goes out on")
	}
	if len(c.FlowtableDevices) > maxFlowtableDevices {
		bad("flowtable_devices", "%d interfaces; at most %d", len(c.FlowtableDevices), maxFlowtableDevices)
	}
	seen := map[string]bool{}
	for i, d := range c.FlowtableDevices {
		key := fmt.Sprintf("flowtable_devices[%d]", i)
		if err := ruleset.CheckDevice(d); err != nil {
			bad(key, "%v", err)
		} else if seen[d] {
			bad(key, "%q is listed twice", d)
		}
		seen[d] = true
	}
}

// flowtableDevices are the flowtable's devices for the ruleset: none
// when it is off.
func (c *Config) flowtableDevices() []string {
	if !c.Flowtable {
		return nil
	}
	return c.FlowtableDevices
}

// flowtablePackets is the flowtable's packet count for the ruleset: none
// when it is off.
func (c *Config) flowtablePackets() uint64 {
	if !c.Flowtable || c.FlowtablePackets < 0 {
		return 0
	}
	return uint64(c.FlowtablePackets)
}

// conntrackAcctSysctl turns conntrack's accounting (per-connection packet
// and byte counters) on or off in the namespace.
const conntrackAcctSysctl = "/proc/sys/net/netfilter/nf_conntrack_acct"

// setupConntrackAcct turns conntrack's accounting on when the flowtable is:
// the flowtable adds what it forwards to those counters (its counter flag),
// which exist only for connections made while accounting is on, and the
// status page's flows read their bytes there. The packet count's rule
// turns it on anyway; this covers flowtable_packets = 0. It runs after
// the kernel check, which loads conntrack.
func setupConntrackAcct(cfg *Config, log *slog.Logger, sysctl string) error {
	if !cfg.Flowtable {
		return nil
	}
	_, changed, err := setSysctl(sysctl, "1")
	if err != nil {
		return fmt.Errorf("flowtable: turn conntrack's accounting on: %w", err)
	}
	if changed {
		log.Info("conntrack's accounting turned on for the flowtable's counts", "sysctl", sysctl)
	}
	return nil
}

// checkFlowtableDevices tells whether every device of the flowtable
// exists: the kernel would refuse the whole first sync otherwise.
func (c *Config) checkFlowtableDevices() error {
	for i, d := range c.flowtableDevices() {
		if _, err := net.InterfaceByName(d); err != nil {
			return fmt.Errorf("flowtable_devices[%d]: %q: %w", i, d, err)
		}
	}
	return nil
}
