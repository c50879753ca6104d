package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"

	testlab "github.com/nftgate/nftgate/internal/testing/lab"
)

// TestFlowsReadsTranslatedFlows fills a namespace's conntrack table with a
// UDP flow whose destination the kernel translated (DNAT), an untranslated
// one, and one whose reply comes from elsewhere without the kernel's
// translation (created so through netlink: no DNAT status), and reads them
// back: only the translated one, with its client, destination and
// endpoint; a second reading within FlowsMaxAge is the first one again.
func TestFlowsReadsTranslatedFlows(t *testing.T) {
	ns := newNetNS(t)
	linkUp(t, nlHandle(t, ns), "lo")
	conn := ctConn(t, ns)
	nat := natConn(t, ns)
	translated := synthFlow{proto: 17, src: netip.MustParseAddrPort("198.18.1.5:4000"),
		dst: netip.MustParseAddrPort("10.96.0.10:53"), replySrc: netip.MustParseAddrPort("10.128.0.7:5353")}
	plain := synthFlow{proto: 17, src: netip.MustParseAddrPort("198.18.1.5:4001"),
		dst: netip.MustParseAddrPort("10.128.0.7:5353"), replySrc: netip.MustParseAddrPort("10.128.0.7:5353")}
	untranslated := synthFlow{proto: 17, src: netip.MustParseAddrPort("198.18.1.5:4002"),
		dst: netip.MustParseAddrPort("10.96.0.10:53"), replySrc: netip.MustParseAddrPort("10.128.0.8:5353")}
	createDNAT(t, nat, translated)
	for _, f := range []synthFlow{plain, untranslated} {
		if err := conn.Create(f.flow(120)); err != nil {
			t.Fatalf("create %v: %v", f, err)
		}
	}
	r := NewFlows(WithNetNS(int(ns)))
	flows, at, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 1 {
		t.Fatalf("read %+v, want only the translated flow", flows)
	}
	f := flows[0]
	if f.Proto != 17 || f.Client != translated.src || f.Dest != translated.dst || f.Endpoint != translated.replySrc ||
		!f.Open() || f.Timeout <= 0 || f.Timeout > 120*time.Second {
		t.Errorf("read %+v, want %v, open, timeout within 120 s", f, translated)
	}
	another := translated
	another.src = netip.MustParseAddrPort("198.18.1.6:4000")
	createDNAT(t, nat, another)
	again, at2, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || at2 != at {
		t.Errorf("a reading within %v read the kernel again: %d flows", FlowsMaxAge, len(again))
	}
}

// TestFlowsMatchTiMo: Flows reads real flows through the lab's DNAT, both
// families, TCP (open and closed) and UDP, with their bytes
// (nf_conntrack_acct) and ages (nf_conntrack_timestamp), as
// ti-mo/conntrack's complete decoder reads the same table, and leaves out
// the flow it routes untranslated; OpenFlows counts those it says are open.
func TestFlowsMatchTiMo(t *testing.T) {
	requireRoot(t)
	for _, a := range []labAddrs{lab4, lab6} {
		t.Run(a.family, func(t *testing.T) {
			l := newLab(t, a)
			inNS(t, l.gw, func() error {
				for _, k := range []string{"nf_conntrack_acct", "nf_conntrack_timestamp"} {
					if err := os.WriteFile("/proc/sys/net/netfilter/"+k, []byte("1"), 0); err != nil {
						return err
					}
				}
				return nil
			})
			f := a.family
			l.nft(t, "table inet flowslab {\n  chain pre { type nat hook prerouting priority dstnat; policy accept;\n"+
				"    "+f+" daddr "+a.vip.String()+" udp dport 53 dnat "+f+" to "+bracket(a.backendA)+":5353\n"+
				"    "+f+" daddr "+a.vipTCP.String()+" tcp dport 80 dnat "+f+" to "+bracket(a.backendA)+":8080\n  }\n}\n")
			t.Cleanup(func() { l.nft(t, "table inet flowslab\ndelete table inet flowslab\n") })
			udpEcho(t, l.backnd, netip.AddrPortFrom(a.backendA, targetPort), "A")
			tcpEcho(t, l.backnd, netip.AddrPortFrom(a.backendA, 8080))

			vip := netip.AddrPortFrom(a.vip, svcPort)
			if got := dialUDP(t, l.client, netip.AddrPortFrom(a.client, clientPort), vip).first(); got != "A" {
				t.Fatalf("UDP via the Service: answer from %q", got)
			}
			direct := netip.AddrPortFrom(a.backendA, targetPort)
			if got := dialUDP(t, l.client, netip.AddrPortFrom(a.client, clientPort+1), direct).first(); got != "A" {
				t.Fatalf("UDP routed: answer from %q", got)
			}
			for i, keep := range []bool{true, false} {
				var c net.Conn
				inNS(t, l.client, func() (err error) {
					d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(a.client, uint16(clientPort+2+i))), Timeout: 5 * time.Second}
					c, err = d.Dial("tcp", netip.AddrPortFrom(a.vipTCP, 80).String())
					return err
				})
				tcpRoundTrip(t, c, "hello")
				if keep {
					t.Cleanup(func() { c.Close() })
				} else {
					c.Close()
				}
			}

			// Once the closed connection's end has passed (TIME_WAIT: no
			// packet changes the table any more), both read it.
			closed := func(fl Flow) bool { return fl.State == "TIME_WAIT" }
			if err := testlab.EventuallyWithin(10*time.Second, func() error {
				for _, k := range l.ctDump(t) {
					if fl, _ := tiMoFlow(&k, time.Now()); closed(fl) {
						return nil
					}
				}
				return fmt.Errorf("the closed connection not in TIME_WAIT yet")
			}); err != nil {
				t.Fatal(err)
			}
			got, at, err := NewFlows(WithNetNS(int(l.gw))).Read()
			if err != nil {
				t.Fatal(err)
			}
			got = slices.Clone(got)
			var want []Flow
			open := 0
			for _, k := range l.ctDump(t) {
				if fl, translated := tiMoFlow(&k, at); translated {
					want = append(want, fl)
					if fl.open {
						open++
					}
				}
			}
			if len(want) != 3 || open != 2 {
				t.Fatalf("ti-mo read %+v: want 3 translated flows, 2 of them open", want)
			}
			byClient := func(x, y Flow) int { return strings.Compare(x.Client.String(), y.Client.String()) }
			slices.SortFunc(got, byClient)
			slices.SortFunc(want, byClient)
			if len(got) != len(want) {
				t.Fatalf("read %+v, want %+v", got, want)
			}
			near := func(x, y time.Duration) bool { return (x - y).Abs() <= time.Second }
			for i := range want {
				g, w := got[i], want[i]
				if g.Proto != w.Proto || g.Client != w.Client || g.Dest != w.Dest || g.Endpoint != w.Endpoint || g.State != w.State ||
					g.open != w.open || g.Bytes != w.Bytes || !near(g.Timeout, w.Timeout) || !near(g.Age, w.Age) {
					t.Errorf("read %+v, ti-mo %+v", g, w)
				}
				if g.Bytes == 0 || g.Age <= 0 {
					t.Errorf("%+v: no bytes or no age (nf_conntrack_acct, nf_conntrack_timestamp are on)", g)
				}
			}
			n, err := OpenFlows([]netip.Addr{a.vip, a.vipTCP}, WithNetNS(int(l.gw)))
			if err != nil || n != open {
				t.Errorf("OpenFlows: %d, %v; want %d", n, err, open)
			}
		})
	}
}

// tiMoFlow is a Flow as read from ti-mo/conntrack's decoding of an entry
// (what Flows did with it), and whether its destination was translated.
func tiMoFlow(k *ct.Flow, at time.Time) (Flow, bool) {
	o, r := &k.TupleOrig, &k.TupleReply
	fl := Flow{
		Proto:    Protocol(o.Proto.Protocol),
		Client:   netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
		Dest:     netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort),
		Endpoint: netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort),
		Timeout:  time.Duration(k.Timeout) * time.Second,
		Bytes:    k.CountersOrig.Bytes + k.CountersReply.Bytes,
	}
	if st := k.Timestamp.Start; !st.IsZero() {
		fl.Age = max(at.Sub(st), 0)
	}
	tcp := k.ProtoInfo.TCP
	fl.open = tcp == nil || tcp.State >= tcpSynSent && tcp.State <= tcpEstablished
	if tcp != nil {
		fl.State = tcpStateName(tcp.State)
	}
	return fl, fl.Dest != fl.Endpoint
}
