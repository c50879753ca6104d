package nft

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// The rule that silences the conntrack events of untranslated connections
// (ruleset.Config.UntranslatedEventsOff), as nftgate renders it into its
// NAT postrouting chain, in a kernel: in a new namespace, a listener on
// conntrack's three event groups with no filter, a TCP connection over
// loopback straight to a server, then one whose destination an output NAT
// rule translates to the same server, then a flush of the table, and a
// last translated connection as a marker (a socket's events come in the
// order the kernel sent them). With the rule the kernel reports nothing
// of the direct connection and everything of the translated one (its
// start, its TCP states, its end); without it, the direct one's too.
func TestCtEventsOffInKernel(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("rule=%t", on), func(t *testing.T) { testCtEventsOff(t, on) })
	}
}

func testCtEventsOff(t *testing.T, on bool) {
	name, fd := testNetNS(t)
	const table = "nftgate-ct-events"
	server := netip.MustParseAddr("127.0.0.1")
	translated := netip.MustParsePrefix("127.0.0.2/31") // 127.0.0.2, then .3 for the marker

	// The rules after the masquerade jump of nftgate's own NAT postrouting
	// chain: what it renders, not a copy.
	var events []ruleset.Rule
	for _, c := range ruleset.Static(&ruleset.Config{Table: "nftgate", UntranslatedEventsOff: on}, ruleset.IPv4).Chains {
		if c.Name == "nat-postrouting" {
			events = c.Rules[1:]
		}
	}
	if on && len(events) != 1 {
		t.Fatalf("nat-postrouting has %d rules after the masquerade jump with UntranslatedEventsOff, want 1", len(events))
	}
	if !on && len(events) != 0 {
		t.Fatalf("nat-postrouting has rules after the masquerade jump without UntranslatedEventsOff: %v", events)
	}

	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	var l net.Listener
	if err := netnstest.Do(h, func() (err error) {
		l, err = net.Listen("tcp4", netip.AddrPortFrom(server, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lab.ServeConns(l, func(c net.Conn) { fmt.Fprintln(c, "hello") })
	port := uint16(l.Addr().(*net.TCPAddr).Port)

	chains := []*ruleset.Chain{
		{Name: "nat-output", Hook: &ruleset.Hook{Type: "nat", Hook: "output", Priority: ruleset.PrioDstNAT},
			Rules: []ruleset.Rule{{ruleset.MatchAddr{Dir: ruleset.Dst, Prefix: translated},
				ruleset.DNAT{Proto: model.TCP, To: netip.AddrPortFrom(server, port)}}}},
		{Name: "nat-postrouting", Hook: &ruleset.Hook{Type: "nat", Hook: "postrouting", Priority: ruleset.PrioSrcNAT},
			Rules: events},
	}
	programChains(t, fd, table, chains...)
	if on {
		if listed := nftList(t, name, "list", "chain", "ip", table, "nat-postrouting"); !strings.Contains(listed, "ct status ! dnat ct event set 0x0") {
			t.Fatalf("nft lists the chain as:\n%s\nwant the rule \"ct status ! dnat ct event set 0x0\"", listed)
		}
	}

	ev, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	for _, g := range []uint32{ctnetlink.GroupNew, ctnetlink.GroupUpdate, ctnetlink.GroupDestroy} {
		if err := ev.JoinGroup(g); err != nil {
			t.Fatalf("join conntrack event group %d: %v", g, err)
		}
	}

	exchange := func(to netip.Addr) {
		t.Helper()
		if err := netnstest.Do(h, func() error {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(to, port).String(), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || line != "hello\n" {
				return fmt.Errorf("read %q, %v", line, err)
			}
			return nil
		}); err != nil {
			t.Fatalf("connection to %s: %v", to, err)
		}
	}
	exchange(server)            // direct
	exchange(translated.Addr()) // translated: 127.0.0.2
	if out, err := exec.Command("ip", "netns", "exec", name, "conntrack", "-F").CombinedOutput(); err != nil {
		t.Fatalf("conntrack -F: %v: %s", err, out)
	}
	marker := translated.Addr().Next()
	exchange(marker)

	// Events by the original destination: NEW, UPDATE or DESTROY.
	seen := map[netip.Addr]map[string]int{}
	deadline := time.Now().Add(10 * time.Second)
	for seen[marker]["NEW"] == 0 {
		if err := ev.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		msgs, err := ev.Receive()
		if err != nil {
			t.Fatalf("reading conntrack events (so far %v): %v", seen, err)
		}
		for _, m := range msgs {
			kind, dst, err := ctEvent(m)
			if err != nil {
				t.Fatal(err)
			}
			if seen[dst] == nil {
				seen[dst] = map[string]int{}
			}
			seen[dst][kind]++
		}
	}
	t.Logf("events by original destination: %v", seen)
	got := seen[translated.Addr()]
	if got["NEW"] != 1 || got["UPDATE"] == 0 || got["DESTROY"] != 1 {
		t.Errorf("the translated connection's events: %v, want a NEW, UPDATEs and a DESTROY", got)
	}
	direct := seen[server]
	switch {
	case on && len(direct) != 0:
		t.Errorf("the direct connection's events with the rule: %v, want none", direct)
	case !on && (direct["NEW"] != 1 || direct["DESTROY"] != 1):
		t.Errorf("the direct connection's events without the rule: %v, want a NEW and a DESTROY (else the test shows nothing)", direct)
	}
}

// ctEvent decodes a conntrack event's kind and its original tuple's IPv4
// destination.
func ctEvent(m netlink.Message) (kind string, dst netip.Addr, err error) {
	switch {
	case m.Header.Type != netlink.HeaderType(ctnetlink.Subsys<<8|ctnetlink.MsgNew) &&
		m.Header.Type != netlink.HeaderType(ctnetlink.Subsys<<8|ctnetlink.MsgDelete):
		return "", dst, fmt.Errorf("message type %#x is no conntrack event", m.Header.Type)
	case len(m.Data) < ctnetlink.NFGenMsgLen:
		return "", dst, errors.New("short conntrack event")
	}
	kind = "UPDATE"
	if m.Header.Type&0xff == ctnetlink.MsgDelete {
		kind = "DESTROY"
	} else if m.Header.Flags&(netlink.Create|netlink.Excl) != 0 {
		kind = "NEW"
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[ctnetlink.NFGenMsgLen:])
	if err != nil {
		return "", dst, err
	}
	const ipV4Dst = 2 // CTA_IP_V4_DST
	for ad.Next() {
		if ad.Type() != ctnetlink.TupleOrig {
			continue
		}
		ad.Nested(func(tuple *netlink.AttributeDecoder) error {
			for tuple.Next() {
				if tuple.Type() != ctnetlink.TupleIP {
					continue
				}
				tuple.Nested(func(ip *netlink.AttributeDecoder) error {
					for ip.Next() {
						if ip.Type() == ipV4Dst {
							dst, _ = netip.AddrFromSlice(ip.Bytes())
						}
					}
					return nil
				})
			}
			return nil
		})
	}
	if err := ad.Err(); err != nil {
		return "", dst, err
	}
	if !dst.IsValid() {
		return "", dst, fmt.Errorf("%s event without an IPv4 original destination", kind)
	}
	return kind, dst, nil
}
