package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifests is what the demo needs from a manifest directory.
type manifests struct {
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
}

// loadManifests reads every .yaml, .yml and .json file in dir (not
// recursing), each holding any number of documents as `kubectl apply -f`
// takes them. Services and EndpointSlices are kept; other kinds are skipped.
func loadManifests(dir string) (*manifests, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("manifests: %w", err)
	}
	m := &manifests{}
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("manifests: %w", err)
		}
		if err := m.add(path, data); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *manifests) add(path string, data []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			return fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		where := fmt.Sprintf("%s: document %d (%s)", path, doc, tm.Kind)
		switch {
		case tm.Kind == "Service" && tm.APIVersion == "v1":
			var s corev1.Service
			if err := yaml.UnmarshalStrict(raw, &s); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			m.Services = append(m.Services, &s)
		case tm.Kind == "EndpointSlice" && tm.APIVersion == "discovery.k8s.io/v1":
			var s discoveryv1.EndpointSlice
			if err := yaml.UnmarshalStrict(raw, &s); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			m.EndpointSlices = append(m.EndpointSlices, &s)
		case tm.Kind == "":
			return fmt.Errorf("%s: document %d: no kind", path, doc)
		}
	}
}

// stripComments drops comment lines and document separators, to tell an
// empty document from a real one.
func stripComments(doc []byte) []byte {
	var out []byte
	for line := range bytes.Lines(doc) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' && !bytes.HasPrefix(t, []byte("---")) {
			out = append(out, line...)
		}
	}
	return out
}

// backend is one echo server the demo runs for an endpoint.
type backend struct {
	Proto string // "tcp" or "udp"
	Addr  netip.AddrPort
}

// backends lists every endpoint address and port of the slices once, in a
// stable order. Ports of other protocols (SCTP) are skipped.
func (m *manifests) backends() ([]backend, error) {
	seen := map[backend]bool{}
	var out []backend
	for _, s := range m.EndpointSlices {
		where := "EndpointSlice " + s.Namespace + "/" + s.Name
		for pi, p := range s.Ports {
			if p.Port == nil {
				continue
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP {
				continue
			}
			if *p.Port < 1 || *p.Port > 65535 {
				return nil, fmt.Errorf("%s: ports[%d].port %d: want 1-65535", where, pi, *p.Port)
			}
			for ei, e := range s.Endpoints {
				for ai, a := range e.Addresses {
					ip, err := netip.ParseAddr(a)
					if err != nil {
						return nil, fmt.Errorf("%s: endpoints[%d].addresses[%d] %q: not an IP address", where, ei, ai, a)
					}
					b := backend{Proto: strings.ToLower(string(proto)), Addr: netip.AddrPortFrom(ip.Unmap(), uint16(*p.Port))}
					if !seen[b] {
						seen[b] = true
						out = append(out, b)
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].Addr.Compare(out[j].Addr); c != 0 {
			return c < 0
		}
		return out[i].Proto < out[j].Proto
	})
	return out, nil
}

// probeTarget is one way to reach one service port from the client.
type probeTarget struct {
	Service string // namespace/name:port-name
	Kind    string // ClusterIP, ExternalIP, LoadBalancer, NodePort
	Proto   string
	Dst     netip.AddrPort
}

// probeTargets lists every address a client may use for every service port:
// cluster IPs, external IPs, load-balancer ingress IPs and, for NodePorts,
// nodeIP:nodePort.
func (m *manifests) probeTargets(nodeIP netip.Addr) []probeTarget {
	var out []probeTarget
	for _, s := range m.Services {
		for _, p := range s.Spec.Ports {
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			if proto != "tcp" && proto != "udp" {
				continue
			}
			name := s.Namespace + "/" + s.Name + ":" + p.Name
			add := func(kind, ip string, port int32) {
				a, err := netip.ParseAddr(ip)
				if err != nil || port <= 0 || port > 65535 {
					return
				}
				out = append(out, probeTarget{name, kind, proto, netip.AddrPortFrom(a, uint16(port))})
			}
			ips := s.Spec.ClusterIPs
			if len(ips) == 0 && s.Spec.ClusterIP != "" {
				ips = []string{s.Spec.ClusterIP}
			}
			for _, ip := range ips {
				if ip != corev1.ClusterIPNone {
					add("ClusterIP", ip, p.Port)
				}
			}
			for _, ip := range s.Spec.ExternalIPs {
				add("ExternalIP", ip, p.Port)
			}
			if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
				for _, ing := range s.Status.LoadBalancer.Ingress {
					add("LoadBalancer", ing.IP, p.Port)
				}
			}
			if p.NodePort != 0 && slices.Contains([]corev1.ServiceType{corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}, s.Spec.Type) {
				add("NodePort", nodeIP.String(), p.NodePort)
			}
		}
	}
	return out
}
