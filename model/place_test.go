package model_test

import (
	"slices"
	"testing"
	"unsafe"

	"github.com/nftgate/nftgate/model"
)

func TestPlaceHoldsAnyNames(t *testing.T) {
	long := string(make([]byte, 300)) // a length past one varint byte, NULs in it
	zones, nodes := []string{"zone-a", "", "b\x00c", long}, []string{"n1"}
	p := model.NewPlace("node\x00x", "zone-a", zones, nodes)
	if p.Node() != "node\x00x" || p.Zone() != "zone-a" {
		t.Errorf("node %q zone %q", p.Node(), p.Zone())
	}
	if got := p.ForZones(); !slices.Equal(got, zones) {
		t.Errorf("zones %q, want %q", got, zones)
	}
	if got := p.ForNodes(); !slices.Equal(got, nodes) {
		t.Errorf("nodes %q, want %q", got, nodes)
	}
	if p != model.NewPlace("node\x00x", "zone-a", slices.Clone(zones), []string{"n1"}) {
		t.Error("the same place made twice is not one handle")
	}
	if p == model.NewPlace("node\x00x", "zone-a", zones[:3], nodes) {
		t.Error("places with other hints are equal")
	}
	if q := p.WithHints(nil, nil); q != model.NewPlace("node\x00x", "zone-a", nil, nil) || q.ForZones() != nil {
		t.Errorf("without hints: %v", q)
	}
}

func TestPlaceZeroKnowsNothing(t *testing.T) {
	var p model.Place
	if p.Node() != "" || p.Zone() != "" || p.ForZones() != nil || p.ForNodes() != nil {
		t.Errorf("zero place: %v", p)
	}
	if model.NewPlace("", "", nil, nil) != p {
		t.Error("an empty place is not the zero Place")
	}
}

// What is kept of every Service and every endpoint (400,000 endpoints at
// 100,000 Services): each a size class of Go's allocator.
func TestKeptSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, max uintptr
	}{
		{"model.Endpoint", unsafe.Sizeof(model.Endpoint{}), 32},
		{"model.Service", unsafe.Sizeof(model.Service{}), 96},
		{"model.ServiceObject", unsafe.Sizeof(model.ServiceObject{}), 96},
		{"model.SliceObject", unsafe.Sizeof(model.SliceObject{}), 96},
	} {
		if c.size > c.max {
			t.Errorf("%s is %d bytes, want at most %d", c.name, c.size, c.max)
		}
	}
}
