package model

import (
	"math/rand/v2"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The checks that let a valid name skip the API's regular expressions
// agree with the API's functions on every name: random ones over an
// alphabet of the characters that matter, and every length around the
// limits.
func TestNameChecksAgreeWithTheAPI(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab09-.Z_ "
	var names []string
	for range 200_000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		names = append(names, string(b))
	}
	for _, n := range []int{1, 62, 63, 64, 65, 252, 253, 254} {
		names = append(names, strings.Repeat("a", n), strings.Repeat("a", n-1)+"-", strings.Repeat("a.", n/2)+"a")
	}
	for _, s := range names {
		if got, want := isDNS1123Label(s), len(validation.IsDNS1123Label(s)) == 0; got != want {
			t.Errorf("label %q: %v, the API %v", s, got, want)
		}
		if got, want := isDNS1123Subdomain(s), len(validation.IsDNS1123Subdomain(s)) == 0; got != want {
			t.Errorf("subdomain %q: %v, the API %v", s, got, want)
		}
	}
}
