package kubetest

import (
	"errors"
	"os"
	"testing"
)

// EnvCI names the environment variable that marks a CI run: there, missing
// binaries fail a test instead of skipping it.
const EnvCI = "CI"

// StartForTest starts a control plane for t and stops it in t.Cleanup, also
// when t fails. It skips t, with the reason, when this machine cannot run
// one: not root while opts.NetNS is set (entering a namespace needs it), or
// kube-apiserver/etcd missing while $CI is unset. Any other failure fails t.
func StartForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if opts.NetNS != "" && os.Geteuid() != 0 {
		t.Skip("kubetest: running a control plane in a network namespace needs root")
	}
	cp, err := Start(t.Context(), opts)
	if err != nil {
		if errors.Is(err, ErrBinariesMissing) && os.Getenv(EnvCI) == "" {
			t.Skipf("%v (set %s=1 to make this a failure)", err, EnvCI)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("kubetest: stop: %v", err)
		}
	})
	return cp
}
