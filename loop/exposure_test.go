package loop

import (
	"context"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
)

// recordingProgrammer keeps what it is asked to program, and reports the
// conflicts it is told to.
type recordingProgrammer struct {
	mu        sync.Mutex
	services  map[model.ServiceKey]*model.Service
	conflicts map[model.ServiceKey][]string // reported by the next sync
	synced    chan struct{}
}

func (p *recordingProgrammer) sync(changes map[model.ServiceKey]*model.Service) (nft.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, s := range changes {
		if s == nil {
			delete(p.services, k)
		} else {
			p.services[k] = s
		}
	}
	res := nft.Result{ServiceConflicts: p.conflicts}
	p.conflicts = nil
	select {
	case p.synced <- struct{}{}:
	default:
	}
	return res, nil
}

func (p *recordingProgrammer) Full(all map[model.ServiceKey]*model.Service) (nft.Result, error) {
	p.mu.Lock()
	p.services = map[model.ServiceKey]*model.Service{}
	p.mu.Unlock()
	return p.sync(all)
}

func (p *recordingProgrammer) Partial(changes map[model.ServiceKey]*model.Service) (nft.Result, error) {
	return p.sync(changes)
}

// await waits until the Syncer's view of k satisfies ok.
func await(t *testing.T, s *Syncer, k model.ServiceKey, what string, ok func(ServiceState) bool) ServiceState {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		st, _ := s.Service(k)
		if ok(st) {
			return st
		}
		select {
		case <-s.Programmer.(*recordingProgrammer).synced:
		case <-time.After(10 * time.Millisecond): // the state is set just after the sync
		case <-deadline:
			t.Fatalf("%s: never happened; state %+v", what, st)
		}
	}
}

func TestSyncerAppliesTheExposure(t *testing.T) {
	tr := NewTracker()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", CreationTimestamp: metav1.Now()},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1",
			ExternalIPs: []string{"203.0.113.7", "127.0.0.1"},
			Ports:       []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	k := model.NewServiceKey("ns", "web")
	tr.SetService(svc)
	tr.SetSynced()
	prog := &recordingProgrammer{synced: make(chan struct{}, 1)}
	s := &Syncer{Tracker: tr, Programmer: prog} // no Exposure: no externalIP is served
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	ext := func(st ServiceState) []netip.Addr {
		if st.Model == nil {
			return nil
		}
		return st.Model.ExternalIPs()
	}
	st := await(t, s, k, "both externalIPs refused", func(st ServiceState) bool { return st.Model != nil && len(st.Warnings) == 2 })
	if len(ext(st)) != 0 || len(st.Model.ClusterIPs) != 1 {
		t.Errorf("programmed %+v, want its ClusterIP and no externalIP", st.Model)
	}

	allowed := &model.Exposure{ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	s.SetExposure(allowed)
	st = await(t, s, k, "externalIP served once the CIDR allows it", func(st ServiceState) bool { return len(ext(st)) == 1 })
	if want := []string{"externalIP 127.0.0.1 is not served: a loopback address"}; !reflect.DeepEqual(st.Warnings, want) {
		t.Errorf("warnings %q, want %q", st.Warnings, want)
	}

	// The address becomes the gateway's own: no longer served.
	s.SetExposure(&model.Exposure{ExternalIPCIDRs: allowed.ExternalIPCIDRs, Host: []netip.Prefix{netip.MustParsePrefix("203.0.113.7/24")}})
	st = await(t, s, k, "the gateway's own address refused", func(st ServiceState) bool { return st.Model != nil && len(ext(st)) == 0 })
	if len(st.Warnings) != 2 || st.Warnings[0] != "externalIP 203.0.113.7 is not served: an address of the gateway itself" {
		t.Errorf("warnings %q", st.Warnings)
	}

	// Conflicts the programmer reports follow the refused addresses.
	prog.mu.Lock()
	prog.conflicts = map[model.ServiceKey][]string{k: {"ip 10.96.0.1 . tcp . 80 in service-ips is already used by service a/b"}}
	prog.mu.Unlock()
	s.SetExposure(allowed)
	st = await(t, s, k, "conflict reported", func(st ServiceState) bool { return len(st.Warnings) == 2 && len(ext(st)) == 1 })
	if st.Warnings[1] != "ip 10.96.0.1 . tcp . 80 in service-ips is already used by service a/b" {
		t.Errorf("warnings %q", st.Warnings)
	}
	// The Service goes, and with it its claims: so do its warnings.
	prog.mu.Lock()
	prog.conflicts = map[model.ServiceKey][]string{k: nil}
	prog.mu.Unlock()
	tr.DeleteService(k)
	await(t, s, k, "warnings gone with the Service", func(st ServiceState) bool { return st.Model == nil && len(st.Warnings) == 0 })
}
