package e2e_test

// End-to-end tests of which external addresses the gateway serves: an
// externalIP is a claim any Service author can make on any address routed
// through the box, so the gateway serves them only inside external_ip_cidrs,
// and never its own or special addresses.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftgate/nftgate/internal/testing/lab"
	"github.com/nftgate/nftgate/internal/testing/lab/gatewaytest"
	"github.com/nftgate/nftgate/internal/testing/lab/labtest"
)

// serviceWarnings reads one Service's warnings from the API.
func serviceWarnings(g *gatewaytest.Gateway, namespace, name string) ([]string, error) {
	code, body, err := g.Get("/api/v1/services/" + namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET service %s/%s: %d %s", namespace, name, code, body)
	}
	var s struct {
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		return nil, err
	}
	return s.Warnings, nil
}

// awaitWarnings waits until the Service's warnings are exactly as many as
// want, each containing the corresponding text.
func awaitWarnings(t *testing.T, g *gatewaytest.Gateway, namespace, name string, want ...string) []string {
	t.Helper()
	var got []string
	err := lab.EventuallyWithin(10*time.Second, func() error {
		var err error
		if got, err = serviceWarnings(g, namespace, name); err != nil {
			return err
		}
		if len(got) != len(want) {
			return fmt.Errorf("warnings %q, want %d of them", got, len(want))
		}
		for i, w := range want {
			if !strings.Contains(got[i], w) {
				return fmt.Errorf("warning %d is %q, want it to say %q", i, got[i], w)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("service %s/%s: %v", namespace, name, err)
	}
	return got
}

// awaitSyncs waits until the gateway has made n more syncs.
func awaitSyncs(t *testing.T, g *gatewaytest.Gateway, n uint64) {
	t.Helper()
	syncs := func() (uint64, error) {
		_, body, err := g.Get("/api/v1/status")
		if err != nil {
			return 0, err
		}
		var st struct {
			Sync struct {
				Syncs uint64 `json:"syncs"`
			} `json:"sync"`
		}
		return st.Sync.Syncs, json.Unmarshal([]byte(body), &st)
	}
	start, err := syncs()
	if err != nil {
		t.Fatal(err)
	}
	err = lab.EventuallyWithin(time.Duration(n+5)*2*time.Second, func() error {
		now, err := syncs()
		if err == nil && now < start+n {
			err = fmt.Errorf("%d syncs since, want %d", now-start, n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestExternalIPCannotHijackAnotherHost: a Service naming another host's
// address as an externalIP took over every connection to it through the
// gateway. By default no externalIP is served; the rest of the Service is.
func TestExternalIPCannotHijackAnotherHost(t *testing.T) {
	topo := labtest.Gateway(t)
	victim := netip.AddrPortFrom(topo.BackendIPv4[0], 2222) // a real host's SSH, say
	gatewaytest.Serve(t, topo.Backend, "tcp", victim, ap("198.18.2.11:8080"))

	svc := gatewaytest.Service("evil", "hijack", "ClusterIP", []string{"198.19.0.90"}, gatewaytest.Port{Name: "ssh", Port: 2222})
	svc.Spec.ExternalIPs = []string{victim.Addr().String()}
	slice := gatewaytest.Slice("evil", "hijack-1", "hijack", "ssh", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"})

	t.Run("default serves no externalIP", func(t *testing.T) {
		g := gatewaytest.New(t, topo)
		g.Write("hijack.yaml", svc, slice)
		g.Start()
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", victim, 5), victim.String())
		// The rest of the Service is served.
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.90:2222"), 3), "198.18.2.11:8080")
		ws := awaitWarnings(t, g, "evil", "hijack", "externalIP "+victim.Addr().String())
		if !strings.Contains(ws[0], "external_ip_cidrs") {
			t.Errorf("warning %q does not say how to serve it", ws[0])
		}
		if !strings.Contains(g.Logs(), "externalIP "+victim.Addr().String()) {
			t.Errorf("the refused externalIP is not logged:\n%s", g.Logs())
		}
	})
	t.Run("served inside external_ip_cidrs", func(t *testing.T) {
		g := gatewaytest.New(t, topo, "--external-ip-cidr", "198.18.2.0/28")
		g.Write("hijack.yaml", svc, slice)
		g.Start()
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", victim, 5), "198.18.2.11:8080")
		awaitWarnings(t, g, "evil", "hijack")
	})
}

// TestSpecialAddressesAreNeverServed: whatever external_ip_cidrs allows,
// the gateway's own addresses and loopback, link-local, multicast,
// unspecified and broadcast addresses are neither externalIPs nor
// LoadBalancer IPs; each is named in a warning, and the rest is served.
func TestSpecialAddressesAreNeverServed(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.11:8080"))
	refused := []string{"127.0.0.1", "169.254.10.1", "224.0.0.5", "0.0.0.0", "255.255.255.255",
		"::1", "fe80::1", "ff02::1", topo.GatewayClientIPv4.String(), "198.18.1.255", topo.GatewayBackendIPv6.String()}
	svc := gatewaytest.Service("default", "special", "LoadBalancer", []string{"198.19.0.91", "fd42:ff::91"},
		gatewaytest.Port{Name: "http", Port: 80, NodePort: 30091})
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	svc.Spec.ExternalIPs = append(append([]string{}, refused...), "198.19.1.91")
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: topo.GatewayBackendIPv4.String()}, {IP: "127.0.0.2"}, {IP: "198.19.1.92"}}
	slice := gatewaytest.Slice("default", "special-1", "special", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"})

	g := gatewaytest.New(t, topo, "--external-ip-cidr", "0.0.0.0/0", "--external-ip-cidr", "::/0")
	g.Write("special.yaml", svc, slice)
	g.Start()

	var want []string
	for _, a := range refused {
		want = append(want, "externalIP "+a+" ")
	}
	want = append(want, "loadBalancer IP "+topo.GatewayBackendIPv4.String()+" ", "loadBalancer IP 127.0.0.2 ")
	ws := awaitWarnings(t, g, "default", "special", want...)
	for _, w := range ws {
		if !strings.Contains(w, "not served") {
			t.Errorf("warning %q does not say the address is not served", w)
		}
	}
	for _, dst := range []string{"198.19.1.91:80", "198.19.1.92:80", "198.19.0.91:80"} {
		wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap(dst), 3), "198.18.2.11:8080")
	}
	// The gateway's own address keeps its own meaning: nothing listens
	// on port 80 there, so the connection is refused, not proxied.
	if _, err := topo.Client.Dial("tcp", netip.AddrPortFrom(topo.GatewayClientIPv4, 80), lab.DialOpts{Timeout: 3 * time.Second}); !lab.IsRefused(err) {
		t.Errorf("the gateway's own address, port 80: got %v, want refused", err)
	}
	ruleset := g.Nft("list", "ruleset")
	programmed := func(a string) bool {
		return regexp.MustCompile(`(^|[\s{,])` + regexp.QuoteMeta(a) + ` \. `).MatchString(ruleset)
	}
	for _, a := range append(refused, topo.GatewayBackendIPv4.String(), "127.0.0.2") {
		if programmed(a) {
			t.Errorf("%s is programmed:\n%s", a, ruleset)
		}
	}
	for _, a := range []string{"198.19.1.91", "198.19.1.92", "fd42:ff::91"} {
		if !programmed(a) {
			t.Errorf("%s is not programmed:\n%s", a, ruleset)
		}
	}
}

// TestOwnAddressesFollowTheInterfaces: an address the gateway takes at
// run time stops being served as an externalIP at once, and is served
// again when the gateway lets it go.
func TestOwnAddressesFollowTheInterfaces(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.11:8080"))
	svc := gatewaytest.Service("default", "moving", "ClusterIP", []string{"198.19.0.93"}, gatewaytest.Port{Name: "http", Port: 80})
	svc.Spec.ExternalIPs = []string{"198.19.1.93"}
	slice := gatewaytest.Slice("default", "moving-1", "moving", "http", "", 8080, gatewaytest.Endpoint{Addr: "198.18.2.11"})
	g := gatewaytest.New(t, topo, "--external-ip-cidr", "198.19.1.0/24")
	g.Write("moving.yaml", svc, slice)
	g.Start()
	ext := ap("198.19.1.93:80")
	wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ext, 3), "198.18.2.11:8080")
	awaitWarnings(t, g, "default", "moving")

	own := netip.MustParsePrefix("198.19.1.93/32")
	if err := topo.Gateway.AddAddress(topo.GatewayClientIface, own); err != nil {
		t.Fatal(err)
	}
	awaitWarnings(t, g, "default", "moving", "externalIP 198.19.1.93 ")
	err := lab.EventuallyWithin(10*time.Second, func() error {
		_, err := topo.Client.Dial("tcp", ext, lab.DialOpts{Timeout: time.Second})
		if !lab.IsRefused(err) {
			return fmt.Errorf("got %v, want refused by the gateway itself", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	link, err := topo.Gateway.Netlink().LinkByName(topo.GatewayClientIface)
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.Gateway.Netlink().AddrDel(link, &netlink.Addr{IPNet: &net.IPNet{IP: own.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	awaitWarnings(t, g, "default", "moving")
	if err := awaitBackend(t, topo.Client, ext, "198.18.2.11:8080", 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestExternalIPConflictOlderWins: two Services claim one address,
// protocol and port. The older keeps it whichever arrives first, and the
// other says which Service holds it.
func TestExternalIPConflictOlderWins(t *testing.T) {
	topo := labtest.Gateway(t)
	gatewaytest.Serve(t, topo.Backend, "tcp", ap("198.18.2.11:8080"), ap("198.18.2.12:8080"))
	now := time.Now()
	mk := func(ns string, created time.Time, cip, ep string) []any {
		s := gatewaytest.Service(ns, "web", "ClusterIP", []string{cip}, gatewaytest.Port{Name: "http", Port: 80})
		s.CreationTimestamp = metav1.NewTime(created)
		s.Spec.ExternalIPs = []string{"198.19.1.94"}
		return []any{s, gatewaytest.Slice(ns, "web-1", "web", "http", "", 8080, gatewaytest.Endpoint{Addr: ep})}
	}
	// "zz" is older, so it wins although "aa" comes first by name.
	older := mk("zz", now.Add(-time.Hour), "198.19.0.94", "198.18.2.11")
	newer := mk("aa", now, "198.19.0.95", "198.18.2.12")
	ext := ap("198.19.1.94:80")
	for _, order := range []struct {
		name          string
		first, second []any
		olderFile     string
	}{{"older first", older, newer, "first.yaml"}, {"newer first", newer, older, "second.yaml"}} {
		t.Run(order.name, func(t *testing.T) {
			g := gatewaytest.New(t, topo, "--external-ip-cidr", "198.19.1.0/24", "--reconcile-interval", "1s")
			g.Write("first.yaml", order.first...)
			g.Start()
			g.Write("second.yaml", order.second...)
			ws := awaitWarnings(t, g, "aa", "web", "198.19.1.94 . tcp . 80")
			if !strings.Contains(ws[0], "service zz/web") {
				t.Errorf("warning %q does not name the Service that holds the address", ws[0])
			}
			awaitWarnings(t, g, "zz", "web")
			if err := awaitBackend(t, topo.Client, ext, "198.18.2.11:8080", 10*time.Second); err != nil {
				t.Fatal(err)
			}
			wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ext, 10), "198.18.2.11:8080")
			// The loser's ClusterIP is served all the same.
			wantBackends(t, gatewaytest.Backends(t, topo.Client, "tcp", ap("198.19.0.95:80"), 3), "198.18.2.12:8080")
			// The conflict is logged once, not on every sync.
			awaitSyncs(t, g, 3)
			if n := strings.Count(g.Logs(), "already used by service zz/web"); n != 1 {
				t.Errorf("the conflict is logged %d times, want once:\n%s", n, g.Logs())
			}
			// When the winner goes, the other takes the address and
			// its warning goes.
			g.Remove(order.olderFile)
			awaitWarnings(t, g, "aa", "web")
			if err := awaitBackend(t, topo.Client, ext, "198.18.2.12:8080", 10*time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
}
