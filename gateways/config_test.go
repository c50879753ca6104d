package gateways

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadKeyNamesFileAndLength(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("  too short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{short, "has 9 bytes"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		_, err := Config{KeyFile: tc.file}.ReadKey()
		if err == nil || !strings.Contains(err.Error(), "gateways.key_file = \""+tc.file+"\"") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadKey(%s) = %v, want the key, file and %q", tc.file, err, tc.want)
		}
	}
}

// The set hash is the same from every gateway's configuration of one set,
// whatever the order, and differs when a name or the timing does.
func TestSetHashAgreesAcrossTheSet(t *testing.T) {
	a := Config{Name: "gw-a", Peers: []PeerConfig{{Name: "gw-b"}, {Name: "gw-c"}}}.WithDefaults()
	b := Config{Name: "gw-b", Peers: []PeerConfig{{Name: "gw-c"}, {Name: "gw-a"}}}.WithDefaults()
	if a.SetHash() != b.SetHash() {
		t.Errorf("one set, two hashes")
	}
	c := Config{Name: "gw-b", Peers: []PeerConfig{{Name: "gw-a"}}}.WithDefaults()
	d := b
	d.DeadAfter = 4
	if c.SetHash() == b.SetHash() || d.SetHash() == b.SetHash() {
		t.Errorf("another set, or other timing, hashes the same")
	}
}

// TestConntrackEventsDefaultsToAutoWithStateSync: the kernel spares the
// routed connections' events only where the sync is their listener (and
// nftgate chooses at start how few of a Service connection's it reports).
func TestConntrackEventsDefaultsToAutoWithStateSync(t *testing.T) {
	off := false
	for _, tc := range []struct {
		sync *bool
		want string
	}{{nil, EventsAuto}, {&off, EventsAll}} {
		if got := (Config{StateSync: tc.sync}).WithDefaults().ConntrackEvents; got != tc.want {
			t.Errorf("state_sync %v: conntrack_events defaults to %q, want %q", tc.sync, got, tc.want)
		}
	}
}

// TestMidstreamTCPDefaultsToWaitWithStateSync: the ruleset waits for the
// replica only where one can come.
func TestMidstreamTCPDefaultsToWaitWithStateSync(t *testing.T) {
	off := false
	for _, tc := range []struct {
		sync *bool
		want string
	}{{nil, MidstreamWait}, {&off, MidstreamPickup}} {
		if got := (Config{StateSync: tc.sync}).WithDefaults().MidstreamTCP; got != tc.want {
			t.Errorf("state_sync %v: midstream_tcp defaults to %q, want %q", tc.sync, got, tc.want)
		}
	}
}

// TestMidstreamTCPWaitDefaultsToTwoRefreshes: the wait outlasts the
// origin's next refresh, which sends a replica whose events were lost;
// "pickup" waits for nothing.
func TestMidstreamTCPWaitDefaultsToTwoRefreshes(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want time.Duration
	}{
		{Config{}, 10 * time.Second},
		{Config{SyncRefreshInterval: 30 * time.Second}, time.Minute},
		{Config{MidstreamTCPWait: 3 * time.Second}, 3 * time.Second},
		{Config{MidstreamTCP: MidstreamPickup}, 0},
	} {
		if got := tc.c.WithDefaults().MidstreamTCPWait; got != tc.want {
			t.Errorf("%+v: midstream_tcp_wait defaults to %v, want %v", tc.c, got, tc.want)
		}
	}
}

// TestMidstreamTCPWaitPeerDeadDefaults: while a peer is dead the wait is
// half a second, or four sync batches where they take longer, and never
// longer than midstream_tcp_wait; "pickup" waits for nothing.
func TestMidstreamTCPWaitPeerDeadDefaults(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want time.Duration
	}{
		{Config{}, 500 * time.Millisecond},
		{Config{SyncBatchInterval: 200 * time.Millisecond}, 800 * time.Millisecond},
		{Config{SyncBatchInterval: time.Second, MidstreamTCPWait: 2 * time.Second}, 2 * time.Second},
		{Config{MidstreamTCPWaitPeerDead: 3 * time.Second}, 3 * time.Second},
		{Config{MidstreamTCP: MidstreamPickup}, 0},
		// Batches too long for a shorter wait than 1s: none, and valid.
		{Config{SyncBatchInterval: 600 * time.Millisecond, MidstreamTCPWait: time.Second}, time.Second},
	} {
		tc.c.Name, tc.c.KeyFile, tc.c.Peers = "gw-a", "k", []PeerConfig{{Name: "gw-b", Addresses: []string{"10.0.0.2:7480"}}}
		c := tc.c.WithDefaults()
		if got := c.MidstreamTCPWaitPeerDead; got != tc.want {
			t.Errorf("%+v: midstream_tcp_wait_peer_dead defaults to %v, want %v", tc.c, got, tc.want)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: the defaults are refused: %v", tc.c, err)
		}
	}
}
