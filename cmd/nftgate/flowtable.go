package main

import (
	"flag"
	"fmt"
	"net"

	"github.com/nftgate/nftgate/ruleset"
)

// maxFlowtableDevices is the kernel's limit on a flowtable's devices
// (NFT_NETDEVICE_MAX).
const maxFlowtableDevices = 256

// flowtableFlags registers the flowtable's flags.
func flowtableFlags(fs *flag.FlagSet, cfg *Config) {
	fs.BoolVar(&cfg.Flowtable, "flowtable", cfg.Flowtable, "forward established Service connections through an nftables flowtable (see config.toml)")
	fs.Var(&listFlag{dst: &cfg.FlowtableDevices}, "flowtable-device", "network `interface` the flowtable hooks: where Service traffic comes in and goes out (repeatable)")
}

// validateFlowtable checks flowtable_devices when the flowtable is on.
func (c *Config) validateFlowtable(bad func(key, format string, args ...any)) {
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
