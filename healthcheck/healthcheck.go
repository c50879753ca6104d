// Package healthcheck serves the healthCheckNodePort of Services with
// externalTrafficPolicy Local, as kube-proxy does: one HTTP server per
// Service, on the gateway's addresses, answering 200 while this node has
// ready local endpoints for it and 503 otherwise, so that an upstream load
// balancer sends its traffic only to nodes that will not drop it.
//
// The sync loop hands it the Services it programmed (Update, which never
// blocks on the network); Run opens and closes the listeners on its own
// goroutine and retries ports it could not bind.
package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/nftgate/nftgate/appliance/httpserver"
	"github.com/nftgate/nftgate/model"
)

// DefaultRetryInterval is how long a port that could not be bound waits
// before the next attempt.
const DefaultRetryInterval = 2 * time.Second

// Server runs the health check servers of every Service that has one.
type Server struct {
	// NodeName is this gateway's node: endpoints on it are local.
	NodeName string
	// Healthy reports whether the proxy itself is healthy
	// (serviceProxyHealthy); nil means always. A Service with local
	// endpoints still answers 503 while the proxy is unhealthy.
	Healthy func() bool
	Log     *slog.Logger
	// Listen opens a listener; nil means net.Listen. The address is
	// ":port", every address of the gateway in both families.
	Listen func(network, address string) (net.Listener, error)
	// RetryInterval spaces attempts to bind a port that failed; zero means
	// DefaultRetryInterval.
	RetryInterval time.Duration
	// Limits bound each connection's time and header size; zero fields
	// take httpserver.Default's values.
	Limits httpserver.Limits

	mu       sync.RWMutex
	services map[model.ServiceKey]*service // Services that want a server
	kick     chan struct{}
	once     sync.Once
}

// service is one Service's health check: its port and its local ready
// endpoints per family.
type service struct {
	port           uint16
	local4, local6 int
}

// instance is one open listener and its HTTP server.
type instance struct {
	port uint16
	srv  *http.Server
	done chan struct{}
}

func (s *Server) init() {
	s.once.Do(func() {
		s.kick = make(chan struct{}, 1)
		if s.services == nil {
			s.services = map[model.ServiceKey]*service{}
		}
	})
}

// Update applies the programmed state of the changed Services (nil: the
// Service is gone). Counts take effect at once; listeners are opened and
// closed by Run. It never blocks, so the sync loop can call it directly.
func (s *Server) Update(changed map[model.ServiceKey]*model.Service) {
	s.init()
	s.mu.Lock()
	for k, m := range changed {
		port, local4, local6 := Wanted(m, s.NodeName)
		if port == 0 {
			delete(s.services, k)
			continue
		}
		cur := s.services[k]
		if cur == nil {
			cur = &service{}
			s.services[k] = cur
		}
		cur.port, cur.local4, cur.local6 = port, local4, local6
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default: // a reconcile is already pending; it will see this change
	}
}

// Wanted tells which health check port a Service needs (zero: none) and how
// many ready endpoints of each family it has on node. As in kube-proxy only LoadBalancer
// Services with externalTrafficPolicy Local have one (a healthCheckNodePort
// on another type, possible in a hand-written manifest, is ignored), and it
// counts distinct addresses over all ports, and only ready ones: a node
// whose local endpoints are all terminating fails the check, so that the
// load balancer drains it. Families are counted apart because kube-proxy
// runs one proxier per family: a check over IPv4 reports IPv4 endpoints.
func Wanted(m *model.Service, node string) (port uint16, local4, local6 int) {
	if m == nil || m.HealthCheckNodePort == 0 || !m.ExternalLocal || m.Type != model.TypeLoadBalancer {
		return 0, 0, 0
	}
	seen := map[netip.Addr]bool{}
	for _, p := range m.Ports {
		for _, e := range p.Endpoints {
			if a := e.Addr(); e.Ready && node != "" && e.Place.Node() == node && !seen[a] {
				seen[a] = true
				if a.Is4() {
					local4++
				} else {
					local6++
				}
			}
		}
	}
	return m.HealthCheckNodePort, local4, local6
}

// Run opens and closes listeners as Updates arrive, retrying ports that
// could not be bound, until ctx ends; then it closes them all.
func (s *Server) Run(ctx context.Context) {
	s.init()
	retry := s.RetryInterval
	if retry <= 0 {
		retry = DefaultRetryInterval
	}
	running := map[model.ServiceKey]*instance{}
	failed := map[model.ServiceKey]string{} // last error per Service, logged once
	defer func() {
		for _, in := range running {
			in.close()
		}
	}()
	var timer *time.Timer
	for {
		pending := s.reconcile(running, failed)
		var retryC <-chan time.Time
		if pending {
			if timer == nil {
				timer = time.NewTimer(retry)
			} else {
				timer.Reset(retry)
			}
			retryC = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-s.kick:
		case <-retryC:
		}
		if timer != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// reconcile makes the running listeners match the wanted ones; it reports
// whether some port is still waiting to be bound.
func (s *Server) reconcile(running map[model.ServiceKey]*instance, failed map[model.ServiceKey]string) (pending bool) {
	log := s.logger()
	want := map[model.ServiceKey]uint16{}
	s.mu.RLock()
	for k, svc := range s.services {
		want[k] = svc.port
	}
	s.mu.RUnlock()

	for k, in := range running {
		if p, ok := want[k]; !ok || p != in.port {
			in.close()
			delete(running, k)
			log.Info("health check closed", "service", k, "port", in.port)
		}
	}
	for k := range failed {
		if _, ok := want[k]; !ok {
			delete(failed, k)
		}
	}
	for k, port := range want {
		if running[k] != nil {
			continue
		}
		in, err := s.open(k, port)
		if err != nil {
			pending = true
			msg := err.Error()
			if failed[k] != msg {
				log.Error("health check port cannot be opened; retrying", "service", k, "port", port, "err", err)
				failed[k] = msg
			}
			continue
		}
		if _, ok := failed[k]; ok {
			delete(failed, k)
		}
		running[k] = in
		log.Info("health check opened", "service", k, "port", port)
	}
	return pending
}

func (s *Server) open(k model.ServiceKey, port uint16) (*instance, error) {
	listen := s.Listen
	if listen == nil {
		listen = net.Listen
	}
	ln, err := listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	in := &instance{port: port, done: make(chan struct{}),
		srv: httpserver.New(handler{s: s, key: k}, s.Limits)}
	go func() {
		defer close(in.done)
		if err := in.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger().Error("health check server stopped", "service", k, "port", port, "err", err)
		}
	}()
	return in, nil
}

func (in *instance) close() {
	_ = in.srv.Close()
	<-in.done
}

func (s *Server) logger() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// Local returns the local endpoint count reported for a Service to checks
// over IPv6 (or IPv4), and whether it has a health check at all.
func (s *Server) Local(k model.ServiceKey, ipv6 bool) (int, bool) {
	s.init()
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ok := s.services[k]
	if !ok {
		return 0, false
	}
	if ipv6 {
		return svc.local6, true
	}
	return svc.local4, true
}

type handler struct {
	s   *Server
	key model.ServiceKey
}

// ServeHTTP answers as kube-proxy's service health server does, byte for
// byte: load balancers and their tests parse this body.
func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The family the check came in on; an IPv4 client on the dual-stack
	// socket shows as an IPv4-mapped address.
	ipv6 := false
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		ipv6 = a.IP.To4() == nil
	}
	count, _ := h.s.Local(h.key, ipv6) // a Service just removed reports 0
	healthy := h.s.Healthy == nil || h.s.Healthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if count != 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprint(w, Body(h.key, count, healthy))
}

// Body is the JSON document kube-proxy's health check returns.
func Body(k model.ServiceKey, localEndpoints int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		k.Namespace(), k.Name(), localEndpoints, healthy)
}
