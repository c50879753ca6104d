// Package proxy is the gateway's PROXY protocol proxy: the TCP ports of
// Services annotated nftgate.io/proxy-protocol have their new connections
// from outside the cluster redirected by the ruleset to one local port
// (ruleset.Redirect), where this proxy accepts them, reads where each was
// going from conntrack (SO_ORIGINAL_DST), picks one of the endpoints the
// ruleset would have sent it to, dials it, writes a PROXY protocol header
// (github.com/pires/go-proxyproto) with the client's address and port, and
// copies both ways (splice between the two sockets), passing half-closes on.
//
// nftables cannot write a header into a stream, so this is the one part of
// the data path in user space, and only for the Services that ask for it.
// Which destinations are proxied, and to which endpoints, is read from the
// rendered Services (ruleset.Fragment.Proxied), so the proxy and the rules
// never disagree; the table follows every sync (Observe): an endpoint
// removed gets no new connection, the connections it has keep running.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Defaults of Config.
const (
	DefaultPort           = 9190
	DefaultMaxConnections = 10000
	DefaultDialTimeout    = 5 * time.Second
)

// Config is what the proxy depends on.
type Config struct {
	// Ruleset is the configuration the Programmer renders with; its
	// ProxyPort is where the proxy listens, on every address of both
	// families.
	Ruleset ruleset.Config
	// MaxConnections bounds the proxied connections open at once; a
	// connection beyond it is closed at once and counted. Zero means
	// DefaultMaxConnections.
	MaxConnections int
	// DialTimeout bounds the connection to an endpoint; zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	Log         *slog.Logger
}

// Proxy is the PROXY protocol proxy.
type Proxy struct {
	cfg     Config
	log     *slog.Logger
	lns     []*net.TCPListener
	slots   chan struct{}
	metrics metrics

	mu    sync.RWMutex
	table map[ruleset.Destination][]*target // claims on each destination
	bySvc map[model.ServiceKey][]ruleset.Destination

	connMu sync.Mutex
	conns  map[*net.TCPConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// target is one Service's claim on a proxied destination.
type target struct {
	svc       *model.Service
	version   byte
	endpoints []netip.AddrPort
	next      atomic.Uint32
}

// Listen opens the proxy's listeners on Ruleset.ProxyPort, one per family
// (SO_ORIGINAL_DST is answered per family), so that a port in use is an
// error before anything is programmed.
func Listen(cfg Config) (*Proxy, error) {
	port := cfg.Ruleset.ProxyPort
	if port == 0 {
		return nil, errors.New("proxy: no port")
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	p := &Proxy{cfg: cfg, log: cfg.Log, slots: make(chan struct{}, cfg.MaxConnections),
		table: map[ruleset.Destination][]*target{}, bySvc: map[model.ServiceKey][]ruleset.Destination{},
		conns: map[*net.TCPConn]struct{}{}, metrics: newMetrics()}
	if p.log == nil {
		p.log = slog.Default()
	}
	for _, a := range []string{"tcp4/0.0.0.0", "tcp6/::"} {
		network, host := a[:4], a[5:]
		ln, err := net.ListenTCP(network, net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(host), port)))
		if err != nil {
			p.closeListeners()
			return nil, fmt.Errorf("proxy: listen on port %d: %w", port, err)
		}
		p.lns = append(p.lns, ln)
	}
	return p, nil
}

func (p *Proxy) closeListeners() {
	for _, ln := range p.lns {
		_ = ln.Close()
	}
}

// Register adds the proxy's metrics to reg.
func (p *Proxy) Register(reg prometheus.Registerer) error { return p.metrics.register(reg) }

// Observe follows a sync: the destinations of the changed Services are
// rendered again, and the table takes their proxied ones. It is a Syncer
// observer.
func (p *Proxy) Observe(ev loop.Event) {
	if ev.Err != nil {
		return
	}
	for k, svc := range ev.After {
		p.mu.RLock()
		_, had := p.bySvc[k]
		p.mu.RUnlock()
		if !had && (svc == nil || svc.ProxyProtocol == 0) {
			continue
		}
		p.update(k, svc)
	}
}

// update replaces Service k's destinations with those svc (nil: none) has.
func (p *Proxy) update(k model.ServiceKey, svc *model.Service) {
	var proxied []ruleset.ProxyTarget
	if svc != nil && svc.ProxyProtocol != 0 {
		out := ruleset.RenderService(&p.cfg.Ruleset, svc)
		for _, f := range ruleset.Families {
			proxied = append(proxied, out.Of(f).Proxied...)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.bySvc[k] {
		ts := p.table[d][:0]
		for _, t := range p.table[d] {
			if t.svc.Key != k {
				ts = append(ts, t)
			}
		}
		if len(ts) == 0 {
			delete(p.table, d)
		} else {
			p.table[d] = ts
		}
	}
	delete(p.bySvc, k)
	if len(proxied) == 0 {
		return
	}
	dests := make([]ruleset.Destination, 0, len(proxied))
	for _, pt := range proxied {
		t := &target{svc: svc, version: svc.ProxyProtocol}
		for _, e := range pt.Endpoints {
			t.endpoints = append(t.endpoints, e.AddrPort())
		}
		p.table[pt.Dest] = append(p.table[pt.Dest], t)
		dests = append(dests, pt.Dest)
	}
	p.bySvc[k] = dests
}

// lookup finds the target of a connection that was going to orig: an
// address the rules redirect (externalIP, LoadBalancer IP), else a node
// port of the gateway. Of several Services claiming it, the one the rules
// serve wins (ruleset.Older).
func (p *Proxy) lookup(orig netip.AddrPort) *target {
	f := ruleset.Of(orig.Addr())
	p.mu.RLock()
	defer p.mu.RUnlock()
	ts, ok := p.table[ruleset.Destination{Family: f, Proto: model.TCP, Addr: orig.Addr(), Port: orig.Port()}]
	if !ok {
		ts = p.table[ruleset.Destination{Family: f, Proto: model.TCP, Port: orig.Port(), NodePort: true}]
	}
	var w *target
	for _, t := range ts {
		if w == nil || ruleset.Older(t.svc.Created, t.svc.Key, w.svc.Created, w.svc.Key) {
			w = t
		}
	}
	return w
}

// Run accepts and proxies connections until ctx ends, then closes the
// listeners and every proxied connection, and returns when all of its
// goroutines have.
func (p *Proxy) Run(ctx context.Context) {
	for _, ln := range p.lns {
		p.wg.Go(func() { p.accept(ln) })
	}
	<-ctx.Done()
	p.closeListeners()
	p.connMu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.connMu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept(ln *net.TCPListener) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("proxy: accept", "err", err)
			continue
		}
		select {
		case p.slots <- struct{}{}:
		default:
			p.metrics.limited.Inc()
			_ = c.SetLinger(0)
			_ = c.Close()
			continue
		}
		if !p.track(c) {
			<-p.slots
			return
		}
		p.wg.Go(func() {
			defer func() { <-p.slots }()
			p.serve(c)
		})
	}
}

// track records an open connection, so that Run can close it; false when
// the proxy is closing.
func (p *Proxy) track(c *net.TCPConn) bool {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c *net.TCPConn) {
	p.connMu.Lock()
	delete(p.conns, c)
	p.connMu.Unlock()
	_ = c.Close()
}

// serve proxies one accepted connection.
func (p *Proxy) serve(client *net.TCPConn) {
	defer p.untrack(client)
	orig, err := originalDst(client)
	if err != nil {
		p.metrics.unknown.Inc()
		p.log.Debug("proxy: no original destination", "client", client.RemoteAddr(), "err", err)
		return
	}
	t := p.lookup(orig)
	if t == nil {
		// Not redirected by the rules (a connection to the port
		// itself), or its Service is gone since.
		p.metrics.unknown.Inc()
		_ = client.SetLinger(0)
		return
	}
	svc := t.svc.Key.String()
	p.metrics.total.WithLabelValues(svc).Inc()
	backend, err := p.dial(t)
	if err != nil {
		p.metrics.errors.WithLabelValues(svc, "dial").Inc()
		p.log.Debug("proxy: no endpoint answered", "service", svc, "err", err)
		_ = client.SetLinger(0)
		return
	}
	if !p.track(backend) {
		return
	}
	defer p.untrack(backend)
	active := p.metrics.active.WithLabelValues(svc)
	active.Inc()
	defer active.Dec()

	src := client.RemoteAddr().(*net.TCPAddr)
	h := proxyproto.HeaderProxyFromAddrs(t.version, unmapped(src), net.TCPAddrFromAddrPort(orig))
	if _, err := h.WriteTo(backend); err != nil {
		p.metrics.errors.WithLabelValues(svc, "header").Inc()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(backend, client)
	}()
	pipe(client, backend)
	<-done
}

// unmapped is a for the header: an IPv4 client of the IPv4 listener as an
// IPv4 address.
func unmapped(a *net.TCPAddr) *net.TCPAddr {
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a.AddrPort().Addr().Unmap(), a.AddrPort().Port()))
}

// pipe copies from src to dst until src ends, then ends dst's sending
// side: a half-close reaches the other end as it would through the kernel.
func pipe(dst, src *net.TCPConn) {
	_, err := io.Copy(dst, src) // splice(2) between the sockets
	if err != nil {
		// A reset on one side resets the other.
		_ = dst.SetLinger(0)
		_ = dst.Close()
		_ = src.Close()
		return
	}
	_ = dst.CloseWrite()
}

// dial connects to one of the target's endpoints, in turn from the next
// one, trying the others when one does not answer.
func (p *Proxy) dial(t *target) (*net.TCPConn, error) {
	n := len(t.endpoints)
	if n == 0 {
		return nil, errors.New("no endpoint")
	}
	start := int(t.next.Add(1) - 1)
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	var errs []error
	for i := range min(n, 3) {
		ep := t.endpoints[(start+i)%n]
		c, err := d.Dial("tcp", ep.String())
		if err == nil {
			return c.(*net.TCPConn), nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}
