package failover

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// NewConns opens a new TCP connection to dst every interval beside the
// long-lived flows; each exchanges one line with the echo server within
// the timeout and closes, or fails. It measures what a failure costs
// clients that connect during it, where the flows measure what it costs
// those already connected.
type NewConns struct {
	interval, timeout time.Duration
	ctx               context.Context
	cancel            context.CancelFunc
	wg                sync.WaitGroup
	mu                sync.Mutex
	attempts          []attempt
	failed            time.Time
	stopped           time.Time
}

// attempt is one new connection: when it started and ended, and why it
// failed ("" when it echoed).
type attempt struct {
	start, end time.Time
	err        string
}

// StartNewConns opens a connection from client to dst every interval
// (10 ms when zero), each failing when its line has not come back within
// timeout (1 s when zero), until Stop.
func StartNewConns(client *lab.Host, dst netip.AddrPort, interval, timeout time.Duration) *NewConns {
	if interval == 0 {
		interval = 10 * time.Millisecond
	}
	if timeout == 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &NewConns{interval: interval, timeout: timeout, ctx: ctx, cancel: cancel}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := 1; ; seq++ {
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				n.record(n.once(client, dst, seq))
			}()
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return n
}

// once is one attempt: connect, a line out and back, close.
func (n *NewConns) once(client *lab.Host, dst netip.AddrPort, seq int) attempt {
	a := attempt{start: time.Now()}
	ctx, cancel := context.WithDeadline(n.ctx, a.start.Add(n.timeout))
	defer cancel()
	c, err := client.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		a.err = classify(err)
		a.end = time.Now()
		return a
	}
	defer c.Close()
	_ = c.SetDeadline(a.start.Add(n.timeout))
	line := fmt.Sprintf("new connection %d\n", seq)
	if _, err := io.WriteString(c, line); err != nil {
		a.err = classify(err)
	} else if got, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		a.err = classify(err)
	} else if got != line {
		a.err = "wrong bytes"
	}
	a.end = time.Now()
	return a
}

func (n *NewConns) record(a attempt) {
	// An attempt cut short by Stop says nothing.
	if n.ctx.Err() != nil {
		return
	}
	n.mu.Lock()
	n.attempts = append(n.attempts, a)
	n.mu.Unlock()
}

// Succeeded waits until at least k attempts have echoed. Those that
// failed before the failure are counted apart (FailedBefore).
func (n *NewConns) Succeeded(k int, timeout time.Duration) error {
	return lab.EventuallyWithin(timeout, func() error {
		n.mu.Lock()
		defer n.mu.Unlock()
		ok := 0
		for _, a := range n.attempts {
			if a.err == "" {
				ok++
			}
		}
		if ok < k {
			return fmt.Errorf("%d new connections echoed, waiting for %d", ok, k)
		}
		return nil
	})
}

// Failed records the moment the failure was injected.
func (n *NewConns) Failed(at time.Time) {
	n.mu.Lock()
	n.failed = at
	n.mu.Unlock()
}

// Stop ends the attempts and returns the result.
func (n *NewConns) Stop() NewConnStats {
	n.mu.Lock()
	n.stopped = time.Now()
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	return n.Result()
}

// Result is the outcome so far.
func (n *NewConns) Result() NewConnStats {
	n.mu.Lock()
	as, failed, end := slices.Clone(n.attempts), n.failed, n.stopped
	n.mu.Unlock()
	if end.IsZero() {
		end = time.Now()
	}
	return newConnStats(as, failed, end, n.interval, n.timeout)
}

// newConnStats sums up the attempts: those that ended after the failure
// count (one started just before it may fail by it), in the order they
// started. The failure window runs from the start of the first that
// failed to the start of the first that echoed after the last that failed
// (or the end): behind ECMP only the share hashed to the dead gateway
// fails, so failures and successes alternate within it.
func newConnStats(as []attempt, failed, end time.Time, interval, timeout time.Duration) NewConnStats {
	s := NewConnStats{IntervalMs: ms(interval), TimeoutMs: ms(timeout), Reasons: map[string]int{}}
	slices.SortFunc(as, func(a, b attempt) int { return a.start.Compare(b.start) })
	var first, open time.Time // the first failed attempt's start; set while no attempt echoed since the last failed one
	for _, a := range as {
		if !failed.IsZero() && a.end.Before(failed) {
			if a.err != "" {
				s.FailedBefore++
			}
			continue
		}
		s.Attempts++
		if a.err == "" {
			s.SlowestMs = max(s.SlowestMs, ms(a.end.Sub(a.start)))
			if !open.IsZero() {
				s.GapMs = ms(a.start.Sub(first))
				open = time.Time{}
			}
			continue
		}
		s.Failed++
		s.Reasons[a.err]++
		if !failed.IsZero() {
			s.LastFailedMs = max(s.LastFailedMs, ms(a.start.Sub(failed)))
		}
		if first.IsZero() {
			first = a.start
		}
		open = a.start
	}
	if !open.IsZero() {
		s.GapMs = ms(end.Sub(first))
	}
	return s
}

// NewConnStats are the new connections' outcome after the failure.
type NewConnStats struct {
	IntervalMs float64 `json:"interval_ms"`
	TimeoutMs  float64 `json:"timeout_ms"`
	// Attempts that ended after the failure, and how many of them failed
	// (no echo within the timeout, refused, reset), and why.
	Attempts int            `json:"attempts"`
	Failed   int            `json:"failed"`
	Reasons  map[string]int `json:"failed_reasons,omitempty"`
	// FailedBefore: attempts that failed before the failure (none, in a
	// sound run).
	FailedBefore int `json:"failed_before,omitempty"`
	// GapMs is the failure window: from the start of the first failed
	// attempt to the start of the first that echoed after the last
	// failed one.
	GapMs float64 `json:"gap_ms"`
	// LastFailedMs: the last failed attempt started this long after the
	// failure.
	LastFailedMs float64 `json:"last_failed_ms"`
	// SlowestMs is the longest exchange of an attempt that echoed.
	SlowestMs float64 `json:"slowest_ms"`
}

func (s NewConnStats) String() string {
	out := fmt.Sprintf("new connections (every %.0f ms, %.0f ms timeout): %d of %d failed", s.IntervalMs, s.TimeoutMs, s.Failed, s.Attempts)
	if s.Failed > 0 {
		out += fmt.Sprintf(" %v within a window of %.0f ms, the last started %.0f ms after the failure", s.Reasons, s.GapMs, s.LastFailedMs)
	}
	return out + fmt.Sprintf(", slowest that echoed %.0f ms", s.SlowestMs)
}
