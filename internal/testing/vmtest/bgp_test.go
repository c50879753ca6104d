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
		netip.MustParseAddr(vmClientAddr), netip.Addr{}, vmASN, "debug { states, routes };"))
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

// routeWatch polls BIRD for a prefix and the state of a session until
// Stop: graceful restart is right when no poll that saw the session down
// found the route missing.
type routeWatch struct {
	stop chan struct{}
	done chan struct{}

	mu          sync.Mutex
	polls       int
	down        int         // polls that saw the session not Established
	downMissing int         // of those, polls without the route
	upGaps      []time.Time // polls without the route, session up
	firstErr    error
}

func watchRoute(b *bird.Router, protocol string, prefix netip.Prefix) *routeWatch {
	w := &routeWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			// The route first: BIRD flushes stale routes only once the
			// session is up again, so a route missing here with the
			// session down at the next read was missing while it was
			// down.
			has, err := b.HasRoute(prefix)
			var state string
			if err == nil {
				state, err = b.ProtocolState(protocol)
			}
			w.mu.Lock()
			switch {
			case err != nil:
				if w.firstErr == nil {
					w.firstErr = err
				}
			case state != "Established":
				w.polls++
				w.down++
				if !has {
					w.downMissing++
				}
			default:
				w.polls++
				if !has {
					w.upGaps = append(w.upGaps, time.Now())
				}
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

// Stop ends the watch and checks that the session went down and BIRD
// kept the route all the while, also once the session was up again: a
// speaker that sent End-of-RIB before its first sync had announced the
// route made the router flush it until that sync.
func (w *routeWatch) Stop(t *testing.T, prefix netip.Prefix) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.firstErr != nil {
		t.Errorf("watching BIRD during the update: %v", w.firstErr)
	}
	if w.down == 0 {
		t.Errorf("BIRD's session never went down in %d polls during the update", w.polls)
	}
	if w.downMissing > 0 {
		t.Errorf("BIRD lost %s in %d of %d polls while the session was down: graceful restart did not keep it", prefix, w.downMissing, w.down)
	} else {
		t.Logf("during the update: the session down in %d of %d polls (every 250 ms), %s kept all the while", w.down, w.polls, prefix)
	}
	if n := len(w.upGaps); n > 0 {
		const layout = "15:04:05.000"
		t.Errorf("with the session up, %s missing in %d polls (%s to %s)",
			prefix, n, w.upGaps[0].Format(layout), w.upGaps[n-1].Format(layout))
	}
}

// refused checks that a connection from ns to addr fails: the router no
// longer has a route to the address.
func refused(ctx context.Context, t *testing.T, ns *Netns, addr string) {
	t.Helper()
	if b, _, err := fetch(ctx, ns, addr); err == nil {
		t.Errorf("%s answered by %s after its route was withdrawn", addr, b)
	}
}
