package nft

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
	"github.com/nftgate/nftgate/ruleset"
	bc "github.com/nftgate/nftgate/ruleset/bytecode"
)

// newAnonNetns returns a fresh network namespace, removed when the test
// ends (it has no name; closing the last handle frees it).
func newAnonNetns(t *testing.T) int {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and programs nf_tables in it")
	}
	return int(netnstest.Temp(t))
}

func tablesIn(t *testing.T, fd int) []string {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.Name)
	}
	return names
}

// countingRunner counts the batches a runner sends.
func countingRunner(run probeRunner, n *int) probeRunner {
	return func(ps []kernelProbe) error { *n++; return run(ps) }
}

func TestKernelCheckPassesInNetns(t *testing.T) {
	fd := newAnonNetns(t)
	batches := 0
	start := time.Now()
	probes := kernelProbesFor(&ruleset.Config{Table: "nftgate", Counters: true, TrafficElements: 16, MasqueradePortGroups: 2,
		UntranslatedEventsOff: true, LeanServiceEvents: true, DropMidstreamTCP: true, MidstreamWait: time.Second})
	err := checkKernelFeatures(probes, countingRunner(netlinkProbeRunner(fd, probeTableName()), &batches))
	if err != nil {
		t.Fatalf("kernel check on this kernel: %v", err)
	}
	t.Logf("kernel check: %d probes in %d batch, %v", len(probes), batches, time.Since(start))
	if batches != 1 {
		t.Errorf("a kernel with every feature took %d batches, want 1", batches)
	}
	if names := tablesIn(t, fd); len(names) != 0 {
		t.Errorf("the check left tables behind: %v", names)
	}
}

// A probe the kernel refuses (a jhash with modulus 0 is out of range for
// every kernel) stands in for a missing feature: the real kernel's refusal
// must come back under that probe's name, and only that one.
func TestKernelCheckNamesWhatTheKernelRefuses(t *testing.T) {
	fd := newAnonNetns(t)
	probes := kernelProbes()
	base := probes[0].Feature
	probes = append(probes, kernelProbe{
		Feature: "hash expression with modulus 0", Option: "CONFIG_NFT_HASH", Needs: []string{base},
		add: func(b *probeBatch) {
			b.rule(b.filterChain(ruleset.IPv4), ruleset.HashBucket{Seed: ruleset.DefaultHashSeed, Modulus: 0})
		},
	})
	err := checkKernelFeatures(probes, netlinkProbeRunner(fd, probeTableName()))
	var kerr *kernelFeatureError
	if !errors.As(err, &kerr) {
		t.Fatalf("got %v, want a kernelFeatureError", err)
	}
	if len(kerr.Missing) != 1 || kerr.Missing[0].Feature != "hash expression with modulus 0" {
		t.Fatalf("missing = %+v, want only the modulus 0 probe", kerr.Missing)
	}
	if !strings.Contains(err.Error(), "hash expression with modulus 0 (kernel option CONFIG_NFT_HASH): refused with \"numerical result out of range\"") {
		t.Errorf("error %q does not name the feature and its kernel option", err)
	}
	t.Log(err)
	if names := tablesIn(t, fd); len(names) != 0 {
		t.Errorf("the failed check left tables behind: %v", names)
	}
}

// fakeKernel refuses every batch that uses a missing feature, directly or
// through a probe it needs, as a kernel without it would.
type fakeKernel struct {
	missing map[string]bool
	probes  map[string]kernelProbe
	batches int
}

func newFakeKernel(probes []kernelProbe, missing ...string) *fakeKernel {
	k := &fakeKernel{missing: map[string]bool{}, probes: map[string]kernelProbe{}}
	for _, m := range missing {
		k.missing[m] = true
	}
	for _, p := range probes {
		k.probes[p.Feature] = p
	}
	return k
}

func (k *fakeKernel) uses(p kernelProbe) string {
	if k.missing[p.Feature] {
		return p.Feature
	}
	for _, n := range p.Needs {
		if m := k.uses(k.probes[n]); m != "" {
			return m
		}
	}
	return ""
}

func (k *fakeKernel) run(ps []kernelProbe) error {
	k.batches++
	for _, p := range ps {
		if m := k.uses(p); m != "" {
			return errors.New("no such file or directory")
		}
	}
	return nil
}

func TestKernelCheckErrorNaming(t *testing.T) {
	probes := kernelProbes()
	for _, tc := range []struct {
		name    string
		missing []string
		want    []string // features the error names, in order
	}{
		{name: "complete kernel"},
		{name: "no jhash (CONFIG_NFT_HASH off)",
			missing: []string{"hash expression (jhash) (ip)", "hash expression (jhash) (ip6)"},
			want:    []string{"hash expression (jhash) (ip)", "hash expression (jhash) (ip6)"}},
		{name: "no ip6 tables: nothing built on them is named",
			missing: []string{"nf_tables ip6 family with filter chains"},
			want:    []string{"nf_tables ip6 family with filter chains"}},
		{name: "no nat chains: dnat and masquerade are not named on top",
			missing: []string{"nat chains (ip)"},
			want:    []string{"nat chains (ip)"}},
		{name: "fib ip6 and reject ip",
			missing: []string{"reject expression (ip)", "fib expression (ip6)"},
			want:    []string{"reject expression (ip)", "fib expression (ip6)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel(probes, tc.missing...)
			err := checkKernelFeatures(probes, k.run)
			if len(tc.want) == 0 {
				if err != nil || k.batches != 1 {
					t.Fatalf("got %v after %d batches, want success in 1", err, k.batches)
				}
				return
			}
			var kerr *kernelFeatureError
			if !errors.As(err, &kerr) {
				t.Fatalf("got %v, want a kernelFeatureError", err)
			}
			var got []string
			for _, m := range kerr.Missing {
				got = append(got, m.Feature)
				if !strings.Contains(err.Error(), m.Feature+" (kernel option "+m.Option+`): refused with "no such file or directory"`) {
					t.Errorf("error %q does not carry %q with its option and the kernel's reason", err, m.Feature)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("named %q, want %q", got, tc.want)
			}
		})
	}
}

// A kernel that refuses the whole batch but each probe alone gets an error
// that says so rather than blaming nothing.
func TestKernelCheckCombinedOnlyFailure(t *testing.T) {
	probes := kernelProbes()
	run := func(ps []kernelProbe) error {
		if len(ps) > 1 {
			return errors.New("message too long")
		}
		return nil
	}
	err := checkKernelFeatures(probes, run)
	if err == nil || !strings.Contains(err.Error(), "accepts each feature alone: message too long") {
		t.Fatalf("got %v", err)
	}
}

func TestKernelProbesNeedEarlierProbes(t *testing.T) {
	checkProbeOrder(t, kernelProbes())
	checkProbeOrder(t, releaseProbes())
}

func checkProbeOrder(t *testing.T, probes []kernelProbe) {
	t.Helper()
	seen := map[string]bool{}
	for _, p := range probes {
		if seen[p.Feature] {
			t.Errorf("feature %q listed twice", p.Feature)
		}
		if p.Option == "" {
			t.Errorf("feature %q has no kernel option", p.Feature)
		}
		for _, n := range p.Needs {
			if !seen[n] {
				t.Errorf("feature %q needs %q, which is not an earlier probe", p.Feature, n)
			}
		}
		seen[p.Feature] = true
	}
}

// The release of the endpoints' TIME_WAIT and the answer to refused SYNs
// are checked on their own (a kernel without one runs without it): this
// kernel has both, only the release needs conntrack marks, and a probe the
// kernel refuses is named with its option.
func TestKernelCheckReleaseTimeWait(t *testing.T) {
	fd := newAnonNetns(t)
	run := netlinkProbeRunner(fd, probeTableName())
	if err := checkKernelFeatures(releaseProbes(), run); err != nil {
		t.Fatalf("release check on this kernel: %v", err)
	}
	if err := checkKernelFeatures(refusedProbes(), run); err != nil {
		t.Fatalf("answer check on this kernel: %v", err)
	}
	for _, p := range refusedProbes() {
		if strings.Contains(p.Option, "CONNTRACK_MARK") {
			t.Errorf("the answer to refused SYNs probes %q (%s): it needs no conntrack marks", p.Feature, p.Option)
		}
	}
	probes := append(releaseProbes(), kernelProbe{
		Feature: "dup to a register never loaded", Option: "CONFIG_NFT_DUP_IPV4", Needs: []string{releaseProbes()[0].Feature},
		add: func(b *probeBatch) {
			b.rule(b.filterChain(ruleset.IPv4), ruleset.MatchCtNew{}, dupFromUnloadedRegister{})
		},
	})
	err := checkKernelFeatures(probes, run)
	var kerr *kernelFeatureError
	if !errors.As(err, &kerr) || len(kerr.Missing) != 1 || kerr.Missing[0].Feature != "dup to a register never loaded" {
		t.Fatalf("got %v, want the refused dup named alone", err)
	}
}

// The lean events' rules are checked on their own too (CheckLeanEvents:
// conntrack_events = "auto" runs as "services" on a kernel without ct
// labels), in a batch with nothing else: this kernel takes them.
func TestKernelCheckLeanEventsAlone(t *testing.T) {
	fd := newAnonNetns(t)
	if err := checkKernelFeatures(leanEventProbes(), netlinkProbeRunner(fd, probeTableName())); err != nil {
		t.Fatalf("lean events check on this kernel: %v", err)
	}
	if names := tablesIn(t, fd); len(names) != 0 {
		t.Errorf("the check left tables behind: %v", names)
	}
}

// dupFromUnloadedRegister is a dup whose address register nothing loaded,
// which the kernel refuses.
type dupFromUnloadedRegister struct{}

func (dupFromUnloadedRegister) AppendText(b []byte, _ ruleset.Family) []byte {
	return append(b, "dup"...)
}
func (dupFromUnloadedRegister) Encode(_ ruleset.Family, s bc.Sink) { s.Dup(bc.Dup{RegAddr: 42}) }

// The flowtable is probed only when the configuration turns it on; on a
// kernel without flowtables the check then names the missing option for
// each family, and nothing else.
func TestKernelCheckFlowtable(t *testing.T) {
	fd := newAnonNetns(t)
	run := netlinkProbeRunner(fd, probeTableName())
	off := &ruleset.Config{Table: "nftgate"}
	if err := checkKernelFeatures(kernelProbesFor(off), run); err != nil {
		t.Fatalf("kernel check without the flowtable: %v", err)
	}
	on := &ruleset.Config{Table: "nftgate", FlowtableDevices: []string{"eth0"}}
	err := checkKernelFeatures(kernelProbesFor(on), run)
	if names := tablesIn(t, fd); len(names) != 0 {
		t.Errorf("the check left tables behind: %v", names)
	}
	if netnstest.KernelHas(t, "CONFIG_NF_FLOW_TABLE", "CONFIG_NF_FLOW_TABLE_INET", "CONFIG_NFT_FLOW_OFFLOAD") {
		if err != nil {
			t.Fatalf("kernel check with the flowtable, on a kernel built with it: %v", err)
		}
		return
	}
	var fe *kernelFeatureError
	if !errors.As(err, &fe) {
		t.Fatalf("kernel check with the flowtable on a kernel without it: %v, want the missing features named", err)
	}
	var got []string
	for _, m := range fe.Missing {
		got = append(got, m.Feature+": "+m.Option)
	}
	want := []string{
		"flowtable (ip): CONFIG_NF_FLOW_TABLE and CONFIG_NF_FLOW_TABLE_INET",
		"flowtable (ip6): CONFIG_NF_FLOW_TABLE and CONFIG_NF_FLOW_TABLE_INET",
	}
	if !slices.Equal(got, want) {
		t.Errorf("missing features %q, want %q", got, want)
	}
	t.Logf("the check says: %v", err)
}
