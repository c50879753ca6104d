// Package network describes and applies the interface settings of the
// nftgate appliance: which interface gokrazy's DHCP client runs on, static
// addresses and routes on the others, and the sysctls a gateway needs.
//
// gokrazy has no setting for sysctls and its DHCP client handles exactly one
// interface, so the image runs a small program (image/cmd/netconfig) that
// applies this configuration once at boot.
package network

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strings"
)

// Config is the content of the appliance's network.json.
type Config struct {
	// Interfaces lists the interfaces to configure. Interfaces not listed
	// are left alone.
	Interfaces []Interface `json:"interfaces"`
	// Sysctls are extra sysctls to set at boot, keyed by dotted name
	// (net.ipv4.conf.all.rp_filter). They override DefaultSysctls.
	Sysctls map[string]string `json:"sysctls,omitempty"`
}

// Interface is the configuration of one network interface.
type Interface struct {
	Name string `json:"name"`
	// DHCP makes gokrazy's DHCP client obtain an IPv4 address for this
	// interface. At most one interface may use DHCP.
	DHCP bool `json:"dhcp,omitempty"`
	// Addresses are static addresses in CIDR form (10.0.0.1/24, fd00::1/64).
	Addresses []string `json:"addresses,omitempty"`
	// Routes are static routes through this interface.
	Routes []Route `json:"routes,omitempty"`
	// MTU, when non-zero, is set on the link.
	MTU int `json:"mtu,omitempty"`
	// VLAN, when set, makes this interface an 802.1Q VLAN on another
	// link, which netconfig creates at boot. The kernel needs
	// CONFIG_VLAN_8021Q: the kernel package of `make kernel` has it, the
	// stock gokrazy kernel does not.
	VLAN *VLAN `json:"vlan,omitempty"`
}

// VLAN names the parent link and the VLAN id of a VLAN interface.
type VLAN struct {
	// Link is the interface carrying the tagged frames (eth1).
	Link string `json:"link"`
	// ID is the 802.1Q VLAN id, 1..4094.
	ID int `json:"id"`
}

// Route is a static route. To is a prefix (0.0.0.0/0 for a default route);
// Via is the gateway address, empty for an on-link route.
type Route struct {
	To  string `json:"to"`
	Via string `json:"via,omitempty"`
}

// DefaultSysctls are set on every boot: a gateway forwards packets, and
// gokrazy boots with forwarding off.
var DefaultSysctls = map[string]string{
	"net.ipv4.ip_forward":          "1",
	"net.ipv6.conf.all.forwarding": "1",
}

// DHCPConfig is the configuration used when none is given: DHCP on eth0.
func DHCPConfig() Config {
	return Config{Interfaces: []Interface{{Name: "eth0", DHCP: true}}}
}

// Load reads and validates a network.json file.
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates network.json content. Unknown fields are
// errors, so a misspelt key does not silently leave an interface unset.
func Parse(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("decoding network config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Linux interface names: at most 15 bytes, no slash, colon or whitespace.
var ifnameRE = regexp.MustCompile(`^[^/:\s]{1,15}$`)

// Sysctl names as dotted paths below /proc/sys; restricting the alphabet
// keeps a name from escaping that directory.
var sysctlRE = regexp.MustCompile(`^[a-z0-9_\-]+(\.[a-zA-Z0-9_\-]+)+$`)

// Validate checks every field and names the first bad one.
func (c Config) Validate() error {
	seen := map[string]bool{}
	vlans := map[VLAN]string{}
	dhcp := ""
	for i, ifc := range c.Interfaces {
		field := fmt.Sprintf("interfaces[%d]", i)
		if !ifnameRE.MatchString(ifc.Name) {
			return fmt.Errorf("%s.name: invalid interface name %q", field, ifc.Name)
		}
		field = fmt.Sprintf("interfaces[%d] (%s)", i, ifc.Name)
		if seen[ifc.Name] {
			return fmt.Errorf("%s.name: interface %q listed twice", field, ifc.Name)
		}
		seen[ifc.Name] = true
		if ifc.DHCP {
			if dhcp != "" {
				return fmt.Errorf("%s.dhcp: only one interface can use DHCP, %q already does", field, dhcp)
			}
			dhcp = ifc.Name
		}
		if v := ifc.VLAN; v != nil {
			if !ifnameRE.MatchString(v.Link) {
				return fmt.Errorf("%s.vlan.link: invalid interface name %q", field, v.Link)
			}
			if v.Link == ifc.Name {
				return fmt.Errorf("%s.vlan.link: %q is the VLAN interface itself, want its parent link", field, v.Link)
			}
			if v.ID < 1 || v.ID > 4094 {
				return fmt.Errorf("%s.vlan.id: %d is outside 1..4094", field, v.ID)
			}
			if other, dup := vlans[*v]; dup {
				return fmt.Errorf("%s.vlan: VLAN %d on %s is already interface %q", field, v.ID, v.Link, other)
			}
			vlans[*v] = ifc.Name
		}
		if !ifc.DHCP && len(ifc.Addresses) == 0 && len(ifc.Routes) == 0 && ifc.MTU == 0 && ifc.VLAN == nil {
			return fmt.Errorf("%s: neither dhcp, addresses, routes, mtu nor vlan set", field)
		}
		for j, a := range ifc.Addresses {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("%s.addresses[%d]: %q is not an address in CIDR form (10.0.0.1/24): %v", field, j, a, err)
			}
		}
		for j, r := range ifc.Routes {
			to, err := netip.ParsePrefix(r.To)
			if err != nil {
				return fmt.Errorf("%s.routes[%d].to: %q is not a prefix (0.0.0.0/0, 10.96.0.0/12): %v", field, j, r.To, err)
			}
			if r.Via != "" {
				via, err := netip.ParseAddr(r.Via)
				if err != nil {
					return fmt.Errorf("%s.routes[%d].via: %q is not an address: %v", field, j, r.Via, err)
				}
				if via.Is4() != to.Addr().Is4() {
					return fmt.Errorf("%s.routes[%d].via: gateway %s is not of the same family as %s", field, j, r.Via, r.To)
				}
			}
		}
		if ifc.MTU != 0 && (ifc.MTU < 68 || ifc.MTU > 65535) {
			return fmt.Errorf("%s.mtu: %d is outside 68..65535", field, ifc.MTU)
		}
	}
	for name := range c.Sysctls {
		if !sysctlRE.MatchString(name) {
			return fmt.Errorf("sysctls: invalid sysctl name %q (want dotted form such as net.ipv4.ip_forward)", name)
		}
	}
	return nil
}

// DHCPInterface returns the interface gokrazy's DHCP client should run on,
// or "" when every interface is configured statically.
func (c Config) DHCPInterface() string {
	for _, ifc := range c.Interfaces {
		if ifc.DHCP {
			return ifc.Name
		}
	}
	return ""
}

// Sysctl is one setting, in the order Apply writes them.
type Sysctl struct{ Name, Value string }

// EffectiveSysctls merges DefaultSysctls with the configured ones, sorted by
// name so that boots are reproducible.
func (c Config) EffectiveSysctls() []Sysctl {
	m := map[string]string{}
	for k, v := range DefaultSysctls {
		m[k] = v
	}
	for k, v := range c.Sysctls {
		m[k] = v
	}
	out := make([]Sysctl, 0, len(m))
	for k, v := range m {
		out = append(out, Sysctl{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// SysctlPath maps a dotted sysctl name to its file under /proc/sys.
func SysctlPath(name string) string {
	return "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
}
