package model

import (
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A slice keeps the name of its Service, its namespace and what is wrong
// with it, whether or not the Service's name starts the slice's.
func TestSliceObjectKeepsItsServiceAndError(t *testing.T) {
	slice := func(name, service string, addrType discoveryv1.AddressType) *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, AddressType: addrType}
		if service != "" {
			sl.Labels = map[string]string{LabelServiceName: service}
		}
		return sl
	}
	long := strings.Repeat("a", 300)
	for _, c := range []struct {
		name, label string
		addrType    discoveryv1.AddressType
		wantErr     bool
	}{
		{"web-x7k2p", "web", discoveryv1.AddressTypeIPv4, false},
		{"web", "web", discoveryv1.AddressTypeIPv4, false},
		{"custom-slice", "web", discoveryv1.AddressTypeIPv4, false},
		{long + "-x", long, discoveryv1.AddressTypeIPv4, true},
		{"web-x7k2p", "web", "Carrier-Pigeon", true},
		{"other-x7k2p", "web", "Carrier-Pigeon", true},
		{"web-x7k2p", "", discoveryv1.AddressTypeIPv4, false},
	} {
		o := NewSliceObject(slice(c.name, c.label, c.addrType))
		k, ok := o.Service()
		if ok != (c.label != "") || ok && (k.Namespace() != "shop" || k.Name() != c.label) {
			t.Errorf("%s labelled %q: Service() = %s, %v", c.name, c.label, k, ok)
		}
		if o.Namespace() != "shop" || o.Name != c.name {
			t.Errorf("%s: named %s/%s", c.name, o.Namespace(), o.Name)
		}
		if err := o.sliceErr(); (err != nil) != c.wantErr {
			t.Errorf("%s labelled %q: error %v, want one: %v", c.name, c.label, err, c.wantErr)
		}
		in := o.InFile("slices.yaml")
		if k2, ok2 := in.Service(); k2 != k || ok2 != ok {
			t.Errorf("%s: in a file, Service() = %s, %v; want %s, %v", c.name, k2, ok2, k, ok)
		}
		if err := in.sliceErr(); c.wantErr && (err == nil || !strings.HasPrefix(err.Error(), "slices.yaml: ")) {
			t.Errorf("%s: in a file, error %v", c.name, err)
		}
	}
}
