package model

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestExposureDecidesEachAddress(t *testing.T) {
	host := []netip.Prefix{
		netip.MustParsePrefix("192.0.2.1/24"),
		netip.MustParsePrefix("10.0.0.5/31"), // no broadcast address
		netip.MustParsePrefix("2001:db8::1/64"),
		netip.MustParsePrefix("127.0.0.1/8"),
	}
	open := &Exposure{ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, Host: host}
	some := &Exposure{ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Host: host}
	none := &Exposure{Host: host}
	for _, c := range []struct {
		addr string
		// why is what the refusal says, "" when served; for the
		// open exposure (every address allowed by external_ip_cidrs).
		why string
	}{
		{"198.51.100.7", ""},
		{"203.0.113.9", ""},
		{"2001:db8:1::7", ""},
		{"10.0.0.4", ""}, // a /31 has no broadcast address
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"127.0.0.1", "loopback"},
		{"127.1.2.3", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"169.254.10.1", "link-local"},
		{"fe80::1", "link-local"},
		{"224.0.0.5", "link-local"}, // link-local multicast
		{"239.1.2.3", "multicast"},
		{"ff02::1", "link-local"},
		{"ff05::2", "multicast"},
		{"255.255.255.255", "the broadcast address"},
		{"192.0.2.255", "broadcast address of the gateway's subnet 192.0.2.0/24"},
		{"192.0.2.1", "the gateway itself"},
		{"10.0.0.5", "the gateway itself"},
		{"2001:db8::1", "the gateway itself"},
	} {
		a := netip.MustParseAddr(c.addr)
		for _, serves := range []struct {
			name string
			f    func(netip.Addr) (bool, string)
		}{{"externalIP", open.ServesExternalIP}, {"loadBalancer IP", open.ServesLoadBalancerIP}, {"LB without CIDRs", none.ServesLoadBalancerIP}} {
			ok, why := serves.f(a)
			if ok != (c.why == "") || !strings.Contains(why, c.why) {
				t.Errorf("%s %s: served %v (%q), want served %v (%q)", serves.name, a, ok, why, c.why == "", c.why)
			}
		}
	}
	for _, c := range []struct {
		e    *Exposure
		addr string
		why  string
	}{
		{some, "198.51.100.7", ""},
		{some, "198.51.101.7", "outside external_ip_cidrs (198.51.100.0/24)"},
		{some, "2001:db8:1::7", "outside external_ip_cidrs"},
		{some, "198.51.100.0", ""},
		{none, "198.51.100.7", "none configured"},
		{none, "2001:db8:1::7", "none configured"},
		{&Exposure{}, "127.0.0.1", "loopback"}, // the zero Exposure refuses all the same
	} {
		ok, why := c.e.ServesExternalIP(netip.MustParseAddr(c.addr))
		if ok != (c.why == "") || !strings.Contains(why, c.why) {
			t.Errorf("externalIP %s with CIDRs %v: served %v (%q), want %q", c.addr, c.e.ExternalIPCIDRs, ok, why, c.why)
		}
	}
}

func TestExposureApplyKeepsTheRest(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	e := &Exposure{ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		Host: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}}
	svc := &Service{Key: NewServiceKey("ns", "web"), ClusterIPs: addrs("10.96.0.1"),
		Rare:  &Rare{ExternalIPs: addrs("198.51.100.1", "10.99.0.1", "198.51.100.2", "127.0.0.1"), LoadBalancerIPs: addrs("203.0.113.1", "192.0.2.1")},
		Ports: []ServicePort{{Protocol: TCP, Port: 80, NodePort: 30080}}}
	before := *svc
	got, warnings := e.Apply(svc)
	if !reflect.DeepEqual(*svc, before) {
		t.Fatalf("Apply modified its input")
	}
	if got == svc {
		t.Fatalf("Apply returned its input although it left addresses out")
	}
	if want := addrs("198.51.100.1", "198.51.100.2"); !reflect.DeepEqual(got.ExternalIPs(), want) {
		t.Errorf("externalIPs %v, want %v", got.ExternalIPs(), want)
	}
	if want := addrs("203.0.113.1"); !reflect.DeepEqual(got.LoadBalancerIPs(), want) {
		t.Errorf("LB IPs %v, want %v", got.LoadBalancerIPs(), want)
	}
	if !reflect.DeepEqual(got.ClusterIPs, svc.ClusterIPs) || !reflect.DeepEqual(got.Ports, svc.Ports) {
		t.Errorf("the rest of the Service changed: %+v", got)
	}
	want := []string{
		"externalIP 10.99.0.1 is not served: outside external_ip_cidrs (198.51.100.0/24)",
		"externalIP 127.0.0.1 is not served: a loopback address",
		"loadBalancer IP 192.0.2.1 is not served: an address of the gateway itself",
	}
	if !reflect.DeepEqual(warnings, want) {
		t.Errorf("warnings\n%q\nwant\n%q", warnings, want)
	}

	// Nothing left out: the same Service, no warning.
	ok := &Service{Rare: &Rare{ExternalIPs: addrs("198.51.100.1"), LoadBalancerIPs: addrs("203.0.113.1")}}
	if got, w := e.Apply(ok); got != ok || w != nil {
		t.Errorf("Apply of a Service served whole: %p %q, want %p and no warning", got, w, ok)
	}
	// Everything left out: empty lists.
	got, _ = e.Apply(&Service{Rare: &Rare{ExternalIPs: addrs("10.99.0.1"), LoadBalancerIPs: addrs("127.0.0.1")}})
	if got.ExternalIPs() != nil || got.LoadBalancerIPs() != nil {
		t.Errorf("nothing served, but %v and %v remain", got.ExternalIPs(), got.LoadBalancerIPs())
	}
}
