package nft

import (
	"slices"
	"testing"

	"github.com/nftgate/nftgate/ruleset"
)

// A device that went away is not drift (recreating the flowtable with it
// would fail every sync); one that is back but missing from the flowtable
// is.
func TestFlowtableDevicesReadBack(t *testing.T) {
	want := []string{"eth0", "eth1.100"}
	def := ruleset.FlowtableDefOf(&ruleset.Flowtable{Priority: 0, Devices: want})
	for _, c := range []struct {
		name   string
		kernel []string
		exists []string
		drift  bool
	}{
		{"all there", []string{"eth1.100", "eth0"}, want, false},
		{"eth1.100 deleted", []string{"eth0"}, []string{"eth0"}, false},
		{"eth1.100 back, not hooked", []string{"eth0"}, want, true},
		{"another device hooked", []string{"eth0", "eth1.100", "eth2"}, want, true},
	} {
		got := withAbsentDevices(c.kernel, want, func(d string) bool { return slices.Contains(c.exists, d) })
		if drift := ruleset.FlowtableDefFrom(0, got, false) != def; drift != c.drift {
			t.Errorf("%s: kernel %v read as %v: drift %v, want %v", c.name, c.kernel, got, drift, c.drift)
		}
	}
}
