package source

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const (
	richService = `{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"shop","labels":{"a":"b"},` +
		`"annotations":{"x":"y"},"creationTimestamp":"2024-01-02T03:04:05Z"},"spec":{"type":"LoadBalancer","clusterIP":"10.0.0.1",` +
		`"clusterIPs":["10.0.0.1","fd00::1"],"ipFamilies":["IPv4","IPv6"],"externalIPs":["192.0.2.1"],"sessionAffinity":"ClientIP",` +
		`"sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}},"externalTrafficPolicy":"Local","healthCheckNodePort":31000,` +
		`"loadBalancerSourceRanges":["198.51.100.0/24"],"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":"http","nodePort":30080},` +
		`{"name":"dns","protocol":"UDP","port":53,"targetPort":5353}]},"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.9"}]}}}`
	richSlice = `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"shop",` +
		`"labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],` +
		`"endpoints":[{"addresses":["10.1.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"n1",` +
		`"zone":"z1","hints":{"forZones":[{"name":"z1"}]}},{"addresses":["10.1.0.2"],"conditions":{"ready":false}}]}`
)

// TestDecodeDocumentAsTheStrictCodec holds the one-pass decode to what
// Kubernetes' strict codec makes of the same documents, and of their
// YAML form.
func TestDecodeDocumentAsTheStrictCodec(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	yamlService := "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  clusterIP: 10.0.0.1\n" +
		"  ports:\n  - port: 80\n    targetPort: 8080\n"
	for _, doc := range []string{richService, richSlice, yamlService} {
		want, _, err := codec.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeDocument([]byte(doc))
		if err != nil {
			t.Fatalf("decode %.40s: %v", doc, err)
		}
		if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
			t.Errorf("decode %.40s:\n got %#v\nwant %#v", doc, got, want)
		}
	}
}

func TestDecodeDocument(t *testing.T) {
	deployment := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"anything":[1,{"x":null}]}}`
	for _, tc := range []struct {
		name, doc string
		kinds     []string // of the objects decoded
		err       string   // what the error must say
	}{
		{name: "service", doc: richService, kinds: []string{"Service"}},
		{name: "kind before apiVersion", doc: `{"kind":"Service","metadata":{"name":"a"},"apiVersion":"v1"}`, kinds: []string{"Service"}},
		{name: "other kind skipped", doc: deployment},
		{name: "other group's Service skipped", doc: `{"apiVersion":"example.com/v1","kind":"Service","spec":{"x":1}}`},
		{name: "list", doc: `{"apiVersion":"v1","kind":"List","items":[` + richService + `,` + deployment + `,` + richSlice + `]}`,
			kinds: []string{"Service", "EndpointSlice"}},
		{name: "items before kind", doc: `{"items":[` + richSlice + `],"apiVersion":"v1","kind":"ServiceList"}`, kinds: []string{"EndpointSlice"}},
		{name: "list item bad", doc: `{"apiVersion":"v1","kind":"List","items":[` + richService + `,{"kind":"Service","apiVersion":"v1","spec":{"bogus":1}}]}`,
			err: `items[1]: Service: strict decoding error: unknown field "spec.bogus"`},
		{name: "unknown field", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterAddress":"10.0.0.1"}}`,
			err: `Service: strict decoding error: unknown field "spec.clusterAddress"`},
		{name: "duplicate field", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","name":"b"}}`,
			err: `duplicate field "metadata.name"`},
		{name: "wrong type", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":"eighty"}]}}`,
			err: `Service: field "spec.ports[0].port": cannot decode a JSON string "eighty" into int32`},
		{name: "wrong kind", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","labels":[1]}}`,
			err: `Service: field "metadata.labels": cannot decode a JSON array into map[string]string`},
		{name: "bad time", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","creationTimestamp":"yesterday"}}`,
			err: `Service: field "metadata.creationTimestamp": cannot decode a JSON string "yesterday" into v1.Time: parsing time "yesterday"`},
		{name: "unknown field in a list", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80},{"port":81,"nodeport":30081}]}}`,
			err: `Service: strict decoding error: unknown field "spec.ports[1].nodeport"`},
		{name: "duplicate field in a list", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":80,"port":81}]}}`,
			err: `Service: strict decoding error: duplicate field "spec.ports[0].port"`},
		{name: "number out of range", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"ports":[{"port":4294967296}]}}`,
			err: `Service: field "spec.ports[0].port": cannot decode a JSON number 4294967296 into int32: value out of range`},
		{name: "malformed after the kind", doc: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{`, err: "Service: "},
		{name: "malformed other kind", doc: `{"apiVersion":"apps/v1","kind":"Deployment","spec":{"x":[1,}}`, err: "not a Kubernetes object"},
		{name: "two values", doc: `{"apiVersion":"apps/v1","kind":"Deployment"} {}`, err: "not a Kubernetes object"},
		{name: "no kind", doc: `{"apiVersion":"v1","metadata":{"name":"a"}}`, err: "kind is missing"},
		{name: "null kind", doc: `{"apiVersion":"v1","kind":null}`, err: "kind is missing"},
		{name: "kind not a string", doc: `{"apiVersion":"v1","kind":7}`, err: "not a Kubernetes object: kind: a JSON number, not a string"},
		{name: "no apiVersion", doc: `{"kind":"Service","metadata":{"name":"a"}}`, err: "Service: apiVersion is missing"},
		{name: "not an object", doc: `just text`, err: "not a Kubernetes object: a JSON string, not an object"},
		{name: "no name", doc: `{"apiVersion":"v1","kind":"Service"}`, err: "Service: metadata.name is missing"},
		{name: "slice without service", doc: `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"s"},"addressType":"IPv4"}`,
			err: "EndpointSlice s: label kubernetes.io/service-name is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := decodeDocument([]byte(tc.doc))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
			}
			if !reflect.DeepEqual(kinds, tc.kinds) {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
		})
	}
}

// BenchmarkDecodeDocument is one Service and one EndpointSlice of the
// benchmark's shape, decoded.
func BenchmarkDecodeDocument(b *testing.B) {
	docs := [][]byte{[]byte(richService), []byte(richSlice)}
	if _, err := utilyaml.ToJSON(docs[0]); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, d := range docs {
			if _, err := decodeDocument(d); err != nil {
				b.Fatal(err)
			}
		}
	}
}
