package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/statesync"
)

// The state-sync load's second generator, `nftgate-bench statesync-ctgen`,
// runs in gateway A's namespace and makes A's kernel hold new translated
// flows at the target rate without any handshake: it creates, through
// conntrack netlink, the entry a connection to the Service would have
// (client → Service address, DNAT to an endpoint, masquerade to F), so
// that A's kernel emits the same NEW event and A's sync reads, checks,
// sends and B writes exactly what a real flow costs them. On this small
// machine the TCP generator and the handshakes it causes saturate both
// cores long before 10,000 connections a second; this one does not.
const statesyncCtgenCmd = "statesync-ctgen"

// ctgenTick is how often the generator creates what is due: at 10,000/s,
// 10 entries in one sendmsg.
const ctgenTick = time.Millisecond

// ctgenTimeout is the created entries' timeout: a short connection's
// entry lives as long after its reset (TCP CLOSE, 10 s).
const ctgenTimeout = 10

// tcpEstablished is TCP_CONNTRACK_ESTABLISHED.
const tcpEstablished = 3

// ctgenEntry is the n-th flow (ESTABLISHED, ctgenTimeout): source srcs[n % len(srcs)] and a port that
// counts up per source from firstPort (as the TCP generator's), endpoint
// eps[n % len(eps)] and masquerade port counting up per endpoint: unique
// original and reply tuples for more than 120,000 flows.
func ctgenEntry(n int, svc netip.AddrPort, srcs []netip.Addr, eps []netip.AddrPort, masq netip.Addr) statesync.Entry {
	return ctgenShaped(n, svc, srcs, eps, masq, tcpEstablished, ctgenTimeout)
}

// ctgenShaped is ctgenEntry in TCP state state with timeout seconds left.
func ctgenShaped(n int, svc netip.AddrPort, srcs []netip.Addr, eps []netip.AddrPort, masq netip.Addr, state uint8, timeout uint32) statesync.Entry {
	const ports = 65536 - firstPort
	src := netip.AddrPortFrom(srcs[n%len(srcs)], uint16(firstPort+n/len(srcs)%ports))
	ep := eps[n%len(eps)]
	return statesync.Entry{
		Proto:   unix.IPPROTO_TCP,
		Orig:    statesync.Tuple{Src: src, Dst: svc},
		Reply:   statesync.Tuple{Src: ep, Dst: netip.AddrPortFrom(masq, uint16(firstPort+n/len(eps)%ports))},
		Status:  statesync.StatusSeenReply | statesync.StatusAssured,
		Timeout: timeout,
		TCP:     statesync.TCPInfo{State: state},
	}
}

// runCtgen creates entries at rate per second for window and returns what it did as ConnStats (an exchange is an
// entry created). A generator that falls behind does not catch up more
// than 100 ms, as the TCP generator's workers do not.
func runCtgen(k *statesync.Conntrack, svc netip.AddrPort, srcs []netip.Addr, eps []netip.AddrPort, masq netip.Addr, rate float64, window time.Duration) ConnStats {
	return runCtgenShaped(k, svc, srcs, eps, masq, rate, window, tcpEstablished, ctgenTimeout)
}

// runCtgenShaped is runCtgen with entries in TCP state state with
// timeout seconds left.
func runCtgenShaped(k *statesync.Conntrack, svc netip.AddrPort, srcs []netip.Addr, eps []netip.AddrPort, masq netip.Addr, rate float64, window time.Duration, state uint8, timeout uint32) ConnStats {
	var st ConnStats
	var failed int
	start := time.Now()
	end := start.Add(window)
	n, done := 0, 0.0
	batch := make([]statesync.Entry, 0, 256)
	tick := time.NewTicker(ctgenTick)
	defer tick.Stop()
	for now := start; now.Before(end); now = time.Now() {
		target := rate * now.Sub(start).Seconds()
		done = max(done, target-rate/10)
		due := min(int(target-done), 4096)
		batch = batch[:0]
		for range due {
			batch = append(batch, ctgenShaped(n, svc, srcs, eps, masq, state, timeout))
			n++
		}
		done += float64(due)
		for _, err := range k.CreateOrigins(batch) {
			if err != nil {
				failed++
				st.LastError = time.Now().UTC().Format("15:04:05.000") + " " + err.Error()
			}
		}
		st.Exchanges += len(batch)
		<-tick.C // pacing, not waiting for readiness
	}
	st.Failed = failed
	st.Completed = st.Exchanges - failed
	st.PerSecond = float64(st.Completed) / window.Seconds()
	return st
}

// statesyncCtgenMain is the netlink generator process; -dst is the
// Service, -src the clients.
func statesyncCtgenMain(args []string) int {
	return clientMain(statesyncCtgenCmd, args, func(fs *flag.FlagSet) clientRun {
		rate := fs.Float64("rate", 1000, "new entries per second")
		epList := fs.String("endpoints", "", "comma-separated endpoint address:port pairs (the DNAT's)")
		masqAddr := fs.String("masquerade", "", "the masquerade address (the SNAT's)")
		return func(to netip.AddrPort, srcs []netip.Addr, window time.Duration) (ConnStats, error) {
			var eps []netip.AddrPort
			for _, s := range strings.Split(*epList, ",") {
				ep, err := netip.ParseAddrPort(strings.TrimSpace(s))
				if err != nil {
					return ConnStats{}, fmt.Errorf("-endpoints: %w", err)
				}
				eps = append(eps, ep)
			}
			masq, err := netip.ParseAddr(*masqAddr)
			if err != nil {
				return ConnStats{}, fmt.Errorf("-masquerade: %w", err)
			}
			// The reply tuples (the masquerade address and a port per
			// endpoint) last for 129,024 entries of 10 s.
			if window <= 0 || *rate <= 0 || *rate > 12000 {
				return ConnStats{}, fmt.Errorf("-duration %v, -rate %v: want more than 0, and a rate up to 12,000", window, *rate)
			}
			k, err := statesync.NewConntrack(statesync.ConntrackOptions{})
			if err != nil {
				return ConnStats{}, err
			}
			st := runCtgen(k, to, srcs, eps, masq, *rate, window)
			return st, errors.Join(k.Close())
		}
	})
}
