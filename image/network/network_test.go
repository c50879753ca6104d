package network

import (
	"strings"
	"testing"
)

func TestParseValid(t *testing.T) {
	c, err := Parse([]byte(`{
		"interfaces": [
			{"name": "eth0", "dhcp": true},
			{"name": "eth1", "addresses": ["10.0.2.1/24", "fd00::1/64"],
			 "routes": [{"to": "10.96.0.0/12", "via": "10.0.2.2"}, {"to": "192.0.2.0/24"}], "mtu": 1500}
		],
		"sysctls": {"net.ipv4.conf.all.rp_filter": "0", "net.ipv6.conf.all.forwarding": "0"}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.DHCPInterface(); got != "eth0" {
		t.Errorf("DHCPInterface = %q, want eth0", got)
	}
	got := c.EffectiveSysctls()
	want := []Sysctl{
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.all.forwarding", "0"},
	}
	if len(got) != len(want) {
		t.Fatalf("EffectiveSysctls = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("EffectiveSysctls[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if p := SysctlPath("net.ipv4.ip_forward"); p != "/proc/sys/net/ipv4/ip_forward" {
		t.Errorf("SysctlPath = %q", p)
	}
}

func TestParseVLAN(t *testing.T) {
	c, err := Parse([]byte(`{"interfaces": [
		{"name": "eth1", "addresses": ["10.0.2.1/24"]},
		{"name": "eth1.100", "vlan": {"link": "eth1", "id": 100}, "addresses": ["10.0.100.1/24"]},
		{"name": "eth1.200", "vlan": {"link": "eth1", "id": 200}}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	if v := c.Interfaces[1].VLAN; v == nil || *v != (VLAN{Link: "eth1", ID: 100}) {
		t.Errorf("interfaces[1].vlan = %+v, want eth1 id 100", v)
	}
	if c.Interfaces[0].VLAN != nil {
		t.Errorf("interfaces[0].vlan = %+v, want none", c.Interfaces[0].VLAN)
	}
}

func TestDefaultIsDHCPOnEth0(t *testing.T) {
	c := DHCPConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.DHCPInterface() != "eth0" {
		t.Errorf("DHCPInterface = %q, want eth0", c.DHCPInterface())
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"unknown field", `{"interfaces":[{"name":"eth0","adresses":["10.0.0.1/24"]}]}`, `unknown field "adresses"`},
		{"bad name", `{"interfaces":[{"name":"eth/0","dhcp":true}]}`, `interfaces[0].name: invalid interface name "eth/0"`},
		{"long name", `{"interfaces":[{"name":"abcdefghijklmnop","dhcp":true}]}`, `invalid interface name "abcdefghijklmnop"`},
		{"duplicate", `{"interfaces":[{"name":"eth0","dhcp":true},{"name":"eth0","mtu":1500}]}`, `interfaces[1] (eth0).name: interface "eth0" listed twice`},
		{"two dhcp", `{"interfaces":[{"name":"eth0","dhcp":true},{"name":"eth1","dhcp":true}]}`, `interfaces[1] (eth1).dhcp: only one interface can use DHCP, "eth0" already does`},
		{"empty", `{"interfaces":[{"name":"eth0"}]}`, `interfaces[0] (eth0): neither dhcp, addresses, routes, mtu nor vlan set`},
		{"bad address", `{"interfaces":[{"name":"eth1","addresses":["10.0.0.1"]}]}`, `interfaces[0] (eth1).addresses[0]: "10.0.0.1" is not an address in CIDR form`},
		{"bad route", `{"interfaces":[{"name":"eth1","routes":[{"to":"default"}]}]}`, `interfaces[0] (eth1).routes[0].to: "default" is not a prefix`},
		{"bad via", `{"interfaces":[{"name":"eth1","routes":[{"to":"0.0.0.0/0","via":"10.0.0"}]}]}`, `interfaces[0] (eth1).routes[0].via: "10.0.0" is not an address`},
		{"mixed family", `{"interfaces":[{"name":"eth1","routes":[{"to":"0.0.0.0/0","via":"fd00::1"}]}]}`, `routes[0].via: gateway fd00::1 is not of the same family as 0.0.0.0/0`},
		{"bad mtu", `{"interfaces":[{"name":"eth1","mtu":20}]}`, `interfaces[0] (eth1).mtu: 20 is outside 68..65535`},
		{"vlan without link", `{"interfaces":[{"name":"eth1.7","vlan":{"id":7}}]}`, `interfaces[0] (eth1.7).vlan.link: invalid interface name ""`},
		{"vlan on itself", `{"interfaces":[{"name":"eth1","vlan":{"link":"eth1","id":7}}]}`, `interfaces[0] (eth1).vlan.link: "eth1" is the VLAN interface itself`},
		{"vlan id 0", `{"interfaces":[{"name":"eth1.0","vlan":{"link":"eth1","id":0}}]}`, `interfaces[0] (eth1.0).vlan.id: 0 is outside 1..4094`},
		{"vlan id 4095", `{"interfaces":[{"name":"eth1.x","vlan":{"link":"eth1","id":4095}}]}`, `interfaces[0] (eth1.x).vlan.id: 4095 is outside 1..4094`},
		{"vlan twice", `{"interfaces":[{"name":"a","vlan":{"link":"eth1","id":7}},{"name":"b","vlan":{"link":"eth1","id":7}}]}`, `interfaces[1] (b).vlan: VLAN 7 on eth1 is already interface "a"`},
		{"vlan unknown field", `{"interfaces":[{"name":"a","vlan":{"link":"eth1","vid":7}}]}`, `unknown field "vid"`},
		{"bad sysctl", `{"interfaces":[],"sysctls":{"../../etc/passwd":"1"}}`, `sysctls: invalid sysctl name "../../etc/passwd"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil {
				t.Fatalf("Parse succeeded, want error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}
