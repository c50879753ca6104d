package source

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftgate/nftgate/internal/testing/kubetest"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
)

// TestKubeSourceSyncedHasEverything starts a KubeSource against a real
// kube-apiserver holding Services and slices, with its event handlers
// lagging behind its informers: the tracker must hold every object by the
// time the source says its view is complete, or the first full sync would
// remove the rules of the Services not handed over yet.
func TestKubeSourceSyncedHasEverything(t *testing.T) {
	cp := kubetest.StartForTest(t, kubetest.Options{})
	const n = 100
	createServices(t, cp.Client(), "load", n)

	tr := loop.NewTracker()
	src := &KubeSource{Config: cp.RESTConfig(), onEvent: func() { time.Sleep(5 * time.Millisecond) }}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, tr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("source: %v", err)
		}
	})
	deadline := time.After(time.Minute)
	for !tr.Synced() {
		select {
		case <-tr.Changed():
		case <-deadline:
			t.Fatal("the source never reported a complete view")
		}
	}
	all, _ := tr.All()
	services, slices := 0, 0
	for k, o := range all {
		if k.Namespace() == "load" {
			services++
			slices += len(o.Slices)
		}
	}
	if services != n || slices != n {
		t.Errorf("when the source reported a complete view the tracker held %d Services and %d slices of %d each", services, slices, n)
	}
}

// createServices creates n ClusterIP Services in namespace ns, each with
// an EndpointSlice of one endpoint.
func createServices(t *testing.T, c kubernetes.Interface, ns string, n int) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				name := fmt.Sprintf("svc-%d", i)
				svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
				if _, err := c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
					errs <- err
					continue
				}
				port, proto := int32(8080), corev1.ProtocolTCP
				portName := "http"
				sl := &discoveryv1.EndpointSlice{
					ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{model.LabelServiceName: name}},
					AddressType: discoveryv1.AddressTypeIPv4,
					Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
					Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.1.%d.%d", i/250, 1+i%250)}}},
				}
				if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
