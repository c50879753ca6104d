package model_test

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftgate/nftgate/model"
)

// richService carries every field the API fills in, and some it rarely
// does, so that trimming is checked against what a cluster really sends.
func richService(mods ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns1", Name: "web", UID: "0f4ac1a2-7d6e-4b8f-9a51-3c2d1e0f9b7a", ResourceVersion: "4711",
			Generation: 3, CreationTimestamp: metav1.Unix(1700000000, 0),
			Labels:          map[string]string{"app": "web", "team": "shop"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"big":"json"}`},
			Finalizers:      []string{"service.kubernetes.io/load-balancer-cleanup"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "x"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "172.30.0.41", ClusterIPs: []string{"172.30.0.41", "fd00::41"},
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			IPFamilyPolicy: ptr(corev1.IPFamilyPolicyRequireDualStack),
			Selector:       map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080, TargetPort: intstr.FromString("web"), AppProtocol: ptr("http")},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053, TargetPort: intstr.FromInt32(5353)},
			},
			ExternalIPs:                   []string{"192.0.2.7"},
			LoadBalancerIP:                "192.0.2.8",
			LoadBalancerClass:             ptr("example.com/lb"),
			LoadBalancerSourceRanges:      []string{"198.51.100.0/24", " 203.0.113.0/25"},
			SessionAffinity:               corev1.ServiceAffinityClientIP,
			SessionAffinityConfig:         &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}},
			ExternalTrafficPolicy:         corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:           32000,
			InternalTrafficPolicy:         ptr(corev1.ServiceInternalTrafficPolicyLocal),
			AllocateLoadBalancerNodePorts: ptr(true),
			PublishNotReadyAddresses:      true,
			TrafficDistribution:           ptr("PreferClose"),
		},
		Status: corev1.ServiceStatus{
			LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
				{IP: "192.0.2.9", Ports: []corev1.PortStatus{{Port: 80, Protocol: corev1.ProtocolTCP}}},
				{IP: "192.0.2.10", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
				{Hostname: "lb.example.com"},
				{IP: "192.0.2.11", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
			}},
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func richSlice(name string, mods ...func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns1", Name: name, GenerateName: "web-", UID: types.UID("u-" + name), ResourceVersion: "99",
			Labels: map[string]string{model.LabelServiceName: "web", "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
				"app": "web"},
			Annotations:     map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-22T04:00:00.123456Z", "other": "x"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "0f4a", Controller: ptr(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080)), AppProtocol: ptr("http")},
			{Name: ptr("dns"), Protocol: ptr(corev1.ProtocolUDP), Port: ptr(int32(5353))},
		},
	}
	for i, addr := range []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"} {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{addr, "10.9.9.9"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(i != 1), Serving: ptr(true), Terminating: ptr(i == 1)},
			Hostname:   ptr("pod-" + name),
			NodeName:   ptr([]string{"node-a", "node-b"}[i%2]),
			Zone:       ptr([]string{"zone-1", "zone-2"}[i%2]),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns1", Name: "web-" + addr, UID: "pod-uid"},
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-1"}},
				ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}},
			DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node-a"},
		}
		sl.Endpoints = append(sl.Endpoints, ep)
	}
	for _, m := range mods {
		m(sl)
	}
	return sl
}

// TestTrimKeepsTheModel builds each Service's model from the objects as the
// API sends them and from their trimmed copies: trimming must not change
// what the gateway programs, nor why a Service is skipped or refused.
func TestTrimKeepsTheModel(t *testing.T) {
	opts := model.Options{ProxyName: "edge"}
	cases := map[string]struct {
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
	}{
		"load balancer, every field": {richService(), []*discoveryv1.EndpointSlice{richSlice("web-a"), richSlice("web-b")}},
		"cluster IP, IPv4 only": {richService(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
			s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		}), []*discoveryv1.EndpointSlice{richSlice("web-a")}},
		"labelled for this proxy": {richService(func(s *corev1.Service) {
			s.Labels[model.LabelServiceProxyName] = "edge"
		}), []*discoveryv1.EndpointSlice{richSlice("web-a")}},
		"labelled for another proxy": {richService(func(s *corev1.Service) {
			s.Labels[model.LabelServiceProxyName] = "other"
		}), nil},
		"invalid external IP": {richService(func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"not-an-ip"}
		}), nil},
		"invalid endpoint address": {richService(), []*discoveryv1.EndpointSlice{richSlice("web-a", func(sl *discoveryv1.EndpointSlice) {
			sl.Endpoints[2].Addresses[0] = "10.1.0.300"
		})}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			wantSkip := model.Skip(c.svc, opts)
			want, wantErr := model.FromKubernetes(c.svc, c.slices, opts)

			svc := c.svc.DeepCopy()
			model.TrimService(svc)
			var slices []*discoveryv1.EndpointSlice
			for _, sl := range c.slices {
				sl = sl.DeepCopy()
				model.TrimEndpointSlice(sl)
				slices = append(slices, sl)
			}
			if got := model.Skip(svc, opts); got != wantSkip {
				t.Errorf("Skip after trimming = %q, want %q", got, wantSkip)
			}
			got, err := model.FromKubernetes(svc, slices, opts)
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("FromKubernetes after trimming: error %v, want %v", err, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("model after trimming:\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// TestTrimDropsTheRest checks that the fields nobody reads are really gone:
// they are what makes objects big at scale.
func TestTrimDropsTheRest(t *testing.T) {
	svc := richService()
	model.TrimService(svc)
	if svc.Labels != nil || svc.Annotations != nil || svc.ManagedFields != nil || svc.OwnerReferences != nil ||
		svc.Finalizers != nil || svc.Spec.Selector != nil || svc.Spec.Ports[0].AppProtocol != nil ||
		svc.Spec.Ports[0].TargetPort.StrVal != "" || svc.Status.Conditions != nil || svc.Status.LoadBalancer.Ingress[0].Ports != nil {
		t.Errorf("trimmed Service still carries unread fields: %+v", svc)
	}
	if svc.UID == "" || svc.ResourceVersion != "4711" || svc.Name != "web" || svc.Namespace != "ns1" {
		t.Errorf("trimmed Service lost its identity: %+v", svc.ObjectMeta)
	}

	sl := richSlice("web-a")
	model.TrimEndpointSlice(sl)
	if !reflect.DeepEqual(sl.Labels, map[string]string{model.LabelServiceName: "web"}) {
		t.Errorf("trimmed slice labels = %v, want only %s", sl.Labels, model.LabelServiceName)
	}
	if !reflect.DeepEqual(sl.Annotations, map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-22T04:00:00.123456Z"}) {
		t.Errorf("trimmed slice annotations = %v, want only the trigger time", sl.Annotations)
	}
	if sl.OwnerReferences != nil || sl.ManagedFields != nil || sl.GenerateName != "" {
		t.Errorf("trimmed slice still carries unread metadata: %+v", sl.ObjectMeta)
	}
	for i, ep := range sl.Endpoints {
		if ep.TargetRef != nil || ep.Hostname != nil || ep.DeprecatedTopology != nil || len(ep.Addresses) != 1 {
			t.Errorf("trimmed endpoint %d still carries unread fields: %+v", i, ep)
		}
	}
}
