package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/nftgate/nftgate/internal/kubeclient"
)

// Defaults of Options.
const (
	DefaultLeaseNamespace = "nftgate"
	DefaultLeaseName      = "nftgate-ipam"
	DefaultLeaseDuration  = 15 * time.Second
	DefaultRenewDeadline  = 10 * time.Second
	DefaultRetryPeriod    = 2 * time.Second
	// EventComponent is the source of the Events the controller writes.
	EventComponent = "nftgate-ipam"
	// ClientQPS and ClientBurst are the client-side rate limit of the
	// controller's status writes (client-go's default, 5 per second,
	// would take more than half an hour for the first statuses of 10,000
	// Services); the API server's own priority and fairness still applies.
	ClientQPS   = 200
	ClientBurst = 400
	// statusWriters is how many statuses are written at a time.
	statusWriters = 8
)

// Options configure a Controller.
type Options struct {
	// Config reaches the API. The status writes get a client of their
	// own limited to ClientQPS and ClientBurst (one request per Service
	// that changes, two when the Service changed since it was read); the
	// Lease and Events keep Config's limits.
	Config *rest.Config
	Policy *Policy
	// Identity names this gateway in the Lease, in Events and as the
	// field manager of the statuses it writes. Required.
	Identity string
	// The Lease that elects the one writer: coordination.k8s.io/v1 Lease
	// LeaseNamespace/LeaseName.
	LeaseNamespace, LeaseName string
	// Lease timing, as client-go's leaderelection takes it: a writer that
	// stops renewing is replaced within LeaseDuration; it stops writing
	// itself when it could not renew for RenewDeadline; it renews, and
	// the others try to acquire, every RetryPeriod. LeaseDuration >
	// RenewDeadline > 1.2 × RetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Clock times the Lease and the Events; nil: the real clock.
	Clock clock.Clock
	// Registerer takes the controller's gauges; nil: none.
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Controller allocates addresses to LoadBalancer Services and, while it
// holds the Lease, writes them to their status.loadBalancer.ingress, with
// an Event on each Service whose allocation failed. Every gateway runs
// one; all of them compute the same allocation (it is a pure function of
// the Services), and only the holder of the Lease writes.
//
// It is fed Services by SetService and DeleteService (from the same
// informer as the ruleset, or from Watch), and told by SetSynced when it
// has the complete first list: before that it writes nothing, since an
// address would look free that a Service not yet seen holds.
type Controller struct {
	o       Options
	log     *slog.Logger
	kick    chan struct{}
	writes  atomic.Int64
	passes  atomic.Int64 // reconciles completed as the writer
	metrics *metrics

	mu       sync.Mutex
	policy   *Policy
	services map[Key]*Service
	synced   bool
	leadCtx  context.Context // non-nil while this gateway holds the Lease
	leader   string
	latest   *Result
	// reported is the problems last reported by Event, per Service.
	reported map[Key]string

	core   rest.Interface // core/v1: Events
	status rest.Interface // core/v1, ClientQPS: Services' status
	// noPatch: the API refused a status patch (RBAC from before nftgate
	// patched statuses: update only); every write reads and updates.
	noPatch atomic.Bool
	elector *elector
	events  *eventWriter
}

// NewController checks o and returns a controller that does nothing until
// Run.
func NewController(o Options) (*Controller, error) {
	if o.Config == nil || o.Policy == nil {
		return nil, errors.New("ipam: Options.Config and Options.Policy are required")
	}
	if o.Identity == "" {
		return nil, errors.New("ipam: Options.Identity is required")
	}
	o.LeaseNamespace = cmpOr(o.LeaseNamespace, DefaultLeaseNamespace)
	o.LeaseName = cmpOr(o.LeaseName, DefaultLeaseName)
	o.LeaseDuration = cmpOr(o.LeaseDuration, DefaultLeaseDuration)
	o.RenewDeadline = cmpOr(o.RenewDeadline, DefaultRenewDeadline)
	o.RetryPeriod = cmpOr(o.RetryPeriod, DefaultRetryPeriod)
	if err := checkTiming(o.LeaseDuration, o.RenewDeadline, o.RetryPeriod); err != nil {
		return nil, fmt.Errorf("ipam: %w", err)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{o: o, log: log.With("component", "ipam"), kick: make(chan struct{}, 1), policy: o.Policy,
		services: map[Key]*Service{}, reported: map[Key]string{}}
	cfg := rest.CopyConfig(o.Config)
	cfg.UserAgent = cmpOr(cfg.UserAgent, "nftgate")
	core, err := kubeclient.New(cfg, corev1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("ipam: kubernetes client: %w", err)
	}
	coordination, err := kubeclient.New(cfg, coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("ipam: kubernetes client: %w", err)
	}
	c.core = core
	scfg := rest.CopyConfig(cfg)
	scfg.QPS, scfg.Burst = ClientQPS, ClientBurst
	if c.status, err = kubeclient.New(scfg, corev1.SchemeGroupVersion); err != nil {
		return nil, fmt.Errorf("ipam: kubernetes client: %w", err)
	}
	c.events = newEventWriter(core, corev1.EventSource{Component: EventComponent, Host: o.Identity}, o.Clock, c.log)
	c.elector = &elector{
		store:     restLeases{client: coordination, namespace: o.LeaseNamespace, name: o.LeaseName},
		namespace: o.LeaseNamespace, name: o.LeaseName, id: o.Identity,
		leaseDuration: o.LeaseDuration, renewDeadline: o.RenewDeadline, retryPeriod: o.RetryPeriod,
		clock: o.Clock, log: c.log,
		newLeader: func(id string) {
			c.mu.Lock()
			c.leader = id
			c.mu.Unlock()
		},
	}
	if o.Registerer != nil {
		if c.metrics, err = newMetrics(o.Registerer); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// SetService adds or replaces a Service.
func (c *Controller) SetService(s *Service) {
	c.mu.Lock()
	c.services[s.Key] = s
	c.mu.Unlock()
	c.changed()
}

// DeleteService forgets a Service.
func (c *Controller) DeleteService(k Key) {
	c.mu.Lock()
	delete(c.services, k)
	delete(c.reported, k)
	c.mu.Unlock()
	c.changed()
}

// SetSynced says every Service has been given.
func (c *Controller) SetSynced() {
	c.mu.Lock()
	c.synced = true
	c.mu.Unlock()
	c.changed()
}

// SetPolicy replaces the pools and class (a configuration change).
// Addresses outside every new pool are released and reallocated.
func (c *Controller) SetPolicy(p *Policy) {
	c.mu.Lock()
	c.policy = p
	c.mu.Unlock()
	c.changed()
}

func (c *Controller) changed() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Writes counts the status updates this controller made.
func (c *Controller) Writes() int64 { return c.writes.Load() }

// Writer tells whether this gateway holds the Lease.
func (c *Controller) Writer() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leadCtx != nil && c.leadCtx.Err() == nil
}

// Run elects the writer and allocates until ctx ends; a writer that stops
// gives up the Lease, so that another takes over at once.
func (c *Controller) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { c.events.run(ctx) })
	wg.Go(func() { c.work(ctx) })
	lease := c.o.LeaseNamespace + "/" + c.o.LeaseName
	c.elector.run(ctx, func(lctx context.Context) {
		c.log.Info("this gateway now writes LoadBalancer addresses", "lease", lease)
		c.mu.Lock()
		c.leadCtx = lctx
		c.mu.Unlock()
		c.changed()
	}, func() {
		c.mu.Lock()
		c.leadCtx = nil
		c.mu.Unlock()
		c.log.Info("this gateway no longer writes LoadBalancer addresses", "lease", lease)
	})
	return nil
}

// work reconciles after every change, and retries failed writes.
func (c *Controller) work(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	backoff := 500 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-retry.C:
		}
		if err := c.reconcile(); err != nil {
			c.log.Warn("writing LoadBalancer statuses failed; trying again", "err", err, "in", backoff)
			retry.Reset(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = 500 * time.Millisecond
		}
	}
}

// reconcile allocates, and as the writer writes what differs from the
// statuses and reports new problems.
func (c *Controller) reconcile() error {
	c.mu.Lock()
	svcs := make([]*Service, 0, len(c.services))
	for _, s := range c.services {
		svcs = append(svcs, s)
	}
	pol, synced, lctx := c.policy, c.synced, c.leadCtx
	c.mu.Unlock()

	res := pol.Allocate(svcs)
	c.mu.Lock()
	c.latest = res
	c.mu.Unlock()
	if c.metrics != nil {
		c.metrics.update(res, lctx != nil && lctx.Err() == nil)
	}
	if !synced || lctx == nil || lctx.Err() != nil {
		return nil
	}
	var todo []*Allocation
	for _, al := range res.Allocations {
		if !slices.Equal(al.IPs(), al.Service.Held) {
			todo = append(todo, al)
		}
	}
	err := c.writeAll(lctx, todo)
	if lctx.Err() != nil {
		return nil // no longer the writer
	}
	for _, al := range res.Allocations {
		c.report(al)
	}
	c.passes.Add(1)
	return err
}

// writeAll writes the allocations' statuses, statusWriters at a time, as
// long as this gateway is the writer (lctx).
func (c *Controller) writeAll(lctx context.Context, todo []*Allocation) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan *Allocation)
	for range min(statusWriters, len(todo)) {
		wg.Go(func() {
			for al := range next {
				if lctx.Err() != nil {
					continue
				}
				if err := c.write(lctx, al); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", al.Service.Key, err))
					mu.Unlock()
				}
			}
		})
	}
	for _, al := range todo {
		next <- al
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// write puts al's addresses into the Service's status.
func (c *Controller) write(ctx context.Context, al *Allocation) error {
	s := al.Service
	want := make([]corev1.LoadBalancerIngress, len(al.Addresses))
	vip := corev1.LoadBalancerIPModeVIP
	for i, a := range al.Addresses {
		want[i] = corev1.LoadBalancerIngress{IP: a.Addr.String(), IPMode: &vip}
	}
	// One request when the Service is as it was read: a merge patch of
	// the status that the API applies only to that version (and UID).
	wrote, err := c.patchStatus(ctx, s, want)
	if apierrors.IsForbidden(err) && !c.noPatch.Swap(true) {
		c.log.Warn("patching Service status is forbidden; reading and updating each instead (grant services/status patch as deploy/rbac.yaml does)", "err", err)
	}
	if apierrors.IsConflict(err) || apierrors.IsForbidden(err) || (err == nil && wrote == nil) {
		// Changed since (or a version unknown): read it and write again.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &corev1.Service{}
			err := c.status.Get().Namespace(s.Namespace).Resource("services").Name(s.Name).Do(ctx).Into(cur)
			if err != nil {
				return err
			}
			if s.UID != "" && cur.UID != s.UID {
				return nil // deleted and made anew: its own event follows
			}
			if ingressIPs(cur.Status.LoadBalancer.Ingress) == ingressIPs(want) {
				wrote = cur
				return nil
			}
			cur.Status.LoadBalancer.Ingress = want
			out := &corev1.Service{}
			err = c.status.Put().Namespace(s.Namespace).Resource("services").Name(s.Name).SubResource("status").
				Param("fieldManager", c.fieldManager()).Body(cur).Do(ctx).Into(out)
			if err == nil {
				wrote = out
				c.written(s, want)
			}
			return err
		})
	}
	if apierrors.IsNotFound(err) {
		return nil // gone: its delete event follows
	}
	if err == nil && wrote != nil {
		// What the status now holds, so that the next reconcile before
		// the informer's event neither writes it again nor misreads it.
		c.mu.Lock()
		if cur := c.services[s.Key]; cur == s {
			c.services[s.Key] = NewService(wrote)
		}
		c.mu.Unlock()
	}
	return err
}

// patchStatus writes want into the status of the version of s it was read
// from. Without a version, or when patches are refused, it does nothing
// and returns nil, nil.
func (c *Controller) patchStatus(ctx context.Context, s *Service, want []corev1.LoadBalancerIngress) (*corev1.Service, error) {
	if s.ResourceVersion == "" || c.noPatch.Load() {
		return nil, nil
	}
	meta := map[string]any{"resourceVersion": s.ResourceVersion}
	if s.UID != "" {
		meta["uid"] = s.UID
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": meta,
		"status":   map[string]any{"loadBalancer": map[string]any{"ingress": want}},
	})
	if err != nil {
		return nil, err
	}
	wrote := &corev1.Service{}
	err = c.status.Patch(types.MergePatchType).Namespace(s.Namespace).Resource("services").Name(s.Name).SubResource("status").
		Param("fieldManager", c.fieldManager()).Body(patch).Do(ctx).Into(wrote)
	if err != nil {
		return nil, err
	}
	c.written(s, want)
	return wrote, nil
}

// written counts and logs a status write.
func (c *Controller) written(s *Service, want []corev1.LoadBalancerIngress) {
	c.writes.Add(1)
	c.log.Info("LoadBalancer status written", "service", s.Key.String(), "ingress", ingressIPs(want))
}

func ingressIPs(in []corev1.LoadBalancerIngress) string {
	ips := make([]string, len(in))
	for i, x := range in {
		ips[i] = x.IP
	}
	return strings.Join(ips, ",")
}

// fieldManager names this gateway as the writer of the statuses, in
// their managedFields.
func (c *Controller) fieldManager() string {
	m := "nftgate-ipam/" + c.o.Identity
	if len(m) > 128 {
		m = m[:128]
	}
	return m
}

// report writes one Event per problem of al, when they differ from what
// was last reported for the Service.
func (c *Controller) report(al *Allocation) {
	k := al.Service.Key
	var b strings.Builder
	for _, p := range al.Problems {
		b.WriteString(p.Reason + ": " + p.Message + "\n")
	}
	c.mu.Lock()
	same := c.reported[k] == b.String()
	if b.Len() == 0 {
		delete(c.reported, k)
	} else {
		c.reported[k] = b.String()
	}
	c.mu.Unlock()
	if same {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: k.Namespace, Name: k.Name, UID: al.Service.UID}
	for _, p := range al.Problems {
		c.events.event(ref, corev1.EventTypeWarning, p.Reason, p.Message)
		c.log.Warn("LoadBalancer address", "service", k.String(), "reason", p.Reason, "message", p.Message)
	}
}

// Snapshot is the allocation as the status page shows it.
type Snapshot struct {
	// Writer: this gateway holds the Lease and writes the statuses.
	Writer bool `json:"writer"`
	// Leader is the holder of the Lease as last seen.
	Leader string `json:"leader"`
	// Synced: the controller has every Service.
	Synced   bool           `json:"synced"`
	Pools    []Usage        `json:"pools"`
	Services []ServiceState `json:"services"`
}

// ServiceState is one Service's allocation.
type ServiceState struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Addresses []Assigned `json:"addresses"`
	// Written: the status holds these addresses.
	Written  bool      `json:"written"`
	Problems []Problem `json:"problems,omitempty"`
}

// Snapshot returns the latest allocation.
func (c *Controller) Snapshot() Snapshot {
	c.mu.Lock()
	res := c.latest
	sn := Snapshot{Writer: c.leadCtx != nil && c.leadCtx.Err() == nil, Leader: c.leader, Synced: c.synced}
	c.mu.Unlock()
	return snapshotOf(res, sn)
}

// snapshotOf fills sn with the pools and Services of res (nil: none yet).
func snapshotOf(res *Result, sn Snapshot) Snapshot {
	if res == nil {
		return sn
	}
	sn.Pools = res.Usage
	for _, al := range res.Allocations {
		sn.Services = append(sn.Services, ServiceState{Namespace: al.Service.Namespace, Name: al.Service.Name,
			Addresses: al.Addresses, Written: slices.Equal(al.IPs(), al.Service.Held), Problems: al.Problems})
	}
	return sn
}

// metrics are the controller's gauges.
type metrics struct {
	used, free *prometheus.GaugeVec
	writer     prometheus.Gauge
	failed     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nftgate_pool_addresses_used",
			Help: "Addresses of the pool given to LoadBalancer Services."}, []string{"pool"}),
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nftgate_pool_addresses_free",
			Help: "Addresses of the pool still free (saturated at 2^64)."}, []string{"pool"}),
		writer: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftgate_ipam_writer",
			Help: "1 while this gateway holds the Lease and writes LoadBalancer statuses."}),
		failed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nftgate_ipam_services_failed",
			Help: "LoadBalancer Services missing an address they ask for."}),
	}
	for _, col := range []prometheus.Collector{m.used, m.free, m.writer, m.failed} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("ipam: metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) update(res *Result, writer bool) {
	m.used.Reset()
	m.free.Reset()
	for _, u := range res.Usage {
		m.used.WithLabelValues(u.Pool).Set(float64(u.Used))
		m.free.WithLabelValues(u.Pool).Set(float64(u.Free))
	}
	w := 0.0
	if writer {
		w = 1
	}
	m.writer.Set(w)
	failed := 0
	for _, al := range res.Allocations {
		if len(al.Addresses) < len(al.Service.Families) && slices.ContainsFunc(al.Problems, func(p Problem) bool { return p.Reason != ReasonReleased }) {
			failed++
		}
	}
	m.failed.Set(float64(failed))
}
