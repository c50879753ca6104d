package ruleset

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"slices"
)

// Maglev lookup tables (Eisenbud et al., "Maglev: A Fast and Reliable
// Software Network Load Balancer", NSDI 2016, section 3.4).
//
// Each backend has a permutation of the table's M slots, given by an
// offset and a skip taken from two hashes of its name: slot j of its
// permutation is (offset + j·skip) mod M, which visits every slot once
// because M is prime. The backends then take turns, in a fixed order, each
// claiming the next slot of its permutation that no backend holds yet,
// until every slot is held. Every backend holds ⌊M/N⌋ or ⌈M/N⌉ slots, and
// when one backend goes, the others mostly keep their slots: about 1/N of
// the flows move, where a choice by hash mod N moves about (N−1)/N.
//
// The backends are the endpoints' address and port, sorted, and the
// hashes are seeded with the hash seed, so the table is a pure function of
// the set of endpoints and the seed: every gateway with the same seed and
// the same EndpointSlices fills the same table, whatever order the
// endpoints arrived in.

// A Maglev table's size M is the first of MaglevSizes that is at least
// MaglevSlotsPerEndpoint times the number of endpoints (the paper's
// M ≥ 100·N: fewer slots per endpoint move more flows when one goes, see
// TestMaglevDisruption), and the last one (the paper's 65,537) past that:
// beyond 655 endpoints each holds fewer than 100 slots.
//
// The sizes are a fixed ladder, each about twice the one before, because
// a flow's slot depends on M: an endpoint that comes or goes keeps M, and
// moves only about 1/N of the flows, unless the count crosses a step of
// the ladder (from 5 to 6 endpoints, 10 to 11, 20 to 21, 40 to 41, ...),
// when the table is rebuilt at the next size and every flow is chosen
// anew, as with a hash modulo N.
const MaglevSlotsPerEndpoint = 100

// MaglevSizes are the table sizes, primes.
var MaglevSizes = []int{509, 1021, 2039, 4093, 8191, 16381, 32749, 65537}

// MaglevSize is the table size for n endpoints.
func MaglevSize(n int) int {
	for _, m := range MaglevSizes {
		if m >= MaglevSlotsPerEndpoint*n {
			return m
		}
	}
	return MaglevSizes[len(MaglevSizes)-1]
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// MaglevTable fills a table of m slots (a prime) for the backends and
// returns, for each slot, the backend it sends to. The backends are
// sorted and repeats dropped first, so their order does not matter.
func MaglevTable(backends []netip.AddrPort, m int, seed uint32) []netip.AddrPort {
	bs := slices.Clone(backends)
	slices.SortFunc(bs, netip.AddrPort.Compare)
	bs = slices.Compact(bs)
	if len(bs) == 0 || m < 1 {
		return nil
	}
	offset := make([]uint64, len(bs))
	skip := make([]uint64, len(bs))
	next := make([]uint64, len(bs))
	for i, b := range bs {
		offset[i], skip[i] = maglevHashes(b, seed)
		offset[i] %= uint64(m)
		if m > 1 {
			skip[i] = skip[i]%uint64(m-1) + 1
		}
	}
	owner := make([]int32, m)
	for i := range owner {
		owner[i] = -1
	}
	table := make([]netip.AddrPort, m)
	for filled := 0; ; {
		for i := range bs {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for owner[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			owner[c] = int32(i)
			table[c] = bs[i]
			next[i]++
			if filled++; filled == m {
				return table
			}
		}
	}
}

// maglevHashes are the two hashes of a backend's name (its address and
// port) that give its offset and skip: the first two words of the
// SHA-256 digest of the seed and the name.
func maglevHashes(b netip.AddrPort, seed uint32) (uint64, uint64) {
	buf := make([]byte, 4, 4+len("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"))
	binary.BigEndian.PutUint32(buf, seed)
	buf = b.AppendTo(buf)
	sum := sha256.Sum256(buf)
	return binary.BigEndian.Uint64(sum[0:8]), binary.BigEndian.Uint64(sum[8:16])
}

// KernelBucket is what the kernel's hash expression makes of a flow's
// 32-bit Jenkins hash for "mod n": reciprocal_scale, the hash scaled to
// [0, n), not the remainder.
func KernelBucket(h uint32, n int) int { return int(uint64(h) * uint64(n) >> 32) }

// Disruption is the share of flows whose endpoint changes when one of N
// endpoints goes, averaged over which one goes, and the worst case.
type Disruption struct {
	Endpoints int     `json:"endpoints"`
	TableSize int     `json:"table_size"`
	Mean      float64 `json:"mean"`
	Worst     float64 `json:"worst"`
	// ModNMean and ModNWorst are the same for the choice by hash mod N.
	ModNMean  float64 `json:"mod_n_mean"`
	ModNWorst float64 `json:"mod_n_worst"`
}

// MaglevDisruption removes each of the backends in turn and counts the
// share of flows (their jhash values) whose endpoint changes, read from
// the Maglev tables before and after (each sized for its own endpoint
// count) and, beside it, from the choice by hash mod N as the kernel
// computes it (the endpoints in the order given).
func MaglevDisruption(backends []netip.AddrPort, flows []uint32, seed uint32) Disruption {
	n := len(backends)
	d := Disruption{Endpoints: n, TableSize: MaglevSize(n)}
	if n < 2 || len(flows) == 0 {
		return d
	}
	before := MaglevTable(backends, d.TableSize, seed)
	for gone := range n {
		rest := slices.Delete(slices.Clone(backends), gone, gone+1)
		after := MaglevTable(rest, MaglevSize(n-1), seed)
		moved, modMoved := 0, 0
		for _, h := range flows {
			if before[KernelBucket(h, len(before))] != after[KernelBucket(h, len(after))] {
				moved++
			}
			if backends[KernelBucket(h, n)] != rest[KernelBucket(h, n-1)] {
				modMoved++
			}
		}
		f, mf := float64(moved)/float64(len(flows)), float64(modMoved)/float64(len(flows))
		d.Mean, d.Worst = d.Mean+f, max(d.Worst, f)
		d.ModNMean, d.ModNWorst = d.ModNMean+mf, max(d.ModNWorst, mf)
	}
	d.Mean /= float64(n)
	d.ModNMean /= float64(n)
	return d
}
