// Package model is nftgate's view of a cluster's Services: what the gateway
// must proxy, stripped of everything Kubernetes-specific that the ruleset does
// not need. Sources (the Kubernetes API, a directory of manifests) produce it;
// the ruleset renderer consumes it. Nothing here talks to the kernel.
package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// ServiceKey names a Service.
type ServiceKey struct {
	Namespace string
	Name      string
}

func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// Less orders keys by namespace, then name.
func (k ServiceKey) Less(o ServiceKey) bool {
	if k.Namespace != o.Namespace {
		return k.Namespace < o.Namespace
	}
	return k.Name < o.Name
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

// Service is one proxied Service with the endpoints of all its slices merged.
type Service struct {
	Key  ServiceKey
	Type string // ClusterIP, NodePort or LoadBalancer
	// Created orders Services that claim the same address and port: the
	// older one keeps it, as the API server's allocator would have it.
	Created time.Time

	// IPv4 and IPv6 tell which families the Service has (spec.ipFamilies).
	// A family it lacks gets nothing from it, NodePorts included.
	IPv4, IPv6 bool

	ClusterIPs      []netip.Addr // empty when the gateway must not expose ClusterIPs
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr // status ingress IPs, except ipMode Proxy
	// SourceRanges restrict who may reach the LoadBalancer IPs; empty allows all.
	SourceRanges []netip.Prefix

	Ports []ServicePort

	// AffinityTimeout is the ClientIP session affinity timeout; zero means
	// no affinity.
	AffinityTimeout time.Duration
	// ExternalLocal is externalTrafficPolicy Local: NodePort, ExternalIP and
	// LoadBalancer traffic goes only to endpoints on this gateway's node.
	ExternalLocal bool
	// InternalLocal is internalTrafficPolicy Local, the same for ClusterIPs.
	InternalLocal       bool
	HealthCheckNodePort uint16
	TrafficDistribution string

	// ProxyProtocol is the PROXY protocol version (1 or 2) the Service asks
	// its TCP connections from outside the cluster to carry
	// (AnnotationProxyProtocol); zero for none.
	ProxyProtocol uint8
	// EndpointSelection is how the Service asks its endpoints to be
	// chosen (AnnotationEndpointSelection): SelectionHash,
	// SelectionMaglev, or empty for the gateway's default.
	EndpointSelection string
	// Warnings say what the Service asks for that is not served as asked,
	// and why (an annotation with an invalid value, say); the Service is
	// served as though it had not asked.
	Warnings []string
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
// EndpointSlice (named target ports can differ from slice to slice).
type Endpoint struct {
	Addr        netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	// Hints are the endpoint's topology hints; nil when it has none, as
	// most have (a pointer keeps every endpoint 40 bytes smaller).
	Hints *Hints
}

// Hints are where an endpoint should receive traffic from (its
// EndpointSlice's hints.forZones and hints.forNodes).
type Hints struct {
	Zones []string
	Nodes []string
}

// ZoneHints are the zones the endpoint is meant for, if any.
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints are the nodes the endpoint is meant for, if any.
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// OfFamily is the port with only its endpoints of one family (IPv6 or
// IPv4): endpoints are chosen per family, as kube-proxy does. The port is
// returned as it is when all its endpoints are of that family already.
func (p *ServicePort) OfFamily(ipv6 bool) ServicePort {
	out := *p
	if !slices.ContainsFunc(p.Endpoints, func(e Endpoint) bool { return e.Addr.Is6() != ipv6 }) {
		return out
	}
	out.Endpoints = make([]Endpoint, 0, len(p.Endpoints))
	for _, e := range p.Endpoints {
		if e.Addr.Is6() == ipv6 {
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
	if s.EndpointSelection != "" {
		return s.EndpointSelection == SelectionMaglev
	}
	return def == SelectionMaglev
}

// AddrPort is the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// ExternallyAccessible tells whether the Service is reachable from outside the
// cluster through a NodePort, an ExternalIP or a LoadBalancer IP.
func (s *Service) ExternallyAccessible() bool {
	if len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0 {
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
