package lab_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/internal/testing/netnstest"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func serve(t *testing.T, h *lab.Host, proto string, addr netip.AddrPort) {
	t.Helper()
	if _, err := h.ServeEcho(proto, addr); err != nil {
		t.Fatal(err)
	}
}

func TestGatewayForwardsTCPAndUDP(t *testing.T) {
	t.Parallel()
	topo := labtest.Gateway(t)
	for _, tc := range []struct {
		proto  string
		server netip.AddrPort
		source netip.AddrPort
	}{
		{"tcp", ap("198.18.2.10:8080"), ap("198.18.1.3:0")},
		{"udp", ap("198.18.2.11:5353"), ap("198.18.1.4:40000")},
		{"tcp", ap("[fd42:2::12]:8080"), ap("[fd42:1::5]:0")},
		{"udp", ap("[fd42:2::29]:5353"), ap("[fd42:1::9]:40001")},
	} {
		t.Run(tc.proto+"-"+tc.server.String(), func(t *testing.T) {
			serve(t, topo.Backend, tc.proto, tc.server)
			// Twice from the same fixed source: the second exchange must not
			// trip over the first one's socket state.
			for range 2 {
				rep, err := topo.Client.Dial(tc.proto, tc.server, lab.DialOpts{Source: tc.source})
				if err != nil {
					t.Fatal(err)
				}
				if rep.Backend != tc.server.String() {
					t.Errorf("backend %q, want %q", rep.Backend, tc.server)
				}
				if rep.ObservedSource.Addr() != tc.source.Addr() {
					t.Errorf("server saw source %s, want address %s (routed, not masqueraded)", rep.ObservedSource, tc.source.Addr())
				}
				if tc.source.Port() != 0 && rep.ObservedSource.Port() != tc.source.Port() {
					t.Errorf("server saw port %d, want fixed source port %d", rep.ObservedSource.Port(), tc.source.Port())
				}
				if rep.Local != rep.ObservedSource || rep.Masqueraded() {
					t.Errorf("local %s, observed %s: want equal", rep.Local, rep.ObservedSource)
				}
			}
		})
	}
}

func TestRefusedAndTimeoutAreTold(t *testing.T) {
	t.Parallel()
	topo := labtest.Gateway(t)
	// A blackhole on the router drops forwarded packets without a word.
	dropped := netip.MustParsePrefix("198.18.2.20/32")
	dropped6 := netip.MustParsePrefix("fd42:2::20/128")
	for _, p := range []netip.Prefix{dropped, dropped6} {
		if err := topo.Gateway.AddBlackholeRoute(p); err != nil {
			t.Fatal(err)
		}
	}
	serve(t, topo.Backend, "tcp", ap("198.18.2.20:80"))
	serve(t, topo.Backend, "udp", ap("198.18.2.20:53"))

	short := lab.DialOpts{Timeout: 300 * time.Millisecond}
	// IPv4 "no route" errors are rate limited per source address by a
	// limiter outside the namespace (5 at once, then 1/s), so those cases
	// use a source of their own.
	for _, tc := range []struct {
		name    string
		proto   string
		src     string
		dst     netip.AddrPort
		refused bool
	}{
		{"tcp closed port", "tcp", "198.18.1.2", ap("198.18.2.10:9"), true},
		{"udp closed port", "udp", "198.18.1.2", ap("198.18.2.10:9"), true},
		{"tcp6 closed port", "tcp", "fd42:1::2", ap("[fd42:2::10]:9"), true},
		{"udp6 closed port", "udp", "fd42:1::2", ap("[fd42:2::10]:9"), true},
		{"tcp no route at gateway", "tcp", "198.18.1.5", ap("198.18.3.1:80"), true},
		{"udp no route at gateway", "udp", "198.18.1.6", ap("198.18.3.1:53"), true},
		{"udp6 no route at gateway", "udp", "fd42:1::2", ap("[fd42:3::1]:53"), true},
		{"tcp6 no route at gateway", "tcp", "fd42:1::2", ap("[fd42:3::1]:80"), true},
		{"tcp VIP without rules", "tcp", "198.18.1.2", ap("198.19.0.10:80"), false},
		{"udp VIP without rules", "udp", "198.18.1.2", ap("198.19.0.10:53"), false},
		{"udp6 VIP without rules", "udp", "fd42:1::2", ap("[fd42:ff::10]:53"), false},
		{"tcp blackholed", "tcp", "198.18.1.2", ap("198.18.2.20:80"), false},
		{"udp blackholed", "udp", "198.18.1.2", ap("198.18.2.20:53"), false},
		{"tcp6 blackholed", "tcp", "fd42:1::2", ap("[fd42:2::20]:80"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := short
			opts.Source = netip.AddrPortFrom(netip.MustParseAddr(tc.src), 0)
			if tc.refused && strings.Contains(tc.name, "no route") && tc.dst.Addr().Is4() {
				// The kernel's global ICMP limiter, which the namespaces
				// cannot turn off, is shared with every other test on the
				// machine: the refusal shows once its budget allows.
				err := lab.EventuallyWithin(10*time.Second, func() error {
					_, err := topo.Client.Dial(tc.proto, tc.dst, opts)
					if lab.IsRefused(err) {
						return nil
					}
					return fmt.Errorf("dial %s: %v", tc.dst, err)
				})
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			// Rejections must show on every attempt and well within the
			// 300 ms timeout, long before a TCP SYN is resent (the lab turns
			// the namespaces' ICMP rate limiting off).
			for range 3 {
				_, err := topo.Client.Dial(tc.proto, tc.dst, opts)
				if err == nil {
					t.Fatalf("dial %s succeeded, want an error", tc.dst)
				}
				if lab.IsRefused(err) != tc.refused || lab.IsTimeout(err) == tc.refused {
					t.Fatalf("dial %s: %v: IsRefused=%v IsTimeout=%v, want refused=%v", tc.dst, err, lab.IsRefused(err), lab.IsTimeout(err), tc.refused)
				}
			}
		})
	}
	// The blackholed servers do answer when asked without the gateway.
	for _, proto := range []string{"tcp", "udp"} {
		dst := ap("198.18.2.20:53")
		if proto == "tcp" {
			dst = ap("198.18.2.20:80")
		}
		rep, err := topo.Backend.Dial(proto, dst, lab.DialOpts{})
		if err != nil || rep.Backend != dst.String() {
			t.Fatalf("backend to its own blackholed server: %+v, %v", rep, err)
		}
	}
}

func TestEchoAnswersHTTP(t *testing.T) {
	t.Parallel()
	topo := labtest.Gateway(t)
	serve(t, topo.Backend, "tcp", ap("198.18.2.12:8080"))
	client := &http.Client{Transport: &http.Transport{DialContext: topo.Client.DialContext}, Timeout: 5 * time.Second}
	resp, err := client.Get("http://198.18.2.12:8080/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "198.18.2.12:8080 198.18.1.") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
}

func TestCommandRunsInNamespaceAndDiesWithLab(t *testing.T) {
	t.Parallel()
	topo := labtest.Gateway(t)
	for _, tc := range []struct {
		h    *lab.Host
		want string
	}{{topo.Gateway, "1"}, {topo.Client, "0"}} {
		out, err := tc.h.Command(context.Background(), "cat", "/proc/sys/net/ipv4/ip_forward").Output()
		if err != nil {
			t.Fatalf("%s: %v", tc.h, err)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("%s ip_forward = %q, want %q", tc.h, got, tc.want)
		}
		v, err := tc.h.ReadSysctl("net.ipv4.ip_forward")
		if err != nil || v != tc.want {
			t.Errorf("%s ReadSysctl = %q, %v; want %q", tc.h, v, err, tc.want)
		}
	}
	// A program in the namespace sees its interfaces, e.g. the gateway's.
	out, err := topo.Gateway.Command(context.Background(), "cat", "/sys/class/net/backend/operstate").Output()
	if err != nil || strings.TrimSpace(string(out)) != "up" {
		t.Fatalf("gateway backend operstate: %q, %v", out, err)
	}

	sleeper := topo.Client.Command(context.Background(), "sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err == nil {
			t.Fatal("sleep exited cleanly, want it killed by Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("process started in the lab still runs 10 s after Close")
	}
}

func TestHostFDAndNetlinkReachTheNamespace(t *testing.T) {
	t.Parallel()
	topo := labtest.Gateway(t)
	nl, err := netlink.NewHandleAt(netns.NsHandle(topo.Gateway.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	for _, name := range []string{topo.GatewayClientIface, topo.GatewayBackendIface} {
		if _, err := nl.LinkByName(name); err != nil {
			t.Errorf("gateway link %q: %v", name, err)
		}
	}
	if _, err := os.Stat(topo.Gateway.Path()); err != nil {
		t.Errorf("namespace file: %v", err)
	}
	// Do must leave the calling side in the root namespace: a backend
	// address can be bound inside, never outside.
	err = topo.Backend.Do(func() error {
		l, err := net.Listen("tcp", "198.18.2.13:0")
		if err != nil {
			return err
		}
		return l.Close()
	})
	if err != nil {
		t.Fatalf("listen inside backend: %v", err)
	}
	if l, err := net.Listen("tcp", "198.18.2.13:0"); err == nil {
		l.Close()
		t.Fatal("backend address bindable outside the namespace: Do leaked the namespace")
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	labtest.RequireRoot(t)
	l, err := lab.New("closecheck")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	a, err := l.AddHost("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AddHost("a"); err == nil {
		t.Error("second host named a accepted")
	}
	b, err := l.AddHost("b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Link(a, nil, b, nil); err != nil {
		t.Fatal(err)
	}
	v, err := l.Link(a, []netip.Prefix{netip.MustParsePrefix("198.18.9.1/24")}, b, []netip.Prefix{netip.MustParsePrefix("198.18.9.2/24")})
	if err != nil {
		t.Fatal(err)
	}
	if v.A != "b1" || v.B != "a1" {
		t.Errorf("second link named %+v, want b1/a1", v)
	}
	rv, err := l.LinkRoot(nil, a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := l.RootLinks(); len(got) != 1 || got[0] != rv.A {
		t.Fatalf("root links %v, want [%s]", got, rv.A)
	}
	serveErr := func() error { _, err := a.ServeEcho("tcp", ap("198.18.9.1:80")); return err }()
	if serveErr != nil {
		t.Fatal(serveErr)
	}
	names, err := l.Namespaces()
	if err != nil || len(names) != 2 {
		t.Fatalf("namespaces %v, %v; want 2", names, err)
	}
	for _, n := range names {
		if !strings.Contains(n, fmt.Sprintf("-%d-", os.Getpid())) {
			t.Errorf("namespace %s does not carry the pid", n)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if left, _ := l.Namespaces(); len(left) != 0 {
		t.Errorf("namespaces left: %v", left)
	}
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(lab.NetnsDir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists: %v", n, err)
		}
	}
	if left, _ := l.RootLinks(); len(left) != 0 {
		t.Errorf("root links left: %v", left)
	}
	if _, err := l.AddHost("c"); err == nil {
		t.Error("AddHost after Close succeeded")
	}
}

func TestRemoveStaleDeletesDeadProcessesNamespaces(t *testing.T) {
	labtest.RequireRoot(t)
	// A pid that surely belongs to no running process: one that just exited.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("nftg-%d-1-stale-host", dead.Process.Pid)
	live := fmt.Sprintf("nftg-%d-999-keep-host", os.Getpid())
	for _, n := range []string{name, live} {
		makeNamedNetns(t, n)
	}
	removed, err := lab.RemoveStale()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range removed {
		found = found || r == name
		if r == live {
			t.Errorf("RemoveStale removed %s of a live process", live)
		}
	}
	if !found {
		t.Errorf("RemoveStale removed %v, want %s among them", removed, name)
	}
	if _, err := os.Lstat(filepath.Join(lab.NetnsDir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists", name)
	}
	if _, err := os.Lstat(filepath.Join(lab.NetnsDir, live)); err != nil {
		t.Errorf("%s was removed: %v", live, err)
	}
}

func makeNamedNetns(t *testing.T, name string) {
	t.Helper()
	ns, err := netnstest.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	t.Cleanup(func() { netns.DeleteNamed(name) })
}

func TestManyEchoServersAreCheap(t *testing.T) {
	t.Parallel()
	topo := labtest.Gateway(t)
	start := time.Now()
	var targets []struct {
		proto string
		dst   netip.AddrPort
	}
	for _, addrs := range [][]netip.Addr{topo.BackendIPv4, topo.BackendIPv6} {
		for _, a := range addrs {
			for _, port := range []uint16{8080, 8081} {
				for _, proto := range []string{"tcp", "udp"} {
					dst := netip.AddrPortFrom(a, port)
					serve(t, topo.Backend, proto, dst)
					targets = append(targets, struct {
						proto string
						dst   netip.AddrPort
					}{proto, dst})
				}
			}
		}
	}
	started := time.Since(start)
	start = time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(targets))
	sem := make(chan struct{}, 16)
	for _, tg := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rep, err := topo.Client.Dial(tg.proto, tg.dst, lab.DialOpts{})
			if err == nil && rep.Backend != tg.dst.String() {
				err = fmt.Errorf("%s %s answered by %s", tg.proto, tg.dst, rep.Backend)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d echo servers started in %v; one probe each through the gateway in %v", len(targets), started, time.Since(start))
}

func TestTwoLabsWithOneNameDoNotCollide(t *testing.T) {
	t.Parallel()
	labtest.RequireRoot(t)
	var hosts []*lab.Host
	for range 2 {
		l, err := lab.New("same")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		h, err := l.AddHost("h")
		if err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, h)
	}
	if hosts[0].Name() == hosts[1].Name() {
		t.Fatalf("both labs named their host %s", hosts[0].Name())
	}
}

func TestBadInputIsNamed(t *testing.T) {
	if _, err := lab.New("bad name!"); err == nil || !strings.Contains(err.Error(), `"bad name!"`) {
		t.Errorf("lab.New(bad name!) = %v", err)
	}
	labtest.RequireRoot(t)
	topo := labtest.Gateway(t)
	if _, err := topo.Backend.ServeEcho("sctp", ap("198.18.2.10:1")); err == nil || !strings.Contains(err.Error(), `"sctp"`) {
		t.Errorf("ServeEcho(sctp) = %v", err)
	}
	if _, err := topo.Client.Dial("icmp", ap("198.18.2.10:1"), lab.DialOpts{}); err == nil || !strings.Contains(err.Error(), `"icmp"`) {
		t.Errorf("Dial(icmp) = %v", err)
	}
	if err := topo.Client.AddRoute(netip.MustParsePrefix("198.19.0.0/16"), netip.MustParseAddr("fd42:1::1")); err == nil {
		t.Error("AddRoute with mixed families accepted")
	}
	if err := topo.Client.Sysctl("net.ipv4.no_such_key", "1"); err == nil || !strings.Contains(err.Error(), "net.ipv4.no_such_key") {
		t.Errorf("Sysctl(no_such_key) = %v", err)
	}
}

func TestHostLinkReachesTheGateway(t *testing.T) {
	topo := labtest.GatewayWith(t, lab.GatewayOptions{HostLink: true})
	if topo.HostIface == "" || topo.GatewayHostIface != "host" {
		t.Fatalf("host link interfaces %q / %q", topo.HostIface, topo.GatewayHostIface)
	}
	gw := netip.AddrPortFrom(topo.GatewayHostIPv4, 7070)
	serve(t, topo.Gateway, "tcp", gw)
	// From the machine itself, over the host link.
	c, err := net.DialTimeout("tcp", gw.String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		t.Fatal(err)
	}
	line, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	want := gw.String() + " " + topo.HostIPv4.String() + ":"
	if !strings.HasPrefix(string(line), want) {
		t.Fatalf("reply %q, want it to start with %q", line, want)
	}
}
