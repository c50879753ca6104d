package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/kubeclient"
	"github.com/nftgate/nftgate/internal/testing/kubetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"
)

// eventually waits until cond holds, failing t after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running is a controller fed by Watch, stopped in cleanup.
type running struct {
	*Controller
	stop func()
	done chan struct{}
}

func startController(t *testing.T, cfg *rest.Config, id string, pol *Policy, reg prometheus.Registerer) *running {
	t.Helper()
	c, err := NewController(Options{Config: cfg, Policy: pol, Identity: id, Registerer: reg,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Controller: c, done: make(chan struct{})}
	watched := make(chan struct{})
	go func() { defer close(watched); Watch(ctx, cfg, c) }()
	go func() {
		defer close(r.done)
		if err := c.Run(ctx); err != nil {
			t.Error(err)
		}
		<-watched
	}()
	r.stop = func() {
		cancel()
		<-r.done
	}
	t.Cleanup(r.stop)
	return r
}

type svcOpt func(*corev1.Service)

func annotate(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func onPort(p int32) svcOpt { return func(s *corev1.Service) { s.Spec.Ports[0].Port = p } }

func createLB(t *testing.T, c kubernetes.Interface, cls, name string, opts ...svcOpt) {
	t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &cls,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	for _, o := range opts {
		o(s)
	}
	if _, err := c.CoreV1().Services("default").Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ingress(t *testing.T, c kubernetes.Interface, name string) string {
	t.Helper()
	s, err := c.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ingressIPs(s.Status.LoadBalancer.Ingress)
}

func waitIngress(t *testing.T, c kubernetes.Interface, name, want string) {
	t.Helper()
	got := ""
	eventually(t, 10*time.Second, fmt.Sprintf("%s has ingress %q, want %q", name, got, want), func() bool {
		got = ingress(t, c, name)
		return got == want
	})
}

// waitEvent waits for a Warning Event of that reason on the Service and
// returns its message.
func waitEvent(t *testing.T, c kubernetes.Interface, name, reason string) string {
	t.Helper()
	var msg string
	eventually(t, 10*time.Second, fmt.Sprintf("no %s Event on %s", reason, name), func() bool {
		l, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String()})
		if err != nil || len(l.Items) == 0 {
			return false
		}
		msg = l.Items[0].Message
		return l.Items[0].Type == corev1.EventTypeWarning && l.Items[0].Source.Component == EventComponent
	})
	return msg
}

// applyRBAC creates the objects of deploy/rbac.yaml (the token Secret is
// left out: no controller here fills it in).
func applyRBAC(t *testing.T, c kubernetes.Interface) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "deploy", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, doc := range strings.Split(string(data), "\n---") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		decode := func(o any) {
			if err := yaml.Unmarshal([]byte(doc), o); err != nil {
				t.Fatal(err)
			}
		}
		switch tm.Kind {
		case "Namespace":
			var o corev1.Namespace
			decode(&o)
			_, err = c.CoreV1().Namespaces().Create(ctx, &o, metav1.CreateOptions{})
		case "ServiceAccount":
			var o corev1.ServiceAccount
			decode(&o)
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRole":
			var o rbacv1.ClusterRole
			decode(&o)
			_, err = c.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			decode(&o)
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
		case "Secret":
			continue
		default:
			t.Fatalf("deploy/rbac.yaml: unexpected kind %q", tm.Kind)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("deploy/rbac.yaml: %s: %v", tm.Kind, err)
		}
	}
}

// statusManagers are the field managers that wrote the Service's status.
func statusManagers(t *testing.T, c kubernetes.Interface, name string) []string {
	t.Helper()
	s, err := c.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range s.ManagedFields {
		if m.Subresource == "status" {
			out = append(out, m.Manager)
		}
	}
	return out
}

// The controller against a real kube-apiserver, with the rights of
// deploy/rbac.yaml only. Each part serves its own loadBalancerClass, so
// that the parts' Services stay apart.
func TestControllerAgainstAPIServer(t *testing.T) {
	cp := kubetest.StartForTest(t, kubetest.Options{})
	admin := cp.Client()
	applyRBAC(t, admin)
	sa, err := cp.ServiceAccountConfig(context.Background(), "nftgate", "nftgate")
	if err != nil {
		t.Fatal(err)
	}
	policy := func(cls string, addrs ...string) *Policy {
		return compile(t, Config{LoadBalancerClass: cls, Pools: []PoolConfig{{Name: "p", Addresses: addrs}}})
	}

	t.Run("requested, shared, refused, exhausted; restart changes nothing", func(t *testing.T) {
		const cls = "nftgate.io/a"
		reg := prometheus.NewRegistry()
		c := startController(t, sa, "gw-1", policy(cls, "10.10.0.1-10.10.0.3"), reg)
		createLB(t, admin, cls, "first")
		waitIngress(t, admin, "first", "10.10.0.1")
		if c.noPatch.Load() {
			t.Error("a status patch was refused with the rights of deploy/rbac.yaml")
		}
		createLB(t, admin, cls, "asks", annotate("metallb.io/loadBalancerIPs", "10.10.0.3"))
		waitIngress(t, admin, "asks", "10.10.0.3")
		createLB(t, admin, cls, "share-1", annotate("metallb.io/allow-shared-ip", "k"))
		waitIngress(t, admin, "share-1", "10.10.0.2")
		createLB(t, admin, cls, "share-2", annotate("metallb.io/allow-shared-ip", "k"), onPort(443))
		waitIngress(t, admin, "share-2", "10.10.0.2")

		createLB(t, admin, cls, "same-port", annotate("nftgate.io/allow-shared-ip", "k"), annotate("nftgate.io/load-balancer-ips", "10.10.0.2"))
		msg := waitEvent(t, admin, "same-port", ReasonSharingRefused)
		if !strings.Contains(msg, "port TCP/80 is already used there by default/share-1") {
			t.Errorf("SharingRefused: %q", msg)
		}
		createLB(t, admin, cls, "taken", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.10.0.1" })
		if msg := waitEvent(t, admin, "taken", ReasonAddressTaken); !strings.Contains(msg, "10.10.0.1") || !strings.Contains(msg, "default/first") {
			t.Errorf("AddressTaken: %q", msg)
		}
		createLB(t, admin, cls, "one-too-many")
		if msg := waitEvent(t, admin, "one-too-many", ReasonPoolExhausted); !strings.Contains(msg, `pool "p"`) {
			t.Errorf("PoolExhausted: %q", msg)
		}
		for _, n := range []string{"same-port", "taken", "one-too-many"} {
			if got := ingress(t, admin, n); got != "" {
				t.Errorf("%s: ingress %q, want none", n, got)
			}
		}
		if got := testutil.ToFloat64(c.metrics.used.WithLabelValues("p")); got != 3 {
			t.Errorf("nftgate_pool_addresses_used{pool=p} = %v, want 3", got)
		}
		if got := testutil.ToFloat64(c.metrics.free.WithLabelValues("p")); got != 0 {
			t.Errorf("nftgate_pool_addresses_free{pool=p} = %v, want 0", got)
		}
		sn := c.Snapshot()
		if !sn.Writer || len(sn.Services) != 7 || sn.Pools[0] != (Usage{"p", 3, 0}) {
			t.Errorf("snapshot %+v", sn)
		}

		// Restart: a new controller recovers every address from status.
		before := map[string]string{}
		list, _ := admin.CoreV1().Services("default").List(context.Background(), metav1.ListOptions{})
		for _, s := range list.Items {
			before[s.Name] = s.ResourceVersion
		}
		c.stop()
		c2 := startController(t, sa, "gw-2", policy(cls, "10.10.0.1-10.10.0.3"), nil)
		eventually(t, 10*time.Second, "the new controller is the writer and has reconciled", func() bool {
			sn := c2.Snapshot()
			return sn.Writer && sn.Synced && c2.passes.Load() > 0
		})
		if n := c2.Writes(); n != 0 {
			t.Errorf("the restarted controller wrote %d statuses", n)
		}
		list, _ = admin.CoreV1().Services("default").List(context.Background(), metav1.ListOptions{})
		for _, s := range list.Items {
			if before[s.Name] != s.ResourceVersion {
				t.Errorf("%s changed across the restart", s.Name)
			}
		}

		// A pool change: first's address leaves the pool; it moves, with
		// an Event, and nothing else moves.
		c2.SetPolicy(policy(cls, "10.10.0.2-10.10.0.4"))
		waitIngress(t, admin, "first", "10.10.0.4")
		if msg := waitEvent(t, admin, "first", ReasonReleased); !strings.Contains(msg, "10.10.0.1") {
			t.Errorf("AddressReleased: %q", msg)
		}
		for n, want := range map[string]string{"asks": "10.10.0.3", "share-1": "10.10.0.2", "share-2": "10.10.0.2", "one-too-many": ""} {
			if got := ingress(t, admin, n); got != want {
				t.Errorf("after the pool change %s: %q, want %q", n, got, want)
			}
		}
	})

	t.Run("Lease: one leads; cut off, it stops before the other takes over; a clean stop releases at once", func(t *testing.T) {
		elector := func(id string) (*runningElector, *cutStore) {
			c, err := NewController(Options{Config: sa, Policy: policy("nftgate.io/lease", "10.30.0.1"), Identity: id,
				LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			cs := &cutStore{leaseStore: c.elector.store}
			c.elector.store = cs
			r := runElector(c.elector)
			t.Cleanup(func() { r.cancel(); <-r.done })
			return r, cs
		}
		leases := admin.CoordinationV1().Leases(DefaultLeaseNamespace)
		lease := func() *coordinationv1.Lease {
			l, err := leases.Get(context.Background(), DefaultLeaseName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		a, cutA := elector("el-a")
		b, cutB := elector("el-b")
		eventually(t, 10*time.Second, "one elector leads", func() bool { return a.leading() || b.leading() })
		leader, other, cutLeader := a, b, cutA
		if b.leading() {
			leader, other, cutLeader = b, a, cutB
		}
		leaderID, otherID := leader.e.id, other.e.id
		if h := lease().Spec.HolderIdentity; h == nil || *h != leaderID {
			t.Fatalf("the Lease is held by %v, want %s", h, leaderID)
		}
		transitions := *lease().Spec.LeaseTransitions

		// The leader is cut off from the API: it stops leading once it
		// could not renew for the renew deadline; the other takes the
		// Lease once it has not changed for the lease duration, after.
		cut := time.Now()
		cutLeader.cut.Store(true)
		eventually(t, 20*time.Second, "the other elector takes over", other.leading)
		_, stopped := leader.terms()
		started, _ := other.terms()
		if len(stopped) != 1 || len(started) != 1 || !stopped[0].Before(started[0]) {
			t.Fatalf("the cut-off leader stopped at %v, the other started at %v: both led at once", stopped, started)
		}
		t.Logf("cut off: the leader stopped after %v, the other took over after %v", stopped[0].Sub(cut), started[0].Sub(cut))
		l := lease()
		if *l.Spec.HolderIdentity != otherID || *l.Spec.LeaseTransitions != transitions+1 || *l.Spec.LeaseDurationSeconds != 2 ||
			!l.Spec.AcquireTime.Equal(l.Spec.RenewTime) && l.Spec.AcquireTime.After(l.Spec.RenewTime.Time) {
			t.Errorf("after the takeover the Lease is %+v", l.Spec)
		}
		eventually(t, 5*time.Second, "the new leader renews", func() bool { return lease().Spec.RenewTime.After(l.Spec.RenewTime.Time) })
		cutLeader.cut.Store(false)

		// A clean stop releases the Lease: no holder, and the first
		// leader, back on the API, takes it at its next attempt.
		stop := time.Now()
		other.cancel()
		<-other.done
		if l := lease(); *l.Spec.HolderIdentity != "" || *l.Spec.LeaseDurationSeconds != 1 {
			t.Fatalf("after a clean stop the Lease is %+v, want released", l.Spec)
		}
		eventually(t, 10*time.Second, "the first leader takes the released Lease", leader.leading)
		started, _ = leader.terms()
		t.Logf("released: taken over after %v", started[1].Sub(stop))
		if *lease().Spec.HolderIdentity != leaderID {
			t.Errorf("the Lease is not held by %s", leaderID)
		}
	})

	t.Run("Events: the same again bumps the count; too many about one object are dropped", func(t *testing.T) {
		core, err := kubeclient.New(sa, corev1.SchemeGroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		clk := clocktesting.NewFakeClock(time.Now())
		w := newEventWriter(core, corev1.EventSource{Component: EventComponent, Host: "gw-events"}, clk, slog.Default())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); w.run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		events := func(name string) []corev1.Event {
			l, err := admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
				FieldSelector: fields.Set{"involvedObject.name": name}.String()})
			if err != nil {
				t.Fatal(err)
			}
			return l.Items
		}
		// flushed waits until every Event queued so far is handled: the
		// writer is sequential, so a marker about another object shows.
		marks := 0
		flushed := func() {
			marks++
			mark := fmt.Sprintf("mark-%d", marks)
			w.event(&corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: "default", Name: mark}, corev1.EventTypeNormal, "Mark", mark)
			eventually(t, 10*time.Second, "the marker Event is written", func() bool { return len(events(mark)) == 1 })
		}
		ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: "default", Name: "ev", UID: "uid-ev"}
		w.event(ref, corev1.EventTypeWarning, ReasonPoolExhausted, "the same")
		clk.Step(time.Second)
		w.event(ref, corev1.EventTypeWarning, ReasonPoolExhausted, "the same")
		flushed()
		evs := events("ev")
		if len(evs) != 1 || evs[0].Count != 2 || !evs[0].LastTimestamp.After(evs[0].FirstTimestamp.Time) ||
			evs[0].Source.Host != "gw-events" || evs[0].ReportingController != EventComponent {
			var got []string
			for _, e := range evs {
				got = append(got, fmt.Sprintf("%s count %d first %v last %v source %+v reporting %s", e.Name, e.Count, e.FirstTimestamp, e.LastTimestamp, e.Source, e.ReportingController))
			}
			t.Fatalf("the same Event twice gave %d Events, want one counted twice: %q", len(evs), got)
		}
		// 2 of the burst of 25 are spent; of 24 more, the last is dropped.
		for i := range 24 {
			w.event(ref, corev1.EventTypeWarning, ReasonPoolExhausted, fmt.Sprintf("message %d", i))
		}
		flushed()
		if n := len(events("ev")); n != 24 {
			t.Fatalf("%d Events about the object, want 24 (1 counted twice, 23 more, then the rate limit)", n)
		}
		clk.Step(eventEvery)
		w.event(ref, corev1.EventTypeWarning, ReasonPoolExhausted, "later")
		flushed()
		if n := len(events("ev")); n != 25 {
			t.Fatalf("%d Events about the object after %v, want 25", n, eventEvery)
		}
	})

	t.Run("two gateways: exactly one writes, the other takes over", func(t *testing.T) {
		const cls = "nftgate.io/b"
		pol := policy(cls, "10.20.0.0/24")
		g1 := startController(t, sa, "gw-a", pol, nil)
		g2 := startController(t, sa, "gw-b", pol, nil)
		eventually(t, 10*time.Second, "one gateway holds the Lease", func() bool { return g1.Writer() || g2.Writer() })
		w, r := g1, g2
		if g2.Writer() {
			w, r = g2, g1
		}
		both := make(chan bool, 1)
		watchCtx, stopWatch := context.WithCancel(context.Background())
		go func() {
			seen := false
			for watchCtx.Err() == nil {
				seen = seen || g1.Writer() && g2.Writer()
				time.Sleep(5 * time.Millisecond)
			}
			both <- seen
		}()
		for i := range 5 {
			createLB(t, admin, cls, fmt.Sprintf("b-%d", i))
		}
		for i := range 5 {
			waitIngress(t, admin, fmt.Sprintf("b-%d", i), fmt.Sprintf("10.20.0.%d", i))
			if m := statusManagers(t, admin, fmt.Sprintf("b-%d", i)); fmt.Sprint(m) != "["+w.fieldManager()+"]" {
				t.Errorf("b-%d: status written by %v, want only %s", i, m, w.fieldManager())
			}
		}
		eventually(t, 5*time.Second, "the reader computed the same allocation", func() bool {
			sn := r.Snapshot()
			return len(sn.Services) == 5 && sn.Services[4].Written
		})
		if r.Writes() != 0 || r.Snapshot().Writer {
			t.Errorf("the reader wrote %d statuses", r.Writes())
		}

		start := time.Now()
		w.stop()
		eventually(t, 2*time.Second, "the other gateway takes over within the lease duration", r.Writer)
		t.Logf("takeover after %v", time.Since(start))
		createLB(t, admin, cls, "b-after")
		waitIngress(t, admin, "b-after", "10.20.0.5")
		if m := statusManagers(t, admin, "b-after"); fmt.Sprint(m) != "["+r.fieldManager()+"]" {
			t.Errorf("b-after: status written by %v, want only %s", m, r.fieldManager())
		}
		stopWatch()
		if <-both {
			t.Error("both gateways held the Lease at once")
		}
	})
}
