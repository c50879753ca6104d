// Package kubetest runs a real Kubernetes control plane (etcd and
// kube-apiserver) for tests and benchmarks.
//
// Each control plane gets a fresh data directory, its own PKI and free ports,
// so tests in parallel packages do not collide. It can run inside a network
// namespace, where only processes in that namespace (and this process,
// through RESTConfig) can reach it.
//
// kube-apiserver is built by `make kube-apiserver` (`make kube-bin` builds
// kube-proxy too; tools/k8s/build.sh); etcd is Debian's (`make kube-deps`).
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// ServiceCIDR is the Service ClusterIP range, the test lab's VIP range.
	ServiceCIDR = "198.19.0.0/16"
	// ServiceCIDR6 is the secondary, IPv6 Service range (the cluster is
	// dual-stack, IPv4 first), inside the test lab's IPv6 VIP range.
	ServiceCIDR6 = "fd42:ff::/112"
	// NodePortRange is the NodePort range (the Kubernetes default).
	NodePortRange = "30000-32767"

	// defaultStartTimeout bounds startup when the context has no deadline.
	defaultStartTimeout = 2 * time.Minute
	// stopGrace is how long a server may take to exit after SIGTERM
	// before it is killed.
	stopGrace = 15 * time.Second
	// bindAttempts is how often Start picks new ports when another process
	// took one between choosing it and the server binding it.
	bindAttempts = 3
	logTailLines = 40
)

// Options configures a control plane. The zero value runs on 127.0.0.1 in
// the caller's network namespace with the binaries from BinDir.
type Options struct {
	// NetNS is the network namespace to run etcd and kube-apiserver in: a
	// name as created by `ip netns add` (/run/netns/NAME) or a path to a
	// namespace file. Empty: the caller's namespace.
	NetNS string
	// Address is the IP kube-apiserver binds to and advertises. Default
	// 127.0.0.1. An unspecified address (0.0.0.0, ::) binds all addresses
	// and clients use loopback.
	Address string
	// BinDir holds kube-apiserver. Default: BinDir().
	BinDir string
	// Etcd is the etcd binary. Default: /usr/bin/etcd.
	Etcd string
	// ExtraAPIServerArgs are appended to kube-apiserver's flags (later
	// flags win), e.g. feature gates.
	ExtraAPIServerArgs []string
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	nsPath     string
	bindIP     net.IP
	clientHost string
	dataDir    string
	apiBin     string
	etcdBin    string
	apiArgs    []string
	etcdURL    string
	apiPort    int
	pki        *pki
	restConfig *rest.Config
	client     kubernetes.Interface
	kubeconfig string

	mu        sync.Mutex
	etcd      *process
	apiserver *process
	stopped   bool
}

// Start starts etcd and kube-apiserver and returns once /readyz answers ok.
// ctx bounds the startup only (two minutes when it has no deadline); the
// servers run until Stop. On failure everything started is torn down and
// the error carries the tail of the server logs.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	cp, err := newControlPlane(opts)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}
	if err := cp.start(ctx); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	return cp, nil
}

func newControlPlane(opts Options) (*ControlPlane, error) {
	nsPath, err := netnsPath(opts.NetNS)
	if err != nil {
		return nil, err
	}
	addr := opts.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	bindIP := net.ParseIP(addr)
	if bindIP == nil {
		return nil, fmt.Errorf("kubetest: Options.Address %q: not an IP address", opts.Address)
	}
	clientIP := bindIP
	if bindIP.IsUnspecified() {
		clientIP = net.IPv4(127, 0, 0, 1)
		if bindIP.To4() == nil {
			clientIP = net.IPv6loopback
		}
	}
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = BinDir(); err != nil {
			return nil, err
		}
	} else if err := checkBin(binDir, "kube-apiserver"); err != nil {
		return nil, fmt.Errorf("kubetest: Options.BinDir %q: %w; run `make kube-apiserver`", opts.BinDir, err)
	}
	etcdBin := opts.Etcd
	if etcdBin == "" {
		etcdBin = DefaultEtcd
	}
	if etcdBin, err = lookEtcd(etcdBin); err != nil {
		return nil, err
	}
	return &ControlPlane{
		nsPath:     nsPath,
		bindIP:     bindIP,
		clientHost: clientIP.String(),
		apiBin:     filepath.Join(binDir, "kube-apiserver"),
		apiArgs:    opts.ExtraAPIServerArgs,
		etcdBin:    etcdBin,
	}, nil
}

func (cp *ControlPlane) start(ctx context.Context) error {
	var err error
	// tmpfs when there is one: etcd fsyncs every write, and the data of a
	// test control plane is thrown away anyway.
	root := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		root = "/dev/shm"
	}
	if cp.dataDir, err = os.MkdirTemp(root, fmt.Sprintf("kubetest-%d-", os.Getpid())); err != nil {
		return fmt.Errorf("kubetest: data dir: %w", err)
	}
	cp.kubeconfig = filepath.Join(cp.dataDir, "kubeconfig")
	if err := setLoopbackUp(cp.nsPath); err != nil {
		return fmt.Errorf("kubetest: Options.NetNS: %w", err)
	}

	serveIPs := []net.IP{net.ParseIP(cp.clientHost), net.IPv4(127, 0, 0, 1), net.IPv6loopback,
		firstServiceIP()}
	if !cp.bindIP.IsUnspecified() {
		serveIPs = append(serveIPs, cp.bindIP)
	}
	if cp.pki, err = newPKI(filepath.Join(cp.dataDir, "pki"), serveIPs); err != nil {
		return fmt.Errorf("kubetest: pki: %w", err)
	}

	for attempt := 1; ; attempt++ {
		err := cp.startOnce(ctx)
		if err == nil {
			return nil
		}
		if attempt == bindAttempts || !errors.Is(err, errAddrInUse) || ctx.Err() != nil {
			return err
		}
		// Another process took a port between our choosing it and the
		// server binding it: choose again.
		cp.stopProcesses()
		os.RemoveAll(filepath.Join(cp.dataDir, "etcd"))
	}
}

var errAddrInUse = errors.New("address already in use")

// startOnce picks ports, starts etcd and kube-apiserver and waits for both.
func (cp *ControlPlane) startOnce(ctx context.Context) error {
	// Ports free on the wildcard address are free on every address, so one
	// set serves etcd on loopback and kube-apiserver on its address.
	wildcard := net.IPv4zero
	if cp.bindIP.To4() == nil {
		wildcard = net.IPv6unspecified
	}
	ports, err := freePorts(cp.nsPath, wildcard, 3)
	if err != nil {
		return fmt.Errorf("kubetest: choose ports: %w", err)
	}
	etcdClient, etcdPeer := ports[0], ports[1]
	cp.apiPort = ports[2]
	// Fail with a clear error when the address is not on an interface of
	// the namespace, rather than in kube-apiserver's log.
	if err := canListen(cp.nsPath, cp.bindIP, cp.apiPort); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			// Taken since it was chosen (the machine is shared): choose again.
			return fmt.Errorf("kubetest: port %d on %s: %w", cp.apiPort, cp.bindIP, errAddrInUse)
		}
		return fmt.Errorf("kubetest: Options.Address %s: cannot listen there: %w", cp.bindIP, err)
	}

	cp.etcdURL = "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdClient))
	peerURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdPeer))
	etcdArgs := []string{
		"--name=kubetest",
		"--data-dir=" + filepath.Join(cp.dataDir, "etcd"),
		"--listen-client-urls=" + cp.etcdURL,
		"--advertise-client-urls=" + cp.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubetest=" + peerURL,
		"--initial-cluster-state=new",
		// A single member on loopback: a short election timeout lets it
		// elect itself in ~0.1 s instead of ~1 s.
		"--heartbeat-interval=10",
		"--election-timeout=100",
		// kube-apiserver asks etcd for the current revision before serving
		// a watch or consistent list from its cache, and waits (up to 3 s,
		// then fails with "Too large resource version") until the cache of
		// that resource has caught up. Debian's etcd (3.4.23) is older than
		// 3.4.31, so kube-apiserver cannot request progress on demand, and
		// the cache of a resource nobody writes only moves on periodic
		// progress notifications: every 10 min by default.
		"--experimental-watch-progress-notify-interval=100ms",
		"--logger=zap",
		"--log-outputs=stderr",
	}
	etcd, err := startProcess("etcd", cp.nsPath, filepath.Join(cp.dataDir, "etcd.log"), cp.etcdBin, etcdArgs)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.etcd = etcd
	cp.mu.Unlock()

	httpc := &http.Client{Transport: &http.Transport{DialContext: dialer(cp.nsPath)}}
	err = waitUntil(ctx, []*process{etcd}, func(ctx context.Context) error {
		return httpGetOK(ctx, httpc, cp.etcdURL+"/health", `"health":"true"`)
	})
	httpc.CloseIdleConnections()
	if err != nil {
		return cp.startError("etcd", err, etcd)
	}

	if err := cp.setupClients(); err != nil {
		return err
	}
	if err := cp.startAPIServer(ctx); err != nil {
		return err
	}
	// kube-apiserver creates the default/kubernetes Service in the
	// background, possibly after /readyz is ok. Wait for it, so that every
	// test starts from the same objects and none sees it appear later.
	cp.mu.Lock()
	apiserver := cp.apiserver
	cp.mu.Unlock()
	err = waitUntil(ctx, []*process{etcd, apiserver}, func(ctx context.Context) error {
		_, err := cp.client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err
	})
	if err != nil {
		return cp.startError("default/kubernetes Service", err, etcd, apiserver)
	}
	return nil
}

// canListen checks that port can be bound on ip in the namespace.
func canListen(nsPath string, ip net.IP, port int) error {
	return inNetNS(nsPath, func() error {
		l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return l.Close()
	})
}

// firstServiceIP is the ClusterIP kube-apiserver gives the "kubernetes"
// Service: the first address of ServiceCIDR.
func firstServiceIP() net.IP {
	_, n, _ := net.ParseCIDR(ServiceCIDR)
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+1)
}

func (cp *ControlPlane) apiServerArgs() []string {
	reconciler := "lease"
	if cp.bindIP.IsLoopback() || cp.bindIP.IsUnspecified() {
		// The endpoints of the "kubernetes" Service may not be loopback
		// addresses; with nothing valid to publish, publish nothing.
		reconciler = "none"
	}
	args := []string{
		"--etcd-servers=" + cp.etcdURL,
		"--bind-address=" + cp.bindIP.String(),
		"--advertise-address=" + cp.clientHost,
		"--secure-port=" + strconv.Itoa(cp.apiPort),
		"--cert-dir=" + filepath.Join(cp.dataDir, "pki"),
		"--tls-cert-file=" + cp.pki.serveCertFile,
		"--tls-private-key-file=" + cp.pki.serveKeyFile,
		"--client-ca-file=" + cp.pki.caCertFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + cp.pki.saKeyFile,
		"--service-account-signing-key-file=" + cp.pki.saKeyFile,
		"--service-cluster-ip-range=" + ServiceCIDR + "," + ServiceCIDR6,
		"--service-node-port-range=" + NodePortRange,
		"--endpoint-reconciler-type=" + reconciler,
		// Not needed by tests, and each costs startup time.
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	return append(args, cp.apiArgs...)
}

func (cp *ControlPlane) setupClients() error {
	cp.restConfig = &rest.Config{
		Host: "https://" + net.JoinHostPort(cp.clientHost, strconv.Itoa(cp.apiPort)),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.pki.caCertPEM,
			CertData: cp.pki.adminCertPEM,
			KeyData:  cp.pki.adminKeyPEM,
		},
		UserAgent: "kubetest",
		// Tests and benchmarks write thousands of objects; the server,
		// not a client-side limiter, should be what they measure.
		QPS: -1,
	}
	if cp.nsPath != "" {
		cp.restConfig.Dial = dialer(cp.nsPath)
	}
	client, err := kubernetes.NewForConfig(cp.restConfig)
	if err != nil {
		return fmt.Errorf("kubetest: client: %w", err)
	}
	cp.client = client
	return writeKubeconfig(cp.kubeconfig, cp.restConfig.Host, cp.pki.caCertPEM, clientcmdapi.AuthInfo{
		ClientCertificateData: cp.pki.adminCertPEM,
		ClientKeyData:         cp.pki.adminKeyPEM,
	})
}

func writeKubeconfig(path, server string, caPEM []byte, auth clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["kubetest"] = &auth
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	cfg.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("kubetest: write kubeconfig: %w", err)
	}
	return nil
}

// startAPIServer starts kube-apiserver and waits until /readyz is ok.
func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	apiserver, err := startProcess("kube-apiserver", cp.nsPath, filepath.Join(cp.dataDir, "kube-apiserver.log"),
		cp.apiBin, cp.apiServerArgs())
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.apiserver = apiserver
	etcd := cp.etcd
	cp.mu.Unlock()

	httpc, err := rest.HTTPClientFor(cp.restConfig)
	if err != nil {
		return fmt.Errorf("kubetest: http client: %w", err)
	}
	err = waitUntil(ctx, []*process{etcd, apiserver}, func(ctx context.Context) error {
		return httpGetOK(ctx, httpc, cp.restConfig.Host+"/readyz", "ok")
	})
	httpc.CloseIdleConnections()
	if err != nil {
		return cp.startError("kube-apiserver", err, etcd, apiserver)
	}
	return nil
}

// startError wraps err with the log tails of procs, and marks a lost port
// race so that Start can retry.
func (cp *ControlPlane) startError(what string, err error, procs ...*process) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kubetest: %s did not become ready: %v", what, err)
	inUse := false
	for _, p := range procs {
		tail := logTail(p.logPath, logTailLines)
		if p.exited() && strings.Contains(tail, "address already in use") {
			inUse = true
		}
		fmt.Fprintf(&b, "\n--- %s (%s) last lines:\n%s", p.name, p.logPath, tail)
	}
	if inUse {
		return fmt.Errorf("%s: %w", b.String(), errAddrInUse)
	}
	return errors.New(b.String())
}

// waitUntil polls check until it succeeds, one of procs exits, or ctx ends.
func waitUntil(ctx context.Context, procs []*process, check func(context.Context) error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		for _, p := range procs {
			if p.exited() {
				return fmt.Errorf("%s exited: %v", p.name, p.err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last check: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func httpGetOK(ctx context.Context, c *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return nil
}

// RESTConfig returns a config for the admin user (group system:masters)
// with no client-side rate limit. When the control plane runs in a network
// namespace, the config dials from inside it, so it works from this
// process wherever it runs. Each call returns a fresh copy.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	return rest.CopyConfig(cp.restConfig)
}

// Client returns a clientset for the admin user. It keeps working across
// StopAPIServer/StartAPIServer.
func (cp *ControlPlane) Client() kubernetes.Interface {
	return cp.client
}

// Kubeconfig returns the path of a kubeconfig file for the admin user,
// pointing at the server's address: usable by a process running in the
// control plane's network namespace. It lives in the data directory, so it
// is gone after Stop.
func (cp *ControlPlane) Kubeconfig() string {
	return cp.kubeconfig
}

// URL is the API server's URL, e.g. https://127.0.0.1:41234.
func (cp *ControlPlane) URL() string {
	return cp.restConfig.Host
}

// CACert returns the PEM of the CA that signed the serving certificate.
func (cp *ControlPlane) CACert() []byte {
	return append([]byte(nil), cp.pki.caCertPEM...)
}

// DataDir is the directory holding etcd's data, the PKI, the kubeconfig
// and the server logs (etcd.log, kube-apiserver.log). Stop removes it.
func (cp *ControlPlane) DataDir() string {
	return cp.dataDir
}

// EtcdPID and APIServerPID return the process ids of the servers, 0 when
// not running. They are the servers themselves, also in a namespace.
func (cp *ControlPlane) EtcdPID() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return pidOf(cp.etcd)
}

// APIServerPID: see EtcdPID.
func (cp *ControlPlane) APIServerPID() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return pidOf(cp.apiserver)
}

func pidOf(p *process) int {
	if p == nil || p.exited() {
		return 0
	}
	return p.cmd.Process.Pid
}

// ServiceAccountConfig returns a config that authenticates with a fresh
// token (valid one hour) of the ServiceAccount namespace/name, creating the
// ServiceAccount when missing. Its rights are only what RBAC grants it, for
// tests of least-privilege access.
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	_, err := cp.client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kubetest: create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	expiry := int64(time.Hour / time.Second)
	tr, err := cp.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubetest: token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(cp.restConfig)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// WriteKubeconfig writes a kubeconfig file for cfg (from RESTConfig or
// ServiceAccountConfig) pointing at this control plane, for a process
// running in its network namespace.
func (cp *ControlPlane) WriteKubeconfig(path string, cfg *rest.Config) error {
	return writeKubeconfig(path, cp.restConfig.Host, cp.pki.caCertPEM, clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	})
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 15 s)
// and leaves etcd running, to simulate an API outage. It is a no-op when
// the API server is not running.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	p := cp.apiserver
	cp.apiserver = nil
	cp.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.stop(stopGrace)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same address and port with the same data, and waits until it is ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	switch {
	case cp.stopped:
		cp.mu.Unlock()
		return errors.New("kubetest: StartAPIServer: control plane is stopped")
	case cp.apiserver != nil && !cp.apiserver.exited():
		cp.mu.Unlock()
		return errors.New("kubetest: StartAPIServer: kube-apiserver is already running")
	}
	cp.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}
	if err := cp.startAPIServer(ctx); err != nil {
		// Leave nothing half started: the caller may try again.
		return errors.Join(err, cp.StopAPIServer())
	}
	return nil
}

// stopProcesses stops kube-apiserver, then etcd.
func (cp *ControlPlane) stopProcesses() error {
	errAPI := cp.StopAPIServer()
	cp.mu.Lock()
	etcd := cp.etcd
	cp.etcd = nil
	cp.mu.Unlock()
	var errEtcd error
	if etcd != nil {
		errEtcd = etcd.stop(stopGrace)
	}
	return errors.Join(errAPI, errEtcd)
}

// Stop kills kube-apiserver and etcd and removes the data directory. It is
// safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil
	}
	cp.stopped = true
	cp.mu.Unlock()
	err := cp.stopProcesses()
	if cp.dataDir != "" {
		err = errors.Join(err, os.RemoveAll(cp.dataDir))
	}
	return err
}
