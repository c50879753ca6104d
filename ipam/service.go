package ipam

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// Annotations a Service may carry. nftgate's own come first; MetalLB's are
// read too, so that a Service written for MetalLB moves over unchanged.
// Where several are given, the first in each list wins.
var (
	// AnnotationsLoadBalancerIPs request addresses: a comma-separated
	// list, at most one per IP family. spec.loadBalancerIP is read after
	// them.
	AnnotationsLoadBalancerIPs = []string{
		"nftgate.io/load-balancer-ips",
		"metallb.io/loadBalancerIPs",
		"metallb.universe.tf/loadBalancerIPs",
	}
	// AnnotationsAddressPool name the pool to allocate from.
	AnnotationsAddressPool = []string{
		"nftgate.io/address-pool",
		"metallb.io/address-pool",
		"metallb.universe.tf/address-pool",
	}
	// AnnotationsAllowSharedIP give the sharing key: Services with the
	// same key may share an address when no port and protocol of theirs
	// overlap.
	AnnotationsAllowSharedIP = []string{
		"nftgate.io/allow-shared-ip",
		"metallb.io/allow-shared-ip",
		"metallb.universe.tf/allow-shared-ip",
	}
)

// Key names a Service.
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Service is what allocation reads of a Service object (NewService).
type Service struct {
	Key
	UID types.UID
	// ResourceVersion is the object's version this was read from: a
	// status write made against it fails when the Service changed since.
	ResourceVersion string
	Created         time.Time
	Labels          map[string]string
	// LoadBalancer: type LoadBalancer.
	LoadBalancer bool
	// Class is spec.loadBalancerClass, "" when unset.
	Class string
	// Families are the IP families it asks for, in order (4 or 6).
	Families []int
	// RequireAll: ipFamilyPolicy RequireDualStack; every family or none.
	RequireAll bool
	// Requested are the addresses it asks for, from RequestedFrom.
	Requested     []netip.Addr
	RequestedFrom string
	// Pool is the pool it names, from PoolFrom.
	Pool, PoolFrom string
	// SharingKey allows sharing an address with Services of the same key.
	SharingKey string
	// Backend is what sharing Services must agree on besides the key: the
	// selector under externalTrafficPolicy Local (MetalLB's rule: the
	// Services' endpoints must be the same, or traffic to one Service's
	// port would be sent to nodes that have no local endpoint of it).
	Backend string
	// Ports are the Service's protocol/port pairs.
	Ports []Port
	// Held are the addresses in status.loadBalancer.ingress.
	Held []netip.Addr
	// Invalid says why a field the allocation needs could not be read;
	// such a Service gets nothing and an Event.
	Invalid string
}

// Port is a protocol and port of a Service.
type Port struct {
	Protocol corev1.Protocol
	Port     int32
}

// NewService reads what allocation needs of svc. It never fails: a field
// it cannot use is recorded in Invalid, with the field and the value.
func NewService(svc *corev1.Service) *Service {
	s := &Service{
		Key:             Key{Namespace: svc.Namespace, Name: svc.Name},
		UID:             svc.UID,
		ResourceVersion: svc.ResourceVersion,
		Created:         svc.CreationTimestamp.Time,
		Labels:          svc.Labels,
		LoadBalancer:    svc.Spec.Type == corev1.ServiceTypeLoadBalancer,
	}
	if s.Namespace == "" {
		s.Namespace = metaNamespaceDefault
	}
	if svc.Spec.LoadBalancerClass != nil {
		s.Class = *svc.Spec.LoadBalancerClass
	}
	var problems []string
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			s.Families = append(s.Families, 4)
		case corev1.IPv6Protocol:
			s.Families = append(s.Families, 6)
		default:
			problems = append(problems, fmt.Sprintf("spec.ipFamilies: %q is not an IP family", f))
		}
	}
	if len(s.Families) == 0 {
		// Manifests may leave ipFamilies out: the ClusterIP's family,
		// else IPv4.
		s.Families = []int{4}
		if a, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil && a.Is6() && !a.Is4In6() {
			s.Families = []int{6}
		}
	}
	policy := svc.Spec.IPFamilyPolicy
	if policy == nil || *policy == corev1.IPFamilyPolicySingleStack {
		s.Families = s.Families[:1]
	}
	s.RequireAll = policy != nil && *policy == corev1.IPFamilyPolicyRequireDualStack

	if v, from := firstAnnotation(svc, AnnotationsLoadBalancerIPs); from != "" {
		s.RequestedFrom = "annotation " + from
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			a, err := netip.ParseAddr(f)
			if err != nil || a.Zone() != "" {
				problems = append(problems, fmt.Sprintf("%s: %q is not an IP address", s.RequestedFrom, f))
				continue
			}
			s.Requested = append(s.Requested, a.Unmap())
		}
	} else if svc.Spec.LoadBalancerIP != "" {
		s.RequestedFrom = "spec.loadBalancerIP"
		a, err := netip.ParseAddr(svc.Spec.LoadBalancerIP)
		if err != nil || a.Zone() != "" {
			problems = append(problems, fmt.Sprintf("spec.loadBalancerIP: %q is not an IP address", svc.Spec.LoadBalancerIP))
		} else {
			s.Requested = []netip.Addr{a.Unmap()}
		}
	}
	if len(s.Requested) > 0 && len(problems) == 0 {
		seen := map[int]netip.Addr{}
		for _, a := range s.Requested {
			f := 4 + 2*family(a)
			if b, ok := seen[f]; ok {
				problems = append(problems, fmt.Sprintf("%s: %s and %s are both IPv%d; give at most one address per family", s.RequestedFrom, b, a, f))
			}
			seen[f] = a
			if !hasFamily(s.Families, f) {
				problems = append(problems, fmt.Sprintf("%s: %s is IPv%d, but the Service asks for %s (spec.ipFamilies, spec.ipFamilyPolicy)", s.RequestedFrom, a, f, familyList(s.Families)))
			}
		}
	}
	if v, from := firstAnnotation(svc, AnnotationsAddressPool); from != "" {
		s.Pool, s.PoolFrom = v, "annotation "+from
	}
	s.SharingKey, _ = firstAnnotation(svc, AnnotationsAllowSharedIP)
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		s.Backend = labels.Set(svc.Spec.Selector).String()
	}
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		s.Ports = append(s.Ports, Port{proto, p.Port})
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			s.Held = append(s.Held, a.Unmap())
		}
	}
	s.Invalid = strings.Join(problems, "; ")
	return s
}

const metaNamespaceDefault = "default"

func firstAnnotation(svc *corev1.Service, names []string) (value, name string) {
	for _, n := range names {
		if v, ok := svc.Annotations[n]; ok {
			return v, n
		}
	}
	return "", ""
}

func hasFamily(fs []int, f int) bool {
	for _, g := range fs {
		if g == f {
			return true
		}
	}
	return false
}

func familyList(fs []int) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = fmt.Sprintf("IPv%d", f)
	}
	return strings.Join(s, " and ")
}

// Serves tells whether nftgate allocates for s under the policy: a
// LoadBalancer Service of the policy's class (no class when the policy
// has none).
func (pol *Policy) Serves(s *Service) bool {
	return s.LoadBalancer && s.Class == pol.Class
}
