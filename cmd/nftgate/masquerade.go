package main

import (
	"fmt"
	"net/netip"

	"go4.org/netipx"

	"github.com/nftgate/nftgate/ruleset"
)

// maxMasqueradeAddresses bounds each family's masquerade pool: a new
// connection passes one rule per address.
const maxMasqueradeAddresses = 64

// validateMasquerade parses masquerade_addresses into c.masqueradeAddrs,
// after cluster_cidrs, external_ip_cidrs and the pools are parsed. Each
// entry is an address or a CIDR; an IPv4 CIDR of /30 or wider leaves out
// its first and last address (network and broadcast).
func (c *Config) validateMasquerade(bad func(key, format string, args ...any)) {
	count := map[ruleset.Family]int{}
	for i, v := range c.MasqueradeAddresses {
		key := fmt.Sprintf("masquerade_addresses[%d]", i)
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
		for _, r := range c.masqueradeAddrs {
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
			c.masqueradeAddrs = append(c.masqueradeAddrs, a)
			count[f]++
		}
	}
}
