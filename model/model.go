// Package model is nftgate's view of a cluster's Services: what the gateway
// must proxy, stripped of everything Kubernetes-specific that the ruleset does
// not need. Sources (the Kubernetes API, a directory of manifests) produce it;
// the ruleset renderer consumes it. Nothing here talks to the kernel.
package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
	"unique"
)

// ServiceKey names a Service: its namespace and name, in one string (the
// namespace's length as a uvarint, the namespace, the name). Every map
// keyed by Service and every claim on a map element holds one: two
// strings made each of those 16 bytes larger, 10 MB at 100,000 Services.
// The zero key has an empty namespace and name.
type ServiceKey struct{ s string }

// NewServiceKey returns the key of Service name in namespace.
func NewServiceKey(namespace, name string) ServiceKey {
	if namespace == "" && name == "" {
		return ServiceKey{}
	}
	var n [binary.MaxVarintLen64]byte
	prefix := binary.PutUvarint(n[:], uint64(len(namespace)))
	var b strings.Builder // one allocation: its String does not copy
	b.Grow(prefix + len(namespace) + len(name))
	b.Write(n[:prefix])
	b.WriteString(namespace)
	b.WriteString(name)
	return ServiceKey{b.String()}
}

// split returns the namespace and the name.
func (k ServiceKey) split() (namespace, name string) {
	if k.s == "" {
		return "", ""
	}
	var n uint64
	for i, shift := 0, uint(0); i < len(k.s); i, shift = i+1, shift+7 {
		b := k.s[i]
		n |= uint64(b&0x7f) << shift
		if b < 0x80 {
			rest := k.s[i+1:]
			return rest[:n], rest[n:]
		}
	}
	return "", "" // not made by NewServiceKey
}

// Namespace is the Service's namespace.
func (k ServiceKey) Namespace() string { ns, _ := k.split(); return ns }

// Name is the Service's name.
func (k ServiceKey) Name() string { _, name := k.split(); return name }

func (k ServiceKey) String() string { ns, name := k.split(); return ns + "/" + name }

// Less orders keys by namespace, then name.
func (k ServiceKey) Less(o ServiceKey) bool {
	kns, kname := k.split()
	ons, oname := o.split()
	if kns != ons {
		return kns < ons
	}
	return kname < oname
}

// Protocol is an IP protocol number of a Service port.
type Protocol uint8

// The protocols a Service port can carry.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// KubeName is the protocol as the Kubernetes API spells it ("TCP"), the
// inverse of ParseProtocol.
func (p Protocol) KubeName() string { return strings.ToUpper(p.String()) }

// ParseProtocol reads a Kubernetes protocol name ("TCP", "UDP", "SCTP"; empty
// means TCP, as the API server defaults it).
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "", "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want TCP, UDP or SCTP)", s)
}

// ServiceType is a proxied Service's spec.type. The zero ServiceType is
// none: a Service made without one.
type ServiceType uint8

const (
	TypeClusterIP ServiceType = iota + 1
	TypeNodePort
	TypeLoadBalancer
)

var serviceTypeNames = [...]string{TypeClusterIP: "ClusterIP", TypeNodePort: "NodePort", TypeLoadBalancer: "LoadBalancer"}

// String is the type as spec.type spells it; empty for none.
func (t ServiceType) String() string {
	if int(t) < len(serviceTypeNames) {
		return serviceTypeNames[t]
	}
	return fmt.Sprintf("ServiceType(%d)", t)
}

// ParseServiceType reads a spec.type; an empty one is ClusterIP, as the
// API server defaults it. ExternalName and unknown types are not proxied.
func ParseServiceType(s string) (ServiceType, error) {
	if s == "" {
		return TypeClusterIP, nil
	}
	for t, name := range serviceTypeNames {
		if name != "" && name == s {
			return ServiceType(t), nil
		}
	}
	return 0, fmt.Errorf("unknown type %q", s)
}

// Instant is a time as Unix nanoseconds, clamped to what they hold: a time
// outside 1678-2262, and the zero time (unknown), orders before or after
// every other.
type Instant int64

var minInstant, maxInstant = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

// InstantOf returns t as an Instant.
func InstantOf(t time.Time) Instant {
	switch {
	case t.Before(minInstant):
		return math.MinInt64
	case t.After(maxInstant):
		return math.MaxInt64
	}
	return Instant(t.UnixNano())
}

// Service is one proxied Service with the endpoints of all its slices merged.
// There is one for every Service: its small fields are together, so that
// it fits a smaller size class.
type Service struct {
	Key ServiceKey
	// Created orders Services that claim the same address and port: the
	// older one keeps it, as the API server's allocator would have it.
	// It is an Instant: a time.Time made every Service and every object
	// kept a size class larger.
	Created Instant
	Type    ServiceType

	// IPv4 and IPv6 tell which families the Service has (spec.ipFamilies).
	// A family it lacks gets nothing from it, NodePorts included.
	IPv4, IPv6 bool
	// ExternalLocal is externalTrafficPolicy Local: NodePort, ExternalIP and
	// LoadBalancer traffic goes only to endpoints on this gateway's node.
	ExternalLocal bool
	// InternalLocal is internalTrafficPolicy Local, the same for ClusterIPs.
	InternalLocal bool
	// ProxyProtocol is the PROXY protocol version (1 or 2) the Service asks
	// its TCP connections from outside the cluster to carry
	// (AnnotationProxyProtocol); zero for none.
	ProxyProtocol       uint8
	HealthCheckNodePort uint16

	ClusterIPs []netip.Addr // empty when the gateway must not expose ClusterIPs
	Ports      []ServicePort

	// Rare holds what few Services have; nil when none of it is set. It
	// is shared by copies of the Service: change it with EditRare.
	Rare *Rare
}

// Rare is the part of a Service's model that few Services have: held in
// every Service, it was 120 of its 248 bytes.
type Rare struct {
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr // status ingress IPs, except ipMode Proxy
	// SourceRanges restrict who may reach the LoadBalancer IPs; empty allows all.
	SourceRanges []netip.Prefix

	// AffinityTimeout is the ClientIP session affinity timeout; zero means
	// no affinity.
	AffinityTimeout time.Duration

	// EndpointSelection is how the Service asks its endpoints to be
	// chosen (AnnotationEndpointSelection): SelectionHash,
	// SelectionMaglev, or empty for the gateway's default.
	EndpointSelection string
	// Warnings say what the Service asks for that is not served as asked,
	// and why (an annotation with an invalid value, say); the Service is
	// served as though it had not asked.
	Warnings []string
}

// EditRare returns s's rare fields to change: a copy of them, which s
// holds from then on (copies of s made before keep theirs).
func (s *Service) EditRare() *Rare {
	r := &Rare{}
	if s.Rare != nil {
		*r = *s.Rare
	}
	s.Rare = r
	return r
}

// TidyRare drops the rare fields when none is set, so that a Service
// without them compares equal to one that never had them.
func (s *Service) TidyRare() {
	if s.Rare != nil && reflect.ValueOf(*s.Rare).IsZero() {
		s.Rare = nil
	}
}

// ExternalIPs are the Service's spec.externalIPs.
func (s *Service) ExternalIPs() []netip.Addr {
	if s.Rare == nil {
		return nil
	}
	return s.Rare.ExternalIPs
}

// LoadBalancerIPs are the Service's status ingress IPs, except ipMode Proxy.
func (s *Service) LoadBalancerIPs() []netip.Addr {
	if s.Rare == nil {
		return nil
	}
	return s.Rare.LoadBalancerIPs
}

// SourceRanges restrict who may reach the LoadBalancer IPs; empty allows all.
func (s *Service) SourceRanges() []netip.Prefix {
	if s.Rare == nil {
		return nil
	}
	return s.Rare.SourceRanges
}

// AffinityTimeout is the ClientIP session affinity timeout; zero means no
// affinity.
func (s *Service) AffinityTimeout() time.Duration {
	if s.Rare == nil {
		return 0
	}
	return s.Rare.AffinityTimeout
}

// EndpointSelection is how the Service asks its endpoints to be chosen;
// empty for the gateway's default.
func (s *Service) EndpointSelection() string {
	if s.Rare == nil {
		return ""
	}
	return s.Rare.EndpointSelection
}

// Warnings say what the Service asks for that is not served as asked.
func (s *Service) Warnings() []string {
	if s.Rare == nil {
		return nil
	}
	return s.Rare.Warnings
}

// ServicePort is one port of a Service and the endpoints that serve it.
type ServicePort struct {
	Name      string
	Protocol  Protocol
	Port      uint16
	NodePort  uint16 // zero when none
	Endpoints []Endpoint
}

// Endpoint is one backend of a ServicePort, with the port resolved from its
// EndpointSlice (named target ports can differ from slice to slice). Its
// address is kept as its sixteen bytes and its family (Addr, SetAddr,
// WithAddr): a netip.Addr is 24 bytes, and made every endpoint 40 where
// it is 32.
type Endpoint struct {
	addr        [16]byte
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	fam         uint8 // 4 or 6; 0 for no address
	// Place is where the endpoint runs (its node and zone) and where its
	// topology hints say it should receive traffic from.
	Place Place
}

// Addr is the endpoint's address.
func (e Endpoint) Addr() netip.Addr {
	switch e.fam {
	case 4:
		return netip.AddrFrom4([4]byte(e.addr[12:]))
	case 6:
		return netip.AddrFrom16(e.addr)
	}
	return netip.Addr{}
}

// SetAddr sets the endpoint's address (without a zone: endpoints have
// none).
func (e *Endpoint) SetAddr(a netip.Addr) {
	e.addr, e.fam = [16]byte{}, 0
	switch {
	case a.Is4():
		e.addr, e.fam = a.As16(), 4
	case a.Is6():
		e.addr, e.fam = a.As16(), 6
	}
}

// WithAddr returns e with address a.
func (e Endpoint) WithAddr(a netip.Addr) Endpoint {
	e.SetAddr(a)
	return e
}

// Place is where an endpoint runs, its node and zone, and the topology
// hints of its EndpointSlice (hints.forZones and hints.forNodes). It is a
// handle to one copy shared by every endpoint in the same place: a
// cluster's endpoints are in a few places, and the names held in every
// endpoint were 40 of its 72 bytes. The zero Place knows nothing.
type Place struct{ h unique.Handle[place] }

// place is a Place's value. The hints are names each led by its length (a
// varint), so that the value is comparable, as a handle's must be, and
// holds any name.
type place struct {
	node, zone         string
	forZones, forNodes string
}

// NewPlace returns the place of an endpoint on a node in a zone (either
// may be empty) that its slice hints for the given zones and nodes.
func NewPlace(node, zone string, forZones, forNodes []string) Place {
	v := place{node: node, zone: zone, forZones: joinNames(forZones), forNodes: joinNames(forNodes)}
	if v == (place{}) {
		return Place{}
	}
	return Place{unique.Make(v)}
}

// On is the place of an endpoint on a node, without zone or hints.
func On(node string) Place { return NewPlace(node, "", nil, nil) }

func (p Place) value() place {
	if p.h == (unique.Handle[place]{}) {
		return place{}
	}
	return p.h.Value()
}

// Node is the name of the node the endpoint runs on; empty when unknown.
func (p Place) Node() string { return p.value().node }

// Zone is the zone the endpoint runs in; empty when unknown.
func (p Place) Zone() string { return p.value().zone }

// ForZones are the zones the endpoint is meant for, if any.
func (p Place) ForZones() []string { return splitNames(p.value().forZones) }

// ForNodes are the nodes the endpoint is meant for, if any.
func (p Place) ForNodes() []string { return splitNames(p.value().forNodes) }

// WithHints returns the place with other hints.
func (p Place) WithHints(forZones, forNodes []string) Place {
	v := p.value()
	return NewPlace(v.node, v.zone, forZones, forNodes)
}

func (p Place) String() string {
	v := p.value()
	return fmt.Sprintf("{node:%q zone:%q forZones:%q forNodes:%q}", v.node, v.zone, p.ForZones(), p.ForNodes())
}

func joinNames(names []string) string {
	var b []byte
	for _, n := range names {
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
	}
	return string(b)
}

// eachName calls yield with each name of joined, until it returns false.
func eachName(joined string, yield func(string) bool) {
	for joined != "" {
		n, w := binary.Uvarint([]byte(joined[:min(len(joined), binary.MaxVarintLen64)]))
		if w <= 0 || n > uint64(len(joined)-w) {
			return // not made by joinNames
		}
		if !yield(joined[w : w+int(n)]) {
			return
		}
		joined = joined[w+int(n):]
	}
}

func splitNames(joined string) []string {
	var out []string
	eachName(joined, func(n string) bool { out = append(out, n); return true })
	return out
}

// hinted tells whether the hints are for name (without splitting them).
func hinted(joined, name string) bool {
	found := false
	eachName(joined, func(n string) bool { found = n == name; return !found })
	return found
}

// ZoneHints are the zones the endpoint is meant for, if any.
func (e *Endpoint) ZoneHints() []string { return e.Place.ForZones() }

// NodeHints are the nodes the endpoint is meant for, if any.
func (e *Endpoint) NodeHints() []string { return e.Place.ForNodes() }

// OfFamily is the port with only its endpoints of one family (IPv6 or
// IPv4): endpoints are chosen per family, as kube-proxy does. The port is
// returned as it is when all its endpoints are of that family already.
func (p *ServicePort) OfFamily(ipv6 bool) ServicePort {
	out := *p
	if !slices.ContainsFunc(p.Endpoints, func(e Endpoint) bool { return e.Addr().Is6() != ipv6 }) {
		return out
	}
	out.Endpoints = make([]Endpoint, 0, len(p.Endpoints))
	for _, e := range p.Endpoints {
		if e.Addr().Is6() == ipv6 {
			out.Endpoints = append(out.Endpoints, e)
		}
	}
	return out
}

// Proxied tells whether the PROXY protocol proxy serves the port's
// connections from outside the cluster: the Service asks for it and the
// port is TCP.
func (s *Service) Proxied(p *ServicePort) bool {
	return s.ProxyProtocol != 0 && p.Protocol == TCP
}

// Ways of choosing an endpoint for a new connection.
const (
	SelectionHash   = "hash"
	SelectionMaglev = "maglev"
)

// Maglev tells whether the Service's endpoints are chosen by a Maglev
// table, given the gateway's default selection.
func (s *Service) Maglev(def string) bool {
	if s.EndpointSelection() != "" {
		return s.EndpointSelection() == SelectionMaglev
	}
	return def == SelectionMaglev
}

// AddrPort is the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr(), e.Port) }

// ExternallyAccessible tells whether the Service is reachable from outside the
// cluster through a NodePort, an ExternalIP or a LoadBalancer IP.
func (s *Service) ExternallyAccessible() bool {
	if len(s.ExternalIPs()) > 0 || len(s.LoadBalancerIPs()) > 0 {
		return true
	}
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			return true
		}
	}
	return false
}

// HasFamily tells whether the Service exists in IPv6 (or IPv4).
func (s *Service) HasFamily(ipv6 bool) bool {
	if !s.IPv4 && !s.IPv6 {
		return true // families not known: wherever its addresses are
	}
	if ipv6 {
		return s.IPv6
	}
	return s.IPv4
}
