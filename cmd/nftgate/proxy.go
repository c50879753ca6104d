package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/proxy"
)

// Bounds of the PROXY protocol proxy's keys; config.toml documents them.
const (
	minProxyDialTimeout = 100 * time.Millisecond
	maxProxyDialTimeout = time.Minute
	maxProxyConnections = 1 << 20
)

// validateProxy checks the proxy_protocol_* keys.
func (c *Config) validateProxy(bad func(key, format string, args ...any)) {
	if c.ProxyProtocolMaxConnections < 1 || c.ProxyProtocolMaxConnections > maxProxyConnections {
		bad("proxy_protocol_max_connections", "%d is not between 1 and %d", c.ProxyProtocolMaxConnections, maxProxyConnections)
	}
	if d := time.Duration(c.ProxyProtocolDialTimeout); d < minProxyDialTimeout || d > maxProxyDialTimeout {
		bad("proxy_protocol_dial_timeout", "%s is not between %s and %s", c.ProxyProtocolDialTimeout, minProxyDialTimeout, maxProxyDialTimeout)
	}
}

// modelOptions are the model's options: which Services are proxied, and
// whether the PROXY protocol proxy runs.
func (c *Config) modelOptions() model.Options {
	o := model.Options{ProxyName: c.ProxyName, ExternalOnly: c.ExternalOnly}
	if c.ProxyProtocolPort == 0 {
		o.NoProxy, o.NoProxyWhy = true, "the gateway's proxy is off (proxy_protocol_port = 0)"
	}
	return o
}

// startProxy opens the PROXY protocol proxy's listeners (nil without
// proxy_protocol_port), so that a port in use stops nftgate before anything
// is programmed, and registers its metrics.
func startProxy(cfg *Config, reg prometheus.Registerer, log *slog.Logger) (*proxy.Proxy, error) {
	if cfg.ProxyProtocolPort == 0 {
		return nil, nil
	}
	p, err := proxy.Listen(proxy.Config{Ruleset: cfg.ruleset(), MaxConnections: cfg.ProxyProtocolMaxConnections,
		DialTimeout: time.Duration(cfg.ProxyProtocolDialTimeout), Log: log})
	if err != nil {
		return nil, fmt.Errorf("proxy_protocol_port = %d: %w", cfg.ProxyProtocolPort, err)
	}
	if err := p.Register(reg); err != nil {
		return nil, err
	}
	return p, nil
}

// runProxy feeds the proxy from the sync loop and runs it in wg until ctx
// ends.
func runProxy(ctx context.Context, p *proxy.Proxy, syncer *loop.Syncer, wg *sync.WaitGroup) {
	if p == nil {
		return
	}
	syncer.Observers = append(syncer.Observers, p.Observe)
	wg.Go(func() { p.Run(ctx) })
}
