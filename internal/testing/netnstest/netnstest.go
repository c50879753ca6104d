// Package netnstest is the one place where tests move OS threads between
// network namespaces (github.com/vishvananda/netns).
//
// A network namespace belongs to an OS thread, not to a goroutine, so code
// that enters one must run on a goroutine locked to its thread, and must
// bring the thread back before handing it to the runtime again: a thread
// left in the wrong namespace would run unrelated goroutines there. When
// the thread cannot be brought back it stays locked, and the runtime ends
// it with its goroutine.
//
// Ending a thread is not harmless either: a child started with Pdeathsig
// (etcd, kube-apiserver and QEMU in the test harness) is killed when the
// thread that forked it ends, and the runtime may have forked it on any
// thread. So every function here moves its thread back and discards it
// only when that fails.
package netnstest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread that has entered ns, and waits for it. Sockets
// fn creates stay in ns after it returns and may be used from any
// goroutine; goroutines fn starts do not run in ns. The error is fn's,
// joined with any failure to enter or leave ns. A panic in fn is raised
// again in the caller, after the thread has left ns.
func Do(ns netns.NsHandle, fn func() error) error {
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", ns, err)
		}
		return fn()
	})
}

// New creates a network namespace without a name, leaving the caller's
// namespace as it is. The namespace lives as long as the handle or
// anything inside it (a socket, a process) does.
func New() (netns.NsHandle, error) {
	ns := netns.None()
	err := onThread(func() (err error) {
		ns, err = netns.New()
		return err
	})
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		return netns.None(), fmt.Errorf("create network namespace: %w", err)
	}
	return ns, nil
}

// NewNamed creates a network namespace bind-mounted at /run/netns/name (as
// `ip netns add` does), leaving the caller's namespace as it is. It stays
// until netns.DeleteNamed(name).
func NewNamed(name string) (netns.NsHandle, error) {
	ns := netns.None()
	err := onThread(func() (err error) {
		ns, err = netns.NewNamed(name)
		return err
	})
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
			_ = netns.DeleteNamed(name)
		}
		return netns.None(), fmt.Errorf("create network namespace %s: %w", name, err)
	}
	return ns, nil
}

// Temp creates a network namespace without a name for t, closed when t
// ends; it fails t if the namespace cannot be made.
func Temp(t testing.TB) netns.NsHandle {
	t.Helper()
	ns, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// onThread runs fn on a goroutine locked to its OS thread, then moves the
// thread back to the namespace it started in and returns it to the
// runtime; if that fails, the thread stays locked and ends with the
// goroutine.
func onThread(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		panic    any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("current network namespace: %w", err)}
			return
		}
		defer orig.Close()
		var r result
		func() {
			defer func() {
				if p := recover(); p != nil {
					r.panicked, r.panic = true, p
				}
			}()
			r.err = fn()
		}()
		if err := netns.Set(orig); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("return to network namespace %s: %w", orig, err))
			done <- r
			return
		}
		runtime.UnlockOSThread()
		done <- r
	}()
	r := <-done
	if r.panicked {
		panic(r.panic)
	}
	return r.err
}
