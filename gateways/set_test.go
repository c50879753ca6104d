package gateways

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// held records what a Set hands to OnChange.
type held struct {
	mu sync.Mutex
	v  []netip.Addr
}

func (h *held) set(v []netip.Addr) { h.mu.Lock(); h.v = v; h.mu.Unlock() }
func (h *held) get() []netip.Addr  { h.mu.Lock(); defer h.mu.Unlock(); return slices.Clone(h.v) }

// startPair starts gw-a and gw-b on loopback; b's key may differ.
func startPair(t *testing.T, bKey []byte) (a, b *Set, ha, hb *held) {
	t.Helper()
	ha, hb = &held{}, &held{}
	lnA, lnB := listen(t), listen(t)
	cfgB := Config{Name: "gw-b", Listen: lnB.Addr().String(), KeyFile: "k", Peers: []PeerConfig{{Name: "gw-a", Addresses: []string{lnA.Addr().String()}}}}
	var err error
	b, err = New(cfgB, Options{Key: bKey, OnChange: hb.set, Listener: lnB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	cfgA := Config{Name: "gw-a", Listen: lnA.Addr().String(), KeyFile: "k", Peers: []PeerConfig{{Name: "gw-b", Addresses: []string{b.Addr().String()}}}}
	a, err = New(cfgA, Options{Key: testKey, OnChange: ha.set, Listener: lnA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return
}

func TestSetSharesAddressesAndTakesOverOnClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	a, b, ha, hb := startPair(t, testKey)
	as := addrs(16)
	a.Set(as)
	b.Set(as)
	wait(t, func() error {
		return disjointCover(as, ha.get(), hb.get())
	})
	if len(ha.get()) == 0 || len(hb.get()) == 0 {
		t.Errorf("16 addresses all on one gateway: a %v b %v", ha.get(), hb.get())
	}
	st := a.Status()
	if len(st.Peers) != 1 || st.Peers[0].State != "alive" || len(st.Peers[0].Links) != 1 {
		t.Errorf("status of a: %+v", st.Peers)
	}
	b.Close()
	wait(t, func() error {
		return disjointCover(as, ha.get(), nil)
	})
	if got := hb.get(); len(got) != 0 {
		t.Errorf("b closed but still holds %v", got)
	}
}

func TestSetWrongKeyRefusedNothingChanges(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	reg := prometheus.NewRegistry()
	a, b, ha, hb := startPair(t, []byte("another key, 32 bytes long......"))
	if err := b.Register(reg); err != nil {
		t.Fatal(err)
	}
	a.Set(addrs(4))
	b.Set(addrs(4))
	wait(t, func() error {
		if n := testutil.ToFloat64(b.refusals.WithLabelValues("key")); n < 1 {
			return fmt.Errorf("b refused %v hellos for the key", n)
		}
		return nil
	})
	if p := a.Status().Peers[0]; p.State != "unknown" || len(p.Links) != 0 {
		t.Errorf("a sees b as %+v, want unknown without a link", p)
	}
	if r := b.Status().Refused; len(r) == 0 || r[0].Reason != "key" {
		t.Errorf("b's refusals: %+v", r)
	}
	if len(ha.get())+len(hb.get()) != 0 {
		// Both wait for the peer they cannot hear until the startup
		// wait ends, then each holds what it serves: the set is split,
		// as the key says it must be.
		t.Logf("after the refusal a holds %v, b holds %v", ha.get(), hb.get())
	}
}

func disjointCover(all []netip.Addr, x, y []netip.Addr) error {
	seen := map[netip.Addr]int{}
	for _, a := range append(slices.Clone(x), y...) {
		seen[a]++
	}
	for _, a := range all {
		if seen[a] != 1 {
			return fmt.Errorf("%v held %d times (a %v, b %v)", a, seen[a], x, y)
		}
	}
	return nil
}

func wait(t *testing.T, fn func() error) {
	t.Helper()
	if err := lab.EventuallyWithin(10*time.Second, fn); err != nil {
		t.Fatal(err)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
