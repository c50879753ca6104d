package main

import (
	"slices"
	"testing"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/model"
)

func TestMergeRows(t *testing.T) {
	row := func(ns, name, typ string) appliance.Service {
		return appliance.Service{Namespace: ns, Name: name, Type: typ}
	}
	old := []appliance.Service{row("a", "api", "ClusterIP"), row("a", "web", "ClusterIP"), row("b", "db", "ClusterIP")}
	kept := slices.Clone(old)
	touched := map[model.ServiceKey]struct{}{
		{Namespace: "a", Name: "web"}:  {}, // changed
		{Namespace: "b", Name: "db"}:   {}, // gone
		{Namespace: "a", Name: "aaa"}:  {}, // new, first
		{Namespace: "a", Name: "mail"}: {}, // new, between
		{Namespace: "c", Name: "last"}: {}, // new, last
		{Namespace: "c", Name: "none"}: {}, // never was, still is not
	}
	got := mergeRows(old, touched, func(k model.ServiceKey) (appliance.Service, bool) {
		switch k.Name {
		case "db", "none":
			return appliance.Service{}, false
		}
		return row(k.Namespace, k.Name, "NodePort"), true
	})
	want := []appliance.Service{row("a", "aaa", "NodePort"), row("a", "api", "ClusterIP"), row("a", "mail", "NodePort"),
		row("a", "web", "NodePort"), row("c", "last", "NodePort")}
	if !slices.EqualFunc(got, want, func(a, b appliance.Service) bool {
		return a.Namespace == b.Namespace && a.Name == b.Name && a.Type == b.Type
	}) {
		t.Errorf("merged rows:\n%+v\nwant\n%+v", got, want)
	}
	if !slices.EqualFunc(old, kept, func(a, b appliance.Service) bool { return a.Name == b.Name && a.Type == b.Type }) {
		t.Errorf("the published rows were modified: %+v", old)
	}
	if got := mergeRows(nil, nil, nil); got == nil || len(got) != 0 {
		t.Errorf("merge of nothing = %#v, want an empty list", got)
	}
}
