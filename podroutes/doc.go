// Package podroutes installs the gateway's routes to pods, so that it can
// forward to pod addresses the network does not route to it: a route per
// Node pod CIDR via the Node's InternalIP (pod_routes = "node"), a /32 or
// /128 per endpoint via the InternalIP of its node ("endpoint", for CNIs
// whose IPAM does not follow spec.podCIDRs), or the pod routes BGP peers
// announce ("bgp").
//
// It has two halves. Policy.Plan is pure: from the Nodes (NodeFromObject),
// the model's Services (each endpoint's NodeName, as its EndpointSlice
// gives it) and the routes learned over BGP (Learned, one-for-one with
// announce/bgp's ReceivedRoute) it computes the routes, one per
// destination, and the problems that keep others out (a Node without an
// InternalIP of the family, an endpoint on an unknown node, a prefix
// outside cluster_cidrs...). A Reconciler keeps the kernel equal to that
// plan: Set installs what is missing and deletes what is no longer
// wanted, touching only routes of its own routing protocol (Protocol,
// 246) and never a route of another protocol, even to the same
// destination (that conflict is reported in Status); Run repairs what
// anything else removes or changes, on every route notification and every
// repair interval. Cleanup deletes every route of Protocol, for `nftgate
// cleanup`. The routes stay in the kernel when nftgate exits, as the
// ruleset does, so a restart does not interrupt traffic to pods.
//
// How it is meant to be wired: from the same sync as the ruleset, so that
// "this gateway serves this address" and "this gateway reaches that
// endpoint" come from one snapshot. The binary embeds Config inline in its
// configuration and compiles it with its cluster_cidrs; it opens a
// Reconciler in the gateway's namespace with the registry of its metrics
// and starts Run beside the sync loop. After every sync, with the Services
// the ruleset was rendered from (model.Exposure has already decided which
// of their addresses are served; the endpoints are the ruleset's DNAT
// targets), the Nodes of a Node informer (which needs nodes list and watch
// in deploy/rbac.yaml, in node and endpoint modes only) and, in bgp mode,
// the speaker's Received(), it calls
//
//	rec.Set(policy.Plan(podroutes.Input{Nodes: nodes, Services: services, Learned: learned}))
//
// and puts rec.Status() on the status page. `nftgate cleanup` calls
// Cleanup(nil) in the gateway's namespace.
package podroutes
