package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Conntrack's accounting is turned on with the flowtable, whatever its
// packet count, left alone without it, and a sysctl that cannot be read
// fails the start naming the flowtable.
func TestSetupConntrackAcct(t *testing.T) {
	for _, tc := range []struct {
		name      string
		flowtable bool
		packets   int64
		before    string
		want      string
	}{
		{"off", false, 20, "0\n", "0\n"},
		{"on, packets 0", true, 0, "0\n", "1\n"},
		{"on, packets 20", true, 20, "0\n", "1\n"},
		{"on, already on", true, 20, "1\n", "1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sysctl := filepath.Join(t.TempDir(), "nf_conntrack_acct")
			if err := os.WriteFile(sysctl, []byte(tc.before), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := defaults()
			cfg.Flowtable, cfg.FlowtablePackets = tc.flowtable, tc.packets
			var logged bytes.Buffer
			if err := setupConntrackAcct(&cfg, slog.New(slog.NewTextHandler(&logged, nil)), sysctl); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(sysctl)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("nf_conntrack_acct %q, want %q", got, tc.want)
			}
			if changed := tc.before != tc.want; changed != strings.Contains(logged.String(), "accounting turned on") {
				t.Errorf("log %q after changing %v", logged.String(), changed)
			}
		})
	}
	cfg := defaults()
	cfg.Flowtable = true
	err := setupConntrackAcct(&cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), filepath.Join(t.TempDir(), "missing", "nf_conntrack_acct"))
	if err == nil || !strings.Contains(err.Error(), "flowtable") {
		t.Fatalf("got %v, want an error naming the flowtable", err)
	}
}
