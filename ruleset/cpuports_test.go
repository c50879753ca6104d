package ruleset

import "testing"

// The groups are a power of two up to the maximum, and their shares cover
// 1024-65535 exactly once, in order.
func TestMasqueradePortGroups(t *testing.T) {
	for cpus, want := range map[int]int{0: 1, 1: 1, 2: 2, 3: 2, 6: 4, 8: 8, 15: 8, 16: 16, 64: 16} {
		if got := MasqueradePortGroupsFor(cpus); got != want {
			t.Errorf("MasqueradePortGroupsFor(%d) = %d, want %d", cpus, got, want)
		}
	}
	for _, groups := range []int{2, 4, 8, 16} {
		next := masqueradePortsLow
		for g := range groups {
			p := GroupPorts(g, groups)
			if int(p.Min) != next || p.Max < p.Min {
				t.Fatalf("%d groups: group %d has %d-%d, want it to start at %d", groups, g, p.Min, p.Max, next)
			}
			next = int(p.Max) + 1
		}
		if next != masqueradePortsHigh+1 {
			t.Errorf("%d groups end at %d, want %d", groups, next-1, masqueradePortsHigh)
		}
	}
	// A configured number that is not a power of two is taken down to one.
	if got := masqueradePortGroups(&Config{MasqueradePortGroups: 3}); got != 2 {
		t.Errorf("3 configured groups give %d, want 2", got)
	}
}
