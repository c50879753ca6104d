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
}

// validateUnserved checks unserved_service_traffic.
func (c *Config) validateUnserved(bad func(key, format string, args ...any)) {
	switch c.UnservedServiceTraffic {
	case unservedReject, unservedDrop, unservedRoute:
	default:
		bad("unserved_service_traffic", "%q is not %q, %q or %q", c.UnservedServiceTraffic, unservedReject, unservedDrop, unservedRoute)
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
