package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// The state-sync load's generator runs as a process of its own in the
// client namespace (`nftgate-bench statesync-client`), as the data-plane
// connection test's client does, so that its cost shows apart from the
// bench's listeners.
const statesyncClientCmd = "statesync-client"

// firstPort is the generator's first source port.
const firstPort = 1024

// shortRequest is what the generator sends; the endpoints echo it.
var shortRequest = []byte("nftgate-bench statesync\n")

// runPacedClients opens short connections to dst at rate per second in
// total (0: as fast as the workers go), from workers goroutines, until the
// window ends. Connection n goes from srcs[n % len(srcs)] and a port that
// counts up from 1024 per source: no tuple is used twice before 64,512
// connections per source, so every connection is a new conntrack entry
// (the kernel's own choice reuses a port a reset freed at once, and a SYN
// on an entry in CLOSE reopens it). Each worker keeps
// its own schedule; a worker that falls behind goes on at once without
// catching up more than 100 ms, so the achieved rate is what the machine
// did. One connection: connect, write a line, read its echo, close with
// SO_LINGER 0 (a reset: no TIME_WAIT on either side, the gateway's entry
// goes to CLOSE).
func runPacedClients(ctx context.Context, dst netip.AddrPort, srcs []netip.Addr, rate float64, workers int, window time.Duration) ConnStats {
	ws := make([]connWorker, workers)
	start := time.Now()
	end := start.Add(window)
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(workers) / rate * float64(time.Second))
	}
	var wg sync.WaitGroup
	var conns atomic.Uint64
	for i := range ws {
		wg.Add(1)
		go func(w *connWorker) {
			defer wg.Done()
			next := start.Add(interval * time.Duration(i) / time.Duration(workers))
			for ctx.Err() == nil {
				if interval > 0 {
					if wait := time.Until(next); wait > 0 {
						time.Sleep(wait) // pacing, not waiting for readiness
					}
					if next = next.Add(interval); time.Until(next) < -100*time.Millisecond {
						next = time.Now()
					}
				}
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				n := conns.Add(1) - 1
				src := netip.AddrPortFrom(srcs[n%uint64(len(srcs))], uint16(firstPort+n/uint64(len(srcs))%(65536-firstPort)))
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(src)}
				err := shortExchange(ctx, &d, dst, t0.Add(exchangeTimeout))
				w.record(t0, time.Now(), end, err)
			}
		}(&ws[i])
	}
	wg.Wait()
	return summarizeWorkers(ws, window)
}

// shortExchange is one short connection (see runPacedClients).
func shortExchange(ctx context.Context, d *net.Dialer, dst netip.AddrPort, deadline time.Time) error {
	tc, err := dialBy(ctx, d, dst, deadline)
	if err != nil {
		return err
	}
	defer func() {
		_ = tc.SetLinger(0)
		tc.Close()
	}()
	if _, err := tc.Write(shortRequest); err != nil {
		return fmt.Errorf("writing the request: %w", err)
	}
	got := make([]byte, len(shortRequest))
	if _, err := io.ReadFull(tc, got); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if string(got) != string(shortRequest) {
		return fmt.Errorf("unexpected echo %q", got)
	}
	return nil
}

// statesyncClientMain is the generator process: it runs once and writes
// its ConnStats as JSON on stdout.
func statesyncClientMain(args []string) int {
	return clientMain(statesyncClientCmd, args, func(fs *flag.FlagSet) clientRun {
		rate := fs.Float64("rate", 1000, "new connections per second in total; 0: as fast as the workers go")
		workers := fs.Int("workers", 256, "generator goroutines")
		return func(to netip.AddrPort, srcs []netip.Addr, window time.Duration) (ConnStats, error) {
			if *workers < 1 || window <= 0 || *rate < 0 {
				return ConnStats{}, fmt.Errorf("-workers %d, -duration %v, -rate %v: want at least 1, more than 0, not negative", *workers, window, *rate)
			}
			return runPacedClients(context.Background(), to, srcs, *rate, *workers, window), nil
		}
	})
}
