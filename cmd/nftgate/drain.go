package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/announce"
	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/conntrack"
)

// DefaultDrainPeriod is drain_period's default: long enough for most
// requests to finish, well within the 100 s gokrazy waits after SIGTERM
// before it kills a service for an update.
const DefaultDrainPeriod = 30 * time.Second

// maxDrainPeriod bounds drain_period.
const maxDrainPeriod = 10 * time.Minute

// drainPoll is how often a drain counts the open flows.
const drainPoll = 250 * time.Millisecond

// drainer takes the gateway out of service: it withdraws the Services'
// addresses from every announcer (announce.Coordinator.Withdraw), keeps
// everything else running (the rules, the syncs, the masquerade addresses'
// announcement) while flows to the withdrawn addresses are open, and is
// done when none is left or the period is over.
type drainer struct {
	coord  *announce.Coordinator
	period time.Duration
	// count counts the open flows to addrs (conntrack.OpenFlows).
	count func(addrs []netip.Addr) (int, error)
	// leave, when set, hands every floating address to the other
	// gateways of the set (active-backup: gateways.Set.Leave); moved,
	// when set, tells whether the open flows to addrs have moved to a
	// gateway that holds their state (edge.flowsMoved), which ends the
	// drain as no open flow does.
	leave func()
	moved func(addrs []netip.Addr) bool
	log   *slog.Logger

	mu      sync.Mutex
	st      appliance.DrainState
	started chan struct{} // closed by the first StartDrain
	done    chan struct{} // closed when drained
}

func newDrainer(coord *announce.Coordinator, period time.Duration, log *slog.Logger) *drainer {
	return &drainer{coord: coord, period: period, log: log,
		count:   func(addrs []netip.Addr) (int, error) { return conntrack.OpenFlows(addrs) },
		st:      appliance.DrainState{State: appliance.DrainServing},
		started: make(chan struct{}), done: make(chan struct{})}
}

// StartDrain implements appliance.Drainer.
func (d *drainer) StartDrain(reason string) appliance.DrainState {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st.State != appliance.DrainServing {
		return d.st
	}
	if d.leave != nil {
		d.leave()
	}
	now := time.Now()
	d.st = appliance.DrainState{State: appliance.DrainDraining, Reason: reason, Since: now, Deadline: now.Add(d.period),
		Withdrawn: d.coord.Withdraw()}
	d.log.Info("draining: the announcements are withdrawn; open flows are forwarded until they end",
		"reason", reason, "withdrawn", len(d.st.Withdrawn), "period", d.period)
	close(d.started)
	return d.st
}

// DrainState implements appliance.Drainer.
func (d *drainer) DrainState() appliance.DrainState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.st
}

// Done is closed when a drain is over.
func (d *drainer) Done() <-chan struct{} { return d.done }

// run waits for a drain to start, then counts the open flows until none
// is left or the period is over, and closes Done. It returns when ctx
// ends.
func (d *drainer) run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-d.started:
	}
	st := d.DrainState()
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	movedPolls := 0
	for {
		n, err := d.count(st.Withdrawn)
		if err != nil {
			d.log.Error("draining: counting the open flows failed; waiting for the period to end", "err", err)
			n = -1
		}
		// Moved twice in a row: the last updates of the flows had one poll
		// to reach the sync.
		if d.moved != nil && n != 0 && d.moved(st.Withdrawn) {
			movedPolls++
		} else {
			movedPolls = 0
		}
		d.mu.Lock()
		if n >= 0 {
			d.st.OpenFlows = n
		}
		over := n == 0 || movedPolls >= 2 || !time.Now().Before(d.st.Deadline)
		if over {
			d.st.State = appliance.DrainDrained
			d.log.Info("drained", "open_flows", d.st.OpenFlows, "moved_to_peers", movedPolls >= 2, "took", time.Since(d.st.Since).Round(time.Millisecond))
		}
		d.mu.Unlock()
		if over {
			close(d.done)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drainOnStop drains after SIGTERM (drain_on_stop) and waits until the
// drain is over, serve fails, or a second SIGTERM or SIGINT cuts it short.
func drainOnStop(d *drainer, errc <-chan error) error {
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(again)
	d.StartDrain("SIGTERM")
	select {
	case <-d.Done():
	case <-again:
		d.log.Warn("drain cut short by a second signal")
	case err := <-errc:
		return err
	}
	return nil
}

// drainCommand is `nftgate drain`: it asks the running nftgate, through its
// HTTP API, to drain (POST /api/v1/drain), and follows the drain until
// that nftgate has exited or reports drained. The address, user, password
// and TLS come from the same config.toml (listen, auth_user,
// auth_password_file, tls_cert_file); --url points it at another box.
func drainCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("nftgate drain", flag.ContinueOnError)
	configPath := fs.String("config", "", "the running nftgate's configuration `file` (listen, auth_user, auth_password_file, tls_cert_file)")
	url := fs.String("url", "", "`URL` of the nftgate to drain (default: from listen in the configuration)")
	insecure := fs.Bool("insecure", false, "accept any TLS certificate (a self-signed one on this box)")
	wait := fs.Bool("wait", true, "follow the drain until that nftgate has exited")
	timeout := fs.Duration("timeout", maxDrainPeriod+time.Minute, "give up following after this `long`")
	if err := fs.Parse(args); err != nil {
		return flagError{err}
	}
	var cargs []string
	if *configPath != "" {
		cargs = []string{"--config", *configPath}
	}
	cfg, _, err := loadConfig("nftgate drain", cargs)
	if err != nil {
		return err
	}
	base := *url
	tlsOn := cfg.TLSCertFile != "" || cfg.TLSSelfSignedDir != ""
	if base == "" {
		if base, err = localURL(cfg.Listen, tlsOn); err != nil {
			return err
		}
	}
	tc := &tls.Config{InsecureSkipVerify: *insecure} //nolint:gosec // asked for on the command line
	if cfg.TLSCertFile != "" && !*insecure {
		pem, err := os.ReadFile(cfg.TLSCertFile)
		if err != nil {
			return fmt.Errorf("tls_cert_file: %w", err)
		}
		pool, _ := x509.SystemCertPool()
		if pool == nil {
			pool = x509.NewCertPool()
		}
		pool.AppendCertsFromPEM(pem)
		tc.RootCAs = pool
	}
	var password string
	if cfg.AuthPasswordFile != "" {
		b, err := os.ReadFile(cfg.AuthPasswordFile)
		if err != nil {
			return fmt.Errorf("auth_password_file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	do := func(method string) (appliance.DrainState, error) {
		var st appliance.DrainState
		var body io.Reader
		if method == http.MethodPost {
			body = bytes.NewReader([]byte("{}"))
		}
		req, err := http.NewRequest(method, strings.TrimSuffix(base, "/")+"/api/v1/drain", body)
		if err != nil {
			return st, err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if cfg.AuthUser != "" {
			req.SetBasicAuth(cfg.AuthUser, password)
		}
		resp, err := client.Do(req)
		if err != nil {
			return st, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode/100 != 2 {
			return st, fmt.Errorf("%s %s: %s: %s", method, req.URL, resp.Status, strings.TrimSpace(string(b)))
		}
		return st, json.Unmarshal(b, &st)
	}
	st, err := do(http.MethodPost)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	report := func(st appliance.DrainState) {
		fmt.Fprintf(stdout, "%s: %d addresses withdrawn, %d open flows, until %s\n", st.State, len(st.Withdrawn), st.OpenFlows, st.Deadline.Format(time.RFC3339))
	}
	report(st)
	if !*wait {
		return nil
	}
	deadline := time.Now().Add(*timeout)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		next, err := do(http.MethodGet)
		var ne net.Error
		if errors.As(err, &ne) || err != nil && strings.Contains(err.Error(), "connection refused") {
			// The drained nftgate has exited.
			fmt.Fprintln(stdout, "drained: nftgate has exited")
			return nil
		}
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		if next.State != st.State || next.OpenFlows != st.OpenFlows {
			report(next)
		}
		st = next
	}
	return fmt.Errorf("drain: still %s after %s", st.State, *timeout)
}

// localURL is the status server's URL on this machine, from listen.
func localURL(listen string, tlsOn bool) (string, error) {
	if listen == "" {
		return "", errors.New("listen is empty: the running nftgate serves no HTTP API to drain it through (give --url)")
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen %q: %w", listen, err)
	}
	if a, err := netip.ParseAddr(host); host == "" || err == nil && a.IsUnspecified() {
		host = "127.0.0.1"
		if err == nil && a.Is6() {
			host = "::1"
		}
	}
	scheme := "http"
	if tlsOn {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}
