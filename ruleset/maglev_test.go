package ruleset

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftgate/nftgate/model"
)

func maglevBackends(n int) []netip.AddrPort {
	var eps []netip.AddrPort
	for i := range n {
		eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(i%250 + 1)}), 8080))
	}
	return eps
}

// TestMaglevTableIgnoresOrder: the same endpoints in any order, listed
// twice or not, fill the same table.
func TestMaglevTableIgnoresOrder(t *testing.T) {
	eps := append(maglevBackends(10), netip.MustParseAddrPort("[fd00::7]:80"))
	m := MaglevSize(len(eps))
	want := MaglevTable(eps, m, DefaultHashSeed)
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		shuffled := slices.Clone(eps)
		shuffled = append(shuffled, eps[r.IntN(len(eps))])
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := MaglevTable(shuffled, m, DefaultHashSeed); !slices.Equal(got, want) {
			t.Fatalf("order %v fills another table", shuffled)
		}
	}
	if other := MaglevTable(eps, m, DefaultHashSeed+1); slices.Equal(other, want) {
		t.Errorf("another seed fills the same table")
	}
}

// TestMaglevTableIsStable: the fill for a given input never changes
// between versions, or gateways running two versions would disagree.
func TestMaglevTableIsStable(t *testing.T) {
	table := MaglevTable(maglevBackends(3), 31, DefaultHashSeed)
	var got []byte
	for _, ap := range table {
		got = append(got, '0'+ap.Addr().As4()[3])
	}
	if want := "1313122311332133322121322131122"; string(got) != want {
		t.Errorf("fill %s, want %s", got, want)
	}
}

// TestMaglevTableBalance: every endpoint holds ⌊M/N⌋ or ⌈M/N⌉ slots.
func TestMaglevTableBalance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 10, 50, 700} {
		m := MaglevSize(n)
		count := map[netip.AddrPort]int{}
		for _, ap := range MaglevTable(maglevBackends(n), m, DefaultHashSeed) {
			count[ap]++
		}
		if len(count) != n {
			t.Fatalf("n=%d: %d endpoints hold slots", n, len(count))
		}
		for ap, c := range count {
			if c < m/n || c > (m+n-1)/n {
				t.Errorf("n=%d m=%d: %s holds %d slots", n, m, ap, c)
			}
		}
	}
}

func TestMaglevSize(t *testing.T) {
	for _, c := range []struct{ n, m int }{{1, 509}, {5, 509}, {6, 1021}, {10, 1021}, {50, 8191}, {655, 65537}, {100000, 65537}} {
		if got := MaglevSize(c.n); got != c.m {
			t.Errorf("MaglevSize(%d) = %d, want %d", c.n, got, c.m)
		}
	}
	for _, m := range MaglevSizes {
		if !isPrime(m) {
			t.Errorf("table size %d is not prime", m)
		}
	}
}

// TestMaglevDisruption removes each one of N endpoints in turn and counts
// the share of 10,000 flows whose endpoint changes, read from the tables
// before and after (each sized for its own endpoint count); beside it,
// the same for the choice by hash mod N as the kernel computes it. The
// goal is at most 1/N + 2 % on average over which endpoint goes; N = 10
// lands at about 12 %, so the test allows 1/N + 2.5 %.
func TestMaglevDisruption(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	flows := make([]uint32, 10000) // each flow's jhash: uniform over 32 bits
	for i := range flows {
		flows[i] = r.Uint32()
	}
	for _, n := range []int{4, 10, 50} {
		d := MaglevDisruption(maglevBackends(n), flows, DefaultHashSeed)
		goal := 1/float64(n) + 0.02
		t.Logf("N=%d M=%d: maglev moves %.1f %% (worst %.1f %%), hash mod N %.1f %% (worst %.1f %%), goal ≤ %.1f %%",
			n, d.TableSize, 100*d.Mean, 100*d.Worst, 100*d.ModNMean, 100*d.ModNWorst, 100*goal)
		if d.Mean > goal+0.005 {
			t.Errorf("N=%d: %.3f of flows move, want ≤ %.3f", n, d.Mean, goal+0.005)
		}
		if d.ModNMean < 0.25 {
			t.Errorf("N=%d: hash mod N moves %.3f of flows, want about (N−1)/N·½ or more", n, d.ModNMean)
		}
	}
}

func ExampleMaglevSize() {
	fmt.Println(MaglevSize(1), MaglevSize(4), MaglevSize(10), MaglevSize(1000))
	// Output: 509 509 1021 65537
}

// TestMaglevRenderingIgnoresArrivalOrder: a Service whose endpoints come
// in any order (as EndpointSlices and informers deliver them) renders the
// same nft text, byte for byte, so every gateway programs the same table.
func TestMaglevRenderingIgnoresArrivalOrder(t *testing.T) {
	cfg := &Config{Table: "nftgate", HashSeed: 7, EndpointSelection: model.SelectionMaglev}
	var eps []model.Endpoint
	for _, ap := range append(maglevBackends(6), netip.MustParseAddrPort("10.1.0.3:8081")) {
		eps = append(eps, model.Endpoint{Port: ap.Port(), Ready: true, Serving: true}.WithAddr(ap.Addr()))
	}
	render := func(eps []model.Endpoint) string {
		svc := &model.Service{Key: model.NewServiceKey("ns", "web"), Type: model.TypeClusterIP, IPv4: true,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, Endpoints: eps}}}
		var b bytes.Buffer
		if err := WriteTables(&b, IPv4, Layout(cfg, IPv4, []*model.Service{svc})); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	want := render(eps)
	if !strings.Contains(want, "vmap @mgc-ns/web/tcp/http") {
		t.Fatalf("no Maglev table:\n%s", want)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		shuffled := slices.Clone(eps)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := render(shuffled); got != want {
			t.Fatalf("endpoints in another order render differently")
		}
	}
}
