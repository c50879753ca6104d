// Package labtest wires the lab package into tests: it skips when the test
// cannot create network namespaces (not root), removes what dead test
// processes left behind, and registers cleanup that also proves nothing
// leaked.
package labtest

import (
	"os"
	"regexp"
	"sync"
	"testing"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

var staleOnce sync.Once

// RequireRoot skips t with an explanation unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the network lab creates network namespaces and veth pairs, which needs root (run the tests as root, e.g. sudo go test)")
	}
}

// New returns an empty lab named after the test, closed by t.Cleanup.
func New(t testing.TB) *lab.Lab {
	t.Helper()
	RequireRoot(t)
	removeStale(t)
	l, err := lab.New(labName(t))
	if err != nil {
		t.Fatalf("lab.New: %v", err)
	}
	t.Cleanup(func() { closeAndCheck(t, l) })
	return l
}

// Gateway returns the standard client/gateway/backend topology (see
// lab.NewGateway), closed by t.Cleanup.
func Gateway(t testing.TB) *lab.Topology {
	t.Helper()
	return GatewayWith(t, lab.GatewayOptions{})
}

// GatewayWith is Gateway with options.
func GatewayWith(t testing.TB, opts lab.GatewayOptions) *lab.Topology {
	t.Helper()
	RequireRoot(t)
	removeStale(t)
	topo, err := lab.NewGateway(labName(t), opts)
	if err != nil {
		t.Fatalf("lab.NewGateway: %v", err)
	}
	t.Cleanup(func() { closeAndCheck(t, topo.Lab) })
	return topo
}

func removeStale(t testing.TB) {
	staleOnce.Do(func() {
		removed, err := lab.RemoveStale()
		if err != nil {
			t.Logf("removing stale lab namespaces: %v", err)
		}
		if len(removed) > 0 {
			t.Logf("removed stale lab leftovers: %v", removed)
		}
	})
}

func closeAndCheck(t testing.TB, l *lab.Lab) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Errorf("closing lab %s: %v", l.Name(), err)
	}
	if left, err := l.Namespaces(); err != nil {
		t.Errorf("listing namespaces of lab %s: %v", l.Name(), err)
	} else if len(left) > 0 {
		t.Errorf("lab %s left namespaces behind: %v", l.Name(), left)
	}
	if left, err := l.RootLinks(); err != nil {
		t.Errorf("listing root links of lab %s: %v", l.Name(), err)
	} else if len(left) > 0 {
		t.Errorf("lab %s left links in the root namespace: %v", l.Name(), left)
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// labName turns the test name into a lab name; the lab adds the pid and a
// sequence number, so only readability matters here.
func labName(t testing.TB) string {
	n := unsafeChars.ReplaceAllString(t.Name(), "-")
	for len(n) > 0 && (n[0] == '-' || n[0] == '_') {
		n = n[1:]
	}
	if len(n) > 24 {
		n = n[:24]
	}
	if n == "" {
		n = "test"
	}
	return n
}
