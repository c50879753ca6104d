// Command nftgate-demo runs nftgate in a throw-away network lab: a client, a
// gateway and a backend namespace (see lab.NewGateway), echo servers on every
// endpoint of the example manifests, and nftgate itself inside the gateway.
// It relays nftgate's HTTP status port to the machine's loopback and tears
// everything down on Ctrl-C or SIGTERM.
//
//	nftgate-demo --nftgate build/nftgate --manifests examples/manifests [-- extra nftgate flags]
//	nftgate-demo probe   # from another terminal: try every service from the client
//
// It needs root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// labName is the demo lab's name; probe finds the client namespace by it.
const labName = "demo"

// nftgateHTTPPort is where nftgate listens inside the gateway.
const nftgateHTTPPort = 9180

func main() {
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(probeMain(os.Args[2:]))
	}
	os.Exit(runMain(os.Args[1:]))
}

func runMain(args []string) int {
	fs := flag.NewFlagSet("nftgate-demo", flag.ContinueOnError)
	nftgatePath := fs.String("nftgate", "", "path of the nftgate binary to run in the gateway namespace (required)")
	manifestDir := fs.String("manifests", "examples/manifests", "directory of Service and EndpointSlice manifests, given to nftgate and used to start echo backends")
	httpAddr := fs.String("http", "127.0.0.1:9180", "loopback address on this machine that relays to nftgate's HTTP port in the gateway")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: nftgate-demo --nftgate PATH [--manifests DIR] [--http ADDR] [-- extra nftgate flags]\n       nftgate-demo probe [--manifests DIR] [--count N]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *nftgatePath == "" {
		fmt.Fprintln(os.Stderr, "nftgate-demo: --nftgate is required")
		fs.Usage()
		return 2
	}
	if err := run(*nftgatePath, *manifestDir, *httpAddr, fs.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "nftgate-demo:", err)
		return 1
	}
	return 0
}

func run(nftgatePath, manifestDir, httpAddr string, extra []string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root to create network namespaces")
	}
	bin, err := filepath.Abs(nftgatePath)
	if err != nil {
		return err
	}
	if st, err := os.Stat(bin); err != nil {
		return fmt.Errorf("--nftgate %s: %w", nftgatePath, err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("--nftgate %s: not an executable file", nftgatePath)
	}
	dir, err := filepath.Abs(manifestDir)
	if err != nil {
		return err
	}
	m, err := loadManifests(dir)
	if err != nil {
		return err
	}
	backends, err := m.backends()
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if removed, err := lab.RemoveStale(); err != nil {
		fmt.Fprintln(os.Stderr, "nftgate-demo: removing leftovers of earlier runs:", err)
	} else if len(removed) > 0 {
		fmt.Println("removed leftovers of earlier runs:", strings.Join(removed, " "))
	}
	topo, err := lab.NewGateway(labName, lab.GatewayOptions{HostLink: true})
	if err != nil {
		return err
	}
	defer func() {
		if err := topo.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "nftgate-demo: cleanup:", err)
		} else {
			fmt.Println("lab removed")
		}
	}()

	served, err := startBackends(topo, backends)
	if err != nil {
		return err
	}

	nftgateArgs := append([]string{
		"--manifests", dir,
		"--listen", fmt.Sprintf("0.0.0.0:%d", nftgateHTTPPort),
		"--node-name", "gateway",
		"--cluster-cidr", lab.BackendNet4.String(),
		"--nodeport-addresses", netip.PrefixFrom(topo.GatewayClientIPv4, 32).String(),
		// The example Services' externalIPs lie in the lab's VIP ranges.
		"--external-ip-cidr", lab.VIPNet4.String(),
		"--external-ip-cidr", lab.VIPNet6.String(),
	}, extra...)
	cmd := topo.Gateway.Command(context.Background(), bin, nftgateArgs...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own process group: Ctrl-C reaches only the demo, which then stops
	// nftgate with SIGTERM and waits for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	fmt.Printf("starting in %s: %s %s\n", topo.Gateway.Name(), bin, strings.Join(nftgateArgs, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start nftgate: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	relay, err := startRelay(httpAddr, topo.Gateway, fmt.Sprintf("127.0.0.1:%d", nftgateHTTPPort))
	if err != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		return err
	}
	defer relay.Close()

	printHelp(topo, served, httpAddr)
	go reportReady(ctx, topo.Gateway, nftgateHTTPPort)

	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("nftgate exited: %w", err)
		}
		return errors.New("nftgate exited by itself (status 0)")
	case <-ctx.Done():
		fmt.Println("\nstopping nftgate")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil && !isSignalExit(err) {
				fmt.Fprintln(os.Stderr, "nftgate-demo: nftgate:", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			fmt.Fprintln(os.Stderr, "nftgate-demo: nftgate did not stop within 10 s; killed it")
		}
		return nil
	}
}

func isSignalExit(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true
		}
	}
	return false
}

// startBackends runs an echo server for every endpoint. Endpoint addresses
// inside the backend networks but outside the pre-assigned range are added
// to the backend host; others cannot be reached through the lab and are
// reported and skipped.
func startBackends(topo *lab.Topology, backends []backend) ([]backend, error) {
	have := map[netip.Addr]bool{}
	for _, a := range append(append([]netip.Addr(nil), topo.BackendIPv4...), topo.BackendIPv6...) {
		have[a] = true
	}
	var served []backend
	for _, b := range backends {
		a := b.Addr.Addr()
		if !have[a] {
			switch {
			case lab.BackendNet4.Contains(a) && a != topo.GatewayBackendIPv4:
				if err := topo.Backend.AddAddress(topo.BackendIface, netip.PrefixFrom(a, lab.BackendNet4.Bits())); err != nil {
					return nil, err
				}
			case lab.BackendNet6.Contains(a) && a != topo.GatewayBackendIPv6:
				if err := topo.Backend.AddAddress(topo.BackendIface, netip.PrefixFrom(a, lab.BackendNet6.Bits())); err != nil {
					return nil, err
				}
			default:
				fmt.Fprintf(os.Stderr, "nftgate-demo: endpoint %s is outside the lab's backend networks %s and %s; no backend runs for it\n", a, lab.BackendNet4, lab.BackendNet6)
				continue
			}
			have[a] = true
		}
		if _, err := topo.Backend.ServeEcho(b.Proto, b.Addr); err != nil {
			return nil, err
		}
		served = append(served, b)
	}
	return served, nil
}

// startRelay accepts on listenAddr on this machine and connects each client
// to target inside h, so nftgate's status page is reachable from a browser.
func startRelay(listenAddr string, h *lab.Host, target string) (io.Closer, error) {
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", listenAddr, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			go func() {
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				up, err := h.DialContext(ctx, "tcp", target)
				cancel()
				if err != nil {
					return
				}
				defer up.Close()
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = io.Copy(up, c)
					if tc, ok := up.(*net.TCPConn); ok {
						_ = tc.CloseWrite()
					}
				}()
				_, _ = io.Copy(c, up)
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				wg.Wait()
			}()
		}
	}()
	return ln, nil
}

// reportReady says when nftgate's HTTP port first answers.
func reportReady(ctx context.Context, gw *lab.Host, port int) {
	client := &http.Client{Transport: &http.Transport{DialContext: gw.DialContext}, Timeout: time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := lab.Eventually(ctx, func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	if err == nil {
		fmt.Println("nftgate is answering on its HTTP port")
	}
}

func printHelp(topo *lab.Topology, served []backend, httpAddr string) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nlab %q is up:\n", labName)
	fmt.Fprintf(&b, "  client   %s  %s-%s (default route via the gateway)\n", topo.Client.Name(), topo.ClientIPv4[0], topo.ClientIPv4[len(topo.ClientIPv4)-1])
	fmt.Fprintf(&b, "  gateway  %s  %s %s (nftgate runs here)\n", topo.Gateway.Name(), topo.GatewayClientIPv4, topo.GatewayBackendIPv4)
	fmt.Fprintf(&b, "  backend  %s  %d echo servers\n", topo.Backend.Name(), len(served))
	fmt.Fprintf(&b, "\nTry:\n")
	fmt.Fprintf(&b, "  curl http://%s/                     # nftgate status page (relayed)\n", httpAddr)
	fmt.Fprintf(&b, "  ip netns exec %s curl -s http://198.19.0.10/\n", topo.Client.Name())
	fmt.Fprintf(&b, "  ip netns exec %s curl -s http://%s:30080/\n", topo.Client.Name(), topo.GatewayClientIPv4)
	fmt.Fprintf(&b, "  ip netns exec %s nft list ruleset\n", topo.Gateway.Name())
	fmt.Fprintf(&b, "  %s probe                 # every service from the client\n", os.Args[0])
	fmt.Fprintf(&b, "\nCtrl-C stops nftgate and removes the lab.\n\n")
	fmt.Print(b.String())
}

// demoClientNamespace finds the client namespace of a running demo.
func demoClientNamespace() (string, error) {
	re := regexp.MustCompile(`^nftg-([0-9]+)-[0-9]+-` + labName + `-client$`)
	entries, err := os.ReadDir(lab.NetnsDir)
	if err != nil {
		return "", fmt.Errorf("no running demo found: %w", err)
	}
	for _, e := range entries {
		m := re.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if syscall.Kill(pid, 0) == nil {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("no running demo found in %s (start one with nftgate-demo --nftgate PATH)", lab.NetnsDir)
}

func probeMain(args []string) int {
	fs := flag.NewFlagSet("nftgate-demo probe", flag.ContinueOnError)
	manifestDir := fs.String("manifests", "examples/manifests", "directory of the manifests the demo runs with")
	count := fs.Int("count", 1, "attempts per service address")
	ns := fs.String("netns", "", "client namespace (default: the running demo's)")
	timeout := fs.Duration("timeout", time.Second, "timeout of each attempt")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *count < 1 {
		fmt.Fprintf(os.Stderr, "nftgate-demo probe: --count %d: want at least 1\n", *count)
		return 2
	}
	if err := probe(*manifestDir, *ns, *count, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "nftgate-demo probe:", err)
		return 1
	}
	return 0
}

func probe(manifestDir, nsName string, count int, timeout time.Duration) error {
	m, err := loadManifests(manifestDir)
	if err != nil {
		return err
	}
	if nsName == "" {
		if nsName, err = demoClientNamespace(); err != nil {
			return err
		}
	}
	client, err := lab.OpenHost(nsName)
	if err != nil {
		return err
	}
	defer client.Close()
	nodeIP := netip.MustParseAddr("198.18.1.1")
	fmt.Printf("probing from %s\n", nsName)
	for _, t := range m.probeTargets(nodeIP) {
		for range count {
			rep, err := client.Dial(t.Proto, t.Dst, lab.DialOpts{Timeout: timeout})
			var result string
			switch {
			case err == nil:
				result = "-> " + rep.Backend + " (seen from " + rep.ObservedSource.Addr().String() + ")"
			case lab.IsRefused(err):
				result = "REJECTED (" + rootCause(err) + ")"
			case lab.IsTimeout(err):
				result = "TIMEOUT (dropped)"
			default:
				result = "ERROR " + err.Error()
			}
			fmt.Printf("  %-28s %-12s %-3s %-22s %s\n", t.Service, t.Kind, t.Proto, t.Dst, result)
		}
	}
	return nil
}

func rootCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}
