package model_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nftgate/nftgate/model"
)

// TestNamesValidatedAsTheAPI: every name the ruleset derives object names
// from is checked as the Kubernetes API checks it, and a bad one is an error
// naming the object, the field and the value.
func TestNamesValidatedAsTheAPI(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		name string
		mod  func(*corev1.Service)
		want string // "" when valid
	}{
		{"longest namespace", func(s *corev1.Service) { s.Namespace = long(63) }, ""},
		{"longest name", func(s *corev1.Service) { s.Name = long(63) }, ""},
		{"name starting with a digit (1.37)", func(s *corev1.Service) { s.Name = "1st-api" }, ""},
		{"longest port name", func(s *corev1.Service) { s.Spec.Ports[0].Name = long(63) }, ""},
		{"one unnamed port", func(s *corev1.Service) { s.Spec.Ports[0].Name = "" }, ""},
		{"empty namespace is default", func(s *corev1.Service) { s.Namespace = "" }, ""},
		{"namespace too long", func(s *corev1.Service) { s.Namespace = long(64) },
			`service "` + long(64) + `/web": metadata.namespace: Invalid value: "` + long(64) + `": must be no more than 63 characters`},
		{"namespace with a slash", func(s *corev1.Service) { s.Namespace = "a/b" },
			`metadata.namespace: Invalid value: "a/b": a lowercase RFC 1123 label`},
		{"name too long", func(s *corev1.Service) { s.Name = long(64) }, `metadata.name: Invalid value: "` + long(64) + `": must be no more than 63`},
		{"name empty", func(s *corev1.Service) { s.Name = "" }, `metadata.name: Invalid value: ""`},
		{"name with a slash", func(s *corev1.Service) { s.Name = "b/c" }, `metadata.name: Invalid value: "b/c"`},
		{"name with a newline and braces", func(s *corev1.Service) { s.Name = "x\n}\ntable ip evil {" },
			`service "ns1/x\n}\ntable ip evil {": metadata.name: Invalid value: "x\n}\ntable ip evil {"`},
		{"name in capitals", func(s *corev1.Service) { s.Name = "Web" }, `metadata.name: Invalid value: "Web"`},
		{"port name too long", func(s *corev1.Service) { s.Spec.Ports[0].Name = long(64) }, `spec.ports[0].name: Invalid value: "` + long(64) + `"`},
		{"port name with a semicolon", func(s *corev1.Service) { s.Spec.Ports[0].Name = "a;b" }, `spec.ports[0].name: Invalid value: "a;b"`},
		{"port names repeated", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolUDP, Port: 81})
		}, `spec.ports[1].name: Duplicate value: "http"`},
		{"several ports, one unnamed", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Protocol: corev1.ProtocolTCP, Port: 81})
		}, `spec.ports[1].name: Required value`},
		{"headless with a bad name is refused too", func(s *corev1.Service) { s.Name = "a_b"; s.Spec.ClusterIP = corev1.ClusterIPNone },
			`metadata.name: Invalid value: "a_b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := model.NewServiceObject(service(tc.mod))
			_, err := model.Build(o, nil, model.Options{})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if o.Skip(model.Options{}) != "" {
				t.Fatalf("skipped (%s) instead of refused", o.Skip(model.Options{}))
			}
		})
	}
}

// TestSliceNamesValidatedAsTheAPI: an EndpointSlice with a bad name or port
// name is reported for its Service, by name, and only that Service is
// refused.
func TestSliceNamesValidatedAsTheAPI(t *testing.T) {
	for _, tc := range []struct {
		name, slice, port, want string
	}{
		{"dotted name", "web-1.a.b", "http", ""},
		{"longest name", strings.Repeat("a", 253), "http", ""},
		{"name too long", strings.Repeat("a", 254), "http", `metadata.name: Invalid value: "` + strings.Repeat("a", 254) + `": must be no more than 253 characters`},
		{"name with a newline", "web\n1", "http", `endpointslice "web\n1": metadata.name: Invalid value: "web\n1"`},
		{"port name too long", "web-1", strings.Repeat("p", 64), `ports[0].name: Invalid value: "` + strings.Repeat("p", 64) + `"`},
		{"port name with a brace", "web-1", "h}", `ports[0].name: Invalid value: "h}"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(func(s *corev1.Service) { s.Spec.Ports[0].Name = tc.port })
			sl := slice(tc.slice, discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(tc.port, corev1.ProtocolTCP, 8080)},
				sliceEP{addr: "10.0.0.1"})
			if tc.want != "" && strings.HasPrefix(tc.want, "ports") {
				// the Service's own port name is refused first; the
				// slice's is what is under test here
				svc.Spec.Ports[0].Name = "http"
			}
			m, err := model.FromKubernetes(svc, []*discoveryv1.EndpointSlice{sl}, model.Options{})
			if tc.want == "" {
				if err != nil || len(m.Ports[0].Endpoints) != 1 {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "service ns1/web: ") {
				t.Fatalf("got %v, want an error for service ns1/web containing %q", err, tc.want)
			}
		})
	}
}
