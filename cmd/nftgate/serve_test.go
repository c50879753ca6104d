package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
)

// serveChildEnv marks the test process that runs serve inside a network
// namespace of its own.
const serveChildEnv = "NFTGATE_SERVE_CHILD"

// TestServeWaitsForItsGoroutines runs the gateway in this process, on the
// example manifests, until it is ready, stops it, and checks that no
// goroutine serve started is left once it has returned. The process runs
// in a network namespace of its own (a re-executed test binary): its
// tables, conntrack table and listener end with it.
func TestServeWaitsForItsGoroutines(t *testing.T) {
	if os.Getenv(serveChildEnv) == "" {
		if os.Geteuid() != 0 {
			t.Skip("a network namespace needs root")
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestServeWaitsForItsGoroutines$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), serveChildEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestServeWaitsForItsGoroutines") {
			t.Fatalf("in its own network namespace: %v\n%s", err, out)
		}
		t.Logf("in its own network namespace:\n%s", out)
		return
	}

	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	const listen = "127.0.0.1:9180"
	cfg, _, err := loadConfig("nftgate", []string{"--manifests", "../../examples/manifests", "--node-name", "gw",
		"--listen", listen, "--log-level", "error"})
	if err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, cfg) }()

	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	ready := func() error {
		resp, err := client.Get("http://" + listen + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for err := ready(); err != nil; err = ready() {
		select {
		case err := <-errc:
			t.Fatalf("serve returned before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after its context ended")
	}
	// At the moment serve has returned, none of its goroutines runs.
	if left := goroutinesOf("main.serve"); len(left) > 0 {
		t.Errorf("%d goroutines of serve still run after it returned:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	// Nor any goroutine started on its behalf (goleak retries for a
	// while; a goroutine forgotten for good would be left blocked).
	goleak.VerifyNone(t, before)
}

// goroutinesOf returns the stacks of the goroutines that run fn or a
// function literal of it, or that fn started.
func goroutinesOf(fn string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, line := range strings.Split(g, "\n") {
			line = strings.TrimPrefix(line, "created by ")
			if line == fn || strings.HasPrefix(line, fn+"(") || strings.HasPrefix(line, fn+".func") || strings.HasPrefix(line, fn+" in goroutine") {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
