// Package ipam gives LoadBalancer Services their addresses from the pools
// of the configuration, and writes them to status.loadBalancer.ingress.
//
// Config ([[pools]] and load_balancer_class in config.toml) compiles to a
// Policy; Policy.Allocate is the whole allocation as a pure function of
// the Services (NewService reads what it needs of a Service object), so
// every gateway computes the same result and a restart recovers it from
// the statuses. Controller runs it against the API: one gateway, elected
// by a coordination.k8s.io Lease, writes statuses and Events; the others
// compute the same allocation and only read. Snapshot is its view for the
// status page, and its gauges (nftgate_pool_addresses_used and _free per
// pool) go on the registry it is given.
//
// How it is meant to be wired: it is fed from the same Service informer
// as the ruleset, so that there is one source of truth for "this gateway
// serves this address". The sync source's transform keeps NewService(svc)
// beside the model's object, its handlers call Controller.SetService and
// DeleteService, and SetSynced when the ruleset's source is synced; Run
// goes beside the sync loop. The addresses come back through the same
// informer as status.loadBalancer.ingress, become model.Service's
// LoadBalancerIPs, and model.Exposure decides, as for any LoadBalancer IP,
// whether the gateway serves (and so programs and announces) them. A
// configuration reload calls SetPolicy. Without an informer (tests), Watch
// feeds a controller on its own.
package ipam
