package vmtest

import (
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// ctEntry is one line of /proc/net/nf_conntrack: the protocol, the
// original and the reply tuple, and the mark.
type ctEntry struct {
	Proto         string
	Orig, Reply   tuple
	Mark          uint32
	State         string // TCP only
	Unreplied     bool
	Assured       bool
	TimeoutSecond int
}

type tuple struct{ Src, Dst netip.AddrPort }

// replicaMark is the ct mark bit of an entry written from a peer gateway
// (README "State sync").
const replicaMark = 1 << 31

// parseConntrack reads the IPv4 and IPv6 lines of /proc/net/nf_conntrack
// in out and skips anything else (the serial console mixes in other
// output).
func parseConntrack(out string) []ctEntry {
	var entries []ctEntry
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || (f[0] != "ipv4" && f[0] != "ipv6") {
			continue
		}
		e := ctEntry{Proto: f[2]}
		var tuples []map[string]string
		cur := map[string]string{}
		for i, w := range f[4:] {
			k, v, ok := strings.Cut(w, "=")
			switch {
			case !ok && w == "[UNREPLIED]":
				e.Unreplied = true
			case !ok && w == "[ASSURED]":
				e.Assured = true
			case !ok && i == 0:
				e.TimeoutSecond, _ = strconv.Atoi(w)
			case !ok && e.Proto == "tcp" && len(tuples) == 0 && len(cur) == 0:
				e.State = w
			case k == "src" && len(cur) > 0:
				tuples = append(tuples, cur)
				cur = map[string]string{"src": v}
			case k == "src" || k == "dst" || k == "sport" || k == "dport":
				cur[k] = v
			case k == "mark":
				m, _ := strconv.ParseUint(v, 10, 32)
				e.Mark = uint32(m)
			}
		}
		tuples = append(tuples, cur)
		if len(tuples) != 2 {
			continue
		}
		ap := func(t map[string]string, addr, port string) netip.AddrPort {
			a, _ := netip.ParseAddr(t[addr])
			p, _ := strconv.ParseUint(t[port], 10, 16)
			return netip.AddrPortFrom(a, uint16(p))
		}
		e.Orig = tuple{ap(tuples[0], "src", "sport"), ap(tuples[0], "dst", "dport")}
		e.Reply = tuple{ap(tuples[1], "src", "sport"), ap(tuples[1], "dst", "dport")}
		entries = append(entries, e)
	}
	return entries
}

// TestParseConntrack reads lines of the format Linux 6.12 prints with
// CONFIG_NF_CONNTRACK_MARK, among console noise.
func TestParseConntrack(t *testing.T) {
	out := `[   42.1] some kernel line
ipv4     2 tcp      6 431999 ESTABLISHED src=10.124.1.2 dst=10.124.1.100 sport=40000 dport=80 src=10.124.2.51 dst=10.124.2.100 sport=8080 dport=40000 [ASSURED] mark=2147483648 use=1
ipv4     2 udp      17 27 src=10.124.1.2 dst=10.124.1.100 sport=5000 dport=80 [UNREPLIED] src=10.124.2.50 dst=10.124.2.100 sport=8080 dport=5000 mark=0 use=2
/ # `
	got := parseConntrack(out)
	ap := netip.MustParseAddrPort
	want := []ctEntry{
		{Proto: "tcp", State: "ESTABLISHED", TimeoutSecond: 431999, Assured: true, Mark: replicaMark,
			Orig:  tuple{ap("10.124.1.2:40000"), ap("10.124.1.100:80")},
			Reply: tuple{ap("10.124.2.51:8080"), ap("10.124.2.100:40000")}},
		{Proto: "udp", TimeoutSecond: 27, Unreplied: true,
			Orig:  tuple{ap("10.124.1.2:5000"), ap("10.124.1.100:80")},
			Reply: tuple{ap("10.124.2.50:8080"), ap("10.124.2.100:5000")}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseConntrack:\n got %+v\nwant %+v", got, want)
	}
}
