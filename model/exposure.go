package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Exposure decides which addresses outside the cluster's own ranges the
// gateway serves for Services: it is the one place that answers "does this
// gateway serve this address", for the ruleset and for whatever announces
// the addresses. It is pure: what the gateway holds is given in Host.
//
// Any Service author may list any address as an externalIP, and on an edge
// gateway that is any address routed through the box: externalIPs are
// served only inside ExternalIPCIDRs, none when it is empty. LoadBalancer
// ingress IPs are written by a load-balancer controller, not by Service
// authors, and are not limited by it. Neither is ever served when it is an
// address of the gateway itself (its own traffic would be taken over), a
// loopback, link-local, multicast, unspecified or broadcast address.
type Exposure struct {
	// ExternalIPCIDRs are where externalIPs may lie.
	ExternalIPCIDRs []netip.Prefix
	// Host are the gateway's interface addresses, with the prefixes of
	// their subnets (whose broadcast addresses are refused too).
	Host []netip.Prefix
}

// ExternalIPCIDRsKey is the configuration key of Exposure.ExternalIPCIDRs,
// named in the warnings.
const ExternalIPCIDRsKey = "external_ip_cidrs"

// ServesExternalIP tells whether a is served as an externalIP, and if not,
// why.
func (e *Exposure) ServesExternalIP(a netip.Addr) (bool, string) {
	a = a.Unmap()
	if why := e.never(a); why != "" {
		return false, why
	}
	for _, p := range e.ExternalIPCIDRs {
		if p.Contains(a) {
			return true, ""
		}
	}
	if len(e.ExternalIPCIDRs) == 0 {
		return false, "no externalIP is served unless " + ExternalIPCIDRsKey + " allows it (none configured)"
	}
	return false, fmt.Sprintf("outside %s (%s)", ExternalIPCIDRsKey, prefixList(e.ExternalIPCIDRs))
}

// ServesLoadBalancerIP tells whether a is served as a LoadBalancer ingress
// IP, and if not, why.
func (e *Exposure) ServesLoadBalancerIP(a netip.Addr) (bool, string) {
	if why := e.never(a); why != "" {
		return false, why
	}
	return true, ""
}

// never tells why a is never served, or "" when it may be.
func (e *Exposure) never(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	for _, p := range e.Host {
		if p.Addr() == a {
			return "an address of the gateway itself"
		}
	}
	for _, p := range e.Host {
		if b, ok := broadcast(p); ok && b == a {
			return "the broadcast address of the gateway's subnet " + p.Masked().String()
		}
	}
	return ""
}

// broadcast is the broadcast address of an IPv4 subnet that has one.
func broadcast(p netip.Prefix) (netip.Addr, bool) {
	if !p.Addr().Is4() || p.Bits() > 30 {
		return netip.Addr{}, false
	}
	b := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(b), true
}

// Apply returns the Service with only the externalIPs and LoadBalancer IPs
// the gateway serves, and one warning for each address it left out, saying
// why. The Service itself is never modified: when nothing is left out it
// is returned as it is, else a copy.
func (e *Exposure) Apply(s *Service) (*Service, []string) {
	if s == nil || len(s.ExternalIPs())+len(s.LoadBalancerIPs()) == 0 {
		return s, nil
	}
	var warnings []string
	keep := func(kind string, addrs []netip.Addr, serves func(netip.Addr) (bool, string)) []netip.Addr {
		var out []netip.Addr
		for i, a := range addrs {
			ok, why := serves(a)
			if ok {
				if out != nil {
					out = append(out, a)
				}
				continue
			}
			if out == nil {
				out = append(make([]netip.Addr, 0, len(addrs)), addrs[:i]...)
			}
			warnings = append(warnings, fmt.Sprintf("%s %s is not served: %s", kind, a, why))
		}
		if out == nil {
			return addrs
		}
		return out
	}
	ext := keep("externalIP", s.ExternalIPs(), e.ServesExternalIP)
	lb := keep("loadBalancer IP", s.LoadBalancerIPs(), e.ServesLoadBalancerIP)
	if len(warnings) == 0 {
		return s, nil
	}
	c := *s
	r := c.EditRare()
	r.ExternalIPs, r.LoadBalancerIPs = nilIfEmpty(ext), nilIfEmpty(lb)
	c.TidyRare()
	return &c, warnings
}

func nilIfEmpty(a []netip.Addr) []netip.Addr {
	if len(a) == 0 {
		return nil
	}
	return a
}

// Equal tells whether two exposures decide the same.
func (e *Exposure) Equal(o *Exposure) bool {
	return slices.Equal(e.ExternalIPCIDRs, o.ExternalIPCIDRs) && slices.Equal(e.Host, o.Host)
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
