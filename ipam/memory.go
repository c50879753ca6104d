package ipam

import (
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/source"
)

// Memory allocates without a cluster (manifests): the same Policy.Allocate
// as the Controller, with the allocation kept in memory instead of written
// to the API. It is a source.ServiceStage in front of the sync's Sink: a
// LoadBalancer Service the policy serves, whose manifest has no
// status.loadBalancer.ingress, is passed on with its allocated addresses
// in its status, exactly as the Controller would have written them; a
// Service whose manifest gives a status keeps it (a static address, which
// still counts as used when it lies in a pool). An address stays with its
// Service while the process runs and the Service stays valid; a restart
// allocates again from the manifests, in the same order (creation time,
// then name), so the same manifests give the same addresses.
type Memory struct {
	next source.Sink
	log  *slog.Logger

	mu       sync.Mutex
	policy   *Policy
	services map[Key]*memService
	synced   bool
	latest   *Result
	reported map[Key]string
	metrics  *metrics
}

type memService struct {
	svc    *corev1.Service
	file   string
	s      *Service
	static bool // the manifest gives a status
	// sent is what was last passed on: nil before the first time.
	sent  []netip.Addr
	dirty bool
}

// NewMemory returns a Memory passing Services on to next. reg takes the
// pool gauges (nil: none).
func NewMemory(p *Policy, next source.Sink, reg prometheus.Registerer, log *slog.Logger) (*Memory, error) {
	if log == nil {
		log = slog.Default()
	}
	m := &Memory{next: next, log: log.With("component", "ipam"), policy: p, services: map[Key]*memService{}, reported: map[Key]string{}}
	if reg != nil {
		var err error
		if m.metrics, err = newMetrics(reg); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetService implements source.ServiceStage.
func (m *Memory) SetService(svc *corev1.Service, file string) {
	s := NewService(svc)
	m.mu.Lock()
	defer m.mu.Unlock()
	e := &memService{svc: svc, file: file, s: s, static: len(s.Held) > 0, dirty: true}
	if prev := m.services[s.Key]; prev != nil {
		e.sent = prev.sent
		if !e.static && !prev.static {
			s.Held = prev.s.Held // the address stays with the Service
		}
	}
	m.services[s.Key] = e
	if m.synced {
		m.reallocate()
	}
}

// SetServiceObject implements source.Sink: passed on.
func (m *Memory) SetServiceObject(o *model.ServiceObject) { m.next.SetServiceObject(o) }

// DeleteService implements source.Sink.
func (m *Memory) DeleteService(k model.ServiceKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.services, Key{k.Namespace(), k.Name()})
	delete(m.reported, Key{k.Namespace(), k.Name()})
	m.next.DeleteService(k)
	if m.synced {
		m.reallocate()
	}
}

// SetSliceObject implements source.Sink: passed on.
func (m *Memory) SetSliceObject(o *model.SliceObject) { m.next.SetSliceObject(o) }

// DeleteSlice implements source.Sink: passed on.
func (m *Memory) DeleteSlice(namespace, name string) { m.next.DeleteSlice(namespace, name) }

// SetSynced implements source.Sink: the first allocation of every Service
// is passed on before the sync's sink hears that the view is complete.
func (m *Memory) SetSynced() {
	m.mu.Lock()
	m.synced = true
	m.reallocate()
	m.mu.Unlock()
	m.next.SetSynced()
}

// reallocate allocates every Service and passes on those whose addresses
// or manifest changed; m.mu is held.
func (m *Memory) reallocate() {
	svcs := make([]*Service, 0, len(m.services))
	for _, e := range m.services {
		if e.static && slices.ContainsFunc(e.s.Held, func(a netip.Addr) bool { return m.policy.PoolOf(a) == nil }) {
			continue // a static address outside the pools: not the pools' concern
		}
		svcs = append(svcs, e.s)
	}
	res := m.policy.Allocate(svcs)
	m.latest = res
	if m.metrics != nil {
		m.metrics.update(res, true)
	}
	for k, e := range m.services {
		var ips []netip.Addr
		al := res.Find(k)
		if al != nil && !e.static {
			ips = al.IPs()
			e.s.Held = ips
			m.report(k, al)
		}
		if !e.dirty && e.sent != nil && slices.Equal(ips, e.sent) {
			continue
		}
		e.dirty = false
		e.sent = append(make([]netip.Addr, 0, len(ips)), ips...)
		svc := e.svc
		if !e.static && len(ips) > 0 {
			svc = withIngress(svc, ips)
		}
		m.next.SetServiceObject(model.NewServiceObject(svc).InFile(e.file))
	}
}

// withIngress is a copy of svc with ips as its status.loadBalancer.ingress,
// as the Controller writes it.
func withIngress(svc *corev1.Service, ips []netip.Addr) *corev1.Service {
	c := *svc
	vip := corev1.LoadBalancerIPModeVIP
	c.Status.LoadBalancer.Ingress = make([]corev1.LoadBalancerIngress, len(ips))
	for i, a := range ips {
		c.Status.LoadBalancer.Ingress[i] = corev1.LoadBalancerIngress{IP: a.String(), IPMode: &vip}
	}
	return &c
}

// report logs a Service's allocation problems when they change.
func (m *Memory) report(k Key, al *Allocation) {
	msg := ""
	for _, p := range al.Problems {
		msg += p.Reason + ": " + p.Message + "; "
	}
	if m.reported[k] == msg {
		return
	}
	m.reported[k] = msg
	for _, p := range al.Problems {
		m.log.Warn("LoadBalancer address", "service", k.String(), "reason", p.Reason, "message", p.Message)
	}
}

// Snapshot returns the latest allocation, as Controller.Snapshot does.
func (m *Memory) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return snapshotOf(m.latest, Snapshot{Writer: true, Synced: m.synced})
}
