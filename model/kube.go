package model

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Labels kube-proxy honours, and so does nftgate.
const (
	LabelServiceName      = "kubernetes.io/service-name"
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// AnnotationProxyProtocol asks the gateway to pass a Service's TCP
// connections from outside the cluster through its proxy, which writes a
// PROXY protocol header ("v1": text, "v2": binary) with the client's address
// and port before the connection's data.
const AnnotationProxyProtocol = "nftgate.io/proxy-protocol"

// AnnotationEndpointSelection chooses how a Service's endpoint is picked
// for a new connection, overriding the gateway's endpoint_selection:
// "hash" (the client's address and port hashed modulo the number of
// endpoints) or "maglev" (a Maglev table, which moves few connections'
// choices when an endpoint comes or goes).
const AnnotationEndpointSelection = "nftgate.io/endpoint-selection"

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
	// NoProxy tells that the gateway runs no PROXY protocol proxy: a
	// Service that asks for one gets a warning and the kernel path.
	NoProxy bool
	// NoProxyWhy says why, in that warning (the configuration key).
	NoProxyWhy string
}

// Skip tells why a Service is not proxied at all, or "" when it is.
func Skip(svc *corev1.Service, opts Options) string {
	return NewServiceObject(svc).Skip(opts)
}

// FromKubernetes builds the model of one Service from its API object and all
// EndpointSlices labelled with its name. A malformed field is an error that
// names the field and the value; the caller keeps serving the Service's last
// good state, and every other Service, meanwhile.
func FromKubernetes(svc *corev1.Service, sliceList []*discoveryv1.EndpointSlice, opts Options) (*Service, error) {
	objs := make([]*SliceObject, len(sliceList))
	for i, sl := range sliceList {
		objs[i] = NewSliceObject(sl)
	}
	return Build(NewServiceObject(svc), objs, opts)
}

// ServiceObject is what nftgate keeps of a Service object between syncs:
// its model without endpoints, or why it is not proxied, or what is wrong
// with it. Sources convert each object as it arrives and keep only this: at
// ten thousand Services the API objects, even trimmed, were the largest
// part of the gateway's memory. A ServiceObject is never modified.
type ServiceObject struct {
	Key ServiceKey
	// odd is what few Services have: a service-proxy-name label, a
	// reason never to be proxied, an error; nil when none.
	odd *oddities
	// base is the model without endpoints of a Service that has more
	// than plain holds; nil otherwise, and when skip or err is set.
	base *Service
	// plain is the model without endpoints of a Service that has
	// nothing plainBase leaves out, as most have: the full model kept for
	// each Service was as large as the model built from it.
	plain plainBase
}

// oddities are what few Services' objects have: each held in every
// ServiceObject made it a size class larger.
type oddities struct {
	// proxyName is the service-proxy-name label, when hasProxyName.
	proxyName    string
	hasProxyName bool
	// skip is why the Service is never proxied, whatever the options.
	skip string
	err  error
}

func (o *ServiceObject) oddities() oddities {
	if o.odd == nil {
		return oddities{}
	}
	return *o.odd
}

func (o *ServiceObject) err() error {
	if o.odd == nil {
		return nil
	}
	return o.odd.err
}

// plainBase is the part of a Service's model most Services have; the
// others are kept whole.
type plainBase struct {
	created                      Instant
	clusterIPs                   []netip.Addr
	ports                        []ServicePort
	typ                          ServiceType
	ipv4, ipv6                   bool
	externalLocal, internalLocal bool
	ok                           bool // the Service is kept in this form
}

// plainOf returns s in its plain form; ok is false when s has anything
// the plain form leaves out.
func plainOf(s *Service) (p plainBase, ok bool) {
	p = plainBase{typ: s.Type, created: s.Created, clusterIPs: s.ClusterIPs, ports: s.Ports,
		ipv4: s.IPv4, ipv6: s.IPv6, externalLocal: s.ExternalLocal, internalLocal: s.InternalLocal, ok: true}
	rest := *s
	rest.Key, rest.Type, rest.Created, rest.ClusterIPs, rest.Ports = ServiceKey{}, 0, 0, nil, nil
	rest.IPv4, rest.IPv6, rest.ExternalLocal, rest.InternalLocal = false, false, false, false
	return p, reflect.ValueOf(rest).IsZero() // every other field, those added later too
}

// service is the model without endpoints.
func (p *plainBase) service(key ServiceKey) Service {
	return Service{Key: key, Type: p.typ, Created: p.created, ClusterIPs: p.clusterIPs, Ports: p.ports,
		IPv4: p.ipv4, IPv6: p.ipv6, ExternalLocal: p.externalLocal, InternalLocal: p.internalLocal}
}

// NewServiceObject converts a Service object. It never fails: an invalid
// Service keeps its error, for Build to report.
func NewServiceObject(svc *corev1.Service) *ServiceObject {
	ns := svc.Namespace
	if ns == "" {
		ns = "default"
	}
	o := &ServiceObject{Key: NewServiceKey(ns, svc.Name)}
	var odd oddities
	odd.proxyName, odd.hasProxyName = svc.Labels[LabelServiceProxyName]
	odd.err = validateServiceNames(svc, o.Key.Namespace())
	switch {
	case odd.err != nil:
		// refused by name, whatever else it is
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		odd.skip = "type ExternalName is resolved by DNS, not proxied"
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		odd.skip = "headless (clusterIP None)"
	default:
		o.base, odd.err = serviceBase(svc, o.Key)
		if o.base != nil {
			if p, ok := plainOf(o.base); ok {
				o.base, o.plain = nil, p
			}
		}
	}
	if odd.hasProxyName || odd.skip != "" || odd.err != nil {
		o.odd = &odd
	}
	return o
}

// InFile returns the object as read from the named file: an invalid
// Service's error names the file first, so that the operator knows which
// file to fix. A valid object is returned as it is.
func (o *ServiceObject) InFile(name string) *ServiceObject {
	if o.err() == nil {
		return o
	}
	c, odd := *o, *o.odd
	odd.err = fmt.Errorf("%s: %w", name, o.odd.err)
	c.odd = &odd
	return &c
}

// Skip tells why the Service is not proxied at all, or "" when it is.
func (o *ServiceObject) Skip(opts Options) string {
	odd := o.oddities()
	if odd.hasProxyName && odd.proxyName != opts.ProxyName {
		return fmt.Sprintf("label %s=%q names another proxy", LabelServiceProxyName, odd.proxyName)
	}
	return odd.skip
}

// serviceBase reads every field of a Service that the model holds, except
// its endpoints.
func serviceBase(svc *corev1.Service, key ServiceKey) (*Service, error) {
	errf := func(format string, args ...any) error {
		return fmt.Errorf("service %s: "+format, append([]any{key}, args...)...)
	}
	s := &Service{
		Key:                 key,
		Created:             InstantOf(svc.CreationTimestamp.Time),
		ExternalLocal:       svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
		InternalLocal:       svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		HealthCheckNodePort: 0,
	}
	var r Rare // what few Services have
	typ, err := ParseServiceType(string(svc.Spec.Type))
	if err != nil {
		return nil, errf("spec.type: %v", err)
	}
	s.Type = typ

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
		r.ExternalIPs = append(r.ExternalIPs, a)
	}
	if s.Type == TypeLoadBalancer {
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
			r.LoadBalancerIPs = append(r.LoadBalancerIPs, a)
		}
		for i, sr := range svc.Spec.LoadBalancerSourceRanges {
			p, err := netip.ParsePrefix(strings.TrimSpace(sr))
			if err != nil {
				return nil, errf("spec.loadBalancerSourceRanges[%d]: invalid CIDR %q", i, sr)
			}
			r.SourceRanges = append(r.SourceRanges, p.Masked())
		}
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		r.AffinityTimeout = DefaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t <= 0 || t > 86400 {
				return nil, errf("spec.sessionAffinityConfig.clientIP.timeoutSeconds: %d is out of range 1-86400", t)
			}
			r.AffinityTimeout = time.Duration(t) * time.Second
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
		sp := ServicePort{Name: intern(p.Name), Protocol: proto, Port: uint16(p.Port)}
		if s.Type != TypeClusterIP {
			sp.NodePort = uint16(p.NodePort)
		}
		s.Ports = append(s.Ports, sp)
	}

	s.Rare = &r
	s.TidyRare()
	readProxyProtocol(s, svc.Annotations[AnnotationProxyProtocol])
	readEndpointSelection(s, svc.Annotations[AnnotationEndpointSelection])

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
	return s, nil
}

// readEndpointSelection reads the endpoint selection annotation into s; a
// value it does not know is a warning, and the gateway's default applies.
func readEndpointSelection(s *Service, v string) {
	switch v {
	case "":
	case SelectionHash, SelectionMaglev:
		s.EditRare().EndpointSelection = v
	default:
		s.EditRare().Warnings = append(s.Warnings(), fmt.Sprintf("annotation %s: invalid value %q (want %q or %q); the gateway's endpoint_selection applies", AnnotationEndpointSelection, v, SelectionHash, SelectionMaglev))
	}
}

// readProxyProtocol reads the PROXY protocol annotation into s, with a
// warning for a value it does not know and for the ports it cannot serve:
// either is served without PROXY protocol, the rest of the Service as it is.
func readProxyProtocol(s *Service, v string) {
	if v == "" {
		return
	}
	switch v {
	case "v1":
		s.ProxyProtocol = 1
	case "v2":
		s.ProxyProtocol = 2
	default:
		s.EditRare().Warnings = append(s.Warnings(), fmt.Sprintf("annotation %s: invalid value %q (want \"v1\" or \"v2\"); served without PROXY protocol", AnnotationProxyProtocol, v))
		return
	}
	for _, p := range s.Ports {
		if p.Protocol != TCP {
			s.EditRare().Warnings = append(s.Warnings(), fmt.Sprintf("annotation %s: port %d/%s is served without PROXY protocol, which applies to TCP only", AnnotationProxyProtocol, p.Port, strings.ToUpper(p.Protocol.String())))
		}
	}
}

// Build makes the model of one Service from what is kept of its object and
// of every EndpointSlice labelled with its name. A malformed field is an
// error that names the field and the value; the caller keeps serving the
// Service's last good state, and every other Service, meanwhile.
func Build(o *ServiceObject, sliceList []*SliceObject, opts Options) (*Service, error) {
	if err := o.err(); err != nil {
		return nil, err
	}
	s := new(Service)
	switch {
	case o.base != nil:
		*s = *o.base // its slices are shared, and never modified
	case o.plain.ok:
		*s = o.plain.service(o.Key)
	default:
		return nil, fmt.Errorf("service %s: %s", o.Key, o.oddities().skip)
	}
	s.Ports = slices.Clone(s.Ports)
	if opts.ExternalOnly {
		s.ClusterIPs = nil
	}
	if opts.NoProxy && s.ProxyProtocol != 0 {
		s.ProxyProtocol = 0
		s.EditRare().Warnings = append(slices.Clip(s.Warnings()), fmt.Sprintf("annotation %s is not served: %s; served without PROXY protocol", AnnotationProxyProtocol, opts.NoProxyWhy))
	}
	// Slices in name order, so that an endpoint listed twice resolves the
	// same way on every sync, and the same error is reported.
	ordered := sliceList
	if len(sliceList) > 1 {
		ordered = slices.Clone(sliceList)
		slices.SortFunc(ordered, func(a, b *SliceObject) int { return cmp.Compare(a.Name, b.Name) })
	}
	for _, sl := range ordered {
		if err := sl.sliceErr(); err != nil {
			return nil, fmt.Errorf("service %s: %v", o.Key, err)
		}
	}
	// Each slice port that names a Service port, in slice order: one
	// pass over the slices, whatever the number of ports.
	serving := map[portKey][]servingPort{}
	for _, sl := range ordered {
		if sl.fqdn {
			continue
		}
		for _, port := range sl.ports {
			k := portKey{port.name, port.proto}
			serving[k] = append(serving[k], servingPort{sl, port.port})
		}
	}
	for i := range s.Ports {
		sp := &s.Ports[i]
		from := serving[portKey{sp.Name, sp.Protocol}]
		if len(from) == 1 && len(from[0].slice.ports) == 1 && len(from[0].slice.endpoints) > 0 {
			// Served by one slice that has no other port: its
			// endpoints are the port's, as they are, shared with the
			// slice (neither is ever modified).
			sp.Endpoints = from[0].slice.endpoints
			continue
		}
		n := 0
		for _, f := range from {
			n += len(f.slice.endpoints)
		}
		if n == 0 {
			continue
		}
		sp.Endpoints = make([]Endpoint, 0, n)
		for _, f := range from {
			for _, e := range f.slice.endpoints {
				e.Port = f.port
				sp.Endpoints = append(sp.Endpoints, e)
			}
		}
		// The same endpoint listed in two slices (as happens while a
		// slice is being replaced) is used once.
		sp.Endpoints = sortUnique(sp.Endpoints)
	}
	return s, nil
}

type portKey struct {
	name  string
	proto Protocol
}

// servingPort is a slice that serves a Service port, and the port number
// it gives it.
type servingPort struct {
	slice *SliceObject
	port  uint16
}

// compareAddrPorts orders endpoints by address and port. It is a variable
// only so that a test can count the comparisons a build makes.
var compareAddrPorts = netip.AddrPort.Compare

// sortUnique sorts endpoints by address and port and keeps one listing of
// each: the first ready one, else the first. It sorts their keys, not the
// endpoints themselves (n log n small moves), and returns a new slice
// unless eps is sorted and unique already, as a slice's own list mostly is.
func sortUnique(eps []Endpoint) []Endpoint {
	type ranked struct {
		ap  netip.AddrPort
		pos int32
	}
	keys := make([]ranked, len(eps))
	sorted := true
	for i := range eps {
		keys[i] = ranked{eps[i].AddrPort(), int32(i)}
		if i > 0 && sorted {
			sorted = compareAddrPorts(keys[i-1].ap, keys[i].ap) < 0
		}
	}
	if sorted {
		return eps
	}
	// Equal keys stay in their order: the first listing comes first.
	slices.SortFunc(keys, func(a, b ranked) int {
		if c := compareAddrPorts(a.ap, b.ap); c != 0 {
			return c
		}
		return cmp.Compare(a.pos, b.pos)
	})
	out := make([]Endpoint, 0, len(eps))
	for i := 0; i < len(keys); {
		j, keep := i+1, keys[i].pos
		for ; j < len(keys) && keys[j].ap == keys[i].ap; j++ {
			if eps[keys[j].pos].Ready && !eps[keep].Ready {
				keep = keys[j].pos
			}
		}
		out = append(out, eps[keep])
		i = j
	}
	return out
}

// SliceObject is what nftgate keeps of an EndpointSlice object between
// syncs: its endpoints with their ports unresolved, the Service it belongs
// to, or what is wrong with it. A SliceObject is never modified.
type SliceObject struct {
	Name string
	ns   unique.Handle[string] // the namespace, one copy for all
	// trigger is the slice's last-change-trigger-time annotation (Unix
	// nanoseconds): when the change that led to it happened; zero when
	// unknown. Kept as a number: a time.Time made every slice kept a size
	// class larger.
	trigger int64

	ports []slicePort // the ports with a number
	// endpoints are the slice's endpoints, each address once, in address
	// order. With one port (as most slices have) their Port is set, and a
	// Service port served by this slice alone shares the array instead of
	// copying it; with several, mergeSlice sets it per port.
	endpoints []Endpoint
	// odd holds what few slices have: a Service name that does not start
	// the slice's name, an error; nil when none. Held in every slice,
	// they made it a size class larger.
	odd *sliceOddities
	// serviceLen is the length of the name of the Service the slice
	// belongs to (its kubernetes.io/service-name label), which starts
	// the slice's own name, unless odd names it; hasService is false
	// without one.
	serviceLen uint8
	hasService bool
	fqdn       bool // addressType FQDN: not proxied
}

type sliceOddities struct {
	service string
	err     error
}

// Namespace is the slice's namespace.
func (o *SliceObject) Namespace() string {
	if o.ns == (unique.Handle[string]{}) {
		return "" // a SliceObject not made by NewSliceObject
	}
	return o.ns.Value()
}

// service is the name of the Service the slice belongs to.
func (o *SliceObject) service() string {
	if o.odd != nil && o.odd.service != "" {
		return o.odd.service
	}
	return o.Name[:o.serviceLen]
}

// sliceErr is what is wrong with the slice, or nil.
func (o *SliceObject) sliceErr() error {
	if o.odd == nil {
		return nil
	}
	return o.odd.err
}

// setOdd changes the oddities of a slice being made.
func (o *SliceObject) setOdd(change func(*sliceOddities)) {
	var odd sliceOddities
	if o.odd != nil {
		odd = *o.odd
	}
	change(&odd)
	o.odd = nil
	if odd.service != "" || odd.err != nil {
		o.odd = &odd
	}
}

type slicePort struct {
	name  string
	proto Protocol
	port  uint16
}

// Service is the Service the slice belongs to; ok is false when its
// kubernetes.io/service-name label names none.
func (o *SliceObject) Service() (k ServiceKey, ok bool) {
	return NewServiceKey(o.Namespace(), o.service()), o.hasService
}

// Trigger is the slice's last-change-trigger-time annotation: when the
// change that led to it happened; zero when unknown.
func (o *SliceObject) Trigger() time.Time {
	if o.trigger == 0 {
		return time.Time{}
	}
	return time.Unix(0, o.trigger)
}

// InFile returns the slice as read from the named file: an invalid
// slice's error names the file first. A valid slice is returned as it is.
func (o *SliceObject) InFile(name string) *SliceObject {
	err := o.sliceErr()
	if err == nil {
		return o
	}
	c := *o
	c.setOdd(func(odd *sliceOddities) { odd.err = fmt.Errorf("%s: %w", name, err) })
	return &c
}

// SliceService returns the Service an EndpointSlice belongs to, from its
// kubernetes.io/service-name label.
func SliceService(sl *discoveryv1.EndpointSlice) (ServiceKey, bool) {
	name, ok := sl.Labels[LabelServiceName]
	if !ok || name == "" {
		return ServiceKey{}, false
	}
	return NewServiceKey(intern(sl.Namespace), name), true
}

// NewSliceObject converts an EndpointSlice object. It never fails: an
// invalid slice keeps its error, for Build to report for its Service.
func NewSliceObject(sl *discoveryv1.EndpointSlice) *SliceObject {
	o := &SliceObject{Name: sl.Name, ns: unique.Make(sl.Namespace)}
	if name := sl.Labels[LabelServiceName]; name != "" {
		// A slice's name is most often its Service's followed by a
		// suffix: the Service's name is then kept as part of it rather
		// than in a string of its own.
		if strings.HasPrefix(sl.Name, name) && len(name) <= math.MaxUint8 {
			o.serviceLen = uint8(len(name))
		} else {
			o.setOdd(func(odd *sliceOddities) { odd.service = name })
		}
		o.hasService = true
	}
	if ts, ok := sl.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		if tt, err := time.Parse(time.RFC3339Nano, ts); err == nil && !tt.IsZero() {
			o.trigger = tt.UnixNano()
		}
	}
	err := validateSliceNames(sl)
	if err == nil {
		err = o.read(sl)
	}
	if err != nil {
		o.ports, o.endpoints = nil, nil
		o.setOdd(func(odd *sliceOddities) { odd.err = err })
	}
	return o
}

func (o *SliceObject) read(sl *discoveryv1.EndpointSlice) error {
	switch sl.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
	case discoveryv1.AddressTypeFQDN:
		o.fqdn = true // kube-proxy ignores FQDN slices as well
		return nil
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
		o.ports = append(o.ports, slicePort{name: intern(ptrString(port.Name)), proto: proto, port: uint16(*port.Port)})
	}
	o.endpoints = make([]Endpoint, 0, len(sl.Endpoints))
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
		e := Endpoint{}.WithAddr(a)
		// The API's rules: a nil ready or serving means true, a nil
		// terminating means false.
		e.Ready = ep.Conditions.Ready == nil || *ep.Conditions.Ready
		e.Serving = true
		if ep.Conditions.Serving != nil {
			e.Serving = *ep.Conditions.Serving
		}
		e.Terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
		var node, zone string
		var forZones, forNodes []string
		if ep.NodeName != nil {
			node = *ep.NodeName
		}
		if ep.Zone != nil {
			zone = *ep.Zone
		}
		if h := ep.Hints; h != nil {
			for _, z := range h.ForZones {
				forZones = append(forZones, z.Name)
			}
			for _, n := range h.ForNodes {
				forNodes = append(forNodes, n.Name)
			}
		}
		e.Place = NewPlace(node, zone, forZones, forNodes)
		if len(o.ports) == 1 {
			e.Port = o.ports[0].port
		}
		o.endpoints = append(o.endpoints, e)
	}
	// Each address once (every endpoint of the slice has the same Port
	// here): the first ready listing, else the first.
	o.endpoints = sortUnique(o.endpoints)
	return nil
}

// intern returns one copy of a string that repeats across thousands of
// objects (namespaces, types, port, node and zone names): each object
// decoded holds its own otherwise.
func intern(s string) string { return unique.Make(s).Value() }

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
