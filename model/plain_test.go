package model

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// Whatever field of a Service's model is set, the form the ServiceObject
// keeps gives the same model back: a field the plain form leaves out keeps
// the Service whole. Fields added to Service later are covered as well.
func TestServiceObjectKeepsEveryField(t *testing.T) {
	key := NewServiceKey("shop", "web")
	values := map[reflect.Type]any{
		reflect.TypeFor[string]():         "x",
		reflect.TypeFor[bool]():           true,
		reflect.TypeFor[uint8]():          uint8(1),
		reflect.TypeFor[uint16]():         uint16(30000),
		reflect.TypeFor[ServiceType]():    TypeLoadBalancer,
		reflect.TypeFor[Instant]():        InstantOf(time.Unix(1700000000, 0)),
		reflect.TypeFor[time.Duration]():  time.Minute,
		reflect.TypeFor[ServiceKey]():     key,
		reflect.TypeFor[[]netip.Addr]():   []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		reflect.TypeFor[[]netip.Prefix](): []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		reflect.TypeFor[[]string]():       []string{"a warning"},
		reflect.TypeFor[[]ServicePort]():  []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: 30080}},
		reflect.TypeFor[*Rare]():          &Rare{AffinityTimeout: time.Minute},
	}
	typ := reflect.TypeFor[Service]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		v, ok := values[f.Type]
		if !ok {
			t.Fatalf("field %s of type %s: no test value; add one", f.Name, f.Type)
		}
		s := Service{Key: key, Type: TypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
			Ports: []ServicePort{{Name: "dns", Protocol: UDP, Port: 53}}, IPv4: true}
		reflect.ValueOf(&s).Elem().Field(i).Set(reflect.ValueOf(v))
		p, plain := plainOf(&s)
		if !plain {
			continue // kept whole
		}
		if back := p.service(key); !reflect.DeepEqual(back, s) {
			t.Errorf("with %s set, the plain form gives back\n%+v\nwant\n%+v", f.Name, back, s)
		}
	}
}
