package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// The connection test's client runs as a process of its own in the client
// namespace (`nftgate-bench dataplane-client`, started through `ip netns
// exec`): its sockets must be created there, and a process of its own lets
// the Go scheduler run the workers on every core without threads locked to
// a namespace.
const dataplaneClientCmd = "dataplane-client"

const (
	// stallThreshold: an exchange that took this long waited for a
	// retransmitted SYN (the first retransmission is after 1 s), or worse.
	stallThreshold = time.Second
	// exchangeTimeout bounds one exchange; past it the attempt counts as
	// failed (and as stalled). Long enough for two SYN retransmissions.
	exchangeTimeout = 5 * time.Second
)

// ConnStats is what one run of the connection test measured.
type ConnStats struct {
	// Completed exchanges that ended within the run's window, and their
	// rate over it.
	Completed int     `json:"completed"`
	PerSecond float64 `json:"per_second"`
	// Exchanges: every exchange that ended, in the window or after it
	// (those in flight at its end are waited for).
	Exchanges int `json:"exchanges"`
	// Stalled: exchanges that took at least 1 s, or failed. Failed is
	// the part that failed (refused, reset, timed out).
	Stalled int `json:"stalled"`
	Failed  int `json:"failed"`
	// Durations of the exchanges that succeeded, from connect() until the
	// client saw the server's close, in microseconds.
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	MaxUs float64 `json:"max_us"`
	// LastError is the last failure's error, if any.
	LastError string `json:"last_error,omitempty"`
}

// summarizeExchanges turns the durations of the exchanges that succeeded
// (µs), the number that failed and the number completed within window into
// a ConnStats. An exchange is stalled when it took stallThreshold or more,
// or failed.
func summarizeExchanges(us []float64, failed, inWindow int, window time.Duration, lastErr string) ConnStats {
	s := ConnStats{Completed: inWindow, Exchanges: len(us) + failed, Failed: failed, Stalled: failed, LastError: lastErr,
		P50us: percentile(us, 50), P99us: percentile(us, 99), MaxUs: percentile(us, 100)}
	limit := float64(stallThreshold / time.Microsecond)
	for _, d := range us {
		if d >= limit {
			s.Stalled++
		}
	}
	if window > 0 {
		s.PerSecond = float64(inWindow) / window.Seconds()
	}
	return s
}

// connWorker is one parallel client's record.
type connWorker struct {
	us       []float64
	failed   int
	inWindow int
	lastErr  string
}

// record counts one exchange that started at t0 and ended at t1 with err;
// it is in the window when it ended by end.
func (w *connWorker) record(t0, t1, end time.Time, err error) {
	if err != nil {
		w.failed++
		w.lastErr = t1.UTC().Format("15:04:05.000") + " " + err.Error()
		return
	}
	w.us = append(w.us, float64(t1.Sub(t0))/float64(time.Microsecond))
	if !t1.After(end) {
		w.inWindow++
	}
}

// summarizeWorkers merges the workers' records of a run of window into a
// ConnStats.
func summarizeWorkers(ws []connWorker, window time.Duration) ConnStats {
	var all []float64
	failed, inWindow, lastErr := 0, 0, ""
	for _, w := range ws {
		all = append(all, w.us...)
		failed += w.failed
		inWindow += w.inWindow
		lastErr = max(lastErr, w.lastErr)
	}
	return summarizeExchanges(all, failed, inWindow, window, lastErr)
}

// runConnClients opens connections to dst from parallel workers, worker i
// bound to srcs[i % len(srcs)], until the window ends: connect, read the
// one line the server writes, read its close, close. Workers start no new
// exchange after the window; the ones in flight are waited for.
func runConnClients(ctx context.Context, dst netip.AddrPort, srcs []netip.Addr, parallel int, window time.Duration) ConnStats {
	workers := make([]connWorker, parallel)
	start := time.Now()
	end := start.Add(window)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func(w *connWorker, src netip.Addr) {
			defer wg.Done()
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Control: bindNoPort}
			for ctx.Err() == nil && time.Now().Before(end) {
				t0 := time.Now()
				err := oneExchange(ctx, &d, dst, t0.Add(exchangeTimeout))
				w.record(t0, time.Now(), end, err)
			}
		}(&workers[i], srcs[i%len(srcs)])
	}
	wg.Wait()
	return summarizeWorkers(workers, window)
}

// oneExchange is one connection: the server writes a line and closes
// first, the client reads the line and the close, then closes too. The
// server closing first is what an HTTP/1.0 server or one that ends a
// connection without keep-alive does, and it leaves the TIME_WAIT socket on
// the backend, keyed by the address the backend sees: the client's own, or
// the gateway's when it masquerades. The client's side ends in LAST_ACK,
// not TIME_WAIT, so its own ports are never the limit.
func oneExchange(ctx context.Context, d *net.Dialer, dst netip.AddrPort, deadline time.Time) error {
	c, err := dialBy(ctx, d, dst, deadline)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReaderSize(c, 256)
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the server's line: %w", err)
	}
	if !strings.HasPrefix(line, bannerPrefix) {
		return fmt.Errorf("unexpected line %q", line)
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		return fmt.Errorf("waiting for the server's close: read %d bytes, %v", n, err)
	}
	return nil
}

// dialBy connects to dst over TCP by deadline, which then bounds the
// connection's reads and writes too.
func dialBy(ctx context.Context, d *net.Dialer, dst netip.AddrPort, deadline time.Time) (*net.TCPConn, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := d.DialContext(dctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	if err := tc.SetDeadline(deadline); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}

// bindNoPort lets the kernel choose the source port at connect() time, per
// destination, rather than at bind() time among the ports free for every
// destination: a bound source address does not then narrow the ports.
func bindNoPort(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

// dataplaneClientMain is the client process: it runs one connection test
// and writes its ConnStats as JSON on stdout.
func dataplaneClientMain(args []string) int {
	return clientMain(dataplaneClientCmd, args, func(fs *flag.FlagSet) clientRun {
		parallel := fs.Int("parallel", 8, "parallel clients")
		return func(to netip.AddrPort, srcs []netip.Addr, window time.Duration) (ConnStats, error) {
			if *parallel < 1 || window <= 0 {
				return ConnStats{}, fmt.Errorf("-parallel %d, -duration %v: want at least 1 and more than 0", *parallel, window)
			}
			return runConnClients(context.Background(), to, srcs, *parallel, window), nil
		}
	})
}

// clientCommand is this program run as the client process cmd in h's
// namespace, connecting to dst from srcs, with the test's own flags args.
func clientCommand(ctx context.Context, h *lab.Host, cmd string, dst netip.AddrPort, srcs []netip.Addr, args ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	src := make([]string, len(srcs))
	for i, a := range srcs {
		src[i] = a.String()
	}
	return h.Command(ctx, self, append([]string{cmd, "-dst", dst.String(), "-src", strings.Join(src, ",")}, args...)...), nil
}

// clientRun runs a client process's test from srcs to to for window.
type clientRun func(to netip.AddrPort, srcs []netip.Addr, window time.Duration) (ConnStats, error)

// clientMain is a client process named cmd: it parses args, -dst, the
// comma-separated -src, -duration and the test's own flags (those flags
// defines on fs), runs the test and writes its ConnStats as JSON on stdout.
// A bad flag or a failed write is told on stderr, exit status 2.
func clientMain(cmd string, args []string, flags func(fs *flag.FlagSet) clientRun) int {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	dst := fs.String("dst", "", "address:port to connect to")
	srcList := fs.String("src", "", "comma-separated source addresses")
	window := fs.Duration("duration", 10*time.Second, "how long to open connections")
	run := flags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "%s: %v\n", cmd, err)
		return 2
	}
	to, err := netip.ParseAddrPort(*dst)
	if err != nil {
		return fail(fmt.Errorf("-dst: %w", err))
	}
	var srcs []netip.Addr
	for _, s := range strings.Split(*srcList, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return fail(fmt.Errorf("-src: %w", err))
		}
		srcs = append(srcs, a)
	}
	st, err := run(to, srcs, *window)
	if err != nil {
		return fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(st); err != nil {
		return fail(err)
	}
	return 0
}
