package model_test

import (
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
)

// TestServiceKeyHoldsAnyNames: a key gives back the namespace and name it
// was made of, whatever they hold (a slash, a length past one varint
// byte, nothing), equal keys are equal names, and keys order by
// namespace, then name.
func TestServiceKeyHoldsAnyNames(t *testing.T) {
	long := strings.Repeat("n", 300)
	pairs := [][2]string{{"", ""}, {"default", "web"}, {"a/b", "c"}, {"a", "b/c"}, {"", "web"}, {"ns", ""}, {long, "x"}, {"x", long}, {"\x00\x80", "\xff"}}
	for i, p := range pairs {
		k := model.NewServiceKey(p[0], p[1])
		if k.Namespace() != p[0] || k.Name() != p[1] || k.String() != p[0]+"/"+p[1] {
			t.Errorf("%q/%q: key gives %q, %q, %q", p[0], p[1], k.Namespace(), k.Name(), k.String())
		}
		for j, q := range pairs {
			o := model.NewServiceKey(q[0], q[1])
			if (k == o) != (i == j) {
				t.Errorf("%q/%q == %q/%q is %v", p[0], p[1], q[0], q[1], k == o)
			}
			want := p[0] < q[0] || p[0] == q[0] && p[1] < q[1]
			if k.Less(o) != want {
				t.Errorf("%q/%q < %q/%q is %v, want %v", p[0], p[1], q[0], q[1], k.Less(o), want)
			}
		}
	}
	if (model.ServiceKey{}) != model.NewServiceKey("", "") {
		t.Error("the zero key is not that of the empty names")
	}
}
