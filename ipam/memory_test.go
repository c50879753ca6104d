package ipam

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
)

// sink keeps the last Service object passed on, per key.
type sink struct {
	svcs   map[model.ServiceKey]*model.ServiceObject
	synced bool
}

func (s *sink) SetServiceObject(o *model.ServiceObject) { s.svcs[o.Key] = o }
func (s *sink) DeleteService(k model.ServiceKey)        { delete(s.svcs, k) }
func (s *sink) SetSliceObject(*model.SliceObject)       {}
func (s *sink) DeleteSlice(string, string)              {}
func (s *sink) SetSynced()                              { s.synced = true }

func (s *sink) ips(t *testing.T, name string) []netip.Addr {
	t.Helper()
	o := s.svcs[model.NewServiceKey("default", name)]
	if o == nil {
		t.Fatalf("service %s not passed on", name)
	}
	m, err := model.Build(o, nil, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m.LoadBalancerIPs()
}

func lbService(name string, status ...string) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10",
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	for _, ip := range status {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return svc
}

// Without a cluster, LoadBalancer Services get their addresses from the
// pools before the sync hears the view is complete; they keep them when
// others come and go; a static status stays as the manifest gives it; an
// exhausted pool leaves the Service without an address.
func TestMemoryAllocatesForManifests(t *testing.T) {
	pol := compile(t, Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"192.0.2.1-192.0.2.3"}}}})
	s := &sink{svcs: map[model.ServiceKey]*model.ServiceObject{}}
	m, err := NewMemory(pol, s, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.SetService(lbService("b"), "b.yaml")
	m.SetService(lbService("static", "198.51.100.7"), "s.yaml")
	if len(s.svcs) != 0 {
		t.Fatal("Services passed on before the view is complete")
	}
	m.SetSynced()
	if !s.synced {
		t.Fatal("SetSynced not passed on")
	}
	b := s.ips(t, "b")
	if len(b) != 1 || b[0] != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("b got %v, want 192.0.2.1", b)
	}
	if got := s.ips(t, "static"); len(got) != 1 || got[0] != netip.MustParseAddr("198.51.100.7") {
		t.Fatalf("static got %v", got)
	}
	// "a" sorts before "b": it must not take b's address.
	m.SetService(lbService("a"), "a.yaml")
	m.SetService(lbService("b"), "b.yaml") // b's manifest read again
	if got := s.ips(t, "b"); got[0] != b[0] {
		t.Fatalf("b moved to %v", got)
	}
	if got := s.ips(t, "a"); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.2") {
		t.Fatalf("a got %v", got)
	}
	m.SetService(lbService("c"), "c.yaml")
	m.SetService(lbService("d"), "d.yaml")
	if got := s.ips(t, "d"); len(got) != 0 {
		t.Fatalf("d got %v from an exhausted pool", got)
	}
	if sn := m.Snapshot(); len(sn.Pools) != 1 || sn.Pools[0].Used != 3 || sn.Pools[0].Free != 0 {
		t.Fatalf("pools %+v", sn.Pools)
	}
	m.DeleteService(model.NewServiceKey("default", "a"))
	if got := s.ips(t, "d"); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.2") {
		t.Fatalf("d got %v after a's address was freed", got)
	}
}
