package model_test

import (
	"fmt"
	"io"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// manyEndpoints is a Service with n endpoints listed in slices of perSlice
// endpoints, every endpoint listed twice (once not ready, in another slice
// when there are several), as while a slice is being replaced.
func manyEndpoints(n, perSlice int) (*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "big"},
		Spec: corev1.ServiceSpec{ClusterIP: "172.30.0.1",
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	name, proto, port := "http", corev1.ProtocolTCP, int32(8080)
	yes, no := true, false
	var out []*discoveryv1.EndpointSlice
	for copyNo, ready := range []*bool{&no, &yes} {
		for first := 0; first < n; first += perSlice {
			sl := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("big-%d-%07d", copyNo, first), Labels: map[string]string{model.LabelServiceName: "big"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
			}
			for i := first; i < min(n, first+perSlice); i++ {
				// Addresses in scrambled order, as a sort must see them.
				j := uint64(i) * 2654435761 % uint64(n)
				a := netip.AddrFrom4([4]byte{10, byte(j >> 16), byte(j >> 8), byte(j)})
				sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
					Conditions: discoveryv1.EndpointConditions{Ready: ready}})
			}
			out = append(out, sl)
		}
	}
	if perSlice >= n {
		// One slice: both listings in it.
		out[0].Endpoints = append(out[0].Endpoints, out[1].Endpoints...)
		out = out[:1]
	}
	return svc, out
}

// TestBuildWorkIsLinear counts the endpoint comparisons of building a
// Service from its slices (conversion, de-duplication, merge) at n and 10n
// endpoints: n log n grows them about 12 times, a scan per endpoint would
// grow them 100 times.
func TestBuildWorkIsLinear(t *testing.T) {
	orig := *model.CompareAddrPorts
	t.Cleanup(func() { *model.CompareAddrPorts = orig })
	var count int
	*model.CompareAddrPorts = func(a, b netip.AddrPort) int { count++; return orig(a, b) }
	work := func(n, perSlice int) int {
		svc, sls := manyEndpoints(n, perSlice)
		count = 0
		m, err := model.FromKubernetes(svc, sls, model.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Ports[0].Endpoints) != n {
			t.Fatalf("%d endpoints, want %d", len(m.Ports[0].Endpoints), n)
		}
		for _, e := range m.Ports[0].Endpoints {
			if !e.Ready {
				t.Fatalf("%s: the not-ready listing won over the ready one", e.Addr())
			}
		}
		return count
	}
	for _, perSlice := range []int{1000, 1 << 30} {
		small, large := work(10_000, perSlice), work(100_000, perSlice)
		t.Logf("endpoints per slice %d: %d comparisons at 10,000 endpoints, %d at 100,000 (%.1f times)", min(perSlice, 100_000), small, large, float64(large)/float64(small))
		if large > 16*small {
			t.Errorf("endpoints per slice %d: 10 times the endpoints cost %.1f times the comparisons, want n log n (about 12)", perSlice, float64(large)/float64(small))
		}
	}
}

// BenchmarkOneServiceManyEndpoints is one Service of 100,000 endpoints (in
// slices of 1,000, or in one slice as a manifest may have them; every
// endpoint listed twice) from its objects to its nft script: conversion,
// build, the ruleset, and the text `nftgate render` writes.
func BenchmarkOneServiceManyEndpoints(b *testing.B) {
	cfg := ruleset.Config{Table: "nftgate"}
	for _, perSlice := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("endpoints=100000/per-slice=%d", perSlice), func(b *testing.B) {
			svc, sls := manyEndpoints(100_000, perSlice)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				m, err := model.FromKubernetes(svc, sls, model.Options{})
				if err != nil {
					b.Fatal(err)
				}
				for _, f := range ruleset.Families {
					if err := ruleset.WriteTables(io.Discard, f, ruleset.Layout(&cfg, f, []*model.Service{m})); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
