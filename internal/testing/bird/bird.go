// Package bird runs BIRD 2 (Debian's bird2) as the upstream router of a
// test, in a network namespace of its lab, and reads its routes and
// sessions through birdc: the BGP speaker's tests and the end-to-end tests
// share it.
package bird

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// Router is a BIRD 2 daemon in a namespace of a lab, the upstream router
// of the BGP tests and of the benchmark's edge phase.
type Router struct {
	sock string
	log  string
	cmd  *exec.Cmd
	out  *strings.Builder
	done chan struct{}
}

// Start runs bird with conf in host, and waits until it answers on
// its control socket. The cleanup stops it and shows its log on failure.
func Start(t testing.TB, host *lab.Host, conf string) *Router {
	t.Helper()
	b, err := Launch(host, conf, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		if t.Failed() {
			t.Logf("%s", b.Output(60))
		}
	})
	return b
}

// Launch runs bird with conf in host, its configuration, socket and log
// in dir, and waits until it answers on its control socket. Close stops
// it. Start is the same for tests.
func Launch(host *lab.Host, conf, dir string) (*Router, error) {
	if _, err := exec.LookPath("bird"); err != nil {
		return nil, fmt.Errorf("bird not installed (the Makefile's deps installs bird2): %v", err)
	}
	b := &Router{sock: filepath.Join(dir, "bird.ctl"), log: filepath.Join(dir, "bird.log"),
		out: &strings.Builder{}, done: make(chan struct{})}
	confPath := filepath.Join(dir, "bird.conf")
	conf = fmt.Sprintf("log %q all;\n%s", b.log, conf)
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	b.cmd = host.Command(context.Background(), "bird", "-f", "-c", confPath, "-s", b.sock, "-P", filepath.Join(dir, "bird.pid"))
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start bird: %v", err)
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.done)
	}()
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		_, err := b.Run("show status")
		return err
	}); err != nil {
		b.Close()
		return nil, fmt.Errorf("bird does not answer: %v (output: %s)", err, b.out)
	}
	return b, nil
}

// Close stops bird and waits for it to exit.
func (b *Router) Close() {
	_ = b.cmd.Process.Kill()
	<-b.done
}

// Freeze stops bird with SIGSTOP, as a router starved of CPU: it sends,
// answers and times out nothing until Thaw. Close ends a frozen bird too.
func (b *Router) Freeze() error { return b.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen bird (SIGCONT).
func (b *Router) Thaw() error { return b.cmd.Process.Signal(syscall.SIGCONT) }

// Output is what bird wrote to its standard streams, and the last lines
// of its log.
func (b *Router) Output(lines int) string {
	l, _ := os.ReadFile(b.log)
	return fmt.Sprintf("bird output: %s\nbird log:\n%s", b.out, tail(string(l), lines))
}

// LogPath is bird's log file.
func (b *Router) LogPath() string { return b.log }

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Log is what BIRD logged so far.
func (b *Router) Log() string {
	l, _ := os.ReadFile(b.log)
	return string(l)
}

// Run is one birdc command.
func (b *Router) Run(cmd string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", b.sock}, strings.Fields(cmd)...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("birdc %s: %v: %s", cmd, err, out)
	}
	return string(out), nil
}

// HasRoute tells whether BIRD's table holds prefix (from birdc show route).
func (b *Router) HasRoute(prefix netip.Prefix) (bool, error) {
	out, err := b.Run("show route " + prefix.String())
	if err != nil {
		if strings.Contains(err.Error(), "Network not found") {
			return false, nil
		}
		return false, err
	}
	return listsRoute(out, prefix), nil
}

// listsRoute tells whether the output of show route lists prefix.
func listsRoute(out string, prefix netip.Prefix) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix.String()+" ") {
			return true
		}
	}
	return false
}

// Route is one of BIRD's routes to a prefix, from birdc show route all.
type Route struct {
	// Protocol is the BGP session (or other protocol) it came from.
	Protocol string
	// Attributes are the lines "Name: value" under it, as "BGP.med" →
	// "50", "BGP.as_path" → "64513 64513".
	Attributes map[string]string
}

var routeHead = regexp.MustCompile(`^(?:\S+)?\s+unicast \[(\S+)`)

// Routes lists BIRD's routes to prefix with their attributes (none when
// it has no route).
func (b *Router) Routes(prefix netip.Prefix) ([]Route, error) {
	out, err := b.Run("show route all " + prefix.String())
	if err != nil {
		if strings.Contains(err.Error(), "Network not found") {
			return nil, nil
		}
		return nil, err
	}
	var routes []Route
	for _, line := range strings.Split(out, "\n") {
		if m := routeHead.FindStringSubmatch(line); m != nil {
			routes = append(routes, Route{Protocol: m[1], Attributes: map[string]string{}})
			continue
		}
		if len(routes) == 0 || !strings.HasPrefix(line, "\t") {
			continue
		}
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ": "); ok {
			routes[len(routes)-1].Attributes[k] = v
		}
	}
	return routes, nil
}

// ProtocolState is the state of a BGP protocol from birdc show protocols,
// as in "Established" or "Active".
func (b *Router) ProtocolState(name string) (string, error) {
	out, err := b.Run("show protocols " + name)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		// Name Proto Table State Since Info...
		f := strings.Fields(line)
		if len(f) >= 6 && f[0] == name {
			return f[5], nil
		}
		if len(f) == 5 && f[0] == name {
			return f[3], nil
		}
	}
	return "", fmt.Errorf("no protocol %s in: %s", name, out)
}

var routeCount = regexp.MustCompile(`(\d+) of \d+ routes`)

// RouteCount is how many routes protocol name gave BIRD's tables.
func (b *Router) RouteCount(name string) (int, error) {
	out, err := b.Run("show route protocol " + name + " count")
	if err != nil {
		return 0, err
	}
	return parseRouteCount(out)
}

func parseRouteCount(out string) (int, error) {
	m := routeCount.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no route count in: %s", out)
	}
	return strconv.Atoi(m[1])
}

// WaitRoute waits until BIRD has (want) or lacks (!want) prefix and
// returns how long that took.
func (b *Router) WaitRoute(t testing.TB, prefix netip.Prefix, want bool, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	err := lab.EventuallyWithin(timeout, func() error {
		has, err := b.HasRoute(prefix)
		if err != nil {
			return err
		}
		if has != want {
			return fmt.Errorf("bird has route %s: %v, want %v", prefix, has, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// WaitState waits until BIRD's protocol is (or, with not, leaves) state.
func (b *Router) WaitState(t testing.TB, protocol, state string, not bool, timeout time.Duration) {
	t.Helper()
	err := lab.EventuallyWithin(timeout, func() error {
		got, err := b.ProtocolState(protocol)
		if err != nil {
			return err
		}
		if (got == state) == not {
			return fmt.Errorf("bird protocol %s is %s (want %s%s)", protocol, got, map[bool]string{true: "not "}[not], state)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Upstream is the configuration of an upstream router for a gateway: one
// BGP session per family with the gateway (gw4, gw6, of AS gatewayASN;
// a zero address leaves that family's session out), graceful restart on,
// and the learned routes exported to the kernel so that the router
// forwards to them. extra goes into each session.
func Upstream(routerID netip.Addr, asn uint32, gw4, gw6 netip.Addr, gatewayASN uint32, extra string) string {
	conf := fmt.Sprintf(`
router id %s;
protocol device {}
protocol kernel k4 { ipv4 { import none; export all; }; }
protocol kernel k6 { ipv6 { import none; export all; }; }
template bgp gateway_tpl {
  local as %d;
  hold time 9;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
  graceful restart on;
  graceful restart time 120;
  %s
}
`, routerID, asn, extra)
	if gw4.IsValid() {
		conf += fmt.Sprintf("protocol bgp gw4 from gateway_tpl { neighbor %s as %d; ipv4 { import all; export none; }; }\n", gw4, gatewayASN)
	}
	if gw6.IsValid() {
		conf += fmt.Sprintf("protocol bgp gw6 from gateway_tpl { neighbor %s as %d; ipv6 { import all; export none; }; }\n", gw6, gatewayASN)
	}
	return conf
}

// Several is the configuration of an upstream router for several gateways
// announcing the same addresses (IPv4): one BGP session with each (named
// gw1, gw2, ... in the order of gateways, all of AS gatewayASN), routes
// equal in BGP merged into one multipath route in the kernel (ECMP), and
// with bfd, single-hop BFD on every session (interval, multiplier missed
// packets take it down; 0: 3).
func Several(routerID netip.Addr, asn uint32, gateways []netip.Addr, gatewayASN uint32, bfd time.Duration, multiplier int) string {
	if multiplier == 0 {
		multiplier = 3
	}
	conf := fmt.Sprintf(`
router id %s;
protocol device {}
protocol kernel k4 { merge paths on; ipv4 { import none; export all; }; }
`, routerID)
	session := ""
	if bfd > 0 {
		ms := bfd.Milliseconds()
		conf += fmt.Sprintf("protocol bfd { interface \"*\" { min rx interval %d ms; min tx interval %d ms; multiplier %d; }; }\n", ms, ms, multiplier)
		session = "bfd on;"
	}
	conf += fmt.Sprintf(`template bgp gateway_tpl {
  local as %d;
  hold time 9;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
  graceful restart on;
  %s
}
`, asn, session)
	for i, gw := range gateways {
		conf += fmt.Sprintf("protocol bgp gw%d from gateway_tpl { neighbor %s as %d; ipv4 { import all; export none; }; }\n", i+1, gw, gatewayASN)
	}
	return conf
}
