package conntrack

import (
	"net/netip"
	"testing"
	"time"
)

// TestFlowsReadsTranslatedFlows fills a namespace's conntrack table with a
// translated UDP flow and an untranslated one, and reads them back: only
// the translated one, with its client, destination and endpoint; a second
// reading within FlowsMaxAge is the first one again.
func TestFlowsReadsTranslatedFlows(t *testing.T) {
	ns := newNetNS(t)
	linkUp(t, nlHandle(t, ns), "lo")
	conn := ctConn(t, ns)
	translated := synthFlow{proto: 17, src: netip.MustParseAddrPort("198.18.1.5:4000"),
		dst: netip.MustParseAddrPort("10.96.0.10:53"), replySrc: netip.MustParseAddrPort("10.128.0.7:5353")}
	plain := synthFlow{proto: 17, src: netip.MustParseAddrPort("198.18.1.5:4001"),
		dst: netip.MustParseAddrPort("10.128.0.7:5353"), replySrc: netip.MustParseAddrPort("10.128.0.7:5353")}
	for _, f := range []synthFlow{translated, plain} {
		if err := conn.Create(f.flow(120)); err != nil {
			t.Fatalf("create %v: %v", f, err)
		}
	}
	r := NewFlows(WithNetNS(int(ns)))
	flows, at, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 1 {
		t.Fatalf("read %+v, want only the translated flow", flows)
	}
	f := flows[0]
	if f.Proto != 17 || f.Client != translated.src || f.Dest != translated.dst || f.Endpoint != translated.replySrc ||
		!f.Open() || f.Timeout <= 0 || f.Timeout > 120*time.Second {
		t.Errorf("read %+v, want %v, open, timeout within 120 s", f, translated)
	}
	another := translated
	another.src = netip.MustParseAddrPort("198.18.1.6:4000")
	if err := conn.Create(another.flow(120)); err != nil {
		t.Fatal(err)
	}
	again, at2, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || at2 != at {
		t.Errorf("a reading within %v read the kernel again: %d flows", FlowsMaxAge, len(again))
	}
}
