package model_test

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
)

func ptr[T any](v T) *T { return &v }

func service(mods ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "172.30.0.41", ClusterIPs: []string{"172.30.0.41"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

type sliceEP struct {
	addr                        string
	ready, serving, terminating *bool
	node, zone                  string
	zoneHints, nodeHints        []string
}

func slice(name string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...sliceEP) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns1", Name: name, Labels: map[string]string{model.LabelServiceName: "web"}},
		AddressType: family,
		Ports:       ports,
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating}}
		if e.node != "" {
			ep.NodeName = ptr(e.node)
		}
		if e.zone != "" {
			ep.Zone = ptr(e.zone)
		}
		if e.zoneHints != nil || e.nodeHints != nil {
			ep.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.zoneHints {
				ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range e.nodeHints {
				ep.Hints.ForNodes = append(ep.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		sl.Endpoints = append(sl.Endpoints, ep)
	}
	return sl
}

func port(name string, proto corev1.Protocol, p int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(p)}
}

var (
	yes = ptr(true)
	no  = ptr(false)
)

func mAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func readyEP(a string, p uint16) model.Endpoint {
	return model.Endpoint{Port: p, Ready: true, Serving: true}.WithAddr(mAddr(a))
}

func TestFromKubernetes(t *testing.T) {
	http := []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 8080)}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		opts   model.Options
		check  func(t *testing.T, s *model.Service)
	}{
		{name: "ClusterIP basics",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053})
			}),
			check: func(t *testing.T, s *model.Service) {
				want := &model.Service{
					Key: model.NewServiceKey("ns1", "web"), Type: model.TypeClusterIP, Created: model.InstantOf(time.Unix(1700000000, 0)),
					IPv4: true, ClusterIPs: []netip.Addr{mAddr("172.30.0.41")},
					// A ClusterIP Service has no NodePort, whatever the field says.
					Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}, {Name: "dns", Protocol: model.UDP, Port: 53}},
				}
				if !reflect.DeepEqual(s, want) {
					t.Errorf("got %+v\nwant %+v", s, want)
				}
			}},
		{name: "defaults: type, protocol, namespace",
			svc: service(func(s *corev1.Service) {
				s.Namespace, s.Spec.Type = "", ""
				s.Spec.Ports[0].Protocol = ""
			}),
			check: func(t *testing.T, s *model.Service) {
				if s.Key.Namespace() != "default" || s.Type != model.TypeClusterIP || s.Ports[0].Protocol != model.TCP {
					t.Errorf("got key %v type %q protocol %v", s.Key, s.Type, s.Ports[0].Protocol)
				}
			}},
		{name: "named target ports resolve per slice",
			svc: service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-b", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 9090)}, sliceEP{addr: "10.180.1.1"}),
				slice("web-a", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "10.180.0.1"}, sliceEP{addr: "10.180.0.2"}),
			},
			check: func(t *testing.T, s *model.Service) {
				want := []model.Endpoint{readyEP("10.180.0.1", 8080), readyEP("10.180.0.2", 8080), readyEP("10.180.1.1", 9090)}
				if !reflect.DeepEqual(s.Ports[0].Endpoints, want) {
					t.Errorf("endpoints %+v\nwant %+v", s.Ports[0].Endpoints, want)
				}
			}},
		{name: "slice ports match by name and protocol; unset port skipped",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
			}),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
					port("http", corev1.ProtocolUDP, 1111), // wrong protocol
					port("other", corev1.ProtocolTCP, 2222),
					{Name: ptr("dns"), Protocol: ptr(corev1.ProtocolUDP)}, // no port number
					port("http", corev1.ProtocolTCP, 8080),
				}, sliceEP{addr: "10.180.0.1"}),
			},
			check: func(t *testing.T, s *model.Service) {
				if got, want := s.Ports[0].Endpoints, []model.Endpoint{readyEP("10.180.0.1", 8080)}; !reflect.DeepEqual(got, want) {
					t.Errorf("http endpoints %+v, want %+v", got, want)
				}
				if len(s.Ports[1].Endpoints) != 0 {
					t.Errorf("dns endpoints %+v, want none", s.Ports[1].Endpoints)
				}
			}},
		{name: "slices of both families are merged; FQDN slices ignored",
			svc: service(func(s *corev1.Service) {
				s.Spec.ClusterIPs = []string{"172.30.0.41", "fd00:30::41"}
			}),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-v6", discoveryv1.AddressTypeIPv6, http, sliceEP{addr: "fd00:10::1"}),
				slice("web-v4", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "10.180.0.1"}),
				slice("web-fqdn", discoveryv1.AddressTypeFQDN, http, sliceEP{addr: "backend.example.com"}),
			},
			check: func(t *testing.T, s *model.Service) {
				if want := []netip.Addr{mAddr("172.30.0.41"), mAddr("fd00:30::41")}; !reflect.DeepEqual(s.ClusterIPs, want) {
					t.Errorf("cluster IPs %v", s.ClusterIPs)
				}
				want := []model.Endpoint{readyEP("10.180.0.1", 8080), readyEP("fd00:10::1", 8080)}
				if !reflect.DeepEqual(s.Ports[0].Endpoints, want) {
					t.Errorf("endpoints %+v\nwant %+v", s.Ports[0].Endpoints, want)
				}
			}},
		{name: "an endpoint in two slices is used once, the ready listing winning",
			svc: service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("web-a", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "10.180.0.1", ready: no, serving: yes, terminating: yes}, sliceEP{addr: "10.180.0.2"}),
				slice("web-b", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "10.180.0.1", ready: yes}, sliceEP{addr: "10.180.0.2", ready: no}),
				slice("web-c", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "10.180.0.2"}),
			},
			check: func(t *testing.T, s *model.Service) {
				want := []model.Endpoint{readyEP("10.180.0.1", 8080), readyEP("10.180.0.2", 8080)}
				if !reflect.DeepEqual(s.Ports[0].Endpoints, want) {
					t.Errorf("endpoints %+v\nwant %+v", s.Ports[0].Endpoints, want)
				}
			}},
		{name: "conditions: nil ready and serving mean true, nil terminating false",
			svc: service(),
			slices: []*discoveryv1.EndpointSlice{slice("web-a", discoveryv1.AddressTypeIPv4, http,
				sliceEP{addr: "10.180.0.1"},
				sliceEP{addr: "10.180.0.2", ready: no},
				// Serving nil on a terminating endpoint: the API says
				// "a nil value should be interpreted as true", and
				// kube-proxy reads it so.
				sliceEP{addr: "10.180.0.3", ready: no, terminating: yes},
				sliceEP{addr: "10.180.0.4", ready: no, serving: no, terminating: yes},
			)},
			check: func(t *testing.T, s *model.Service) {
				want := []model.Endpoint{
					model.Endpoint{Port: 8080, Ready: true, Serving: true}.WithAddr(mAddr("10.180.0.1")),
					model.Endpoint{Port: 8080, Serving: true}.WithAddr(mAddr("10.180.0.2")),
					model.Endpoint{Port: 8080, Serving: true, Terminating: true}.WithAddr(mAddr("10.180.0.3")),
					model.Endpoint{Port: 8080, Terminating: true}.WithAddr(mAddr("10.180.0.4")),
				}
				if !reflect.DeepEqual(s.Ports[0].Endpoints, want) {
					t.Errorf("endpoints\n%+v\nwant\n%+v", s.Ports[0].Endpoints, want)
				}
			}},
		{name: "node, zone and hints",
			svc: service(),
			slices: []*discoveryv1.EndpointSlice{slice("web-a", discoveryv1.AddressTypeIPv4, http,
				sliceEP{addr: "10.180.0.1", node: "n1", zone: "zone-a", zoneHints: []string{"zone-a", "zone-b"}, nodeHints: []string{"n1"}})},
			check: func(t *testing.T, s *model.Service) {
				want := model.Endpoint{Port: 8080, Ready: true, Serving: true, Place: model.NewPlace("n1", "zone-a", []string{"zone-a", "zone-b"}, []string{"n1"})}.WithAddr(mAddr("10.180.0.1"))
				if !reflect.DeepEqual(s.Ports[0].Endpoints, []model.Endpoint{want}) {
					t.Errorf("endpoints %+v", s.Ports[0].Endpoints)
				}
			}},
		{name: "LoadBalancer: ingress IPs except ipMode Proxy and hostnames; source ranges; node ports",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalIPs = []string{"192.168.99.11"}
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.7/24", "2001:db8:9::/48"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "198.51.100.1"},
					{IP: "198.51.100.2", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
					{IP: "198.51.100.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
				}
			}),
			check: func(t *testing.T, s *model.Service) {
				if want := []netip.Addr{mAddr("198.51.100.1"), mAddr("198.51.100.2")}; !reflect.DeepEqual(s.LoadBalancerIPs(), want) {
					t.Errorf("LB IPs %v, want %v", s.LoadBalancerIPs(), want)
				}
				if want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:9::/48")}; !reflect.DeepEqual(s.SourceRanges(), want) {
					t.Errorf("source ranges %v, want %v", s.SourceRanges(), want)
				}
				if want := []netip.Addr{mAddr("192.168.99.11")}; !reflect.DeepEqual(s.ExternalIPs(), want) {
					t.Errorf("external IPs %v", s.ExternalIPs())
				}
				if s.Ports[0].NodePort != 30080 || !s.ExternallyAccessible() {
					t.Errorf("node port %d, externally accessible %v", s.Ports[0].NodePort, s.ExternallyAccessible())
				}
			}},
		{name: "ingress of a Service that is no longer a LoadBalancer is ignored",
			svc: service(func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
			}),
			check: func(t *testing.T, s *model.Service) {
				if len(s.LoadBalancerIPs()) != 0 || len(s.SourceRanges()) != 0 {
					t.Errorf("LB IPs %v, ranges %v", s.LoadBalancerIPs(), s.SourceRanges())
				}
			}},
		{name: "source ranges padded with whitespace, which API validation lets through",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/24 "}
			}),
			check: func(t *testing.T, s *model.Service) {
				if want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}; !reflect.DeepEqual(s.SourceRanges(), want) {
					t.Errorf("source ranges %v, want %v", s.SourceRanges(), want)
				}
			}},
		{name: "session affinity default timeout",
			svc: service(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
			check: func(t *testing.T, s *model.Service) {
				if s.AffinityTimeout() != 3*time.Hour {
					t.Errorf("timeout %v", s.AffinityTimeout())
				}
			}},
		{name: "session affinity timeout",
			svc: service(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
			}),
			check: func(t *testing.T, s *model.Service) {
				if s.AffinityTimeout() != time.Minute {
					t.Errorf("timeout %v", s.AffinityTimeout())
				}
			}},
		{name: "no affinity",
			svc: service(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityNone }),
			check: func(t *testing.T, s *model.Service) {
				if s.AffinityTimeout() != 0 {
					t.Errorf("timeout %v", s.AffinityTimeout())
				}
			}},
		{name: "traffic policies and health check port",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
				s.Spec.HealthCheckNodePort = 31000
			}),
			check: func(t *testing.T, s *model.Service) {
				if !s.ExternalLocal || !s.InternalLocal || s.HealthCheckNodePort != 31000 {
					t.Errorf("got %+v", s)
				}
			}},
		{name: "ExternalOnly drops ClusterIPs",
			svc:  service(),
			opts: model.Options{ExternalOnly: true},
			check: func(t *testing.T, s *model.Service) {
				if len(s.ClusterIPs) != 0 {
					t.Errorf("cluster IPs %v", s.ClusterIPs)
				}
			}},
		{name: "clusterIP without clusterIPs",
			svc: service(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }),
			check: func(t *testing.T, s *model.Service) {
				if want := []netip.Addr{mAddr("172.30.0.41")}; !reflect.DeepEqual(s.ClusterIPs, want) {
					t.Errorf("cluster IPs %v", s.ClusterIPs)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := model.FromKubernetes(tc.svc, tc.slices, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

// TestFromKubernetesErrors: bad input is an error that names the field and
// the value.
func TestFromKubernetesErrors(t *testing.T) {
	http := []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 8080)}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   []string // all must appear in the error
	}{
		{"no name", service(func(s *corev1.Service) { s.Name = "" }), nil, []string{"metadata.name"}},
		{"unknown type", service(func(s *corev1.Service) { s.Spec.Type = "Weird" }), nil, []string{"spec.type", "Weird"}},
		{"bad clusterIP", service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"172.30.0.41", "172.30.0"} }), nil,
			[]string{"ns1/web", "spec.clusterIPs[1]", `"172.30.0"`}},
		{"clusterIP with a zone", service(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"fe80::1%eth0"} }), nil,
			[]string{"spec.clusterIPs[0]", "fe80::1%eth0"}},
		{"bad externalIP", service(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"1.2.3.4.5"} }), nil,
			[]string{"spec.externalIPs[0]", "1.2.3.4.5"}},
		{"bad ingress IP", service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}, {IP: "lb"}}
		}), nil, []string{"status.loadBalancer.ingress[1].ip", `"lb"`}},
		{"bad source range", service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"}
		}), nil, []string{"spec.loadBalancerSourceRanges[0]", "10.0.0.0/33"}},
		{"bad protocol", service(func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }), nil,
			[]string{"spec.ports[0].protocol", "ICMP"}},
		{"port zero", service(func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }), nil, []string{"spec.ports[0].port", "0"}},
		{"port too big", service(func(s *corev1.Service) { s.Spec.Ports[0].Port = 70000 }), nil, []string{"spec.ports[0].port", "70000"}},
		{"nodePort too big", service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 70000
		}), nil, []string{"spec.ports[0].nodePort", "70000"}},
		{"healthCheckNodePort too big", service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 65536
		}), nil, []string{"spec.healthCheckNodePort", "65536"}},
		{"affinity timeout zero", service(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(0))}}
		}), nil, []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds", "0"}},
		{"affinity timeout too long", service(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(86401))}}
		}), nil, []string{"timeoutSeconds", "86401"}},
		{"unknown affinity", service(func(s *corev1.Service) { s.Spec.SessionAffinity = "Sticky" }), nil,
			[]string{"spec.sessionAffinity", "Sticky"}},
		{"slice: bad address", service(), []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "10.180.0.1"}, sliceEP{addr: "10.180.0.256"})},
			[]string{"endpointslice web-a", "endpoints[1].addresses[0]", "10.180.0.256"}},
		{"slice: address of the other family", service(), []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4, http, sliceEP{addr: "fd00::1"})},
			[]string{"endpointslice web-a", "fd00::1", "IPv4"}},
		{"slice: unknown address type", service(), []*discoveryv1.EndpointSlice{
			slice("web-a", "IPX", http, sliceEP{addr: "10.180.0.1"})},
			[]string{"endpointslice web-a", "addressType", "IPX"}},
		{"slice: bad protocol", service(), []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", "ICMP", 8080)}, sliceEP{addr: "10.180.0.1"})},
			[]string{"endpointslice web-a", "ports[0].protocol", "ICMP"}},
		{"slice: bad port", service(), []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 65536)}, sliceEP{addr: "10.180.0.1"})},
			[]string{"endpointslice web-a", "ports[0].port", "65536"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := model.FromKubernetes(tc.svc, tc.slices, model.Options{})
			if err == nil {
				t.Fatalf("no error; got %+v", s)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func TestSkip(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		opts model.Options
		want string // substring of the reason; "" when proxied
	}{
		{"ClusterIP", service(), model.Options{}, ""},
		{"headless", service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), model.Options{}, "headless"},
		{"ExternalName", service(func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName, s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ServiceTypeExternalName, "db.example.com", "", nil
		}), model.Options{}, "ExternalName"},
		{"another proxy's Service", service(func(s *corev1.Service) {
			s.Labels = map[string]string{model.LabelServiceProxyName: "other-proxy"}
		}), model.Options{}, "other-proxy"},
		{"another proxy's Service, named gateway", service(func(s *corev1.Service) {
			s.Labels = map[string]string{model.LabelServiceProxyName: "other-proxy"}
		}), model.Options{ProxyName: "nftgate"}, "other-proxy"},
		{"this gateway's Service", service(func(s *corev1.Service) {
			s.Labels = map[string]string{model.LabelServiceProxyName: "nftgate"}
		}), model.Options{ProxyName: "nftgate"}, ""},
		{"unlabelled Service with a named gateway", service(), model.Options{ProxyName: "nftgate"}, ""},
		{"LoadBalancer", service(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }), model.Options{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := model.Skip(tc.svc, tc.opts)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("skipped: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("reason %q, want one naming %q", got, tc.want)
			}
		})
	}
}

// TestBuildFromObjects: the model built from what is kept of the objects
// lists each endpoint once (a ready listing wins), in address order, with
// the port each slice gives; building again gives the same model, so
// nothing Build shares between models is modified.
func TestBuildFromObjects(t *testing.T) {
	svc := service(func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090})
	})
	http := []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 8080)}
	both := []discoveryv1.EndpointPort{port("http", corev1.ProtocolTCP, 8081), port("metrics", corev1.ProtocolTCP, 9100)}
	one := model.NewSliceObject(slice("web-a", discoveryv1.AddressTypeIPv4, http,
		sliceEP{addr: "10.180.0.3"}, sliceEP{addr: "10.180.0.1", ready: ptr(false)}, sliceEP{addr: "10.180.0.1"}))
	two := model.NewSliceObject(slice("web-b", discoveryv1.AddressTypeIPv4, both, sliceEP{addr: "10.180.0.2"}))
	obj := model.NewServiceObject(svc)

	alone, err := model.Build(obj, []*model.SliceObject{one}, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ready := model.Endpoint{Ready: true, Serving: true}
	at := func(a string, p uint16) model.Endpoint { e := ready; e.SetAddr(mAddr(a)); e.Port = p; return e }
	if want := []model.Endpoint{at("10.180.0.1", 8080), at("10.180.0.3", 8080)}; !reflect.DeepEqual(alone.Ports[0].Endpoints, want) {
		t.Errorf("one slice: endpoints %+v, want %+v", alone.Ports[0].Endpoints, want)
	}
	if len(alone.Ports[1].Endpoints) != 0 {
		t.Errorf("one slice: metrics endpoints %+v, want none", alone.Ports[1].Endpoints)
	}

	merged, err := model.Build(obj, []*model.SliceObject{two, one}, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []model.Endpoint{at("10.180.0.1", 8080), at("10.180.0.2", 8081), at("10.180.0.3", 8080)}; !reflect.DeepEqual(merged.Ports[0].Endpoints, want) {
		t.Errorf("two slices: http endpoints %+v, want %+v", merged.Ports[0].Endpoints, want)
	}
	if want := []model.Endpoint{at("10.180.0.2", 9100)}; !reflect.DeepEqual(merged.Ports[1].Endpoints, want) {
		t.Errorf("two slices: metrics endpoints %+v, want %+v", merged.Ports[1].Endpoints, want)
	}
	again, err := model.Build(obj, []*model.SliceObject{one}, model.Options{})
	if err != nil || !reflect.DeepEqual(again, alone) {
		t.Errorf("built again: %+v, %v; want %+v", again, err, alone)
	}
}

// TestProxyProtocolAnnotation: v1 and v2 are read; any other value, and a
// port the proxy cannot serve, is a warning naming the annotation and the
// value, and the Service is served without PROXY protocol.
func TestProxyProtocolAnnotation(t *testing.T) {
	annotated := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{model.AnnotationProxyProtocol: v} }
	}
	withExternalIP := func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.168.99.11"} }
	withUDP := func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
	}
	for _, c := range []struct {
		name    string
		svc     *corev1.Service
		opts    model.Options
		version uint8
		warn    []string
	}{
		{"none", service(), model.Options{}, 0, nil},
		{"v1", service(annotated("v1")), model.Options{}, 1, nil},
		{"v2", service(annotated("v2")), model.Options{}, 2, nil},
		{"invalid", service(annotated("V2")), model.Options{}, 0, []string{`annotation nftgate.io/proxy-protocol: invalid value "V2"`}},
		// The warning is kept beside the Service's other rare fields.
		{"invalid, with an external IP", service(annotated("V2"), withExternalIP), model.Options{}, 0, []string{`annotation nftgate.io/proxy-protocol: invalid value "V2"`}},
		{"udp port", service(annotated("v1"), withUDP), model.Options{}, 1, []string{"port 53/UDP is served without PROXY protocol"}},
		{"proxy off", service(annotated("v1")), model.Options{NoProxy: true, NoProxyWhy: "off here"}, 0, []string{"is not served: off here"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := model.FromKubernetes(c.svc, nil, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if m.ProxyProtocol != c.version || len(m.Warnings()) != len(c.warn) {
				t.Fatalf("version %d, warnings %q; want %d, %d warnings", m.ProxyProtocol, m.Warnings(), c.version, len(c.warn))
			}
			for i, w := range c.warn {
				if !strings.Contains(m.Warnings()[i], w) {
					t.Errorf("warning %q, want it to say %q", m.Warnings()[i], w)
				}
			}
			if len(m.ExternalIPs()) != len(c.svc.Spec.ExternalIPs) {
				t.Errorf("external IPs %v, want %v", m.ExternalIPs(), c.svc.Spec.ExternalIPs)
			}
		})
	}
}

// TestEndpointSelectionAnnotation: "maglev" and "hash" are read; any
// other value is a warning naming the annotation and the value, and the
// gateway's default applies.
func TestEndpointSelectionAnnotation(t *testing.T) {
	for _, c := range []struct{ value, want, warn string }{
		{"", "", ""},
		{"maglev", model.SelectionMaglev, ""},
		{"hash", model.SelectionHash, ""},
		{"Maglev", "", `annotation nftgate.io/endpoint-selection: invalid value "Maglev"`},
	} {
		svc := service(func(s *corev1.Service) {
			if c.value != "" {
				s.Annotations = map[string]string{model.AnnotationEndpointSelection: c.value}
			}
		})
		m, err := model.FromKubernetes(svc, nil, model.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if m.EndpointSelection() != c.want || (c.warn == "") != (len(m.Warnings()) == 0) ||
			c.warn != "" && !strings.Contains(m.Warnings()[0], c.warn) {
			t.Errorf("%q: selection %q, warnings %q; want %q, %q", c.value, m.EndpointSelection(), m.Warnings(), c.want, c.warn)
		}
		if got := m.Maglev(model.SelectionMaglev); got != (c.want != model.SelectionHash) {
			t.Errorf("%q: Maglev under a Maglev default = %v", c.value, got)
		}
	}
}
