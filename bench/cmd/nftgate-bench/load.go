package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftgate/nftgate/internal/testing/kubetest"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
)

const (
	namespace = "bench"
	nodeName  = "gateway"
	// clusterCIDR stands for the pods' range: the backend network. Client
	// traffic comes from outside it and is masqueraded by every proxier.
	clusterCIDR = "198.18.2.0/24"

	// The two Services with real echo servers behind them. Their
	// ClusterIPs lie in the low band of the Service range that
	// kube-apiserver keeps for static addresses, so the Services it
	// allocates addresses for never collide with them.
	canaryName = "canary"
	changeName = "change"
	fixedCount = 2

	servicePort   = 80
	canaryPort    = 8080 // echo servers of the canary's endpoints
	changePortA   = 8081 // the changed Service alternates between
	changePortB   = 8082 // endpoints on these two ports
	bulkPort      = 9000 // nothing listens: a connection is reset by the backend
	maxEndpoints  = 20   // the lab's backend addresses
	minServices   = fixedCount + 2
	maxServices   = 110_000
	firstBulkName = "svc-%06d"
)

var (
	canaryIP = netip.MustParseAddr("198.19.0.10")
	changeIP = netip.MustParseAddr("198.19.0.11")

	// extraServiceCIDRs hold the ClusterIPs beyond kubetest's /16 (65,534
	// addresses) for the largest sizes, inside the lab's 198.18.0.0/15 and
	// clear of its networks (198.18.0-2.x). Only Services nobody connects
	// to get addresses there.
	extraServiceCIDRs = []string{"198.18.128.0/17", "198.18.64.0/18"}

	// bulkRanges are the ClusterIPs the bulk Services get, in order: the
	// Service range above its low band (198.19.0.x, where the canary and
	// the changed Service are), then the extra ServiceCIDRs without their
	// network and broadcast addresses, which no allocator hands out.
	bulkRanges = []ipRange{
		{netip.MustParseAddr("198.19.1.0"), netip.MustParseAddr("198.19.255.254")},
		{netip.MustParseAddr("198.18.128.1"), netip.MustParseAddr("198.18.255.254")},
		{netip.MustParseAddr("198.18.64.1"), netip.MustParseAddr("198.18.127.254")},
	}
)

// ipRange is the IPv4 addresses from first to last, both included.
type ipRange struct{ first, last netip.Addr }

func (r ipRange) size() int { return int(ipv4Uint(r.last) - ipv4Uint(r.first) + 1) }

func ipv4Uint(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// bulkIP is the ClusterIP of bulk Service i (counted from 0).
//
// The benchmark names the addresses instead of leaving the choice to
// kube-apiserver because that is much cheaper for it. Since Kubernetes
// 1.33 every ClusterIP is an IPAddress object, and after creating one the
// allocator counts all IPAddress objects in its cache twice for its
// metrics: each Service costs time proportional to the Services already
// there. For an address it picks itself it does that while holding the one
// lock of all its ranges, so Service creates run one at a time; for a
// requested address it takes no such lock, and creates run on every core.
func bulkIP(i int) (netip.Addr, error) {
	for _, r := range bulkRanges {
		if i < r.size() {
			v := ipv4Uint(r.first) + uint32(i)
			return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
		}
		i -= r.size()
	}
	return netip.Addr{}, fmt.Errorf("bulk Service %d: no ClusterIP left in %v", i, bulkRanges)
}

// Env is the lab, the control plane and the Services every proxier is
// measured against.
type Env struct {
	Cfg    *Config
	Topo   *lab.Topology
	API    *kubetest.ControlPlane
	Client kubernetes.Interface
	LogDir string
	// Manifests, when set (--source manifests), is where the Services go
	// instead of the API: nftgate reads the directory with --manifests,
	// and API and Client are nil.
	Manifests *ManifestDir

	bulk       int                // bulk Services created so far
	probeIPs   map[int]netip.Addr // ClusterIPs of bulk Services used as probes
	change     *discoveryv1.EndpointSlice
	changeOnB  bool // the changed Service's endpoints are on changePortB
	extraCIDRs bool
	// churnWrites counts the churn phase's EndpointSlice writes over the
	// whole run (churn.go).
	churnWrites atomic.Int64
}

// Setup creates the Node object (in the API), the echo servers and the
// canary and changed Services.
func (e *Env) Setup(ctx context.Context) error {
	e.probeIPs = map[int]netip.Addr{}
	backends := e.Topo.BackendIPv4[:e.Cfg.Endpoints]
	for _, port := range []uint16{canaryPort, changePortA, changePortB} {
		for _, ip := range backends {
			if _, err := e.Topo.Backend.ServeEcho("tcp", netip.AddrPortFrom(ip, port)); err != nil {
				return err
			}
		}
	}
	if e.Manifests != nil {
		return e.writeFixed()
	}
	c := e.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	// kube-proxy waits for its Node object and takes the node IPs from it.
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", nodeName, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: e.Topo.GatewayClientIPv4.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set addresses of Node %s: %w", nodeName, err)
	}
	if err := e.createService(ctx, canaryName, canaryIP, canaryPort, backends); err != nil {
		return err
	}
	if err := e.createService(ctx, changeName, changeIP, changePortA, backends); err != nil {
		return err
	}
	sl, err := c.DiscoveryV1().EndpointSlices(namespace).Get(ctx, changeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	e.change = sl
	return nil
}

func (e *Env) createService(ctx context.Context, name string, ip netip.Addr, port int32, backends []netip.Addr) error {
	if _, err := e.Client.CoreV1().Services(namespace).Create(ctx, service(name, ip), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s/%s: %w", namespace, name, err)
	}
	if _, err := e.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice(name, port, backends), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", namespace, name, err)
	}
	return nil
}

// service is the benchmark's Service name with one TCP port, 80, at
// ClusterIP ip: the same object whether it goes to the API or into a
// manifest file.
func service(name string, ip netip.Addr) *corev1.Service {
	svc := gatewaytest.Service(namespace, name, "ClusterIP", []string{ip.String()}, gatewaytest.Port{Name: "http", Port: servicePort})
	svc.CreationTimestamp = metav1.Time{}
	return svc
}

// bulkObjects are bulk Service i (counted from 0) and its EndpointSlice:
// K endpoints on the backend host, taken in turn from its addresses, on a
// port where nothing listens.
func (e *Env) bulkObjects(i int) (*corev1.Service, *discoveryv1.EndpointSlice, error) {
	name := fmt.Sprintf(firstBulkName, i)
	clusterIP, err := bulkIP(i)
	if err != nil {
		return nil, nil, err
	}
	backends := make([]netip.Addr, e.Cfg.Endpoints)
	all := e.Topo.BackendIPv4
	for j := range backends {
		backends[j] = all[(i*e.Cfg.Endpoints+j)%len(all)]
	}
	return service(name, clusterIP), slice(name, bulkPort, backends), nil
}

func slice(service string, port int32, backends []netip.Addr) *discoveryv1.EndpointSlice {
	eps := make([]gatewaytest.Endpoint, len(backends))
	for i, ip := range backends {
		eps[i] = gatewaytest.Endpoint{Addr: ip.String()}
	}
	sl := gatewaytest.Slice(namespace, service, service, "http", "", port, eps...)
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
	return sl
}

// LoadTo creates bulk Services until the API holds n Services in the bench
// namespace (the canary and the changed Service included), each with one
// EndpointSlice of K endpoints on the backend host, with as many writers
// as --load-workers; or, with Manifests, writes them into its files. It
// returns the time the writes took.
func (e *Env) LoadTo(ctx context.Context, n int) (time.Duration, error) {
	target := n - fixedCount
	if target <= e.bulk {
		return 0, nil
	}
	if e.Manifests != nil {
		return e.writeBulk(ctx, target)
	}
	if target > bulkRanges[0].size() && !e.extraCIDRs {
		if err := e.addServiceCIDRs(ctx); err != nil {
			return 0, err
		}
	}
	client, err := e.protoClient()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	next := make(chan int)
	errc := make(chan error, e.Cfg.LoadWorkers)
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range e.Cfg.LoadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ip, err := e.createBulk(ctx, client, i)
				if err != nil {
					errc <- err
					cancel()
					return
				}
				if i == 0 || i == target-1 || i == target/2 {
					mu.Lock()
					e.probeIPs[i] = ip
					mu.Unlock()
				}
			}
		}()
	}
	lastLog, lastCount := time.Now(), e.bulk
feed:
	for i := e.bulk; i < target; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
		if since := time.Since(lastLog); since > 10*time.Second {
			logf("  loading: %d of %d Services (%.0f/s)", i+fixedCount, n, float64(i-lastCount)/since.Seconds())
			lastLog, lastCount = time.Now(), i
		}
	}
	close(next)
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	e.bulk = target
	return time.Since(start), nil
}

// protoClient is a client of the API that speaks protobuf, as
// kube-apiserver's own clients do: cheaper than JSON to encode here and to
// decode there, on the same two cores.
func (e *Env) protoClient() (kubernetes.Interface, error) {
	cfg := e.API.RESTConfig()
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(cfg)
}

func (e *Env) createBulk(ctx context.Context, client kubernetes.Interface, i int) (netip.Addr, error) {
	svc, sl, err := e.bulkObjects(i)
	if err != nil {
		return netip.Addr{}, err
	}
	name := svc.Name
	var created *corev1.Service
	err = retryTransient(ctx, func() error {
		var err error
		created, err = client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
		// A create that timed out may have succeeded: then the retry
		// finds the name taken, or first its ClusterIP.
		if apierrors.IsAlreadyExists(err) || apierrors.IsInvalid(err) && strings.Contains(err.Error(), "already allocated") {
			var gerr error
			if created, gerr = client.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{}); gerr == nil || apierrors.IsAlreadyExists(err) {
				return gerr
			}
		}
		return err
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("create Service %s/%s: %w", namespace, name, err)
	}
	ip, err := netip.ParseAddr(created.Spec.ClusterIP)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("Service %s/%s: spec.clusterIP %q: %w", namespace, name, created.Spec.ClusterIP, err)
	}
	err = retryTransient(ctx, func() error {
		_, err := client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sl, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("create EndpointSlice %s/%s: %w", namespace, name, err)
	}
	return ip, nil
}

// retryTransient retries fn while the API server answers that it is too
// busy, as it may under thousands of writes on two cores.
func retryTransient(ctx context.Context, fn func() error) error {
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || attempt == 10 || !(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) ||
			apierrors.IsTimeout(err) || apierrors.IsServiceUnavailable(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay *= 2
	}
}

// addServiceCIDRs adds ServiceCIDR objects so the API can allocate more
// ClusterIPs than kubetest's /16 holds.
func (e *Env) addServiceCIDRs(ctx context.Context) error {
	for i, cidr := range extraServiceCIDRs {
		obj := &networkingv1.ServiceCIDR{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-extra-%d", i)},
			Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr}},
		}
		if _, err := e.Client.NetworkingV1().ServiceCIDRs().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ServiceCIDR %s: %w", cidr, err)
		}
	}
	// The allocator takes a new range only once it is Ready.
	deadline := time.Now().Add(time.Minute)
	for i := range extraServiceCIDRs {
		name := fmt.Sprintf("bench-extra-%d", i)
		for {
			obj, err := e.Client.NetworkingV1().ServiceCIDRs().Get(ctx, name, metav1.GetOptions{})
			if err == nil && ready(obj.Status.Conditions) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("ServiceCIDR %s not Ready after a minute (last error: %v)", name, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	e.extraCIDRs = true
	return nil
}

func ready(conds []metav1.Condition) bool {
	for _, c := range conds {
		if c.Type == networkingv1.ServiceCIDRConditionReady && c.Status == metav1.ConditionTrue {
			return true
		}
	}
	return false
}

// Probe is a Service the cold start waits for.
type Probe struct {
	Name string
	Dst  netip.AddrPort
	// Echo: an echo server answers. Otherwise the endpoints have no
	// server, and a reset from the backend proves the rules are there
	// (without them the connection times out in the gateway's sink).
	Echo bool
}

// Probes are the canary and the first, middle and last bulk Services
// created, so a cold start counts only when the whole set is served.
func (e *Env) Probes() []Probe {
	ps := []Probe{{Name: canaryName, Dst: netip.AddrPortFrom(canaryIP, servicePort), Echo: true}}
	for _, i := range []int{0, e.bulk / 2, e.bulk - 1} {
		if ip, ok := e.probeIPs[i]; ok {
			ps = append(ps, Probe{Name: fmt.Sprintf(firstBulkName, i), Dst: netip.AddrPortFrom(ip, servicePort)})
		}
	}
	return ps
}

// ChangeEndpoints moves the changed Service's endpoints to the other port
// and returns the port traffic must now reach and the time of the write.
func (e *Env) ChangeEndpoints(ctx context.Context) (uint16, time.Time, error) {
	port := uint16(changePortB)
	if e.changeOnB {
		port = changePortA
	}
	next := slice(changeName, int32(port), e.Topo.BackendIPv4[:e.Cfg.Endpoints])
	if e.Manifests != nil {
		// The whole small file is rewritten, as tooling regenerating
		// it would; the time is that of the rename.
		at, err := e.Manifests.Write(changeFile, service(changeName, changeIP), next)
		if err != nil {
			return 0, at, err
		}
		e.changeOnB = !e.changeOnB
		return port, at, nil
	}
	next.ResourceVersion = e.change.ResourceVersion
	at := time.Now()
	updated, err := e.Client.DiscoveryV1().EndpointSlices(namespace).Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return 0, at, fmt.Errorf("update EndpointSlice %s/%s: %w", namespace, changeName, err)
	}
	e.change = updated
	e.changeOnB = !e.changeOnB
	return port, at, nil
}

// ChangePort is the port the changed Service's endpoints are on now.
func (e *Env) ChangePort() uint16 {
	if e.changeOnB {
		return changePortB
	}
	return changePortA
}
