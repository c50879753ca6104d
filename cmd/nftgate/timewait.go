package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// The endpoints' TIME_WAIT of masqueraded connections (README "Masquerade
// and the client's address", ruleset/release.go).
const (
	// defaultConntrackTCPTimeWait is how long conntrack keeps a closed
	// TCP connection when the gateway releases the endpoints' TIME_WAIT:
	// long enough for the last packets of the close to pass (a FIN sent
	// again when the last ACK was lost), short enough that the
	// masquerade address's ports come free at the rate they are used
	// (64,000 ports / 2 s per endpoint; the kernel's 120 s would keep
	// them for two minutes after the endpoint let go).
	defaultConntrackTCPTimeWait = 2 * time.Second
	maxConntrackTCPTimeWait     = 120 * time.Second
)

// conntrackTimeWaitSysctl is the namespace's conntrack TIME_WAIT timeout.
const conntrackTimeWaitSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait"

// timeWaitChecks are the kernel checks of release_time_wait and
// answer_refused_syns (nft.CheckReleaseTimeWait, CheckAnswerRefusedSYNs).
type timeWaitChecks struct{ release, answer func() error }

// setupReleaseTimeWait turns the release and the answer to refused SYNs
// off where the kernel lacks what they need (and says so), and otherwise
// sets conntrack's TIME_WAIT timeout as configured. It runs after the
// kernel check, which loads conntrack.
func setupReleaseTimeWait(cfg *Config, log *slog.Logger, check timeWaitChecks, sysctl string) error {
	if cfg.ReleaseTimeWait {
		if err := check.release(); err != nil {
			cfg.ReleaseTimeWait = false
			log.Warn("release_time_wait is off: this kernel cannot reset the endpoints' TIME_WAIT once both ends closed; many clients masqueraded to one address are limited to about 1,000 new connections per second per endpoint (README \"Masquerade and the client's address\")", "err", err)
		}
	}
	if cfg.AnswerRefusedSYNs {
		if err := check.answer(); err != nil {
			cfg.AnswerRefusedSYNs = false
			log.Warn("answer_refused_syns is off: this kernel cannot answer an endpoint's refusal of a SYN; a refused client waits for its own retransmission, 1 s or more", "err", err)
		}
	}
	if !cfg.ReleaseTimeWait && !cfg.AnswerRefusedSYNs {
		return nil
	}
	if cfg.ConntrackTCPTimeWait == 0 {
		return nil
	}
	want := int(time.Duration(cfg.ConntrackTCPTimeWait) / time.Second)
	old, changed, err := setSysctl(sysctl, strconv.Itoa(want))
	if err != nil {
		return fmt.Errorf("conntrack_tcp_time_wait = %q: %w", cfg.ConntrackTCPTimeWait, err)
	}
	if changed {
		log.Info("conntrack's TIME_WAIT timeout set", "sysctl", sysctl, "from", old+"s", "to", cfg.ConntrackTCPTimeWait.String())
	}
	return nil
}

// setSysctl writes value to the sysctl at path unless it holds it
// already, and tells what it held and whether it changed it.
func setSysctl(path, value string) (old string, changed bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false, err
	}
	old = strings.TrimSpace(string(b))
	if old == value {
		return old, false, nil
	}
	if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
		return old, false, fmt.Errorf("set %s: %w", path, err)
	}
	return old, true, nil
}
