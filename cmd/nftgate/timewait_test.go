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

// The release and the answer to refused SYNs need the kernel's support,
// each its own: without it the gateway runs without that one and says why
// (a kernel without conntrack marks keeps the answer); with either on,
// conntrack's TIME_WAIT timeout is set as configured, and left alone when
// it already is, or when the setting is 0 or both are off.
func TestSetupReleaseTimeWait(t *testing.T) {
	ok := func() error { return nil }
	noDup := func() error { return errors.New("dup expression (ip) (kernel option CONFIG_NFT_DUP_IPV4): refused") }
	noMarks := func() error {
		return errors.New("conntrack marks (ip) (kernel option CONFIG_NF_CONNTRACK_MARK and CONFIG_NFT_CT): refused")
	}
	for _, tc := range []struct {
		name              string
		release, answer   bool
		timeWait          time.Duration
		check             timeWaitChecks
		before            string
		wantAfter         string
		wantRelease       bool
		wantAnswer        bool
		wantLogged        []string
		wantLoggedNothing bool
	}{
		{name: "default", release: true, answer: true, timeWait: defaultConntrackTCPTimeWait, check: timeWaitChecks{ok, ok}, before: "120\n", wantAfter: "2\n",
			wantRelease: true, wantAnswer: true, wantLogged: []string{"from=120s to=2s"}},
		{name: "already set", release: true, answer: true, timeWait: 2 * time.Second, check: timeWaitChecks{ok, ok}, before: "2\n", wantAfter: "2\n",
			wantRelease: true, wantAnswer: true, wantLoggedNothing: true},
		{name: "left alone", release: true, answer: true, timeWait: 0, check: timeWaitChecks{ok, ok}, before: "120\n", wantAfter: "120\n",
			wantRelease: true, wantAnswer: true, wantLoggedNothing: true},
		{name: "both off", check: timeWaitChecks{noDup, noDup}, timeWait: 2 * time.Second, before: "120\n", wantAfter: "120\n", wantLoggedNothing: true},
		{name: "answer alone", answer: true, check: timeWaitChecks{noMarks, ok}, timeWait: 2 * time.Second, before: "120\n", wantAfter: "2\n",
			wantAnswer: true, wantLogged: []string{"from=120s to=2s"}},
		{name: "kernel without conntrack marks", release: true, answer: true, timeWait: 2 * time.Second, check: timeWaitChecks{noMarks, ok},
			before: "120\n", wantAfter: "2\n", wantAnswer: true, wantLogged: []string{"release_time_wait is off", "CONFIG_NF_CONNTRACK_MARK", "from=120s to=2s"}},
		{name: "kernel without dup", release: true, answer: true, timeWait: 2 * time.Second, check: timeWaitChecks{noDup, noDup}, before: "120\n", wantAfter: "120\n",
			wantLogged: []string{"release_time_wait is off", "answer_refused_syns is off", "CONFIG_NFT_DUP_IPV4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sysctl := filepath.Join(t.TempDir(), "nf_conntrack_tcp_timeout_time_wait")
			if err := os.WriteFile(sysctl, []byte(tc.before), 0o644); err != nil {
				t.Fatal(err)
			}
			var logged bytes.Buffer
			cfg := defaults()
			cfg.ReleaseTimeWait, cfg.AnswerRefusedSYNs, cfg.ConntrackTCPTimeWait = tc.release, tc.answer, Duration(tc.timeWait)
			if err := setupReleaseTimeWait(&cfg, slog.New(slog.NewTextHandler(&logged, nil)), tc.check, sysctl); err != nil {
				t.Fatal(err)
			}
			if cfg.ReleaseTimeWait != tc.wantRelease || cfg.AnswerRefusedSYNs != tc.wantAnswer {
				t.Errorf("after the checks release_time_wait %v, answer_refused_syns %v; want %v, %v",
					cfg.ReleaseTimeWait, cfg.AnswerRefusedSYNs, tc.wantRelease, tc.wantAnswer)
			}
			if got, _ := os.ReadFile(sysctl); string(got) != tc.wantAfter {
				t.Errorf("sysctl %q, want %q", got, tc.wantAfter)
			}
			for _, want := range tc.wantLogged {
				if !strings.Contains(logged.String(), want) {
					t.Errorf("log %q does not say %q", logged.String(), want)
				}
			}
			if tc.wantLoggedNothing && logged.Len() > 0 {
				t.Errorf("logged %q, want nothing", logged.String())
			}
		})
	}
}

// A sysctl that cannot be written fails the start, naming the setting.
func TestSetupReleaseTimeWaitUnwritable(t *testing.T) {
	cfg := defaults()
	ok := func() error { return nil }
	err := setupReleaseTimeWait(&cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), timeWaitChecks{ok, ok},
		filepath.Join(t.TempDir(), "missing", "nf_conntrack_tcp_timeout_time_wait"))
	if err == nil || !strings.Contains(err.Error(), "conntrack_tcp_time_wait") {
		t.Fatalf("got %v, want an error naming conntrack_tcp_time_wait", err)
	}
}
