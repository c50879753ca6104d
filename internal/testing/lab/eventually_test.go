package lab

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

func TestEventuallyRetriesUntilSuccess(t *testing.T) {
	n := 0
	err := EventuallyWithin(5*time.Second, func() error {
		n++
		if n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("err %v after %d calls, want nil after 3", err, n)
	}
}

func TestEventuallyGivesUpWithLastError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Eventually(ctx, func() error { return syscall.ECONNREFUSED })
	if err == nil {
		t.Fatal("Eventually succeeded on a condition that never holds")
	}
	if !IsRefused(err) {
		t.Errorf("last error lost: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("gave up after %v, want about 50ms", took)
	}
}

func TestParseReply(t *testing.T) {
	r, err := parseReply([]byte("[fd42:2::10]:8080 [fd42:1::2]:41000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Backend != "[fd42:2::10]:8080" || r.ObservedSource != netip.MustParseAddrPort("[fd42:1::2]:41000") {
		t.Errorf("parsed %+v", r)
	}
	for _, bad := range []string{"", "one", "a b c", "198.18.2.10:80 nonsense"} {
		if _, err := parseReply([]byte(bad)); err == nil {
			t.Errorf("parseReply(%q) accepted", bad)
		}
	}
}

func TestHTTPRequestLineDetection(t *testing.T) {
	for line, want := range map[string]bool{
		"GET / HTTP/1.1":   true,
		"HEAD /x HTTP/1.0": true,
		"nftgate-lab":      false,
		"GET /":            false,
		"":                 false,
	} {
		if got := isHTTPRequestLine(line); got != want {
			t.Errorf("isHTTPRequestLine(%q) = %v", line, got)
		}
	}
}

func TestSysctlPath(t *testing.T) {
	for key, want := range map[string]string{
		"net.ipv4.ip_forward":               "/proc/sys/net/ipv4/ip_forward",
		"net/ipv4/conf/eth0.100/forwarding": "/proc/sys/net/ipv4/conf/eth0.100/forwarding",
		"net/../../../etc/passwd":           "/proc/sys/etc/passwd",
	} {
		if got := sysctlPath(key); got != want {
			t.Errorf("sysctlPath(%q) = %q, want %q", key, got, want)
		}
	}
}
