package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// envKubeconfigHelper makes the test binary act as a client process: it
// lists the Services of the default namespace with the kubeconfig named by
// the variable and prints their names. The netns test runs it inside the
// namespace, like nftgate would run there.
const envKubeconfigHelper = "KUBETEST_HELPER_KUBECONFIG"

func TestMain(m *testing.M) {
	if path := os.Getenv(envKubeconfigHelper); path != "" {
		if err := listServicesWithKubeconfig(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func listServicesWithKubeconfig(path string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := client.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, s := range list.Items {
		fmt.Println("service", s.Name)
	}
	return nil
}

func TestControlPlane(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	cp := StartForTest(t, Options{})
	t.Logf("control plane ready after %v at %s", time.Since(begin).Round(time.Millisecond), cp.URL())
	logRSS(t, cp)

	ctx := t.Context()
	client := cp.Client()
	etcdPID, apiPID := cp.EtcdPID(), cp.APIServerPID()
	dataDir := cp.DataDir()

	// First, while nothing has written an EndpointSlice yet.
	t.Run("WatchIdleResource", func(t *testing.T) {
		watchSeesCreate(t, ctx, client)
	})

	t.Run("ServiceAndEndpointSlice", func(t *testing.T) {
		createAndReadBack(t, ctx, client)
	})

	t.Run("KubernetesServiceInServiceCIDR", func(t *testing.T) {
		svc, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := svc.Spec.ClusterIP, firstServiceIP().String(); got != want {
			t.Errorf("kubernetes Service ClusterIP = %s, want %s (first address of %s)", got, want, ServiceCIDR)
		}
	})

	t.Run("ServiceAccountLeastPrivilege", func(t *testing.T) {
		checkServiceAccount(t, ctx, cp)
	})

	t.Run("APIServerOutage", func(t *testing.T) {
		if err := cp.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		if pid := cp.APIServerPID(); pid != 0 {
			t.Fatalf("APIServerPID after StopAPIServer = %d, want 0", pid)
		}
		if processRunning(apiPID, "kube-apiserver") {
			t.Fatalf("kube-apiserver (pid %d) still running after StopAPIServer", apiPID)
		}
		if !processRunning(etcdPID, "etcd") {
			t.Fatalf("etcd (pid %d) stopped with the API server", etcdPID)
		}
		shortCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := client.CoreV1().Services("default").Get(shortCtx, "web", metav1.GetOptions{})
		cancel()
		if err == nil {
			t.Fatal("Get succeeded while the API server was stopped")
		}

		begin := time.Now()
		if err := cp.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("API server ready again after %v", time.Since(begin).Round(time.Millisecond))
		if err := cp.StartAPIServer(ctx); err == nil {
			t.Error("second StartAPIServer succeeded, want an error")
		}
		// The same client works again and sees the data kept in etcd.
		svc, err := client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Get after StartAPIServer: %v", err)
		}
		if !strings.HasPrefix(svc.Spec.ClusterIP, "198.19.") {
			t.Errorf("Service web ClusterIP after restart = %q", svc.Spec.ClusterIP)
		}
	})

	apiPID = cp.APIServerPID()
	if err := cp.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if processRunning(etcdPID, "etcd") {
		t.Errorf("etcd (pid %d) still running after Stop", etcdPID)
	}
	if processRunning(apiPID, "kube-apiserver") {
		t.Errorf("kube-apiserver (pid %d) still running after Stop", apiPID)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir %s after Stop: %v, want it gone", dataDir, err)
	}
	if err := cp.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := cp.StartAPIServer(ctx); err == nil {
		t.Error("StartAPIServer after Stop succeeded, want an error")
	}
}

func createAndReadBack(t *testing.T, ctx context.Context, client kubernetes.Interface) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
			}},
		},
	}
	created, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(created.Spec.ClusterIP)
	if err != nil || !netip.MustParsePrefix(ServiceCIDR).Contains(ip) {
		t.Errorf("ClusterIP %q not in %s", created.Spec.ClusterIP, ServiceCIDR)
	}
	if np := created.Spec.Ports[0].NodePort; np < 30000 || np > 32767 {
		t.Errorf("NodePort %d not in %s", np, NodePortRange)
	}

	ready := true
	port := int32(8080)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-1", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.244.0.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: &port}},
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	gotSvc, err := client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gotSvc.Spec.ClusterIP != created.Spec.ClusterIP || gotSvc.Spec.Ports[0].NodePort != created.Spec.Ports[0].NodePort ||
		gotSvc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service read back = %+v, want it as created %+v", gotSvc.Spec, created.Spec)
	}
	slices, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=web",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != 1 {
		t.Fatalf("EndpointSlices of web: %d, want 1", len(slices.Items))
	}
	got := slices.Items[0]
	if len(got.Endpoints) != 1 || got.Endpoints[0].Addresses[0] != "10.244.0.5" ||
		got.Endpoints[0].Conditions.Ready == nil || !*got.Endpoints[0].Conditions.Ready ||
		len(got.Ports) != 1 || *got.Ports[0].Port != 8080 || *got.Ports[0].Name != "http" {
		t.Errorf("EndpointSlice read back = %+v", got)
	}
}

// watchSeesCreate watches EndpointSlices, creates one and expects the watch
// to deliver it. A watch on a resource nobody has written is what breaks
// when kube-apiserver's watch cache cannot learn etcd's current revision.
func watchSeesCreate(t *testing.T, ctx context.Context, client kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	w, err := client.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "watch-probe", Namespace: "default"},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for ev := range w.ResultChan() {
		if got, ok := ev.Object.(*discoveryv1.EndpointSlice); ok && ev.Type == watch.Added && got.Name == "watch-probe" {
			return
		}
		t.Fatalf("watch delivered %s %v, want ADDED watch-probe", ev.Type, ev.Object)
	}
	t.Fatalf("watch ended without the created EndpointSlice: %v", ctx.Err())
}

func ptr[T any](v T) *T { return &v }

// checkServiceAccount grants a ServiceAccount read access to Services and
// EndpointSlices and checks that its token can do exactly that.
func checkServiceAccount(t *testing.T, ctx context.Context, cp *ControlPlane) {
	admin := cp.Client()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "service-reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader-service-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "service-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "reader"}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := cp.ServiceAccountConfig(ctx, "default", "reader")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CertData != nil || cfg.BearerToken == "" {
		t.Fatal("ServiceAccountConfig carries the admin certificate or no token")
	}
	reader, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("ServiceAccount list services: %v", err)
	}
	if _, err := reader.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("ServiceAccount list endpointslices: %v", err)
	}
	_, err = reader.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("ServiceAccount list secrets: %v, want Forbidden", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "not-allowed"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}},
	}
	_, err = reader.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("ServiceAccount create service: %v, want Forbidden", err)
	}
}

func TestControlPlaneInNetNS(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root")
	}
	ns := fmt.Sprintf("kubetest-%d-netns", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})

	// A non-loopback address, so kube-apiserver publishes itself as the
	// endpoint of the kubernetes Service as in a real cluster.
	const addr = "192.0.2.10"
	if out, err := exec.Command("ip", "-n", ns, "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}

	begin := time.Now()
	cp := StartForTest(t, Options{NetNS: ns, Address: addr})
	t.Logf("control plane in netns %s ready after %v at %s", ns, time.Since(begin).Round(time.Millisecond), cp.URL())

	// From this process the config reaches the server through the namespace.
	ctx := t.Context()
	if _, err := cp.Client().CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("client through the namespace: %v", err)
	}

	if !strings.HasPrefix(cp.URL(), "https://"+addr+":") {
		t.Errorf("URL = %s, want it on %s", cp.URL(), addr)
	}
	waitKubernetesEndpoint(t, ctx, cp, addr)

	// The server listens only inside the namespace.
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(cp.URL(), "https://"))
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 2*time.Second); err == nil {
		c.Close()
		t.Errorf("kube-apiserver port %s:%s reachable from outside its namespace", host, port)
	}
	if got, err := readNetNSOf(cp.APIServerPID()); err != nil || got != mustNetNSOf(t, "/run/netns/"+ns) {
		t.Errorf("kube-apiserver network namespace = %q (%v), want that of %s", got, err, ns)
	}

	// A process in the namespace can use the kubeconfig.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, self)
	cmd.Env = append(os.Environ(), envKubeconfigHelper+"="+cp.Kubeconfig())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client in the namespace with %s: %v\n%s", cp.Kubeconfig(), err, out)
	}
	if !strings.Contains(string(out), "service kubernetes\n") {
		t.Errorf("client in the namespace listed:\n%s\nwant the kubernetes Service", out)
	}

	// A least-privilege kubeconfig works there too.
	saCfg, err := cp.ServiceAccountConfig(ctx, "default", "in-netns")
	if err != nil {
		t.Fatal(err)
	}
	saKubeconfig := filepath.Join(t.TempDir(), "sa.kubeconfig")
	if err := cp.WriteKubeconfig(saKubeconfig, saCfg); err != nil {
		t.Fatal(err)
	}
	cmd = exec.CommandContext(ctx, "ip", "netns", "exec", ns, self)
	cmd.Env = append(os.Environ(), envKubeconfigHelper+"="+saKubeconfig)
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "forbidden") {
		t.Errorf("ServiceAccount without rights listing services: err=%v, output:\n%s\nwant forbidden", err, out)
	}
}

// waitKubernetesEndpoint waits until the EndpointSlice of the kubernetes
// Service, written by kube-apiserver's endpoint reconciler, names addr and
// the server's port.
func waitKubernetesEndpoint(t *testing.T, ctx context.Context, cp *ControlPlane, addr string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(cp.URL(), "https://"))
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		slices, err := cp.Client().DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=kubernetes",
		})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%+v", slices.Items)
		for _, slice := range slices.Items {
			if len(slice.Endpoints) == 1 && len(slice.Endpoints[0].Addresses) == 1 && slice.Endpoints[0].Addresses[0] == addr &&
				len(slice.Ports) == 1 && slice.Ports[0].Port != nil && strconv.Itoa(int(*slice.Ports[0].Port)) == port {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("EndpointSlice of the kubernetes Service never became %s:%s: %v; last seen: %s", addr, port, err, last)
	}
}

func readNetNSOf(pid int) (string, error) {
	return os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
}

func mustNetNSOf(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("net:[%d]", st.Ino)
}

func TestOptionsErrors(t *testing.T) {
	t.Parallel()
	empty := t.TempDir()
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"bad address", Options{Address: "localhost", BinDir: empty}, `Options.Address "localhost": not an IP address`},
		{"missing netns", Options{NetNS: "kubetest-no-such-ns"}, `Options.NetNS "kubetest-no-such-ns"`},
		{"empty bin dir", Options{BinDir: empty}, "make kube-apiserver"},
		{"missing etcd", Options{BinDir: fakeBinDir(t), Etcd: filepath.Join(empty, "etcd")}, "make kube-deps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, err := Start(t.Context(), tc.opts)
			if err == nil {
				cp.Stop()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start error = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// fakeBinDir holds an executable named kube-apiserver that is never run.
func fakeBinDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kube-apiserver"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestBinDirEnv(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(EnvBinDir, empty)
	_, err := BinDir()
	if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "make kube-apiserver") {
		t.Errorf("BinDir with empty %s: %v, want ErrBinariesMissing naming make kube-apiserver", EnvBinDir, err)
	}
	dir := fakeBinDir(t)
	t.Setenv(EnvBinDir, dir)
	if got, err := BinDir(); err != nil || got != dir {
		t.Errorf("BinDir = %q, %v; want %q", got, err, dir)
	}
	if _, err := KubeProxy(); !errors.Is(err, ErrBinariesMissing) {
		t.Errorf("KubeProxy without kube-proxy in %s: %v, want ErrBinariesMissing", dir, err)
	}
}

func TestStartErrorMarksPortRace(t *testing.T) {
	t.Parallel()
	log := filepath.Join(t.TempDir(), "server.log")
	p, err := startProcess("server", "", log, "/bin/sh",
		[]string{"-c", "echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2; exit 1"})
	if err != nil {
		t.Fatal(err)
	}
	<-p.done
	cp := &ControlPlane{}
	err = cp.startError("server", errors.New("exited"), p)
	if !errors.Is(err, errAddrInUse) {
		t.Errorf("startError = %v, want it to wrap errAddrInUse", err)
	}
	if !strings.Contains(err.Error(), "bind: address already in use") || !strings.Contains(err.Error(), log) {
		t.Errorf("startError = %q, want the log tail and path", err)
	}
}

// processRunning reports whether pid is alive and still the named program
// (a pid can be reused once the process is gone).
func processRunning(pid int, name string) bool {
	if pid == 0 {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	argv0, _, _ := strings.Cut(string(cmdline), "\x00")
	return filepath.Base(argv0) == name
}

func logRSS(t *testing.T, cp *ControlPlane) {
	for _, p := range []struct {
		name string
		pid  int
	}{{"etcd", cp.EtcdPID()}, {"kube-apiserver", cp.APIServerPID()}} {
		status, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/status")
		if err != nil {
			t.Logf("%s: %v", p.name, err)
			continue
		}
		for line := range strings.Lines(string(status)) {
			if strings.HasPrefix(line, "VmRSS:") {
				t.Logf("%s resident memory: %s", p.name, strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:")))
			}
		}
	}
}
