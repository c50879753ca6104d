// Package kubeclient builds the REST clients nftgate talks to the
// Kubernetes API with: one per API group version, speaking protobuf, with a
// scheme that knows only the kinds nftgate reads or writes.
//
// client-go's clientset, its typed clients, its informer factory, its
// leader election and its event recorder all import
// k8s.io/client-go/kubernetes/scheme, which links and registers every API
// group of Kubernetes at start: that made the binary more than twice as big
// and its resident memory tens of megabytes bigger, for a handful of
// resources. Everything that talks to the API goes through New instead.
package kubeclient

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// The kinds nftgate uses: Services, Nodes and Events (core/v1),
// EndpointSlices (discovery/v1) and Leases (coordination/v1).
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, coordinationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
}

// Protobuf is the content type requests are sent in, as kube-proxy sends
// them: a list of ten thousand Services or EndpointSlices decodes with a
// fraction of the memory and time JSON takes. Responses may be JSON too
// (for kinds the server does not serve as protobuf).
const Protobuf = "application/vnd.kubernetes.protobuf"

// New returns a REST client of cfg's server for the group version gv, one
// of the kinds above. cfg is not modified; without a user agent, the
// client names itself as client-go does.
func New(cfg *rest.Config, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.ContentType = Protobuf
	c.AcceptContentTypes = Protobuf + ",application/json"
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientFor(c)
}
