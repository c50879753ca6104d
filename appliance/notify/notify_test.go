package notify

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// listen creates a real unixgram socket, as systemd does, and points
// NOTIFY_SOCKET at it.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

// recv returns the next datagram, failing the test after a deadline.
func recv(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no sd_notify message: %v", err)
	}
	return string(buf[:n])
}

func expectNone(t *testing.T, conn *net.UnixConn, within time.Duration) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(within)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := conn.Read(buf); err == nil {
		t.Fatalf("unexpected sd_notify message %q", buf[:n])
	}
}

func TestReadyAndStatus(t *testing.T) {
	conn := listen(t)
	t.Setenv("WATCHDOG_USEC", "")
	n, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.WatchdogInterval() != 0 {
		t.Fatalf("watchdog interval %v without WATCHDOG_USEC", n.WatchdogInterval())
	}
	if err := n.Status("waiting for first sync"); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, conn); got != "STATUS=waiting for first sync" {
		t.Fatalf("got %q", got)
	}
	if err := n.Ready("12 services,\nsynced in 1ms"); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, conn); got != "READY=1\nSTATUS=12 services, synced in 1ms" {
		t.Fatalf("got %q", got)
	}
	// READY=1 goes out once; an unchanged status is not repeated.
	if err := n.Ready("again"); err != nil {
		t.Fatal(err)
	}
	if err := n.Status("12 services, synced in 1ms"); err != nil {
		t.Fatal(err)
	}
	if err := n.Status("13 services"); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, conn); got != "STATUS=13 services" {
		t.Fatalf("got %q", got)
	}
	if err := n.Stopping(); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, conn); got != "STOPPING=1" {
		t.Fatalf("got %q", got)
	}
	expectNone(t, conn, 100*time.Millisecond)
}

func TestWatchdog(t *testing.T) {
	conn := listen(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	n, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.WatchdogInterval(); got != 100*time.Millisecond {
		t.Fatalf("interval %v, want half of WATCHDOG_USEC (100ms)", got)
	}

	var healthy atomic.Bool
	healthy.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Watchdog(ctx, func() error {
			if !healthy.Load() {
				return errors.New("sync loop stuck")
			}
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })

	var times []time.Time
	for range 4 {
		if got := recv(t, conn); got != "WATCHDOG=1" {
			t.Fatalf("got %q", got)
		}
		times = append(times, time.Now())
	}
	// Pings follow the interval: none come in a burst.
	for i := 2; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < 50*time.Millisecond {
			t.Errorf("ping %d came %v after the previous one", i, gap)
		}
	}

	// An unhealthy check withholds pings so systemd can restart the process.
	healthy.Store(false)
	// Drain pings sent before the switch; a bounded count so a watchdog that
	// keeps pinging still fails below.
	for range 3 {
		_ = conn.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 64)); err != nil {
			break
		}
	}
	expectNone(t, conn, 350*time.Millisecond)

	healthy.Store(true)
	if got := recv(t, conn); got != "WATCHDOG=1" {
		t.Fatalf("got %q", got)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watchdog did not return after cancel")
	}
}

func TestWatchdogForAnotherProcess(t *testing.T) {
	listen(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()+1))
	n, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.WatchdogInterval() != 0 {
		t.Fatalf("interval %v for another process's watchdog", n.WatchdogInterval())
	}
	// Returns at once.
	n.Watchdog(context.Background(), nil)
}

func TestBadWatchdogUsec(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "soon")
	_, err := New(nil)
	if err == nil || !strings.Contains(err.Error(), "WATCHDOG_USEC") {
		t.Fatalf("err = %v, want one naming WATCHDOG_USEC", err)
	}
}

func TestNoSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	n, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{
		func() error { return n.Ready("ready") },
		func() error { return n.Status("status") },
		n.Stopping,
	} {
		if err := f(); err != nil {
			t.Fatalf("without NOTIFY_SOCKET: %v", err)
		}
	}
	n.Watchdog(context.Background(), nil)
}

func TestSendErrorNamesMessage(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone.sock"))
	n, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Status("x"); err == nil || !strings.Contains(err.Error(), `sd_notify "STATUS"`) {
		t.Fatalf("err = %v", err)
	}
}
