package source

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/nftgate/nftgate/internal/kubeclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Nodes watches the cluster's Nodes, keeping of each only its name,
// spec.podCIDR(s) and InternalIP addresses (routes to pods need nothing
// else), in protobuf through the same REST client as the Services.
type Nodes struct {
	// OnChange, when set, is called after every change once the first
	// list is in (and once for that list), on the informer's goroutine.
	OnChange func()

	mu     sync.Mutex
	inf    cache.SharedIndexInformer
	synced bool
}

// trimNode keeps what Nodes keeps of a Node. It is idempotent, as
// client-go asks of a transform.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	t := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion},
		Spec: corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs}}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			t.Status.Addresses = append(t.Status.Addresses, a)
		}
	}
	return t, nil
}

// Run lists and watches the Nodes of the source's cluster until ctx ends.
func (n *Nodes) Run(ctx context.Context, k *KubeSource) error {
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
	inf := cache.NewSharedIndexInformerWithOptions(
		cache.NewFilteredListWatchFromClient(core, "nodes", metav1.NamespaceAll, func(*metav1.ListOptions) {}),
		&corev1.Node{}, cache.SharedIndexInformerOptions{})
	if err := inf.SetTransform(trimNode); err != nil {
		return err
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		log.Warn("kubernetes watch of Nodes failed; the routes to pods stay as they are", "err", err)
	}); err != nil {
		return err
	}
	changed := func() {
		n.mu.Lock()
		synced := n.synced
		n.mu.Unlock()
		if synced && n.OnChange != nil {
			n.OnChange()
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(_, _ any) { changed() },
		DeleteFunc: func(any) { changed() },
	})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.inf = inf
	n.mu.Unlock()
	var running sync.WaitGroup
	defer running.Wait()
	running.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil // ctx ended
	}
	n.mu.Lock()
	n.synced = true
	n.mu.Unlock()
	changed()
	<-ctx.Done()
	return nil
}

// Synced tells whether the first list is in.
func (n *Nodes) Synced() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.synced
}

// List returns the Nodes as kept (name, pod CIDRs, InternalIPs), sorted by
// name; nil before the first list.
func (n *Nodes) List() []*corev1.Node {
	n.mu.Lock()
	inf := n.inf
	n.mu.Unlock()
	if inf == nil {
		return nil
	}
	var out []*corev1.Node
	for _, o := range inf.GetStore().List() {
		if node, ok := o.(*corev1.Node); ok {
			out = append(out, node)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}
