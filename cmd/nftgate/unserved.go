package main

import (
	"flag"

	"github.com/nftgate/nftgate/ruleset"
)

// What becomes of traffic to a Service address that no Service port
// translates (unserved_service_traffic; ruleset/unserved.go).
const (
	unservedReject = "reject"
	unservedDrop   = "drop"
	unservedRoute  = "route"
)

// unservedFlags registers unserved_service_traffic's flag.
func unservedFlags(fs *flag.FlagSet, cfg *Config) {
	fs.StringVar(&cfg.UnservedServiceTraffic, "unserved-service-traffic", cfg.UnservedServiceTraffic,
		"what becomes of traffic to a LoadBalancer or external IP that no Service port takes: `reject`, drop or route (see config.toml)")
	fs.BoolVar(&cfg.AnswerServiceAddressPing, "answer-service-address-ping", cfg.AnswerServiceAddressPing,
		"answer an ICMP echo request (ping) to a LoadBalancer or external IP on the gateway itself")
	fs.IntVar(&cfg.ServicePingRate, "answer-service-address-ping-rate", cfg.ServicePingRate,
		"new echo flows to Service addresses answered a second, from all sources together (see config.toml)")
	fs.IntVar(&cfg.ServicePingSourceRate, "answer-service-address-ping-source-rate", cfg.ServicePingSourceRate,
		"new echo flows to Service addresses answered a second from one source, an IPv4 address or IPv6 /64 (see config.toml)")
}

// maxServicePingRate bounds both ping rates: an echo flow holds a
// conntrack entry for 30 s past its last request, so a flood of new flows
// at the rate holds 30 times as many.
const maxServicePingRate = 100_000

// validateUnserved checks unserved_service_traffic and the ping rates.
func (c *Config) validateUnserved(bad func(key, format string, args ...any)) {
	switch c.UnservedServiceTraffic {
	case unservedReject, unservedDrop, unservedRoute:
	default:
		bad("unserved_service_traffic", "%q is not %q, %q or %q", c.UnservedServiceTraffic, unservedReject, unservedDrop, unservedRoute)
	}
	for _, r := range []struct {
		key  string
		rate int
	}{{"answer_service_address_ping_rate", c.ServicePingRate}, {"answer_service_address_ping_source_rate", c.ServicePingSourceRate}} {
		if r.rate < 1 || r.rate > maxServicePingRate {
			bad(r.key, "%d is not between 1 and %d echo flows a second", r.rate, maxServicePingRate)
		}
	}
}

// unserved is the ruleset's setting of unserved_service_traffic.
func (c *Config) unserved() ruleset.Unserved {
	switch c.UnservedServiceTraffic {
	case unservedDrop:
		return ruleset.UnservedDrop
	case unservedRoute:
		return ruleset.UnservedRoute
	}
	return ruleset.UnservedReject
}
