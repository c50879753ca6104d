package statesync

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/ctnetlink"
)

// eventsSysctl exists only in kernels built with NF_CONNTRACK_EVENTS.
const eventsSysctl = "/proc/sys/net/netfilter/nf_conntrack_events"

// probeWait bounds how long CheckConntrackKernel waits for the event of
// its probe entry; the kernel sends it before the create is acknowledged,
// so it is there at once or never.
const probeWait = time.Second

// CheckConntrackKernel tells whether the conntrack table of the network
// namespace netns (a file descriptor; 0 the current one) can carry the
// state sync: it writes a short-lived replica of a loopback UDP flow with
// a destination translation and ReplicaMark, and checks that its NEW event
// arrives (NF_CONNTRACK_EVENTS, and the namespace's
// net.netfilter.nf_conntrack_events not 0) and that the entry reads back
// with its mark (NF_CONNTRACK_MARK). The error names what is missing.
func CheckConntrackKernel(netns int) error {
	k, err := NewConntrack(ConntrackOptions{NetNS: netns})
	if err != nil {
		return err
	}
	defer k.Close()
	ev, _, err := dial(netns, 1<<20)
	if err != nil {
		return err
	}
	defer ev.Close()
	if err := ev.JoinGroup(ctnetlink.GroupNew); err != nil {
		return fmt.Errorf("statesync: join conntrack event group: %w (the kernel needs NF_CT_NETLINK)", err)
	}

	port := uint16(20000 + rand.IntN(40000))
	lo := func(last byte) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 254, 0, last}), port)
	}
	probe := Entry{
		Proto: unix.IPPROTO_UDP,
		Orig:  Tuple{Src: lo(1), Dst: lo(2)},
		Reply: Tuple{Src: lo(3), Dst: lo(1)},
		// Small, so that a probe left behind by a crash goes away by itself.
		Timeout: 5,
		Mark:    0x5eed,
	}
	if err := k.Write([]Entry{probe}, nil)[0]; err != nil {
		return fmt.Errorf("statesync: conntrack probe: %w (the kernel needs NF_CT_NETLINK and NF_NAT)", err)
	}
	defer k.Write(nil, []Entry{probe})

	var problems []error
	if !sawProbe(ev, probe) {
		if _, err := os.Stat(eventsSysctl); errors.Is(err, os.ErrNotExist) {
			problems = append(problems, errors.New("the kernel has no conntrack events (CONFIG_NF_CONNTRACK_EVENTS is not set)"))
		} else {
			problems = append(problems, fmt.Errorf("no conntrack event within %v for the probe entry: is net.netfilter.nf_conntrack_events 0 in the namespace? (it must be 1 or 2)", probeWait))
		}
	}
	var mark uint32
	found := false
	if err := k.DumpAll(func(e Entry) {
		if e.Proto == probe.Proto && e.Orig == probe.Orig {
			mark, found = e.Mark, true
		}
	}); err != nil {
		return fmt.Errorf("statesync: conntrack probe: %w", err)
	}
	switch {
	case !found:
		problems = append(problems, errors.New("the probe entry was written but is not in the table"))
	case mark != probe.Mark|ReplicaMark:
		problems = append(problems, fmt.Errorf("the probe entry reads back with ct mark %#x, not %#x (CONFIG_NF_CONNTRACK_MARK is not set)", mark, probe.Mark|ReplicaMark))
	}
	if len(problems) > 0 {
		return fmt.Errorf("statesync: this kernel cannot carry connection-state sync: %w", errors.Join(problems...))
	}
	return nil
}

// sawProbe reads NEW events until the probe's arrives or probeWait ends.
func sawProbe(conn *netlink.Conn, probe Entry) bool {
	if err := conn.SetReadDeadline(time.Now().Add(probeWait)); err != nil {
		return false
	}
	for {
		msgs, err := conn.Receive()
		if err != nil {
			return false
		}
		for _, m := range msgs {
			b, err := m.MarshalBinary()
			if err != nil {
				continue
			}
			if _, e, ok := parseMessage(b); ok && e.Proto == probe.Proto && e.Orig == probe.Orig {
				return true
			}
		}
	}
}

// liberalSysctl is the namespace's switch for TCP window tracking.
const liberalSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"

// LiberalTCP turns off the TCP window checks of conntrack for every entry
// in the current network namespace (nf_conntrack_tcp_be_liberal = 1). In
// active-active mode the two halves of a flow can pass different gateways
// after a failover, also for the flows a gateway originated itself (the
// router moves some of a survivor's flows to another survivor while their
// replies still come to the holder of the masquerade address), and an
// origin entry that sees only one direction would call the other's
// acknowledgements invalid. Replicas carry the per-entry flag already.
func LiberalTCP() error {
	b, err := os.ReadFile(liberalSysctl)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(liberalSysctl, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("set %s = 1: %w", liberalSysctl, err)
	}
	return nil
}
