package model

import (
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TrimService drops, in place, every field of svc that Skip and
// FromKubernetes do not read, so that a source keeping thousands of
// Services holds only what the model needs. The model built from the
// trimmed object is the same as from the original. Kept besides: the name,
// namespace, UID and resourceVersion, which caches and watches key on.
func TrimService(svc *corev1.Service) {
	trimMeta(&svc.ObjectMeta, LabelServiceProxyName, "")
	sp := &svc.Spec
	sp.Selector = nil
	sp.LoadBalancerIP = ""
	sp.LoadBalancerClass = nil
	sp.ExternalName = ""
	sp.IPFamilyPolicy = nil
	sp.AllocateLoadBalancerNodePorts = nil
	sp.PublishNotReadyAddresses = false
	for i := range sp.Ports {
		p := &sp.Ports[i]
		p.AppProtocol = nil
		p.TargetPort.StrVal = ""
		p.TargetPort.IntVal = 0
	}
	ing := svc.Status.LoadBalancer.Ingress
	svc.Status = corev1.ServiceStatus{}
	if len(ing) > 0 {
		kept := make([]corev1.LoadBalancerIngress, len(ing))
		for i, in := range ing {
			kept[i] = corev1.LoadBalancerIngress{IP: in.IP, IPMode: in.IPMode}
		}
		svc.Status.LoadBalancer.Ingress = kept
	}
}

// TrimEndpointSlice drops, in place, every field of sl that FromKubernetes
// does not read, and shares the strings that repeat across endpoints (node
// names, zones). Kept besides: the name, namespace, UID and resourceVersion,
// the kubernetes.io/service-name label that ties the slice to its Service,
// and the last-change-trigger-time annotation, for the network programming
// latency.
func TrimEndpointSlice(sl *discoveryv1.EndpointSlice) {
	trimMeta(&sl.ObjectMeta, LabelServiceName, corev1.EndpointsLastChangeTriggerTime)
	for i := range sl.Ports {
		sl.Ports[i].AppProtocol = nil
	}
	for i := range sl.Endpoints {
		ep := &sl.Endpoints[i]
		if len(ep.Addresses) > 1 {
			// Only the first address is used, as the API documents.
			ep.Addresses = ep.Addresses[:1:1]
		}
		ep.Hostname = nil
		ep.TargetRef = nil
		ep.DeprecatedTopology = nil
		intern(ep.NodeName)
		intern(ep.Zone)
		if h := ep.Hints; h != nil {
			for j := range h.ForZones {
				h.ForZones[j].Name = unique.Make(h.ForZones[j].Name).Value()
			}
			for j := range h.ForNodes {
				h.ForNodes[j].Name = unique.Make(h.ForNodes[j].Name).Value()
			}
		}
	}
}

// trimMeta keeps the identity of an object, its creation time, and at most
// one label and one annotation.
func trimMeta(m *metav1.ObjectMeta, label, annotation string) {
	kept := metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp,
	}
	if v, ok := m.Labels[label]; ok && label != "" {
		kept.Labels = map[string]string{label: v}
	}
	if v, ok := m.Annotations[annotation]; ok && annotation != "" {
		kept.Annotations = map[string]string{annotation: v}
	}
	*m = kept
}

// intern replaces *p by its canonical copy, so that the thousands of
// endpoints on one node share one copy of its name.
func intern(p *string) {
	if p != nil {
		*p = unique.Make(*p).Value()
	}
}
