package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/gateways"
)

// conntrack_events = "auto" (the default with state sync) runs as "lean"
// where a closed connection's entry ends well within FIN_WAIT and the
// kernel takes the lean rules, and as "services" otherwise, saying why; a
// value the operator chose is left as it is.
func TestChooseConntrackEvents(t *testing.T) {
	ok := func() error { return nil }
	noLabels := func() error {
		return errors.New("ct event set and ct label set (ip) (kernel option CONFIG_NF_CONNTRACK_EVENTS and CONFIG_NF_CONNTRACK_LABELS): refused")
	}
	secs := func(n int) func() (int, error) { return func() (int, error) { return n, nil } }
	unreadable := func() (int, error) { return 0, errors.New("no such file") }
	for _, tc := range []struct {
		name       string
		events     string
		refresh    time.Duration
		check      leanChecks
		want       string
		wantLogged []string
	}{
		{name: "the release's TIME_WAIT", events: gateways.EventsAuto, check: leanChecks{ok, secs(2), secs(120)}, want: gateways.EventsLean},
		{name: "the kernel's TIME_WAIT", events: gateways.EventsAuto, check: leanChecks{ok, secs(120), secs(120)}, want: gateways.EventsServices,
			wantLogged: []string{`runs as \"services\"`, "TIME_WAIT", "time_wait=120s fin_wait=120s sync_refresh_interval=5s"}},
		{name: "TIME_WAIT just short enough", events: gateways.EventsAuto, check: leanChecks{ok, secs(109), secs(120)}, want: gateways.EventsLean},
		{name: "TIME_WAIT within two refresh intervals of FIN_WAIT", events: gateways.EventsAuto, check: leanChecks{ok, secs(110), secs(120)}, want: gateways.EventsServices,
			wantLogged: []string{"time_wait=110s"}},
		{name: "a long refresh interval", events: gateways.EventsAuto, refresh: time.Minute, check: leanChecks{ok, secs(2), secs(120)}, want: gateways.EventsServices,
			wantLogged: []string{"sync_refresh_interval=1m0s"}},
		{name: "a kernel without ct labels", events: gateways.EventsAuto, check: leanChecks{noLabels, secs(2), secs(120)}, want: gateways.EventsServices,
			wantLogged: []string{"the kernel refuses the lean rules", "CONFIG_NF_CONNTRACK_LABELS"}},
		{name: "TIME_WAIT unreadable", events: gateways.EventsAuto, check: leanChecks{ok, unreadable, secs(120)}, want: gateways.EventsServices,
			wantLogged: []string{"TIME_WAIT timeout is not readable", "no such file"}},
		{name: "FIN_WAIT unreadable", events: gateways.EventsAuto, check: leanChecks{ok, secs(2), unreadable}, want: gateways.EventsServices,
			wantLogged: []string{"FIN_WAIT timeout is not readable"}},
		{name: "lean chosen", events: gateways.EventsLean, check: leanChecks{noLabels, secs(120), secs(120)}, want: gateways.EventsLean},
		{name: "services chosen", events: gateways.EventsServices, check: leanChecks{ok, secs(2), secs(120)}, want: gateways.EventsServices},
		{name: "all chosen", events: gateways.EventsAll, check: leanChecks{ok, secs(2), secs(120)}, want: gateways.EventsAll},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaults()
			g := gateways.Config{ConntrackEvents: tc.events, SyncRefreshInterval: tc.refresh}.WithDefaults()
			cfg.Gateways = &g
			var logged bytes.Buffer
			chooseConntrackEvents(&cfg, slog.New(slog.NewTextHandler(&logged, nil)), tc.check)
			if got := cfg.Gateways.ConntrackEvents; got != tc.want {
				t.Errorf("conntrack_events %q runs as %q, want %q", tc.events, got, tc.want)
			}
			if len(tc.wantLogged) == 0 && logged.Len() > 0 {
				t.Errorf("logged %q, want nothing", logged.String())
			}
			for _, w := range tc.wantLogged {
				if !strings.Contains(logged.String(), w) {
					t.Errorf("logged %q, want it to contain %q", logged.String(), w)
				}
			}
			if got, want := cfg.leanServiceEvents(), tc.want == gateways.EventsLean; got != want {
				t.Errorf("the ruleset's lean events %v, want %v", got, want)
			}
		})
	}
	none := defaults()
	chooseConntrackEvents(&none, slog.New(slog.DiscardHandler), leanChecks{ok, secs(2), secs(120)})
	if none.Gateways != nil {
		t.Errorf("without [gateways]: %+v", none.Gateways)
	}
}
