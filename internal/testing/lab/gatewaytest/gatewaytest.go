// Package gatewaytest runs the real nftgate binary inside a lab gateway
// namespace for integration tests, and writes the manifests it serves.
package gatewaytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/nftgate/nftgate/internal/testing/kubetest"
	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/repo"
)

var (
	buildOnce stdsync.Once
	binPath   string
	buildErr  error
)

// Binary builds cmd/nftgate once per test process and returns its path. A
// package whose tests use it calls Main from its TestMain, which removes
// the binary when they are done.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := repo.Root()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "nftgate-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "nftgate")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/nftgate")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/nftgate: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Main runs the tests of m, removes the binary Binary built, and exits with
// the tests' status.
func Main(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		if err := os.RemoveAll(filepath.Dir(binPath)); err != nil {
			fmt.Fprintf(os.Stderr, "gatewaytest: remove the nftgate binary: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Gateway is one nftgate process in a lab gateway namespace.
type Gateway struct {
	t    testing.TB
	Topo *lab.Topology
	// Host is the namespace nftgate runs in: Topo.Gateway unless NewOn
	// named another.
	Host *lab.Host
	Dir  string // the manifests directory it serves
	Args []string
	// API is the control plane when the gateway serves one (NewWithAPI).
	API    *kubetest.ControlPlane
	client kubernetes.Interface
	files  map[string][]objKey // objects written per "file", in API mode

	cmd   *exec.Cmd
	done  chan struct{}
	logMu stdsync.Mutex
	logs  bytes.Buffer
}

// VIPExternalIPs are the flags that let nftgate serve externalIPs in the
// lab's VIP ranges, where test Services have their addresses: none is
// served without them.
var VIPExternalIPs = []string{"--external-ip-cidr", lab.VIPNet4.String(), "--external-ip-cidr", lab.VIPNet6.String()}

// New prepares nftgate for topo's gateway namespace with a fresh manifests
// directory; extra flags are appended to the defaults. Call Start after
// writing the first manifests.
func New(t testing.TB, topo *lab.Topology, extra ...string) *Gateway {
	t.Helper()
	return NewOn(t, topo, topo.Gateway, extra...)
}

// NewOn is New for nftgate in host, one of several gateways of a lab.
func NewOn(t testing.TB, topo *lab.Topology, host *lab.Host, extra ...string) *Gateway {
	t.Helper()
	g := &Gateway{t: t, Topo: topo, Host: host, Dir: t.TempDir()}
	g.Args = append([]string{"--manifests", g.Dir, "--listen", Listen, "--node-name", "gateway"}, extra...)
	t.Cleanup(func() {
		g.Stop()
		if t.Failed() {
			t.Logf("nftgate logs:\n%s", g.Logs())
		}
	})
	return g
}

// Start runs the process and waits until it reports ready (first complete
// sync done).
func (g *Gateway) Start() {
	g.t.Helper()
	g.Launch()
	g.WaitReady()
}

// Launch runs the process without waiting for it.
func (g *Gateway) Launch() {
	g.t.Helper()
	bin := Binary(g.t)
	g.cmd = g.Host.Command(context.Background(), bin, g.Args...)
	g.cmd.Stdout = lockedWriter{g}
	g.cmd.Stderr = lockedWriter{g}
	if err := g.cmd.Start(); err != nil {
		g.t.Fatalf("start nftgate: %v", err)
	}
	g.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(g.cmd, g.done)
}

// WaitReady waits until the process reports ready.
func (g *Gateway) WaitReady() {
	g.t.Helper()
	if err := WaitReady(g.Host, g.done, 30*time.Second); err != nil {
		g.t.Fatalf("nftgate never became ready: %v\nlogs:\n%s", err, g.Logs())
	}
}

// WaitReady waits until the nftgate in h answers /readyz on Listen with 200;
// it fails at once when done is closed (the process exited).
func WaitReady(h *lab.Host, done <-chan struct{}, timeout time.Duration) error {
	return lab.EventuallyWithin(timeout, func() error {
		select {
		case <-done:
			return fmt.Errorf("nftgate in %s exited", h)
		default:
		}
		code, body, err := Get(h, "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("readyz %d: %s", code, body)
		}
		return nil
	})
}

type lockedWriter struct{ g *Gateway }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.g.logMu.Lock()
	defer w.g.logMu.Unlock()
	return w.g.logs.Write(b)
}

// Logs returns everything the process wrote so far.
func (g *Gateway) Logs() string {
	g.logMu.Lock()
	defer g.logMu.Unlock()
	return g.logs.String()
}

// Running tells whether the process is alive.
func (g *Gateway) Running() bool {
	if g.done == nil {
		return false
	}
	select {
	case <-g.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process and waits for it to exit.
func (g *Gateway) Signal(sig syscall.Signal) {
	if !g.Running() {
		return
	}
	_ = g.cmd.Process.Signal(sig)
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
		g.t.Errorf("nftgate did not exit on %v", sig)
	}
}

// Stop ends the process with SIGTERM.
func (g *Gateway) Stop() { g.Signal(syscall.SIGTERM) }

// Kill ends the process with SIGKILL, as a crash would.
func (g *Gateway) Kill() { g.Signal(syscall.SIGKILL) }

// Get fetches path from the nftgate's HTTP server.
func (g *Gateway) Get(path string) (int, string, error) { return Get(g.Host, path) }

// Listen is where an nftgate started by this package or the failover
// harness serves HTTP, in its own network namespace.
const Listen = "127.0.0.1:9180"

// Get fetches path from the HTTP server of the nftgate in h.
func Get(h *lab.Host, path string) (int, string, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: h.DialContext}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + Listen + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Nft runs the nft CLI in the gateway namespace, to read the ruleset back.
func (g *Gateway) Nft(args ...string) string {
	g.t.Helper()
	out, err := g.Host.Command(context.Background(), "nft", args...).CombinedOutput()
	if err != nil {
		g.t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Write replaces one manifest file atomically (write, then rename), so the
// gateway never reads half a file.
func (g *Gateway) Write(name string, objs ...any) {
	g.t.Helper()
	if g.client != nil {
		g.apiWrite(name, objs)
		return
	}
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			g.t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	g.WriteRaw(name, b.String())
}

// WriteRaw replaces one manifest file with the given text.
func (g *Gateway) WriteRaw(name, text string) {
	g.t.Helper()
	if g.client != nil {
		g.t.Fatal("gatewaytest: WriteRaw writes manifest files; this gateway serves an API")
	}
	tmp := filepath.Join(g.Dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		g.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(g.Dir, name)); err != nil {
		g.t.Fatal(err)
	}
}

// Remove deletes a manifest file.
func (g *Gateway) Remove(name string) {
	g.t.Helper()
	if g.client != nil {
		g.apiRemove(name)
		return
	}
	if err := os.Remove(filepath.Join(g.Dir, name)); err != nil {
		g.t.Fatal(err)
	}
}

// Port is a Service port for Service.
type Port struct {
	Name     string
	Protocol corev1.Protocol // default TCP
	Port     int32
	NodePort int32
}

// Service builds a Service object; fields the arguments do not cover can be
// set on the result.
func Service(namespace, name, typ string, clusterIPs []string, ports ...Port) *corev1.Service {
	s := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, CreationTimestamp: metav1.Now()},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceType(typ), ClusterIPs: clusterIPs},
	}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, p := range ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: proto, Port: p.Port, NodePort: p.NodePort})
	}
	return s
}

// Endpoint is one endpoint for Slice.
type Endpoint struct {
	Addr     string
	NodeName string
	// NotReady: serving but not ready. Terminating: serving and
	// terminating. Dead: neither ready nor serving.
	NotReady, Terminating, Dead bool
}

// Slice builds an EndpointSlice with one port for a Service.
func Slice(namespace, name, service, portName string, proto corev1.Protocol, port int32, eps ...Endpoint) *discoveryv1.EndpointSlice {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	at := discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && strings.Contains(eps[0].Addr, ":") {
		at = discoveryv1.AddressTypeIPv6
	}
	sl := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, e := range eps {
		ready, serving, term := !e.NotReady && !e.Terminating && !e.Dead, !e.Dead, e.Terminating
		ep := discoveryv1.Endpoint{Addresses: []string{e.Addr},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term}}
		if e.NodeName != "" {
			n := e.NodeName
			ep.NodeName = &n
		}
		sl.Endpoints = append(sl.Endpoints, ep)
	}
	return sl
}

// Serve starts echo servers on h for every address, closed when the test
// ends.
func Serve(t testing.TB, h *lab.Host, proto string, addrs ...netip.AddrPort) {
	t.Helper()
	for _, a := range addrs {
		c, err := h.ServeEcho(proto, a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// Backends dials dst from the client host n times, each from a new source
// port, and returns how often each backend answered. Errors fail the test.
func Backends(t testing.TB, client *lab.Host, proto string, dst netip.AddrPort, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		r, err := client.Dial(proto, dst, lab.DialOpts{})
		if err != nil {
			t.Fatalf("%s %s: %v", proto, dst, err)
		}
		seen[r.Backend]++
	}
	return seen
}
