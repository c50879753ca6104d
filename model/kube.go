package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Labels kube-proxy honours, and so does nftgate.
const (
	LabelServiceName      = "kubernetes.io/service-name"
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// DefaultAffinityTimeout is the API's default ClientIP affinity timeout.
const DefaultAffinityTimeout = 10800 * time.Second

// Options select which Services are proxied and how.
type Options struct {
	// ProxyName is this gateway's service-proxy-name: Services labelled with
	// another proxy name are left to that proxy.
	ProxyName string
	// ExternalOnly limits the gateway to externally reachable Services and
	// never programs ClusterIPs, for sites that must not expose them.
	ExternalOnly bool
}

// Skip tells why a Service is not proxied at all, or "" when it is.
func Skip(svc *corev1.Service, opts Options) string {
	if name, ok := svc.Labels[LabelServiceProxyName]; ok && name != opts.ProxyName {
		return fmt.Sprintf("label %s=%q names another proxy", LabelServiceProxyName, name)
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeExternalName:
		return "type ExternalName is resolved by DNS, not proxied"
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return "headless (clusterIP None)"
	}
	return ""
}

// FromKubernetes builds the model of one Service from its API object and all
// EndpointSlices labelled with its name. A malformed field is an error that
// names the field and the value; the caller keeps serving the Service's last
// good state, and every other Service, meanwhile.
func FromKubernetes(svc *corev1.Service, sliceList []*discoveryv1.EndpointSlice, opts Options) (*Service, error) {
	key := ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
	if svc.Name == "" {
		return nil, fmt.Errorf("service in namespace %q: metadata.name is empty", svc.Namespace)
	}
	if svc.Namespace == "" {
		key.Namespace = "default"
	}
	errf := func(format string, args ...any) error {
		return fmt.Errorf("service %s: "+format, append([]any{key}, args...)...)
	}
	s := &Service{
		Key:                 key,
		Type:                string(svc.Spec.Type),
		Created:             svc.CreationTimestamp.Time,
		ExternalLocal:       svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
		InternalLocal:       svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		HealthCheckNodePort: 0,
	}
	if s.Type == "" {
		s.Type = string(corev1.ServiceTypeClusterIP)
	}
	switch corev1.ServiceType(s.Type) {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	default:
		return nil, errf("spec.type: unknown type %q", s.Type)
	}
	if svc.Spec.TrafficDistribution != nil {
		s.TrafficDistribution = *svc.Spec.TrafficDistribution
	}

	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	for i, ip := range clusterIPs {
		a, err := parseAddr(ip)
		if err != nil {
			return nil, errf("spec.clusterIPs[%d]: %v", i, err)
		}
		s.ClusterIPs = append(s.ClusterIPs, a)
	}
	for i, ip := range svc.Spec.ExternalIPs {
		a, err := parseAddr(ip)
		if err != nil {
			return nil, errf("spec.externalIPs[%d]: %v", i, err)
		}
		s.ExternalIPs = append(s.ExternalIPs, a)
	}
	if s.Type == string(corev1.ServiceTypeLoadBalancer) {
		for i, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" {
				continue // hostname-only ingress: nothing to program
			}
			if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
				continue // the load balancer proxies; traffic arrives at node ports
			}
			a, err := parseAddr(ing.IP)
			if err != nil {
				return nil, errf("status.loadBalancer.ingress[%d].ip: %v", i, err)
			}
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, a)
		}
		for i, r := range svc.Spec.LoadBalancerSourceRanges {
			p, err := netip.ParsePrefix(strings.TrimSpace(r))
			if err != nil {
				return nil, errf("spec.loadBalancerSourceRanges[%d]: invalid CIDR %q", i, r)
			}
			s.SourceRanges = append(s.SourceRanges, p.Masked())
		}
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		s.AffinityTimeout = DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t <= 0 || t > 86400 {
				return nil, errf("spec.sessionAffinityConfig.clientIP.timeoutSeconds: %d is out of range 1-86400", t)
			}
			s.AffinityTimeout = time.Duration(t) * time.Second
		}
	} else if svc.Spec.SessionAffinity != "" && svc.Spec.SessionAffinity != corev1.ServiceAffinityNone {
		return nil, errf("spec.sessionAffinity: unknown value %q", svc.Spec.SessionAffinity)
	}
	if s.ExternalLocal && svc.Spec.HealthCheckNodePort != 0 {
		if svc.Spec.HealthCheckNodePort < 0 || svc.Spec.HealthCheckNodePort > 65535 {
			return nil, errf("spec.healthCheckNodePort: %d is not a port", svc.Spec.HealthCheckNodePort)
		}
		s.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
	}

	for i, p := range svc.Spec.Ports {
		proto, err := ParseProtocol(string(p.Protocol))
		if err != nil {
			return nil, errf("spec.ports[%d].protocol: %v", i, err)
		}
		if p.Port <= 0 || p.Port > 65535 {
			return nil, errf("spec.ports[%d].port: %d is not a port", i, p.Port)
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			return nil, errf("spec.ports[%d].nodePort: %d is not a port", i, p.NodePort)
		}
		sp := ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)}
		if s.Type != string(corev1.ServiceTypeClusterIP) {
			sp.NodePort = uint16(p.NodePort)
		}
		s.Ports = append(s.Ports, sp)
	}

	for _, fam := range svc.Spec.IPFamilies {
		switch fam {
		case corev1.IPv4Protocol:
			s.IPv4 = true
		case corev1.IPv6Protocol:
			s.IPv6 = true
		}
	}
	for _, a := range s.ClusterIPs {
		s.IPv4, s.IPv6 = s.IPv4 || a.Is4(), s.IPv6 || a.Is6()
	}
	if !s.IPv4 && !s.IPv6 {
		// No ClusterIP and no families given (a manifest written by
		// hand): the Service is wherever its addresses are.
		s.IPv4, s.IPv6 = true, true
	}
	if opts.ExternalOnly {
		s.ClusterIPs = nil
	}

	// Slices in name order, so that an endpoint listed twice resolves the
	// same way on every sync.
	ordered := slices.Clone(sliceList)
	slices.SortFunc(ordered, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	for _, sl := range ordered {
		if err := mergeSlice(s, sl); err != nil {
			return nil, errf("%v", err)
		}
	}
	for i := range s.Ports {
		eps := s.Ports[i].Endpoints
		slices.SortFunc(eps, func(a, b Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	}
	return s, nil
}

func mergeSlice(s *Service, sl *discoveryv1.EndpointSlice) error {
	switch sl.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
	case discoveryv1.AddressTypeFQDN:
		return nil // kube-proxy ignores FQDN slices as well
	default:
		return fmt.Errorf("endpointslice %s: addressType: unknown value %q", sl.Name, sl.AddressType)
	}
	for pi, port := range sl.Ports {
		proto, err := ParseProtocol(ptrString(port.Protocol))
		if err != nil {
			return fmt.Errorf("endpointslice %s: ports[%d].protocol: %v", sl.Name, pi, err)
		}
		if port.Port == nil {
			continue // the port is not exposed by these endpoints
		}
		if *port.Port <= 0 || *port.Port > 65535 {
			return fmt.Errorf("endpointslice %s: ports[%d].port: %d is not a port", sl.Name, pi, *port.Port)
		}
		name := ptrString(port.Name)
		for spi := range s.Ports {
			sp := &s.Ports[spi]
			if sp.Name != name || sp.Protocol != proto {
				continue
			}
			for ei, ep := range sl.Endpoints {
				if len(ep.Addresses) == 0 {
					return fmt.Errorf("endpointslice %s: endpoints[%d].addresses is empty", sl.Name, ei)
				}
				a, err := parseAddr(ep.Addresses[0])
				if err != nil {
					return fmt.Errorf("endpointslice %s: endpoints[%d].addresses[0]: %v", sl.Name, ei, err)
				}
				if a.Is4() != (sl.AddressType == discoveryv1.AddressTypeIPv4) {
					return fmt.Errorf("endpointslice %s: endpoints[%d].addresses[0]: %s does not match addressType %s", sl.Name, ei, a, sl.AddressType)
				}
				e := Endpoint{Addr: a, Port: uint16(*port.Port)}
				// The API's rules: a nil ready or serving means true, a nil
				// terminating means false.
				e.Ready = ep.Conditions.Ready == nil || *ep.Conditions.Ready
				e.Serving = true
				if ep.Conditions.Serving != nil {
					e.Serving = *ep.Conditions.Serving
				}
				e.Terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
				if ep.NodeName != nil {
					e.NodeName = *ep.NodeName
				}
				if ep.Zone != nil {
					e.Zone = *ep.Zone
				}
				if ep.Hints != nil {
					for _, z := range ep.Hints.ForZones {
						e.ZoneHints = append(e.ZoneHints, z.Name)
					}
					for _, n := range ep.Hints.ForNodes {
						e.NodeHints = append(e.NodeHints, n.Name)
					}
				}
				addEndpoint(sp, e)
			}
		}
	}
	return nil
}

// addEndpoint merges e into the port, once per address and port: the same
// endpoint listed in two slices (as happens while a slice is being replaced)
// is used once, and a ready listing wins over a not-ready one.
func addEndpoint(sp *ServicePort, e Endpoint) {
	for i := range sp.Endpoints {
		if sp.Endpoints[i].Addr == e.Addr && sp.Endpoints[i].Port == e.Port {
			if e.Ready && !sp.Endpoints[i].Ready {
				sp.Endpoints[i] = e
			}
			return
		}
	}
	sp.Endpoints = append(sp.Endpoints, e)
}

func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q", s)
	}
	return a.Unmap(), nil
}

func ptrString[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
}
