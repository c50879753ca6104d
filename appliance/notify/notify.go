// Package notify tells systemd about nftgate's state through sd_notify:
// READY=1 once the first complete sync is programmed, STATUS= lines, and
// WATCHDOG=1 keep-alives at half of WATCHDOG_USEC.
//
// Without NOTIFY_SOCKET (gokrazy, a shell, a test) every call is a no-op that
// returns nil, so callers need no special case.
package notify

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends sd_notify messages. It is safe for concurrent use.
type Notifier struct {
	log      *slog.Logger
	interval time.Duration // watchdog ping interval; 0 when no watchdog

	mu         sync.Mutex
	ready      bool
	lastStatus string
}

// New reads the watchdog settings systemd passed in the environment
// (WATCHDOG_USEC, WATCHDOG_PID). A malformed WATCHDOG_USEC is an error; a
// watchdog meant for another process is ignored. log may be nil.
func New(log *slog.Logger) (*Notifier, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return nil, fmt.Errorf("systemd watchdog: %w", err)
	}
	return &Notifier{log: log, interval: wd / 2}, nil
}

// WatchdogInterval is how often Watchdog pings: half of WATCHDOG_USEC, or 0
// when systemd set no watchdog for this process.
func (n *Notifier) WatchdogInterval() time.Duration { return n.interval }

func (n *Notifier) send(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %q: %w", strings.SplitN(state, "=", 2)[0], err)
	}
	return nil
}

// Ready sends READY=1 with a status line. Only the first call sends; call it
// after the first complete sync.
func (n *Notifier) Ready(status string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ready {
		return nil
	}
	msg := "READY=1"
	if status != "" {
		msg += "\nSTATUS=" + oneLine(status)
	}
	if err := n.send(msg); err != nil {
		return err
	}
	n.ready, n.lastStatus = true, oneLine(status)
	return nil
}

// Status sends STATUS=status when it differs from the last one sent, so a
// caller may call it after every sync without flooding the manager.
func (n *Notifier) Status(status string) error {
	status = oneLine(status)
	n.mu.Lock()
	defer n.mu.Unlock()
	if status == n.lastStatus {
		return nil
	}
	if err := n.send("STATUS=" + status); err != nil {
		return err
	}
	n.lastStatus = status
	return nil
}

// Stopping sends STOPPING=1, for a clean shutdown.
func (n *Notifier) Stopping() error { return n.send("STOPPING=1") }

// Watchdog pings WATCHDOG=1 every WatchdogInterval until ctx ends. Before
// each ping it calls alive (when non-nil); an error skips that ping and is
// logged, so a hung sync loop lets systemd's watchdog restart the process.
// It returns at once when systemd set no watchdog.
func (n *Notifier) Watchdog(ctx context.Context, alive func() error) {
	if n.interval <= 0 {
		return
	}
	t := time.NewTicker(n.interval)
	defer t.Stop()
	for {
		n.ping(alive)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Notifier) ping(alive func() error) {
	if alive != nil {
		if err := alive(); err != nil {
			n.log.Warn("skipping systemd watchdog ping", "err", err)
			return
		}
	}
	if err := n.send("WATCHDOG=1"); err != nil {
		n.log.Warn("systemd watchdog ping failed", "err", err)
	}
}

// oneLine keeps a status to one line: sd_notify messages are newline
// separated assignments.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
