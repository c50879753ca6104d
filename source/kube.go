package source

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftgate/nftgate/internal/kubeclient"
	"github.com/nftgate/nftgate/model"
)

// KubeSource watches Services and EndpointSlices in the Kubernetes API with
// client-go informers.
type KubeSource struct {
	Config *rest.Config
	Log    *slog.Logger
	// Resync is the informers' resync period; zero disables it (the
	// Syncer's reconcile repairs the kernel independently).
	Resync time.Duration
	// Hook, when set, sees every Service from the same informer as the
	// ruleset (address allocation).
	Hook ServiceHook

	mu        sync.Mutex
	connected bool
	lastErr   string
	// onEvent, when set, is called for every event before the handlers
	// record it: tests make the handlers lag behind the informers with it.
	onEvent func()
}

// LoadKubeConfig finds the cluster: an explicit kubeconfig path, then
// $KUBECONFIG, then the in-cluster service account. ok is false when none
// is configured.
func LoadKubeConfig(path string) (cfg *rest.Config, ok bool, err error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	} else if len(rules.Precedence) == 0 || !anyExists(rules.Precedence) {
		c, err := rest.InClusterConfig()
		if err == rest.ErrNotInCluster {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("in-cluster config: %w", err)
		}
		return c, true, nil
	}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, false, fmt.Errorf("kubeconfig: %w", err)
	}
	return c, true, nil
}

func anyExists(paths []string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// Describe implements Source.
func (k *KubeSource) Describe() string { return "kubernetes:" + k.Config.Host }

// Problems implements Source.
func (k *KubeSource) Problems() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lastErr != "" {
		return []string{k.lastErr}
	}
	return nil
}

// probe checks the API every few seconds: a quiet watch says nothing about
// whether the server is still there.
func (k *KubeSource) probe(ctx context.Context, client rest.Interface, log *slog.Logger) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := client.Get().AbsPath("/version").Do(pctx).Raw()
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Debug("kubernetes API probe failed", "err", err)
		}
		k.mu.Lock()
		k.connected = err == nil
		if err != nil {
			k.lastErr = err.Error()
		} else {
			k.lastErr = ""
		}
		k.mu.Unlock()
	}
}

// Connected tells whether the last API request succeeded.
func (k *KubeSource) Connected() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.connected
}

// convertForCache converts the objects the informers keep to what the
// model reads of them (model.ServiceObject, model.SliceObject): at ten
// thousand Services the API objects, even trimmed, were the largest part of
// the gateway's memory. The tracker keeps the same converted objects, so
// each is held once. It is idempotent, as client-go asks of a transform.
func (k *KubeSource) convertForCache(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		c := &cachedService{ServiceObject: model.NewServiceObject(o)}
		if k.Hook != nil {
			c.hooked = k.Hook.Convert(o)
		}
		return c, nil
	case *discoveryv1.EndpointSlice:
		return &cachedSlice{model.NewSliceObject(o)}, nil
	}
	return obj, nil
}

// ServiceHook sees the Services of a KubeSource in their API form, before
// the informer keeps only what the model needs: Convert keeps what the hook
// needs of a Service beside the model's object (once, in the informer's
// transform), and Set, Delete and SetSynced follow the informer's events,
// as the Sink does.
type ServiceHook interface {
	Convert(*corev1.Service) any
	Set(converted any)
	Delete(namespace, name string)
	SetSynced()
}

// cachedService is a Service as the informer keeps it.
type cachedService struct {
	*model.ServiceObject
	hooked any // what the Hook keeps of it
}

// GetObjectMeta gives the informer the Service's name and namespace, its
// keys; nothing else of the metadata is kept.
func (c *cachedService) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.Key.Namespace(), Name: c.Key.Name()}
}

// GetObjectKind implements runtime.Object.
func (c *cachedService) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object. The converted object is never
// modified, so a copy may share it.
func (c *cachedService) DeepCopyObject() runtime.Object { cp := *c; return &cp }

// cachedSlice is an EndpointSlice as the informer keeps it.
type cachedSlice struct{ *model.SliceObject }

// GetObjectMeta gives the informer the slice's name and namespace.
func (c *cachedSlice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.Namespace(), Name: c.Name}
}

// GetObjectKind implements runtime.Object.
func (c *cachedSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (c *cachedSlice) DeepCopyObject() runtime.Object { cp := *c; return &cp }

// Run implements Source.
func (k *KubeSource) Run(ctx context.Context, t Sink) error {
	log := k.Log
	if log == nil {
		log = slog.Default()
	}
	cfg := rest.CopyConfig(k.Config)
	cfg.UserAgent = "nftgate"
	core, err := kubeclient.New(cfg, corev1.SchemeGroupVersion)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	discovery, err := kubeclient.New(cfg, discoveryv1.SchemeGroupVersion)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// Headless Services are never proxied; let the server filter them.
	svcInf := cache.NewSharedIndexInformerWithOptions(
		cache.NewFilteredListWatchFromClient(core, "services", metav1.NamespaceAll, func(o *metav1.ListOptions) {
			o.LabelSelector = "!" + model.LabelHeadless
		}),
		&corev1.Service{}, cache.SharedIndexInformerOptions{ResyncPeriod: k.Resync})
	sliceInf := cache.NewSharedIndexInformerWithOptions(
		cache.NewFilteredListWatchFromClient(discovery, "endpointslices", metav1.NamespaceAll, func(*metav1.ListOptions) {}),
		&discoveryv1.EndpointSlice{}, cache.SharedIndexInformerOptions{ResyncPeriod: k.Resync})
	for _, inf := range []cache.SharedIndexInformer{svcInf, sliceInf} {
		if err := inf.SetTransform(k.convertForCache); err != nil {
			return err
		}
	}
	watchErr := func(_ *cache.Reflector, err error) {
		k.mu.Lock()
		k.connected = false
		k.lastErr = err.Error()
		k.mu.Unlock()
		log.Warn("kubernetes watch failed; the rules in the kernel stay as they are", "err", err)
	}
	if err := svcInf.SetWatchErrorHandler(watchErr); err != nil {
		return err
	}
	if err := sliceInf.SetWatchErrorHandler(watchErr); err != nil {
		return err
	}
	seen := func() {
		k.mu.Lock()
		k.connected, k.lastErr = true, ""
		k.mu.Unlock()
	}
	event := func() {
		if k.onEvent != nil {
			k.onEvent()
		}
		seen()
	}
	// The informers' own HasSynced says their stores hold the first list;
	// the handlers get it later, on their own goroutines. Only the
	// registrations tell when the tracker has all of it: a full sync of
	// less would remove the rules of Services not yet handed over (and
	// the next sync would add them back, as one slow partial sync).
	svcReg, err := svcInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { event(); k.setCachedService(t, o) },
		UpdateFunc: func(_, o any) { event(); k.setCachedService(t, o) },
		DeleteFunc: func(o any) {
			event()
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if c, ok := o.(*cachedService); ok {
				t.DeleteService(c.Key)
				if k.Hook != nil {
					k.Hook.Delete(c.Key.Namespace(), c.Key.Name())
				}
			}
		},
	})
	if err != nil {
		return err
	}
	sliceReg, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { event(); setCachedSlice(t, o) },
		UpdateFunc: func(_, o any) { event(); setCachedSlice(t, o) },
		DeleteFunc: func(o any) {
			event()
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if c, ok := o.(*cachedSlice); ok {
				t.DeleteSlice(c.Namespace(), c.Name)
			}
		},
	})
	if err != nil {
		return err
	}
	var running sync.WaitGroup
	defer running.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	running.Go(func() { svcInf.RunWithContext(ctx) })
	running.Go(func() { sliceInf.RunWithContext(ctx) })
	go k.probe(ctx, core, log)
	log.Info("waiting for the kubernetes API's complete view before changing anything", "server", cfg.Host)
	if !cache.WaitForCacheSync(ctx.Done(), svcReg.HasSynced, sliceReg.HasSynced) {
		return nil // ctx ended
	}
	seen()
	t.SetSynced()
	if k.Hook != nil {
		k.Hook.SetSynced()
	}
	<-ctx.Done()
	return nil
}

func (k *KubeSource) setCachedService(t Sink, o any) {
	if c, ok := o.(*cachedService); ok {
		t.SetServiceObject(c.ServiceObject)
		if k.Hook != nil {
			k.Hook.Set(c.hooked)
		}
	}
}

func setCachedSlice(t Sink, o any) {
	if c, ok := o.(*cachedSlice); ok {
		t.SetSliceObject(c.SliceObject)
	}
}

// NodeZone reads the topology zone label of the named Node, for a gateway
// that runs as (or next to) that node and has no zone configured.
func (k *KubeSource) NodeZone(ctx context.Context, node string) (string, error) {
	client, err := kubeclient.New(k.Config, corev1.SchemeGroupVersion)
	if err != nil {
		return "", err
	}
	var n corev1.Node
	if err := client.Get().Resource("nodes").Name(node).Do(ctx).Into(&n); err != nil {
		return "", err
	}
	return n.Labels[corev1.LabelTopologyZone], nil
}
