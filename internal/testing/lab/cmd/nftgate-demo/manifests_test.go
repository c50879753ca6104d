package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/repo"
)

// The example manifests are what the demo and the docs show; they must be
// consistent the way a real cluster's objects are.
func TestExampleManifestsAreConsistent(t *testing.T) {
	m, err := loadManifests(repo.Path(t, "examples", "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	services := map[string]*corev1.Service{}
	for _, s := range m.Services {
		services[s.Namespace+"/"+s.Name] = s
	}
	slicesOf := map[string][]*discoveryv1.EndpointSlice{}
	for _, es := range m.EndpointSlices {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			t.Errorf("EndpointSlice %s/%s has no %s label", es.Namespace, es.Name, discoveryv1.LabelServiceName)
			continue
		}
		key := es.Namespace + "/" + svc
		s, ok := services[key]
		if !ok {
			t.Errorf("EndpointSlice %s/%s belongs to unknown service %s", es.Namespace, es.Name, key)
			continue
		}
		slicesOf[key] = append(slicesOf[key], es)
		portNames := map[string]bool{}
		for _, p := range s.Spec.Ports {
			portNames[p.Name] = true
		}
		for _, p := range es.Ports {
			if p.Name == nil || !portNames[*p.Name] {
				t.Errorf("EndpointSlice %s/%s: port %v matches no port name of service %s", es.Namespace, es.Name, p.Name, key)
			}
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready == nil || !*e.Conditions.Ready {
				t.Errorf("EndpointSlice %s/%s: endpoint %v not ready", es.Namespace, es.Name, e.Addresses)
			}
			for _, a := range e.Addresses {
				ip := netip.MustParseAddr(a)
				if ip.Is4() != (es.AddressType == discoveryv1.AddressTypeIPv4) {
					t.Errorf("EndpointSlice %s/%s: address %s does not match addressType %s", es.Namespace, es.Name, a, es.AddressType)
				}
				if !lab.BackendNet4.Contains(ip) && !lab.BackendNet6.Contains(ip) {
					t.Errorf("EndpointSlice %s/%s: address %s outside the lab's backend networks", es.Namespace, es.Name, a)
				}
			}
		}
	}
	kinds := map[string]bool{}
	onGateway := 0
	for key, s := range services {
		for _, ip := range s.Spec.ClusterIPs {
			a := netip.MustParseAddr(ip)
			if !lab.VIPNet4.Contains(a) && !lab.VIPNet6.Contains(a) {
				t.Errorf("service %s: cluster IP %s outside the VIP ranges", key, ip)
			}
		}
		kinds[string(s.Spec.Type)] = true
		if len(s.Spec.ExternalIPs) > 0 {
			kinds["ExternalIP"] = true
		}
		if len(slicesOf[key]) == 0 {
			t.Errorf("service %s has no EndpointSlice", key)
		}
		n := 0
		for _, es := range slicesOf[key] {
			n += len(es.Endpoints)
			for _, e := range es.Endpoints {
				if e.NodeName != nil && *e.NodeName == "gateway" {
					onGateway++
				}
			}
		}
		if n == 0 {
			kinds["no endpoints"] = true
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.StrVal != "" {
				kinds["named targetPort"] = true
			}
			if p.Protocol == corev1.ProtocolUDP {
				kinds["UDP"] = true
			}
		}
		if len(s.Spec.ClusterIPs) == 2 {
			kinds["dual-stack"] = true
		}
	}
	for _, want := range []string{"ClusterIP", "NodePort", "LoadBalancer", "ExternalIP", "named targetPort", "UDP", "no endpoints", "dual-stack"} {
		if !kinds[want] {
			t.Errorf("examples lack a %s service", want)
		}
	}
	if onGateway == 0 {
		t.Error("no example endpoint runs on node gateway")
	}

	backends, err := m.backends()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"tcp 198.18.2.10:8080": true, "udp 198.18.2.13:5353": true, "tcp 198.18.2.21:3587": true, "tcp [fd42:2::22]:8080": true}
	for _, b := range backends {
		delete(want, b.Proto+" "+b.Addr.String())
	}
	if len(want) > 0 {
		t.Errorf("backends %v lack %v", backends, want)
	}

	targets := m.probeTargets(netip.MustParseAddr("198.18.1.1"))
	got := map[string]bool{}
	for _, tg := range targets {
		got[tg.Kind+" "+tg.Proto+" "+tg.Dst.String()] = true
	}
	for _, w := range []string{"ClusterIP tcp 198.19.0.10:80", "ClusterIP udp 198.19.0.53:53", "NodePort tcp 198.18.1.1:30080", "LoadBalancer tcp 198.19.1.1:443", "ExternalIP tcp 198.19.1.2:80", "ClusterIP tcp [fd42:ff::70]:80"} {
		if !got[w] {
			t.Errorf("probe targets lack %s", w)
		}
	}
}

func TestManifestErrorsNameTheProblem(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown field": {"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterAddress: 198.19.0.1}\n", `unknown field "clusterAddress"`},
		"no kind":       {"apiVersion: v1\nmetadata: {name: a}\n", "document 2: no kind"},
		"bad address": {"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: d}\naddressType: IPv4\n" +
			"ports: [{name: http, port: 80}]\nendpoints: [{addresses: [not-an-ip]}]\n", `endpoints[0].addresses[0] "not-an-ip"`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "x.yaml"), []byte("---\n# comment only\n---\n"+tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := loadManifests(dir)
			if err == nil {
				_, err = m.backends()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %s", err, tc.want)
			}
		})
	}
}
