package gatewaytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftgate/nftgate/internal/testing/kubetest"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// NewWithAPI prepares nftgate for topo's gateway namespace with a real
// kube-apiserver and etcd running in that namespace. Write and Remove then
// create, update and delete the objects through the API instead of files:
// the same test runs against both sources.
func NewWithAPI(t testing.TB, topo *lab.Topology, extra ...string) *Gateway {
	t.Helper()
	cp := kubetest.StartForTest(t, kubetest.Options{NetNS: topo.Gateway.Name()})
	g := New(t, topo, extra...)
	g.API = cp
	g.client = cp.Client()
	g.files = map[string][]objKey{}
	g.Args = append([]string{"--kubeconfig", cp.Kubeconfig(), "--listen", Listen, "--node-name", "gateway"}, extra...)
	return g
}

type objKey struct {
	kind, namespace, name string
}

// apiWrite makes the API hold exactly objs for this file: it creates or
// updates them, and deletes what the file held before and no longer does.
func (g *Gateway) apiWrite(name string, objs []any) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keys []objKey
	for _, o := range objs {
		switch obj := o.(type) {
		case *corev1.Service:
			keys = append(keys, objKey{"Service", obj.Namespace, obj.Name})
			g.applyService(ctx, obj.DeepCopy())
		case *discoveryv1.EndpointSlice:
			keys = append(keys, objKey{"EndpointSlice", obj.Namespace, obj.Name})
			g.applySlice(ctx, obj.DeepCopy())
		default:
			g.t.Fatalf("gatewaytest: cannot write %T through the API", o)
		}
	}
	for _, old := range g.files[name] {
		kept := false
		for _, k := range keys {
			kept = kept || k == old
		}
		if !kept {
			g.apiDelete(ctx, old)
		}
	}
	g.files[name] = keys
}

func (g *Gateway) apiRemove(name string) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range g.files[name] {
		g.apiDelete(ctx, k)
	}
	delete(g.files, name)
}

func (g *Gateway) ensureNamespace(ctx context.Context, ns string) {
	_, err := g.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		g.t.Fatalf("create namespace %s: %v", ns, err)
	}
}

func (g *Gateway) applyService(ctx context.Context, s *corev1.Service) {
	g.t.Helper()
	g.ensureNamespace(ctx, s.Namespace)
	c := g.client.CoreV1().Services(s.Namespace)
	status := s.Status
	s.ResourceVersion, s.CreationTimestamp = "", metav1.Time{}
	cur, err := c.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = c.Create(ctx, s, metav1.CreateOptions{})
	case err == nil:
		s.ResourceVersion = cur.ResourceVersion
		cur, err = c.Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		g.t.Fatalf("write Service %s/%s: %v", s.Namespace, s.Name, err)
	}
	if len(status.LoadBalancer.Ingress) > 0 {
		cur.Status = status
		if _, err := c.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			g.t.Fatalf("write Service %s/%s status: %v", s.Namespace, s.Name, err)
		}
	}
}

func (g *Gateway) applySlice(ctx context.Context, sl *discoveryv1.EndpointSlice) {
	g.t.Helper()
	g.ensureNamespace(ctx, sl.Namespace)
	c := g.client.DiscoveryV1().EndpointSlices(sl.Namespace)
	if sl.Annotations == nil {
		sl.Annotations = map[string]string{}
	}
	sl.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	cur, err := c.Get(ctx, sl.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(ctx, sl, metav1.CreateOptions{})
	case err == nil:
		sl.ResourceVersion = cur.ResourceVersion
		_, err = c.Update(ctx, sl, metav1.UpdateOptions{})
	}
	if err != nil {
		g.t.Fatalf("write EndpointSlice %s/%s: %v", sl.Namespace, sl.Name, err)
	}
}

func (g *Gateway) apiDelete(ctx context.Context, k objKey) {
	g.t.Helper()
	var err error
	switch k.kind {
	case "Service":
		err = g.client.CoreV1().Services(k.namespace).Delete(ctx, k.name, metav1.DeleteOptions{})
	case "EndpointSlice":
		err = g.client.DiscoveryV1().EndpointSlices(k.namespace).Delete(ctx, k.name, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		g.t.Fatalf("delete %s %s/%s: %v", k.kind, k.namespace, k.name, err)
	}
}

// Client is the API client of a Gateway made with NewWithAPI.
func (g *Gateway) Client() kubernetes.Interface {
	if g.client == nil {
		panic(fmt.Sprintf("gatewaytest: %s serves manifests, not an API", g.Dir))
	}
	return g.client
}
