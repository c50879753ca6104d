package ipam

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nftgate/nftgate/internal/kubeclient"
)

// Watch feeds c every Service of the cluster until ctx ends, for a
// controller that no other informer feeds.
func Watch(ctx context.Context, cfg *rest.Config, c *Controller) error {
	core, err := kubeclient.New(cfg, corev1.SchemeGroupVersion)
	if err != nil {
		return fmt.Errorf("ipam: watch Services: %w", err)
	}
	inf := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(core, "services", corev1.NamespaceAll, fields.Everything()),
		&corev1.Service{}, 0, cache.Indexers{})
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { setService(c, o) },
		UpdateFunc: func(_, o any) { setService(c, o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if s, ok := o.(*corev1.Service); ok {
				c.DeleteService(Key{s.Namespace, s.Name})
			}
		},
	})
	if err != nil {
		return fmt.Errorf("ipam: watch Services: %w", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		c.SetSynced()
	}
	<-done
	return nil
}

func setService(c *Controller, o any) {
	if s, ok := o.(*corev1.Service); ok {
		c.SetService(NewService(s))
	}
}
