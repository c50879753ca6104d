package vmtest

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftgate/nftgate/internal/testing/bird"
	"github.com/nftgate/nftgate/internal/testing/lab"
)

// The upstream side of the API test: the client namespace, on the VM's
// eth0, is also the upstream router (BIRD, peering with the VM), and an
// outside client namespace behind it has no route but the router. The
// LoadBalancer address comes from the pool of the VM's nftgate; the
// router learns it from the VM by BGP and installs it in its kernel, so
// neither namespace has a static route to it.
const (
	routerASN      = 64512
	vmASN          = 64513
	routerAddr     = "10.123.1.2" // clientAddr without its length
	routerOutAddr  = "10.123.3.1/24"
	outsideAddr    = "10.123.3.2/24"
	outsideGateway = "10.123.3.1"
	// The pool's first address is the one the Service gets.
	lbPool = "203.0.113.10-203.0.113.14"
)

var lbRoute = netip.MustParsePrefix(lbIP + "/32")

// edgeConfig is the part of the VM's config.toml that makes it an edge:
// the pool and the BGP session with the router. The restart time is long
// because the update in the test reboots the VM, which under emulation on
// a loaded host takes minutes; the router keeps the routes meanwhile.
func edgeConfig() string {
	return fmt.Sprintf(`
[bgp]
asn = %d
router_id = %q
restart_time = "600s"
restart_deferral = "1s"

[[bgp.peer]]
address = %q
asn = %d
hold_time = "9s"
connect_retry = "1s"

[[pools]]
name = "vmtest"
addresses = [%q]
`, vmASN, vmClientAddr, routerAddr, routerASN, lbPool)
}

// startUpstream links the outside namespace to the router namespace and
// starts BIRD there, peering with the VM's eth0. Call it once the VM's
// tap exists in router.
func startUpstream(t *testing.T, router, outside *Netns) *bird.Router {
	t.Helper()
	if err := router.AddVeth("to-outside", []string{routerOutAddr}, outside, "to-router", []string{outsideAddr}); err != nil {
		t.Fatal(err)
	}
	if err := outside.RouteAdd("0.0.0.0/0", outsideGateway); err != nil {
		t.Fatal(err)
	}
	host, err := lab.OpenHost(router.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	if err := host.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	return bird.Start(t, host, bird.Upstream(netip.MustParseAddr(routerAddr), routerASN,
		netip.MustParseAddr(vmClientAddr), netip.Addr{}, vmASN, ""))
}

// waitIngress waits until status.loadBalancer.ingress of default/web is
// exactly ip, written by the VM's nftgate.
func waitIngress(ctx context.Context, t *testing.T, vm *VM, c kubernetes.Interface, ip string) {
	t.Helper()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		svc, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err == nil {
			in := svc.Status.LoadBalancer.Ingress
			if len(in) == 1 && in[0].IP == ip {
				return
			}
			last = fmt.Sprintf("ingress %+v", in)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Service default/web never got %s in status.loadBalancer.ingress (last: %s)", ip, last)
		case <-vm.Done():
			t.Fatalf("QEMU exited before default/web got its address (last: %s)", last)
		case <-tick.C:
		}
	}
}

// routeWatch polls BIRD's table for a prefix until Stop, counting the
// polls that did not find it.
type routeWatch struct {
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	polls    int
	missing  int
	firstErr error
}

func watchRoute(b *bird.Router, prefix netip.Prefix) *routeWatch {
	w := &routeWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			has, err := b.HasRoute(prefix)
			w.mu.Lock()
			w.polls++
			if err != nil && w.firstErr == nil {
				w.firstErr = err
			}
			if err == nil && !has {
				w.missing++
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// Stop ends the watch and returns how many polls ran and how many of
// them found no route.
func (w *routeWatch) Stop() (polls, missing int, err error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polls, w.missing, w.firstErr
}

// refused checks that a connection from ns to addr fails: the router no
// longer has a route to the address.
func refused(ctx context.Context, t *testing.T, ns *Netns, addr string) {
	t.Helper()
	if b, _, err := fetch(ctx, ns, addr); err == nil {
		t.Errorf("%s answered by %s after its route was withdrawn", addr, b)
	}
}
