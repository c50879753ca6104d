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
// The binary (cmd/nftgate) feeds it from the same sync as the ruleset, so
// that "this gateway serves this address" and "this gateway reaches that
// endpoint" come from one snapshot: it embeds Config inline in its
// configuration and compiles it with its cluster_cidrs, opens a Reconciler
// with the registry of its metrics and runs it beside the sync loop, and
// calls Set(policy.Plan(Input{...})) with the Nodes of a Node informer (or
// Policy.Nodes without a cluster), the Services the sync programmed, and in
// bgp mode the speaker's Received(). `nftgate cleanup` calls Cleanup(nil).
package podroutes
