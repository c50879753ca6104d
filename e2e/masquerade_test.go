package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
	"github.com/nftgate/nftgate/ruleset"
)

// webServices are a Service per family in front of the first backend.
func webServices() []any {
	return []any{
		gatewaytest.Service("default", "web", "ClusterIP", []string{"198.19.0.10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}),
		gatewaytest.Service("default", "web6", "ClusterIP", []string{"fd42:ff::10"}, gatewaytest.Port{Name: "http", Port: 80}),
		gatewaytest.Slice("default", "web6-1", "web6", "http", "", 8080, gatewaytest.Endpoint{Addr: "fd42:2::10"}),
	}
}

// dialFrom connects from src (any port) to dst and returns what the
// backend saw and the client's own address.
func dialFrom(t *testing.T, topo *lab.Topology, src netip.Addr, dst netip.AddrPort) lab.Reply {
	t.Helper()
	r, err := topo.Client.Dial("tcp", dst, lab.DialOpts{Source: netip.AddrPortFrom(src, 0)})
	if err != nil {
		t.Fatalf("from %s: %v", src, err)
	}
	return r
}

// TestMasqueradeAddressesOnePerClient: with masquerade_addresses, every
// client is masqueraded to one address of the pool, always the same, with
// its own port; different clients are spread over the pool. The pool lies
// on the backends' segment, where only the gateway's ARP/NDP answers for
// it ([l2]) bring the replies back.
func TestMasqueradeAddressesOnePerClient(t *testing.T) {
	topo := labtest.Gateway(t)
	for _, r := range []string{"198.18.3.0/29", "fd42:3::/125"} {
		if out, err := topo.Backend.Command(context.Background(), "ip", "route", "add", r, "dev", topo.BackendIface).CombinedOutput(); err != nil {
			t.Fatalf("ip route add %s: %v: %s", r, err, out)
		}
	}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	text := fmt.Sprintf("masquerade_addresses = [\"198.18.3.0/29\", \"fd42:3::1\"]\n\n[l2]\ninterfaces = [%q]\n", topo.GatewayBackendIface)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gatewaytest.New(t, topo, "--config", cfg)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
	g.Write("web.yaml", webServices()...)
	g.Start()

	pool := netip.MustParsePrefix("198.18.3.0/29")
	groups := cpuPortGroups(t, g)
	used := map[netip.Addr]int{}
	for _, c := range topo.ClientIPv4 {
		var first netip.Addr
		for i := range 3 {
			cpu := i % groups
			r := dialOnCPU(t, topo, c, ap("198.19.0.10:80"), cpu)
			seen := r.ObservedSource
			switch {
			case !pool.Contains(seen.Addr()) || seen.Addr() == pool.Addr() || seen.Addr() == netip.MustParseAddr("198.18.3.7"):
				t.Errorf("client %s seen as %s, want a masquerade address of 198.18.3.1-6", c, seen)
			case i > 0 && seen.Addr() != first:
				t.Errorf("client %s seen as %s, and before as %s: want one address per client", c, seen.Addr(), first)
			}
			checkCPUPort(t, topo.Gateway, r, cpu, groups)
			first = seen.Addr()
		}
		used[first]++
	}
	if len(used) < 2 {
		t.Errorf("%d clients all on %v: want them spread over the pool", len(topo.ClientIPv4), used)
	}
	r := dialOnCPU(t, topo, topo.ClientIPv6[0], ap("[fd42:ff::10]:80"), groups-1)
	if r.ObservedSource.Addr() != netip.MustParseAddr("fd42:3::1") {
		t.Errorf("IPv6 client %s seen as %s, want fd42:3::1", r.Local, r.ObservedSource)
	}
	checkCPUPort(t, topo.Gateway, r, groups-1, groups)
}

// dialOnCPU is dialFrom with the SYN sent, and so translated by the
// gateway, on cpu.
func dialOnCPU(t *testing.T, topo *lab.Topology, src netip.Addr, dst netip.AddrPort, cpu int) lab.Reply {
	t.Helper()
	r, err := topo.Client.Dial("tcp", dst, lab.DialOpts{Source: netip.AddrPortFrom(src, 0), PinCPU: true, CPU: cpu})
	if err != nil {
		t.Fatalf("from %s on CPU %d: %v", src, cpu, err)
	}
	return r
}

// cpuPortGroups counts the CPU groups of the masquerade ports in g's
// ruleset (one chain each; 1 without): as many as the lab's CPUs allow.
func cpuPortGroups(t *testing.T, g *gatewaytest.Gateway) int {
	t.Helper()
	n := strings.Count(g.Nft("list", "table", "ip", "nftgate"), "chain "+ruleset.ChainMasqueradeCPU)
	if want := ruleset.MasqueradePortGroupsFor(runtime.NumCPU()); n != want && !(n == 0 && want == 1) {
		t.Fatalf("%d masquerade CPU chains on %d CPUs, want %d", n, runtime.NumCPU(), want)
	}
	return max(n, 1)
}

// checkCPUPort: a connection translated on cpu is seen from its group's
// ports, from the client's own port when that lies among them and is free:
// when the gateway's conntrack holds the tuple from the backend to the
// masquerade address and the client's port for another connection (the
// gateway's own, or another client's given that port), the masquerade
// must choose another.
func checkCPUPort(t *testing.T, gw *lab.Host, r lab.Reply, cpu, groups int) {
	t.Helper()
	seen, own := r.ObservedSource.Port(), r.Local.Port()
	p := ruleset.Ports{Min: 0, Max: 65535}
	if groups > 1 {
		p = ruleset.GroupPorts(cpu%groups, groups)
		if seen < p.Min || seen > p.Max {
			t.Errorf("client %s translated on CPU %d seen as %s: want a port of %d-%d", r.Local, cpu, r.ObservedSource, p.Min, p.Max)
			return
		}
	}
	if own < p.Min || own > p.Max || seen == own {
		return
	}
	if held := tupleHeld(t, gw, netip.MustParseAddrPort(r.Backend), netip.AddrPortFrom(r.ObservedSource.Addr(), own)); len(held) > 0 {
		t.Logf("client %s seen as %s: its port was held by %s", r.Local, r.ObservedSource, strings.Join(held, "; "))
		return
	}
	t.Errorf("client %s translated on CPU %d seen as %s: want its port kept, in %d-%d (no conntrack entry holds it)", r.Local, cpu, r.ObservedSource, p.Min, p.Max)
}

// tupleHeld lists gw's conntrack entries that hold the tuple from backend
// to to, in either direction.
func tupleHeld(t *testing.T, gw *lab.Host, backend, to netip.AddrPort) []string {
	t.Helper()
	family := "ipv4"
	if to.Addr().Is6() {
		family = "ipv6"
	}
	out, err := gw.Command(context.Background(), "conntrack", "-L", "-p", "tcp", "-f", family).Output()
	if err != nil {
		t.Fatalf("conntrack -L: %v", err)
	}
	tuple := fmt.Sprintf("src=%s dst=%s sport=%d dport=%d ", backend.Addr(), to.Addr(), backend.Port(), to.Port())
	var held []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, tuple) {
			held = append(held, strings.Join(strings.Fields(line), " "))
		}
	}
	return held
}

// masqueradedClient is a client of webServices, the Service it dials and
// the gateway's address it is masqueraded to by default.
type masqueradedClient struct {
	src, gw netip.Addr
	dst     netip.AddrPort
}

// masqueradedClients are the first client of each family.
func masqueradedClients(topo *lab.Topology) []masqueradedClient {
	return []masqueradedClient{
		{topo.ClientIPv4[0], topo.GatewayBackendIPv4, ap("198.19.0.10:80")},
		{topo.ClientIPv6[0], topo.GatewayBackendIPv6, ap("[fd42:ff::10]:80")},
	}
}

// portKeepingGateway starts a gateway whose masquerade keeps the client's
// port (masquerade_ports_by_cpu off) in front of the web Services.
func portKeepingGateway(t *testing.T) *lab.Topology {
	t.Helper()
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo, "--masquerade-ports-by-cpu=false")
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
	g.Write("web.yaml", webServices()...)
	g.Start()
	return topo
}

// TestMasqueradeKeepsThePort: without masquerade_addresses, a client is
// masqueraded to the gateway's address on the backends' side and, with
// masquerade_ports_by_cpu off, keeps its port.
func TestMasqueradeKeepsThePort(t *testing.T) {
	topo := portKeepingGateway(t)
	for _, c := range masqueradedClients(topo) {
		for range 3 {
			r := dialFrom(t, topo, c.src, c.dst)
			if want := netip.AddrPortFrom(c.gw, r.Local.Port()); r.ObservedSource != want {
				t.Errorf("client %s seen as %s, want %s", r.Local, r.ObservedSource, want)
			}
		}
	}
}

// TestMasqueradePortsByCPU: by default each group of CPUs masquerades TCP
// to its own share of the ports, so that two CPUs never give two new
// connections the same one. A connection whose SYN the gateway translates
// on a CPU is seen from that CPU's share, from the client's own port where
// it lies in the share (on two CPUs, the ephemeral ports 32768-60999 mostly
// fall in the second half, few in the first: both cases are met).
func TestMasqueradePortsByCPU(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: no groups")
	}
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
	g.Write("web.yaml", webServices()...)
	g.Start()
	groups := cpuPortGroups(t, g)
	for _, c := range masqueradedClients(topo) {
		kept, moved := 0, 0
		for cpu := range groups {
			for range 10 {
				r := dialOnCPU(t, topo, c.src, c.dst, cpu)
				if r.ObservedSource.Addr() != c.gw {
					t.Fatalf("client %s seen as %s, want masqueraded to %s", r.Local, r.ObservedSource, c.gw)
				}
				checkCPUPort(t, topo.Gateway, r, cpu, groups)
				if r.ObservedSource.Port() == r.Local.Port() {
					kept++
				} else {
					moved++
				}
			}
		}
		if kept == 0 || moved == 0 {
			t.Errorf("%s: %d connections kept their port, %d were given another: want both to happen", c.src, kept, moved)
		}
	}
	// UDP is not grouped: the port is kept.
	gatewaytest.Serve(t, topo.Backend, "udp", ap("198.18.2.10:8080"))
	g.Write("dns.yaml",
		gatewaytest.Service("default", "dns", "ClusterIP", []string{"198.19.0.11"}, gatewaytest.Port{Name: "dns", Port: 53, Protocol: "UDP"}),
		gatewaytest.Slice("default", "dns-1", "dns", "dns", "UDP", 8080, gatewaytest.Endpoint{Addr: "198.18.2.10"}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := topo.Client.Dial("udp", ap("198.19.0.11:53"), lab.DialOpts{Source: netip.AddrPortFrom(topo.ClientIPv4[0], 0), PinCPU: true, CPU: 0, Timeout: 500 * time.Millisecond})
		if err == nil {
			if want := netip.AddrPortFrom(topo.GatewayBackendIPv4, r.Local.Port()); r.ObservedSource != want {
				t.Errorf("UDP client %s seen as %s, want %s", r.Local, r.ObservedSource, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("UDP Service: %v", err)
		}
	}
}

// TestKeepClientAddress: with keep_client_address the backend sees every
// client's own address under policy Cluster, from outside cluster_cidrs.
func TestKeepClientAddress(t *testing.T) {
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo, "--keep-client-address", "--cluster-cidr", "10.244.0.0/16")
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
	g.Write("web.yaml", webServices()...)
	g.Start()
	for _, c := range []struct {
		src netip.Addr
		dst netip.AddrPort
	}{
		{topo.ClientIPv4[1], ap("198.19.0.10:80")},
		{topo.ClientIPv6[1], ap("[fd42:ff::10]:80")},
	} {
		if r := dialFrom(t, topo, c.src, c.dst); r.ObservedSource != r.Local {
			t.Errorf("backend saw %s, want the client's own %s", r.ObservedSource, r.Local)
		}
	}
}

// TestMasqueradeReleasesTimeWait: the backend closes first, so it holds a
// TIME_WAIT socket for each connection's (masquerade address, port) for a
// minute; with release_time_wait (the default) the gateway resets it once
// both ends closed, and without it they remain.
func TestMasqueradeReleasesTimeWait(t *testing.T) {
	const dials = 20
	for _, release := range []bool{true, false} {
		t.Run(fmt.Sprintf("release=%v", release), func(t *testing.T) {
			topo := labtest.Gateway(t)
			g := gatewaytest.New(t, topo, fmt.Sprintf("--release-time-wait=%v", release))
			gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"), ap("[fd42:2::10]:8080"))
			g.Write("web.yaml", webServices()...)
			g.Start()
			for _, c := range masqueradedClients(topo) {
				for range dials {
					if r := dialFrom(t, topo, c.src, c.dst); r.ObservedSource.Addr() != c.gw {
						t.Fatalf("client %s seen as %s, want masqueraded to %s", r.Local, r.ObservedSource, c.gw)
					}
				}
				// A client whose FIN passes the gateway before the
				// backend's (it closed at the same moment) leaves the
				// backend no TIME_WAIT, or, both closing at once, one
				// the gateway does not reset: a few of either may
				// happen, hence the quarter on both sides.
				if !release {
					// Nothing resets them: each stays its minute.
					if n := timeWaitTo(t, topo.Backend, c.gw); n < dials*3/4 {
						t.Errorf("backend holds %d TIME_WAIT sockets for %s after %d connections it closed first, want at least %d", n, c.gw, dials, dials*3/4)
					}
					continue
				}
				// The reset follows the connection's last ACK at once.
				deadline := time.Now().Add(5 * time.Second)
				for n := timeWaitTo(t, topo.Backend, c.gw); n > dials/4; n = timeWaitTo(t, topo.Backend, c.gw) {
					if time.Now().After(deadline) {
						out, _ := topo.Backend.Command(context.Background(), "ss", "-tan", "state", "time-wait").CombinedOutput()
						t.Fatalf("backend still holds %d TIME_WAIT sockets for %s after %d connections, want at most %d:\n%s", n, c.gw, dials, dials/4, out)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
}

// timeWaitTo counts h's TCP sockets in TIME_WAIT whose peer is addr.
func timeWaitTo(t *testing.T, h *lab.Host, addr netip.Addr) int {
	t.Helper()
	n := 0
	for _, peer := range timeWaitPeers(t, h) {
		if peer.Addr() == addr {
			n++
		}
	}
	return n
}

// timeWaitPeers are the peers of h's TCP sockets in TIME_WAIT.
func timeWaitPeers(t *testing.T, h *lab.Host) []netip.AddrPort {
	t.Helper()
	out, err := h.Command(context.Background(), "ss", "-Htan", "state", "time-wait").CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v: %s", err, out)
	}
	var peers []netip.AddrPort
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		if peer, err := netip.ParseAddrPort(f[len(f)-1]); err == nil {
			peers = append(peers, netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()))
		}
	}
	return peers
}

// TestMasqueradeReleasedConnectionStaysClosed: once the gateway has reset
// the backend's TIME_WAIT of a masqueraded connection (the release), a late
// segment of that connection from the client (an ACK or a FIN it sent again
// before the backend's last ACK reached it) finds no socket on the backend,
// which answers it with a reset on the connection's tuple. The client may
// already use that tuple again: its port is free as soon as the last ACK
// arrives, and the masquerade keeps it. A reset that reaches the gateway
// after the new connection's SYN is that connection's first answer, and
// conntrack deletes an entry whose first answer is a reset; the backend's
// SYN-ACK then finds no entry, reaches the gateway's own stack, and is
// answered with a reset that ends the backend's half-open connection, so
// the client sends its SYN again a second later (seen on the appliance:
// docs/design/dataplane.md, "A reset for the connection before"). The
// gateway drops a released connection's late segments from the client
// instead: the backend never sees them and sends no reset. Here the client
// sends its ACK of the backend's FIN once more, after the release, and at
// once opens a new connection from the same port.
func TestMasqueradeReleasedConnectionStaysClosed(t *testing.T) {
	topo := portKeepingGateway(t)
	for _, c := range masqueradedClients(topo) {
		var seqs lab.TCPSeqs
		r, err := topo.Client.Dial("tcp", c.dst, lab.DialOpts{Source: netip.AddrPortFrom(c.src, 0), Seqs: &seqs})
		if err != nil {
			t.Fatal(err)
		}
		if want := netip.AddrPortFrom(c.gw, r.Local.Port()); r.ObservedSource != want {
			t.Fatalf("client %s seen as %s, want %s", r.Local, r.ObservedSource, want)
		}
		// The release: the backend's TIME_WAIT for the masquerade address
		// and port ends with the last ACK.
		deadline := time.Now().Add(5 * time.Second)
		for slices.Contains(timeWaitPeers(t, topo.Backend), r.ObservedSource) {
			if time.Now().After(deadline) {
				t.Fatalf("the backend still holds its TIME_WAIT for %s: the gateway did not release it", r.ObservedSource)
			}
			time.Sleep(10 * time.Millisecond)
		}
		before := tcpCounter(t, topo.Backend, "OutRsts")
		if err := topo.Client.SendTCP(r.Local, c.dst, seqs.Next+1, seqs.Acked, lab.TCPAck); err != nil {
			t.Fatal(err)
		}
		again, err := topo.Client.Dial("tcp", c.dst, lab.DialOpts{Source: r.Local})
		if err != nil {
			t.Fatal(err)
		}
		if again.ObservedSource != r.ObservedSource {
			t.Fatalf("the new connection from %s was seen as %s, want %s (the same tuple)", r.Local, again.ObservedSource, r.ObservedSource)
		}
		if again.SYNRetransmits > 0 {
			t.Errorf("the new connection from %s sent its SYN %d more times", r.Local, again.SYNRetransmits)
		}
		// The late ACK went before the new connection's SYN on the same
		// path: had it reached the backend, its reset would be counted.
		if n := tcpCounter(t, topo.Backend, "OutRsts") - before; n != 0 {
			t.Errorf("the backend sent %d resets: the released connection's late ACK from %s reached it", n, r.Local)
		}
	}
}

// tcpCounter reads one of the Tcp counters of /proc/net/snmp in h (both
// families count there).
func tcpCounter(t *testing.T, h *lab.Host, name string) int {
	t.Helper()
	out, err := h.Command(context.Background(), "cat", "/proc/net/snmp").CombinedOutput()
	if err != nil {
		t.Fatalf("/proc/net/snmp: %v: %s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		if i := slices.Index(names, name); i > 0 && i < len(f) {
			n, err := strconv.Atoi(f[i])
			if err != nil {
				t.Fatalf("/proc/net/snmp Tcp %s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/net/snmp has no Tcp %s:\n%s", name, out)
	return 0
}

// TestMasqueradeRefusedSYNKeepsItsPort: a SYN masqueraded to a port the
// backend still holds in TIME_WAIT for another connection is refused (the
// backend answers with an ACK of the old connection). The gateway resets
// that TIME_WAIT and keeps the client's own reset from closing the
// connection's conntrack entry, so the SYN the client sends again a few
// milliseconds later keeps its port and is accepted. Here the backend holds
// every masquerade port of CPU 0's group in TIME_WAIT (from the gateway's
// own connections), so a SYN sent again on another port would meet one too
// and be refused a second time, which the client answers only after its
// one-second retransmission timeout. Timestamps are off at both ends, so a
// SYN is refused on a TIME_WAIT port by its sequence number alone, about
// half the time, independently for each connection. The answer needs no
// conntrack marks, so it runs without the release too (a kernel without
// marks); /metrics counts the refusals answered, and the releases where
// the release runs.
func TestMasqueradeRefusedSYNKeepsItsPort(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: one group of every port, too many to hold in TIME_WAIT")
	}
	for _, tc := range []struct {
		name    string
		release bool
	}{{"with the release", true}, {"without the release", false}} {
		t.Run(tc.name, func(t *testing.T) {
			testRefusedSYNKeepsItsPort(t, tc.release)
		})
	}
}

func testRefusedSYNKeepsItsPort(t *testing.T, release bool) {
	const dials = 40
	topo := labtest.Gateway(t)
	g := gatewaytest.New(t, topo, fmt.Sprintf("--release-time-wait=%v", release))
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.10:8080"))
	g.Write("web.yaml", webServices()...)
	g.Start()
	if got := strings.Contains(g.Nft("list", "table", "ip", "nftgate"), "ct mark"); got != release {
		t.Fatalf("ruleset uses conntrack marks: %v, want %v (the release's alone)", got, release)
	}
	groups := cpuPortGroups(t, g)
	share := ruleset.GroupPorts(0, groups)
	for _, h := range []*lab.Host{topo.Client, topo.Gateway} {
		if err := h.Sysctl("net.ipv4.tcp_timestamps", "0"); err != nil {
			t.Fatal(err)
		}
	}
	holdTimeWait(t, topo, share)
	// The gateway's own connections are no longer in its conntrack, so
	// its NAT takes their ports as free.
	if out, err := topo.Gateway.Command(context.Background(), "conntrack", "-F").CombinedOutput(); err != nil {
		t.Fatalf("conntrack -F: %v: %s", err, out)
	}
	refused := 0
	for range dials {
		r := dialOnCPU(t, topo, topo.ClientIPv4[0], ap("198.19.0.10:80"), 0)
		checkCPUPort(t, topo.Gateway, r, 0, groups)
		if r.SYNRetransmits > 1 {
			t.Errorf("client %s (seen as %s) sent its SYN %d more times: refused again after the first", r.Local, r.ObservedSource, r.SYNRetransmits)
		}
		refused += r.SYNRetransmits
	}
	if refused == 0 {
		t.Fatalf("none of %d SYNs was refused: the backend's TIME_WAIT sockets were not met", dials)
	}
	t.Logf("%d of %d SYNs refused once, each accepted when sent again", refused, dials)

	// Every refusal was answered by the gateway (the counters are read
	// at most once a second: wait for a reading after the last dial).
	answered := `nftgate_time_wait_resets_total{reason="refused"}`
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lab.Eventually(ctx, func() error {
		if n := conntrackMetric(t, g, answered); n != float64(refused) {
			return fmt.Errorf("%s %v, want %d (the refusals the client saw)", answered, n, refused)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, body, err := g.Get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(body, `nftgate_time_wait_resets_total{reason="released"}`); got != release {
		t.Errorf("/metrics has the released resets: %v, want %v", got, release)
	}
}

// holdTimeWait has the backend hold (the gateway's address, p) in TIME_WAIT
// for every port p of ports: the gateway connects from each to the echo
// server, which closes first.
func holdTimeWait(t *testing.T, topo *lab.Topology, ports ruleset.Ports) {
	t.Helper()
	backend := &net.TCPAddr{IP: net.ParseIP("198.18.2.10"), Port: 8080}
	var wg sync.WaitGroup
	held := 0
	err := topo.Gateway.Do(func() error {
		for p := int(ports.Min); p <= int(ports.Max); p++ {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: topo.GatewayBackendIPv4.AsSlice(), Port: p}, Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", backend.String())
			if errors.Is(err, syscall.EADDRINUSE) {
				continue // the gateway listens on it
			}
			if err != nil {
				return fmt.Errorf("from port %d: %w", p, err)
			}
			held++
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, "hold\n"); err == nil {
					io.Copy(io.Discard, c) // until the server's close
				}
			}()
		}
		return nil
	})
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	want := held
	deadline := time.Now().Add(10 * time.Second)
	for n := timeWaitTo(t, topo.Backend, topo.GatewayBackendIPv4); n < want; n = timeWaitTo(t, topo.Backend, topo.GatewayBackendIPv4) {
		if time.Now().After(deadline) {
			t.Fatalf("backend holds %d TIME_WAIT sockets for the gateway's ports %d-%d, want %d", n, ports.Min, ports.Max, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The backend's last ACKs reach the gateway's sockets (LAST_ACK) before
	// the caller flushes the gateway's conntrack: one that came after
	// would be tracked anew and hold its port.
	if err := lab.EventuallyWithin(10*time.Second, func() error {
		out, err := topo.Gateway.Command(context.Background(), "ss", "-Htan", "dst", backend.String()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ss: %v: %s", err, out)
		}
		if len(strings.TrimSpace(string(out))) > 0 {
			return fmt.Errorf("the gateway still has sockets to %s:\n%s", backend, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
