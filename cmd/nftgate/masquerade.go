package main

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"go4.org/netipx"

	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/ruleset"
)

// maxMasqueradeAddresses bounds each family's masquerade pool: a new
// connection passes one rule per address.
const maxMasqueradeAddresses = 64

// validateMasquerade parses masquerade_addresses into c.masqueradeAddrs,
// after cluster_cidrs, external_ip_cidrs, the pools and [gateways] are
// parsed; in active-active mode also each [[gateways.peers]]'s
// masquerade_addresses, which none of this gateway's may repeat, into
// c.peerMasquerade and the set's homes.
func (c *Config) validateMasquerade(bad func(key, format string, args ...any)) {
	c.masqueradeAddrs = c.parseMasquerade("masquerade_addresses", c.MasqueradeAddresses, nil, bad)
	if c.Gateways == nil || c.Gateways.Mode != gateways.ModeActiveActive {
		return
	}
	c.Gateways.Homes = map[string][]netip.Addr{c.Gateways.Name: c.masqueradeAddrs}
	seen := slices.Clone(c.masqueradeAddrs)
	for i, p := range c.Gateways.Peers {
		key := fmt.Sprintf("%s.peers[%d].masquerade_addresses", gateways.Key, i)
		as := c.parseMasquerade(key, p.MasqueradeAddresses, seen, bad)
		seen = append(seen, as...)
		c.peerMasquerade = append(c.peerMasquerade, as...)
		c.Gateways.Homes[p.Name] = as
	}
}

// peerPools are each peer's home masquerade addresses, one pool per peer,
// in active-active mode (ruleset.Config.PeerMasquerade: a connection
// picked up in mid-stream, at once or given up after the wait for its
// replica, may keep a dead peer's address).
func (c *Config) peerPools() [][]netip.Addr {
	if c.Gateways == nil || c.Gateways.Mode != gateways.ModeActiveActive {
		return nil
	}
	var out [][]netip.Addr
	for _, p := range c.Gateways.Peers {
		if as := c.Gateways.Homes[p.Name]; len(as) > 0 {
			out = append(out, as)
		}
	}
	return out
}

// floatingMasquerade are the masquerade addresses this gateway announces
// while it holds them: its own, and in active-active mode its peers',
// which it takes over when they die.
func (c *Config) floatingMasquerade() []netip.Addr {
	return append(slices.Clone(c.masqueradeAddrs), c.peerMasquerade...)
}

// parseMasquerade parses one list of masquerade addresses (configuration
// key key), none of which may repeat one of taken. Each entry is an
// address or a CIDR; an IPv4 CIDR of /30 or wider leaves out its first and
// last address (network and broadcast).
func (c *Config) parseMasquerade(key string, vals []string, taken []netip.Addr, bad func(key, format string, args ...any)) []netip.Addr {
	var out []netip.Addr
	count := map[ruleset.Family]int{}
	for i, v := range vals {
		key := fmt.Sprintf("%s[%d]", key, i)
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil || a.Zone() != "" {
				bad(key, "%q is not an address or a CIDR", v)
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			bad(key, "%q is an IPv4-mapped IPv6 address; write the IPv4 address", v)
			continue
		}
		p = p.Masked()
		a := p.Addr()
		if a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() || a.IsUnspecified() {
			bad(key, "%q is a loopback, multicast, link-local or unspecified address, which no endpoint can answer", v)
			continue
		}
		f := ruleset.Of(a)
		size := uint64(1) << min(63, p.Addr().BitLen()-p.Bits())
		if count[f]+int(min(size, maxMasqueradeAddresses+1)) > maxMasqueradeAddresses {
			bad(key, "%q makes more than %d %s masquerade addresses", v, maxMasqueradeAddresses, f)
			continue
		}
		for _, cc := range c.clusterCIDRs {
			if cc.Overlaps(p) {
				bad(key, "%q overlaps cluster_cidrs entry %s: pods use those addresses", v, cc)
			}
		}
		for _, e := range c.externalIPCIDRs {
			if e.Overlaps(p) {
				bad(key, "%q overlaps external_ip_cidrs entry %s: Services are served there", v, e)
			}
		}
		for _, r := range append(slices.Clone(taken), out...) {
			if p.Contains(r) {
				bad(key, "%q repeats masquerade address %s", v, r)
				break
			}
		}
		first, last := p.Addr(), netipx.PrefixLastIP(p)
		for a := first; a.IsValid() && a.Compare(last) <= 0; a = a.Next() {
			if a.Is4() && p.Bits() < 31 && (a == first || a == last) {
				continue
			}
			if c.ipamPolicy != nil {
				if pool := c.ipamPolicy.PoolOf(a); pool != nil {
					bad(key, "%q overlaps pool %q (%s is a Service address there)", v, pool.Name, a)
					break
				}
			}
			out = append(out, a)
			count[f]++
		}
	}
	return out
}

// onlineCPUsFile lists the CPU numbers the kernel runs on now.
const onlineCPUsFile = "/sys/devices/system/cpu/online"

// masqueradePortGroups is the ruleset's number of CPU groups for
// masquerade ports: with masquerade_ports_by_cpu, from the CPUs online at
// start (the box's, not only those this process may run on: every CPU
// handles packets); else 1, none. A CPU is in the group of the low bits of
// its number, so one brought online later shares a group.
func (c *Config) masqueradePortGroups() int {
	if !c.MasqueradePortsByCPU {
		return 1
	}
	return ruleset.MasqueradePortGroupsFor(cpuCount(onlineCPUsFile))
}

// cpuCount counts the CPUs of a CPU list file ("0-63", "0,2-3") as one
// more than the highest number. An unreadable or malformed file counts the
// CPUs this process may run on.
func cpuCount(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return runtime.NumCPU()
	}
	highest := -1
	for part := range strings.SplitSeq(strings.TrimSpace(string(b)), ",") {
		first, last, isRange := strings.Cut(part, "-")
		if !isRange {
			last = first
		}
		lo, err1 := strconv.Atoi(first)
		hi, err2 := strconv.Atoi(last)
		if err1 != nil || err2 != nil || lo < 0 || hi < lo {
			return runtime.NumCPU()
		}
		highest = max(highest, hi)
	}
	if highest < 0 {
		return runtime.NumCPU()
	}
	return highest + 1
}
