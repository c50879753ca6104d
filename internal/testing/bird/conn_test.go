package bird_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// TestConnReadsWhatBirdcReads: the control-socket connection sees the
// same routes and counts as birdc, and keeps working across commands,
// errors included.
func TestConnReadsWhatBirdcReads(t *testing.T) {
	l := labtest.New(t)
	h, err := l.AddHost("router")
	if err != nil {
		t.Fatal(err)
	}
	b := bird.Start(t, h, `
router id 192.0.2.1;
protocol device {}
protocol static s4 { ipv4; route 192.0.2.8/32 blackhole; route 192.0.2.9/32 blackhole; route 192.0.2.16/28 blackhole; }
`)
	c, err := b.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b.WaitState(t, "s4", "up", false, 10*time.Second)
	for range 3 {
		for _, tc := range []struct {
			p    string
			want bool
		}{{"192.0.2.8/32", true}, {"192.0.2.9/32", true}, {"192.0.2.10/32", false}, {"192.0.2.16/28", true}, {"192.0.2.16/32", false}} {
			p := netip.MustParsePrefix(tc.p)
			got, err := c.HasRoute(p)
			if err != nil {
				t.Fatal(err)
			}
			viaBirdc, err := b.HasRoute(p)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || viaBirdc != tc.want {
				t.Errorf("%s: conn says %v, birdc %v, want %v", p, got, viaBirdc, tc.want)
			}
		}
		n, err := c.RouteCount("s4")
		if err != nil || n != 3 {
			t.Errorf("RouteCount(s4) = %d, %v; want 3", n, err)
		}
		if _, err := c.Command("show nonsense"); err == nil {
			t.Error("a syntax error was not an error")
		}
	}
}
