package nft

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// elemTestTable holds the shapes of sets nftgate's own tables do not:
// intervals (plain and concatenated), per-element timeouts and comments,
// data maps, every kind of verdict, and elements with two expressions.
const elemTestTable = `table ip elemtest {
	set multi { type ipv4_addr; size 64; flags dynamic; counter; quota 1000 bytes; elements = { 192.0.2.7 } }
	set iv { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 192.168.1.1-192.168.1.9 } }
	set civ { type ipv4_addr . inet_service; flags interval; elements = { 10.0.0.0/8 . 80-90, 192.0.2.1 . 443 } }
	set to { type ipv4_addr . inet_proto . inet_service; flags timeout; timeout 1h; elements = { 192.0.2.1 . tcp . 80 timeout 30m expires 10m, 192.0.2.2 . udp . 53 comment "x" } }
	map dm { type ipv4_addr : mark; elements = { 192.0.2.1 : 0x10, 192.0.2.2 : 0x20 } }
	chain a { }
	map vm { type inet_proto . inet_service : verdict; counter; elements = { tcp . 80 counter packets 5 bytes 500 : jump a, udp . 53 : goto a, tcp . 22 : drop, tcp . 443 : accept } }
}
`

// oracleElem is an element in the form both readers can give.
type oracleElem struct {
	desc    string
	expires time.Duration
}

// TestElemReaderMatchesGoogleNftables fills the sets and maps of every
// shape nftgate makes (its service, node-port, no-endpoint and firewall
// maps with counters, cluster-IP and hairpin sets, Maglev slot maps, full
// traffic sets, in the main and the shard tables), plus intervals, data
// maps, timeouts and comments, in a namespace, and checks that eachElem
// reads every element of every set exactly as google/nftables'
// GetSetElements does.
func TestElemReaderMatchesGoogleNftables(t *testing.T) {
	ns, fd := testNetNS(t)
	c := clusterOf(300)
	for _, cfg := range []ruleset.Config{
		func() ruleset.Config {
			cfg := scaleConfig()
			cfg.Counters, cfg.TrafficElements, cfg.Shards = true, 4096, 2
			return cfg
		}(),
		func() ruleset.Config {
			cfg := scaleConfig()
			cfg.Table, cfg.EndpointSelection, cfg.Counters, cfg.TrafficElements = "nftgate-maglev", model.SelectionMaglev, false, 0
			return cfg
		}(),
	} {
		p, err := NewProgrammer(cfg, Options{NetNSFD: fd})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if _, err := p.Full(c.Services); err != nil {
			t.Fatalf("full sync of table %s: %v", cfg.Table, err)
		}
		if cfg.TrafficElements > 0 {
			fillTrafficSets(t, ns, &cfg, c, 3000)
		}
	}
	f := filepath.Join(t.TempDir(), "elemtest.nft")
	if err := os.WriteFile(f, []byte(elemTestTable), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-f", f).CombinedOutput(); err != nil {
		t.Fatalf("nft -f %s: %v: %s", f, err, out)
	}

	r, err := newReader(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tables, err := r.conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[ruleset.KeyShape]int{}
	var sets, elems, counters, verdicts, timeouts, intervals int
	for _, tb := range tables {
		all, err := r.conn.GetSets(tb)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range all {
			start := time.Now()
			want, err := r.conn.GetSetElements(s)
			if err != nil {
				t.Fatalf("GetSetElements %s %s: %v", tb.Name, s.Name, err)
			}
			var got []oracleElem
			if err := r.eachElem(ruleset.Family(tb.Family), tb.Name, s.Name, func(e *setElem) error {
				got = append(got, describeLean(e))
				if e.HasCounter {
					counters++
				}
				if e.HasVerdict {
					verdicts++
				}
				if e.Timeout > 0 || e.Expires > 0 {
					timeouts++
				}
				if len(e.KeyEnd) > 0 || e.Flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
					intervals++
				}
				return nil
			}); err != nil {
				t.Fatalf("eachElem %s %s: %v", tb.Name, s.Name, err)
			}
			took := time.Since(start)
			if s.Name == "multi" {
				// google/nftables decodes no element with more than one
				// expression (NFTA_SET_ELEM_EXPRESSIONS).
				if len(got) != 1 || got[0].desc != "key=c0000207 keyend= data= verdict=- flags=0 timeout=0s counter=true/0/0" {
					t.Errorf("set multi: got %v, want its one element with a counter", got)
				}
				continue
			}
			verdictMap := s.KeyType == nftables.TypeVerdict // google/nftables' mark of a verdict map
			wantDesc := make([]oracleElem, 0, len(want))
			for _, e := range want {
				wantDesc = append(wantDesc, describeOracle(e, verdictMap))
			}
			compareElems(t, tb.Name+" "+s.Name, got, wantDesc, took)
			sets++
			elems += len(want)
			shapes[ruleset.SetShape(s.Name)] += len(want)
		}
	}
	t.Logf("%d sets, %d elements (%d with counters, %d verdicts, %d with timeouts, %d of intervals); by shape %v", sets, elems, counters, verdicts, timeouts, intervals, shapes)
	for _, shape := range []ruleset.KeyShape{ruleset.KeyAddrProtoPort, ruleset.KeyProtoPort, ruleset.KeyAddr, ruleset.KeyAddrPair, ruleset.KeySlot, ruleset.KeyTraffic} {
		if shapes[shape] == 0 {
			t.Errorf("no elements of key shape %d were compared", shape)
		}
	}
	if counters == 0 || verdicts == 0 || timeouts == 0 || intervals == 0 {
		t.Errorf("compared too little: %d with counters, %d verdicts, %d with timeouts, %d of intervals", counters, verdicts, timeouts, intervals)
	}
}

func describeLean(e *setElem) oracleElem {
	v := "-"
	if e.HasVerdict {
		v = fmt.Sprintf("%d/%s", e.Verdict, e.Chain)
	}
	return oracleElem{fmt.Sprintf("key=%x keyend=%x data=%x verdict=%s flags=%d timeout=%v counter=%v/%d/%d",
		e.Key, e.KeyEnd, e.Data, v, e.Flags&unix.NFT_SET_ELEM_INTERVAL_END, e.Timeout, e.HasCounter, e.Counter.Packets, e.Counter.Bytes), e.Expires}
}

func describeOracle(e nftables.SetElement, verdictMap bool) oracleElem {
	v, data := "-", e.Val
	if verdictMap {
		vd := e.VerdictData
		if vd == nil {
			vd = oracleVerdict(e.Val)
		}
		v, data = fmt.Sprintf("%d/%s", int32(vd.Kind), vd.Chain), nil
	}
	var flags int
	if e.IntervalEnd {
		flags = unix.NFT_SET_ELEM_INTERVAL_END
	}
	var packets, bytes uint64
	if e.Counter != nil {
		packets, bytes = e.Counter.Packets, e.Counter.Bytes
	}
	return oracleElem{fmt.Sprintf("key=%x keyend=%x data=%x verdict=%s flags=%d timeout=%v counter=%v/%d/%d",
		e.Key, e.KeyEnd, data, v, flags, e.Timeout, e.Counter != nil, packets, bytes), e.Expires}
}

// compareElems checks that got and want hold the same elements, in any
// order. The time left to an element's expiry may have gone down by as
// much as passed between the two readings (took), and by the kernel's
// rounding to a jiffy.
func compareElems(t *testing.T, set string, got, want []oracleElem, took time.Duration) {
	t.Helper()
	cmp := func(a, b oracleElem) int {
		if a.desc < b.desc {
			return -1
		}
		if a.desc > b.desc {
			return 1
		}
		return 0
	}
	slices.SortFunc(got, cmp)
	slices.SortFunc(want, cmp)
	if len(got) != len(want) {
		t.Errorf("set %s: eachElem read %d elements, GetSetElements %d", set, len(got), len(want))
		return
	}
	const jiffy = 20 * time.Millisecond
	for i := range got {
		g, w := got[i], want[i]
		if g.desc != w.desc {
			t.Errorf("set %s: element %d: eachElem read\n\t%s\nGetSetElements\n\t%s", set, i, g.desc, w.desc)
			return
		}
		if g.expires > w.expires+jiffy || g.expires < w.expires-took-jiffy {
			t.Errorf("set %s: element %s: expires in %v, GetSetElements said %v (%v before)", set, g.desc, g.expires, w.expires, took)
		}
	}
}

// oracleVerdict decodes a verdict map element's data as google/nftables
// gives it, undecoded (NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN), with
// mdlayher/netlink's decoder rather than eachElem's.
func oracleVerdict(b []byte) *expr.Verdict {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil
	}
	var v *expr.Verdict
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			if v == nil {
				v = &expr.Verdict{}
			}
			v.Kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(ad.Bytes())))
		case unix.NFTA_VERDICT_CHAIN:
			if v == nil {
				v = &expr.Verdict{}
			}
			v.Chain = ad.String()
		}
	}
	if ad.Err() != nil {
		return nil
	}
	return v
}
