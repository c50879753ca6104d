// Package bgp announces the addresses this gateway serves to upstream
// routers over BGP, with GoBGP embedded as a library: one speaker per
// gateway, in the nftgate process, no separate daemon.
//
// The API is declarative. New starts the speaker from a Config (the [bgp]
// section of config.toml) and adds its peers; Set(routes) makes the
// announced set equal to routes, announcing what is new and withdrawing
// what is gone, in proportion to the size of the set (10,000 prefixes are
// cheap). Status reports each session (state, uptime, prefixes sent and
// received, graceful restart, BFD) for the status page, Register exports
// the same as Prometheus metrics, and Received lists the routes the peers
// announce (for pod routes learned over BGP).
//
// How it is meant to be fed: from the same sync as the ruleset, so that
// "this gateway serves this address" has one source of truth. After each
// sync the syncer collects the LoadBalancer ingress IPs (and the
// externalIPs) that model.Exposure lets the gateway serve and that the
// Service can answer right now (a usable endpoint; for
// externalTrafficPolicy Local, a local one), makes each a HostRoute with
// the pool it was allocated from, and calls Set with the whole list. Set is
// idempotent: calling it after every sync with the full list costs one map
// comparison when nothing changed.
//
// Restarts: every session advertises graceful restart (RFC 4724) with a
// restart time, the restart bit and the forwarding bit. When the process
// exits without Stop (an update, a crash, kill -9), the kernel closes the
// TCP sessions; the peers keep the gateway's routes as stale for the
// restart time while the kernel's nftables rules keep forwarding. The new
// process's speaker waits for each peer's End-of-RIB (at most
// restart_deferral), then announces what Set gave it and sends its own
// End-of-RIB, after which the peers flush the stale routes that were not
// announced again. Stop is the other way out, on purpose: it withdraws
// everything, waits until the withdrawals are sent, and closes the
// sessions (drain, shutdown).
//
// The speaker passes no route learned from one peer to another (the
// gateway is not a transit): its export policy accepts only its own
// routes. Each peer receives the prefixes of its own address family (IPv4
// prefixes to IPv4 peers, IPv6 to IPv6 peers).
package bgp
