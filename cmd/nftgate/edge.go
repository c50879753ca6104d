package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftgate/nftgate/announce"
	"github.com/nftgate/nftgate/announce/bgp"
	"github.com/nftgate/nftgate/announce/l2"
	"github.com/nftgate/nftgate/gateways"
	"github.com/nftgate/nftgate/ipam"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
	"github.com/nftgate/nftgate/source"
)

// edge is the gateway's edge: address allocation (ipam), and the
// announcement of the addresses it serves (BGP, L2), fed by the sync loop
// through one announce.Coordinator.
// The routes to pods (pod_routes, podroutes.go) are fed by the same sync
// events, and for pod_routes = "bgp" by the speaker's received routes.
type edge struct {
	coord   *announce.Coordinator
	speaker *bgp.Speaker     // nil: no [bgp]
	l2      *l2.Announcer    // nil: no [l2]
	ctrl    *ipam.Controller // with a cluster and pools
	memory  *ipam.Memory     // without a cluster, with pools
	policy  *ipam.Policy
	pods    *podRouter // nil: pod_routes = "none"
	// gateways: nil without [gateways]; else the announcements go
	// through it and gate (gateways.go).
	gateways *gateways.Set
	// statesync: nil without [gateways] or with state_sync = false
	// (statesync.go).
	statesync *stateSync
	gate      *announce.Gate
	// homes: the map of homes (homes.go), nil without it; stopHomes ends
	// its writer and waits for it.
	homes     *midstreamHomes
	stopHomes func()
	// stopTracker ends the Tracker of the tracked links (nil: none).
	stopTracker func()
}

// startEdge starts the announcers the configuration asks for, before the
// sources run. The BGP speaker opens its sessions with the first sync's
// routes (bgp.Speaker.Set), so that after a restart the peers keep the
// routes they hold (graceful restart) until that sync is announced.
func startEdge(cfg *Config, homes func([]ruleset.Element) error, reg prometheus.Registerer, log *slog.Logger) (*edge, error) {
	e := &edge{policy: cfg.ipamPolicy}
	if cfg.BGP != nil {
		s, err := bgp.New(*cfg.BGP, log)
		if err != nil {
			return nil, fmt.Errorf("bgp: %w", err)
		}
		e.speaker = s
		if err := s.Register(reg); err != nil {
			e.close(false)
			return nil, err
		}
	}
	if cfg.L2 != nil {
		a, err := l2.New(*cfg.L2, log)
		if err != nil {
			e.close(false)
			return nil, fmt.Errorf("l2: %w", err)
		}
		e.l2 = a
		if err := a.Register(reg); err != nil {
			e.close(false)
			return nil, err
		}
	}
	if err := e.startGateways(cfg, homes, reg, log); err != nil {
		e.close(false)
		return nil, err
	}
	e.coord = &announce.Coordinator{Node: model.Node{Name: cfg.NodeName, Zone: cfg.Zone}, PoolOf: e.poolOf, Log: log,
		Always: cfg.floatingMasquerade()}
	if e.speaker != nil {
		e.coord.BGP = e.speaker
	}
	if e.l2 != nil {
		e.coord.L2 = e.l2
	}
	e.announceThroughGateways()
	return e, nil
}

func (e *edge) poolOf(a netip.Addr) string {
	if p := e.policy.PoolOf(a); p != nil {
		return p.Name
	}
	return ""
}

// allocate wires address allocation into the source: with a cluster, the
// Lease-elected controller fed from the source's own Service informer;
// without one, allocation in memory in front of the tracker. It returns
// the sink the source feeds.
func (e *edge) allocate(cfg *Config, src source.Source, sink source.Sink, reg prometheus.Registerer, log *slog.Logger) (source.Sink, error) {
	if len(e.policy.Pools) == 0 {
		return sink, nil
	}
	switch s := src.(type) {
	case *source.KubeSource:
		c, err := ipam.NewController(ipam.Options{Config: s.Config, Policy: e.policy, Identity: cfg.NodeName, Registerer: reg, Log: log})
		if err != nil {
			return nil, err
		}
		e.ctrl = c
		s.Hook = ipamHook{c}
		return sink, nil
	case *source.ManifestSource:
		m, err := ipam.NewMemory(e.policy, sink, reg, log)
		if err != nil {
			return nil, err
		}
		e.memory = m
		return m, nil
	}
	return sink, nil
}

// routePods prepares the routes to pods; their plan follows every sync
// (observe).
func (e *edge) routePods(cfg *Config, src source.Source, reg prometheus.Registerer, log *slog.Logger) error {
	p, err := startPodRoutes(cfg, src, e.speaker, reg, log)
	e.pods = p
	return err
}

// observe is the sync loop's observer of the edge.
func (e *edge) observe(ev loop.Event) {
	e.coord.Observe(ev)
	if e.pods != nil {
		e.pods.Observe(ev)
	}
}

// run runs the allocation controller and the routes to pods, if any,
// until ctx ends.
func (e *edge) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	errc := make(chan error, 2)
	n := 0
	if e.pods != nil {
		n++
		wg.Go(func() { errc <- e.pods.run(ctx) })
	}
	if e.ctrl != nil {
		n++
		wg.Go(func() { errc <- e.ctrl.Run(ctx) })
	}
	for range n {
		if err := <-errc; err != nil {
			return err
		}
	}
	return nil
}

// close ends the announcers. drain withdraws every BGP route first (Stop);
// without it the speaker is left to end with the process, without a
// withdrawal, so that the peers keep the routes for the graceful restart
// time while the next nftgate starts.
func (e *edge) close(drain bool) {
	if e.stopHomes != nil {
		e.stopHomes()
	}
	if e.stopTracker != nil {
		e.stopTracker()
	}
	if e.speaker != nil && drain {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.speaker.Stop(ctx)
		cancel()
	}
	if e.gateways != nil {
		_ = e.gateways.Close()
	}
	e.statesync.close()
	if e.l2 != nil {
		_ = e.l2.Close()
	}
	if e.pods != nil {
		e.pods.close()
	}
}

// ipamHook feeds the allocation controller from the source's informer.
type ipamHook struct{ c *ipam.Controller }

func (h ipamHook) Convert(svc *corev1.Service) any { return ipam.NewService(svc) }
func (h ipamHook) Set(converted any) {
	if s, ok := converted.(*ipam.Service); ok {
		h.c.SetService(s)
	}
}
func (h ipamHook) Delete(namespace, name string) {
	h.c.DeleteService(ipam.Key{Namespace: namespace, Name: name})
}
func (h ipamHook) SetSynced() { h.c.SetSynced() }

// EdgeView is GET /api/v1/edge: per Service its addresses, pool and how
// each is announced; the BGP sessions; the L2 announcements; the pools'
// use and who writes the allocation.
type EdgeView struct {
	Services []EdgeService      `json:"services"`
	Pools    []ipam.Usage       `json:"pools"`
	IPAM     *EdgeIPAM          `json:"ipam,omitempty"`
	BGP      []bgp.PeerStatus   `json:"bgp"`
	BGPError string             `json:"bgpError,omitempty"`
	L2       []l2.AddressStatus `json:"l2"`
	// PodRoutes: nil when pod_routes is none.
	PodRoutes *EdgePodRoutes `json:"podRoutes,omitempty"`
}

// EdgeIPAM is who allocates.
type EdgeIPAM struct {
	Mode   string `json:"mode"` // "lease" with a cluster, "memory" without
	Writer bool   `json:"writer"`
	Leader string `json:"leader,omitempty"`
	Synced bool   `json:"synced"`
}

// EdgeService is one Service's addresses.
type EdgeService struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Addresses []EdgeAddress `json:"addresses"`
	// Problems are the allocation's failures (pool exhausted, address
	// taken, no pool for the family).
	Problems []ipam.Problem `json:"problems,omitempty"`
}

// EdgeAddress is one address and how it is announced.
type EdgeAddress struct {
	announce.ServiceAddress
	// Via lists the announcements: "bgp <peer>" for each established
	// session (with a gateway set, while its gate lets the route out),
	// "l2 <interface>" for each interface answering for it, "l2
	// held by <gateway>" when another gateway of the set answers for it.
	Via []string `json:"via"`
}

func (e *edge) view() any {
	v := EdgeView{BGP: []bgp.PeerStatus{}, L2: []l2.AddressStatus{}, Services: []EdgeService{}}
	var sn *ipam.Snapshot
	switch {
	case e.ctrl != nil:
		s := e.ctrl.Snapshot()
		sn = &s
		v.IPAM = &EdgeIPAM{Mode: "lease", Writer: s.Writer, Leader: s.Leader, Synced: s.Synced}
	case e.memory != nil:
		s := e.memory.Snapshot()
		sn = &s
		v.IPAM = &EdgeIPAM{Mode: "memory", Writer: true, Synced: s.Synced}
	}
	problems := map[model.ServiceKey][]ipam.Problem{}
	if sn != nil {
		v.Pools = sn.Pools
		for _, s := range sn.Services {
			if len(s.Problems) > 0 {
				problems[model.NewServiceKey(s.Namespace, s.Name)] = s.Problems
			}
		}
	}
	// Each address goes to the established peers of its family.
	peers := map[bool][]string{}
	if e.speaker != nil {
		v.BGP = e.speaker.Status()
		for _, p := range v.BGP {
			if a, err := netip.ParseAddr(p.Address); err == nil && p.State == bgp.StateEstablished {
				peers[a.Unmap().Is4()] = append(peers[a.Unmap().Is4()], "bgp "+p.Address)
			}
		}
	}
	ifaces := map[netip.Addr][]string{}
	if e.l2 != nil {
		v.L2 = e.l2.Status()
		for _, a := range v.L2 {
			for _, i := range a.Interfaces {
				ifaces[a.Address] = append(ifaces[a.Address], "l2 "+i)
			}
		}
	}
	// With a gateway set, an address another gateway answers for says so.
	for a, peer := range e.heldByPeers() {
		if len(ifaces[a]) == 0 {
			ifaces[a] = []string{"l2 held by " + peer}
		}
	}
	if e.pods != nil {
		v.PodRoutes = e.pods.view()
	}
	as := e.coord.Snapshot()
	v.BGPError = as.BGPError
	seen := map[model.ServiceKey]bool{}
	for _, s := range as.Services {
		k := model.NewServiceKey(s.Namespace, s.Name)
		seen[k] = true
		es := EdgeService{Namespace: s.Namespace, Name: s.Name, Problems: problems[k]}
		for _, a := range s.Addresses {
			ea := EdgeAddress{ServiceAddress: a, Via: []string{}}
			if a.Announced {
				// With a gateway set, over BGP only what its gate lets out.
				if e.gate == nil || e.gate.Passes(a.Address) {
					ea.Via = append(ea.Via, peers[a.Address.Unmap().Is4()]...)
				}
				ea.Via = append(ea.Via, ifaces[a.Address]...)
			}
			es.Addresses = append(es.Addresses, ea)
		}
		v.Services = append(v.Services, es)
	}
	// Services that have no address yet, because allocation failed.
	for k, p := range problems {
		if !seen[k] {
			v.Services = append(v.Services, EdgeService{Namespace: k.Namespace(), Name: k.Name(), Addresses: []EdgeAddress{}, Problems: p})
		}
	}
	slices.SortFunc(v.Services, func(a, b EdgeService) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return v
}
