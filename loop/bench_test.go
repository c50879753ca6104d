package loop

import (
	"fmt"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
)

// nopProgrammer accepts every sync and programs nothing.
type nopProgrammer struct{}

func (nopProgrammer) Full(map[model.ServiceKey]*model.Service) (nft.Result, error) {
	return nft.Result{}, nil
}

func (nopProgrammer) Partial(map[model.ServiceKey]*model.Service) (nft.Result, error) {
	return nft.Result{}, nil
}

// benchSlice is Service i's EndpointSlice, its endpoints on port.
func benchSlice(i int, port int32) *discoveryv1.EndpointSlice {
	eps := make([]discoveryv1.Endpoint, 4)
	for j := range eps {
		eps[j] = discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 128+i/62500, i/250%250, j*60+i%60+1)}}
	}
	name, proto := "http", corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d-1", i), Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("s%d", i)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
}

// BenchmarkEndpointChange is what the loop does for one endpoint change
// (the tracker, the model, the partial sync and its event), with a
// programmer that programs nothing: its cost must not grow with the number
// of Services (ns/op and B/op alike at 1,000 and 100,000).
func BenchmarkEndpointChange(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			s := benchSyncer(b, n)
			tr := s.Tracker
			events := 0
			s.Observers = []func(Event){func(ev Event) { events += ev.Changed }}
			s.Touched = func([]model.ServiceKey) {}
			slices := [2]*discoveryv1.EndpointSlice{benchSlice(n/2, 8080), benchSlice(n/2, 8081)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				tr.SetSlice(slices[i%2])
				if err := s.partial(s.Log); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if events != b.N {
				b.Fatalf("%d changes synced, want %d", events, b.N)
			}
		})
	}
}

// benchSyncer is a Syncer of n Services, after its first full sync, with
// a programmer that programs nothing.
func benchSyncer(b *testing.B, n int) *Syncer {
	tr := NewTracker()
	for i := range n {
		svc := service(fmt.Sprintf("s%d", i), "http")
		svc.Spec.ClusterIP = fmt.Sprintf("10.%d.%d.%d", 96+i/62500, i/250%250, i%250+1)
		tr.SetService(svc)
		tr.SetSlice(benchSlice(i, 8080))
	}
	tr.SetSynced()
	s := &Syncer{Tracker: tr, Programmer: nopProgrammer{}, Log: slog.New(slog.DiscardHandler)}
	s.reset()
	if err := s.full(s.Log, ""); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkServices lists every Service as the status page's first rows
// are made from it, at 100,000 Services.
func BenchmarkServices(b *testing.B) {
	const n = 100_000
	s := benchSyncer(b, n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if got := s.Services(); len(got) != n {
			b.Fatalf("%d Services listed, want %d", len(got), n)
		}
	}
}

// BenchmarkReconcile is the loop's part of a periodic full sync when
// nothing changed, with a programmer that programs nothing.
func BenchmarkReconcile(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			s := benchSyncer(b, n)
			changed := 0
			s.Observers = []func(Event){func(ev Event) { changed += ev.Changed }}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := s.full(s.Log, ""); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if changed != 0 {
				b.Fatalf("%d Services changed by reconciles of nothing", changed)
			}
		})
	}
}
