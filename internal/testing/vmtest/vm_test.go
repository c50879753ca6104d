package vmtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftgate/nftgate/internal/testing/repo"
)

// The addresses of testdata/network.json, which the test image is
// built with: eth0 faces the client namespace, eth1 the cluster namespace.
const (
	vmClientAddr  = "10.123.1.1"
	clientAddr    = "10.123.1.2/24"
	vmClusterAddr = "10.123.2.1"
	clusterAddr   = "10.123.2.2/24"
	clusterIP     = "10.123.2.2"
)

// testImage returns the image and what its build made for the operator.
// `make vmtest` builds them and passes their paths in the environment; a
// plain `go test` builds them through the same make target.
func testImage(t *testing.T) (image string, a access) {
	t.Helper()
	root := repo.Path(t)
	image = os.Getenv("NFTGATE_VMTEST_IMAGE")
	if image == "" {
		if _, err := os.Stat(filepath.Join(root, "mk", "image.mk")); err != nil {
			t.Fatalf("repository root not found above the vmtest package: %v", err)
		}
		cmd := exec.Command("make", "-C", root, "vmtest-image")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make vmtest-image: %v\n%s", err, out)
		}
		t.Logf("make vmtest-image:\n%s", out)
		image = filepath.Join(root, "build", "nftgate-vmtest.img")
	}
	return image, loadAccess(t, root)
}

func newNetns(t *testing.T, role string) *Netns {
	t.Helper()
	n, err := NewNetns(role)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("removing namespace %s: %v", n.Name, err)
		}
	})
	return n
}

// bootVM starts the image with eth0 in client and eth1 in cluster, and
// stops it (showing the console on failure) when the test ends.
func bootVM(t *testing.T, image string, client, cluster *Netns) *VM {
	t.Helper()
	return startVM(t, Config{
		Image: image,
		NICs: []NIC{
			{Netns: client, Tap: "vm-eth0", MAC: "52:54:00:12:01:01"},
			{Netns: cluster, Tap: "vm-eth1", MAC: "52:54:00:12:02:01"},
		},
	}, func() error {
		for _, step := range []error{
			client.AddrAdd("vm-eth0", clientAddr),
			client.RouteAdd("0.0.0.0/0", vmClientAddr),
			cluster.AddrAdd("vm-eth1", clusterAddr),
			cluster.RouteAdd("0.0.0.0/0", vmClusterAddr),
		} {
			if step != nil {
				return step
			}
		}
		return nil
	})
}

// kernelStartedInit is what the guest kernel prints when it hands over to
// gokrazy.
const kernelStartedInit = "Run /gokrazy/init as init process"

// startVM starts QEMU with cfg (its serial log in a temporary directory),
// runs wire once the taps exist, and waits until the kernel has started
// gokrazy's init. Under emulation the guest kernel now and then stops for
// good early in its boot: the console ends about 2-3 s in, around the
// serial driver's start, and nothing follows for minutes. Such a boot is
// abandoned and the VM started again, at most three times in all. The
// VM is stopped when the test ends.
func startVM(t *testing.T, cfg Config, wire func() error) *VM {
	t.Helper()
	// Legacy BIOS by default (faster); NFTGATE_VMTEST_UEFI=1 boots
	// through OVMF like most current PC hardware.
	cfg.UEFI = os.Getenv("NFTGATE_VMTEST_UEFI") == "1"
	const attempts = 3
	for attempt := 1; ; attempt++ {
		cfg.SerialLog = filepath.Join(t.TempDir(), "serial.log")
		vm, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := wire(); err != nil {
			vm.Stop()
			t.Fatal(err)
		}
		// A normal boot reaches init 10-15 s after QEMU starts, 45 s
		// on a heavily loaded host.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, err = vm.WaitConsole(ctx, 0, kernelStartedInit)
		cancel()
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() || os.Getenv("NFTGATE_VMTEST_SHOW_CONSOLE") != "" {
					t.Logf("console:\n%s", vm.Console(12000))
				}
				if err := vm.Stop(); err != nil {
					t.Error(err)
				}
			})
			if attempt > 1 {
				t.Logf("boot attempt %d reached init", attempt)
			}
			return vm
		}
		t.Logf("boot attempt %d of %d: %v; console:\n%s", attempt, attempts, err, vm.Console(1500))
		if err := vm.Stop(); err != nil {
			t.Error(err)
		}
		if attempt == attempts {
			t.Fatalf("the guest kernel never started init in %d boots", attempts)
		}
	}
}

// TestAppliance boots the demo image (manifests baked in), checks the web
// interface, forwarding, and that nftgate serves its manifests. Updates are
// checked by TestApplianceWithAPI.
func TestAppliance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and tap devices")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatalf("qemu-system-x86_64 not installed (make vmtest-deps installs it): %v", err)
	}
	image, acc := testImage(t)
	client := newNetns(t, "client")
	cluster := newNetns(t, "cluster")
	vm := bootVM(t, image, client, cluster)

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	// gokrazy's web interface lists the supervised programs: the image
	// must contain nftgate and the network setup program. It answers
	// over HTTPS with the build's certificate, and only with the password
	// the build generated.
	status := checkGokrazyAccess(ctx, t, vm, client, acc, vmClientAddr)
	t.Logf("gokrazy web interface answered %.1f s after QEMU started", time.Since(vm.Started).Seconds())
	for _, want := range []string{"/user/nftgate", "/user/netconfig"} {
		if !strings.Contains(status, want) {
			t.Errorf("gokrazy status page does not list %s", want)
		}
	}

	// A server in the cluster namespace, reached from the client namespace
	// only through the VM: this holds only if netconfig configured eth1
	// and switched on forwarding, which gokrazy boots with off.
	ln, err := cluster.Listen("tcp", net.JoinHostPort(clusterIP, "8080"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "cluster saw "+r.RemoteAddr)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	checkForwarding(ctx, t, vm, client)

	// nftgate runs on the manifests baked into the image and is ready,
	// over HTTPS with a certificate it made, behind the build's password.
	statusAddr := net.JoinHostPort(vmClientAddr, "9180")
	pinned, _ := pinStatusCertificate(ctx, t, vm, client, statusAddr)
	checkStatusAccess(ctx, t, vm, client, pinned, acc, statusAddr)
	if _, err := vm.WaitHTTP(ctx, pinned, "https://"+statusAddr+"/api/v1/status", "admin", acc.nftgatePassword, func(code int, body string) error {
		var st statusJSON
		if code != http.StatusOK {
			return fmt.Errorf("status %d", code)
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err
		}
		if st.Identity.Source != "manifests:/etc/nftgate/manifests" || !st.Sync.FirstSyncDone {
			return fmt.Errorf("source %q, firstSyncDone %v", st.Identity.Source, st.Sync.FirstSyncDone)
		}
		return nil
	}); err != nil {
		t.Fatalf("nftgate on the baked-in manifests: %v", err)
	}
	// The stock kernel has no conntrack marks: nftgate runs without the
	// release of the endpoints' TIME_WAIT, which needs them, and answers
	// refused SYNs, which does not (its resets are counted).
	if _, err := vm.WaitHTTP(ctx, pinned, "https://"+statusAddr+"/metrics", "admin", acc.nftgatePassword, func(code int, body string) error {
		if code != http.StatusOK {
			return fmt.Errorf("status %d", code)
		}
		if !strings.Contains(body, `nftgate_time_wait_resets_total{reason="refused"}`) {
			return errors.New(`no nftgate_time_wait_resets_total{reason="refused"}: the answer to refused SYNs is off`)
		}
		if strings.Contains(body, `nftgate_time_wait_resets_total{reason="released"}`) {
			return errors.New(`nftgate_time_wait_resets_total{reason="released"} on a kernel without conntrack marks`)
		}
		return nil
	}); err != nil {
		t.Fatalf("metrics on the stock kernel: %v", err)
	}
}

func statusOK(code int, body string) error {
	if code != http.StatusOK {
		return fmt.Errorf("status %d", code)
	}
	return nil
}

// consoleAt returns the rest of the console line starting at off.
func consoleAt(t *testing.T, vm *VM, off int64) string {
	t.Helper()
	b, err := os.ReadFile(vm.cfg.SerialLog)
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b[off:]), "\n")
	return strings.TrimSpace(line)
}

// checkForwarding fetches from the cluster namespace's server through the VM.
func checkForwarding(ctx context.Context, t *testing.T, vm *VM, client *Netns) {
	t.Helper()
	body, err := vm.WaitHTTP(ctx, client.HTTPClient(5*time.Second), "http://"+net.JoinHostPort(clusterIP, "8080")+"/", "", "", statusOK)
	if err != nil {
		t.Fatalf("forwarding through the VM: %v", err)
	}
	// No NAT on the way: the cluster side sees the client's own address.
	if !strings.HasPrefix(body, "cluster saw 10.123.1.2:") {
		t.Errorf("forwarded request: body %q, want it to come from 10.123.1.2", body)
	}
}
