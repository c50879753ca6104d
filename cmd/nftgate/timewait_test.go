package main

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The release needs the kernel's support: without it the gateway runs
// without the release and says why; with it, conntrack's TIME_WAIT timeout
// is set as configured, and left alone when it already is, or when the
// setting is 0 or the release off.
func TestSetupReleaseTimeWait(t *testing.T) {
	ok := func() error { return nil }
	refused := func() error { return errors.New("dup expression (ip) (kernel option CONFIG_NFT_DUP_IPV4): refused") }
	for _, tc := range []struct {
		name       string
		release    bool
		timeWait   time.Duration
		check      func() error
		before     string
		wantAfter  string
		wantOn     bool
		wantLogged string
	}{
		{name: "default", release: true, timeWait: defaultConntrackTCPTimeWait, check: ok, before: "120\n", wantAfter: "2\n", wantOn: true, wantLogged: "from=120s to=2s"},
		{name: "already set", release: true, timeWait: 2 * time.Second, check: ok, before: "2\n", wantAfter: "2\n", wantOn: true},
		{name: "left alone", release: true, timeWait: 0, check: ok, before: "120\n", wantAfter: "120\n", wantOn: true},
		{name: "release off", release: false, timeWait: 2 * time.Second, check: refused, before: "120\n", wantAfter: "120\n"},
		{name: "kernel without it", release: true, timeWait: 2 * time.Second, check: refused, before: "120\n", wantAfter: "120\n",
			wantLogged: "CONFIG_NFT_DUP_IPV4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sysctl := filepath.Join(t.TempDir(), "nf_conntrack_tcp_timeout_time_wait")
			if err := os.WriteFile(sysctl, []byte(tc.before), 0o644); err != nil {
				t.Fatal(err)
			}
			var logged bytes.Buffer
			cfg := defaults()
			cfg.ReleaseTimeWait, cfg.ConntrackTCPTimeWait = tc.release, Duration(tc.timeWait)
			if err := setupReleaseTimeWait(&cfg, slog.New(slog.NewTextHandler(&logged, nil)), tc.check, sysctl); err != nil {
				t.Fatal(err)
			}
			if cfg.ReleaseTimeWait != tc.wantOn {
				t.Errorf("release_time_wait %v after the check, want %v", cfg.ReleaseTimeWait, tc.wantOn)
			}
			if got, _ := os.ReadFile(sysctl); string(got) != tc.wantAfter {
				t.Errorf("sysctl %q, want %q", got, tc.wantAfter)
			}
			if tc.wantLogged != "" && !strings.Contains(logged.String(), tc.wantLogged) {
				t.Errorf("log %q does not say %q", logged.String(), tc.wantLogged)
			}
			if tc.wantLogged == "" && logged.Len() > 0 {
				t.Errorf("logged %q, want nothing", logged.String())
			}
		})
	}
}

// A sysctl that cannot be written fails the start, naming the setting.
func TestSetupReleaseTimeWaitUnwritable(t *testing.T) {
	cfg := defaults()
	err := setupReleaseTimeWait(&cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), func() error { return nil },
		filepath.Join(t.TempDir(), "missing", "nf_conntrack_tcp_timeout_time_wait"))
	if err == nil || !strings.Contains(err.Error(), "conntrack_tcp_time_wait") {
		t.Fatalf("got %v, want an error naming conntrack_tcp_time_wait", err)
	}
}
