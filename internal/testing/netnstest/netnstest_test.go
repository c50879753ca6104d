package netnstest_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
}

// threadsOutside fails t unless every thread of the process is in the
// namespace the process started in.
func threadsOutside(t *testing.T) {
	t.Helper()
	want, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tasks {
		got, err := os.Readlink(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread ended
		}
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s is %s, want %s: a thread was left in another namespace", p, got, want)
		}
	}
}

func current(t *testing.T) netns.NsHandle {
	t.Helper()
	h, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestDoRunsInTheNamespaceAndComesBack(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	root := current(t)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			err := netnstest.Do(ns, func() error {
				in, err := netns.Get()
				if err != nil {
					return err
				}
				defer in.Close()
				if !in.Equal(ns) {
					return fmt.Errorf("fn runs in %s, want %s", in, ns)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if h := current(t); !h.Equal(root) {
		t.Errorf("the caller is in %s after Do, want %s", h, root)
	}
	threadsOutside(t)
}

func TestDoKeepsSocketsInTheNamespace(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	// 127.0.0.2:<port> inside the namespace: a listener made outside it
	// would be the host's.
	var l net.Listener
	if err := netnstest.Do(ns, func() (err error) {
		l, err = net.Listen("tcp", "127.0.0.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
		c.Close()
		t.Errorf("%s answered from the host's namespace", l.Addr())
	}
	if err := netnstest.Do(ns, func() error {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Errorf("dial %s inside the namespace: %v", l.Addr(), err)
	}
	threadsOutside(t)
}

func TestDoReturnsTheErrorAndRaisesThePanic(t *testing.T) {
	requireRoot(t)
	ns := netnstest.Temp(t)
	errFn := errors.New("from fn")
	if err := netnstest.Do(ns, func() error { return errFn }); !errors.Is(err, errFn) {
		t.Errorf("Do returned %v, want %v", err, errFn)
	}
	func() {
		defer func() {
			if p := recover(); p != "from fn" {
				t.Errorf("recovered %v, want the panic of fn", p)
			}
		}()
		_ = netnstest.Do(ns, func() error { panic("from fn") })
	}()
	threadsOutside(t)
}

func TestDoIntoAClosedNamespaceFails(t *testing.T) {
	requireRoot(t)
	ns, err := netnstest.New()
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	ran := false
	if err := netnstest.Do(ns, func() error { ran = true; return nil }); err == nil || ran {
		t.Errorf("Do into a closed handle: err %v, fn ran %v; want an error and fn not run", err, ran)
	}
	threadsOutside(t)
}

func TestNewNamed(t *testing.T) {
	requireRoot(t)
	name := fmt.Sprintf("nftgate-netnstest-%d", os.Getpid())
	ns, err := netnstest.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Error(err)
		}
	})
	byName, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer byName.Close()
	if !byName.Equal(ns) {
		t.Errorf("/run/netns/%s is %s, want %s", name, byName, ns)
	}
	if _, err := netnstest.NewNamed(name); err == nil {
		t.Errorf("a second NewNamed(%q) succeeded", name)
	}
	threadsOutside(t)
}
