package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftgate/nftgate/announce/bgp"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/podroutes"
	"github.com/nftgate/nftgate/source"
)

// learnedPoll is how often, in pod_routes = "bgp", the routes the peers
// announce are read from the speaker.
const learnedPoll = time.Second

// podRouter keeps the routes to pods (pod_routes): it computes the plan
// from the Nodes (the cluster's, or pod_routes_nodes without one), the
// Services of the last sync (endpoint mode) or the routes the BGP peers
// announce (bgp mode), and hands it to the reconciler, which keeps the
// kernel equal to it.
type podRouter struct {
	policy  *podroutes.Policy
	rec     *podroutes.Reconciler
	kube    *source.KubeSource // with a cluster, in node and endpoint modes
	nodes   *source.Nodes
	speaker *bgp.Speaker
	log     *slog.Logger
	kick    chan struct{}

	mu       sync.Mutex
	services map[model.ServiceKey]*model.Service
	synced   bool // a complete sync has been observed (endpoint mode)
	plan     podroutes.Plan
	nodeOf   map[netip.Addr]string // next hop to node name, of the last plan
	learned  []podroutes.Learned
}

// startPodRoutes prepares the routes to pods for the configuration's mode;
// nil in mode none, where it deletes the routes a previous mode left.
func startPodRoutes(cfg *Config, src source.Source, speaker *bgp.Speaker, reg prometheus.Registerer, log *slog.Logger) (*podRouter, error) {
	pol := cfg.podRoutes
	if pol.Mode == podroutes.None {
		n, err := podroutes.Cleanup(nil)
		if n > 0 {
			log.Info("pod_routes is none: deleted the routes to pods a previous configuration installed", "routes", n)
		}
		if err != nil {
			return nil, err
		}
		return nil, nil
	}
	p := &podRouter{policy: pol, speaker: speaker, log: log, kick: make(chan struct{}, 1),
		services: map[model.ServiceKey]*model.Service{}, nodeOf: map[netip.Addr]string{}}
	if ks, ok := src.(*source.KubeSource); ok && pol.Mode != podroutes.BGP {
		if len(pol.Nodes) > 0 {
			return nil, fmt.Errorf("%s: %d nodes given, but the source is a cluster (%s), whose Nodes are used; remove them", podroutes.NodesKey, len(pol.Nodes), src.Describe())
		}
		p.kube = ks
		p.nodes = &source.Nodes{OnChange: p.trigger}
	}
	rec, err := podroutes.New(podroutes.Options{Policy: pol, Registerer: reg, Logger: log})
	if err != nil {
		return nil, err
	}
	p.rec = rec
	return p, nil
}

func (p *podRouter) trigger() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Observe follows the sync loop: in endpoint mode the routes follow the
// endpoints the ruleset was rendered with.
func (p *podRouter) Observe(ev loop.Event) {
	if p.policy.Mode != podroutes.Endpoint || ev.Err != nil {
		return
	}
	p.mu.Lock()
	for k, m := range ev.After {
		if m == nil {
			delete(p.services, k)
		} else {
			p.services[k] = m
		}
	}
	first := !p.synced && ev.Full
	p.synced = p.synced || ev.Full
	p.mu.Unlock()
	if len(ev.After) > 0 || first {
		p.trigger()
	}
}

// ready tells whether the inputs are complete: an incomplete input would
// delete routes that are still wanted (the routes stay in the kernel
// across restarts of nftgate, and must not drop while it starts).
func (p *podRouter) ready() bool {
	if p.nodes != nil && !p.nodes.Synced() {
		return false
	}
	switch p.policy.Mode {
	case podroutes.Endpoint:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.synced
	case podroutes.BGP:
		// Every peer has come up: each has sent what it announces.
		for _, s := range p.speaker.Status() {
			if s.State != bgp.StateEstablished {
				return false
			}
		}
	}
	return true
}

func (p *podRouter) nodeInfos() []podroutes.NodeInfo {
	if p.nodes == nil {
		return p.policy.Nodes
	}
	var out []podroutes.NodeInfo
	for _, n := range p.nodes.List() {
		info, problems := podroutes.NodeFromObject(n)
		for _, pr := range problems {
			p.log.Debug("pod routes: node", "problem", pr)
		}
		out = append(out, info)
	}
	return out
}

func (p *podRouter) readLearned() []podroutes.Learned {
	rs := p.speaker.Received()
	out := make([]podroutes.Learned, len(rs))
	for i, r := range rs {
		out[i] = podroutes.Learned(r)
	}
	return out
}

// update computes the plan and installs it.
func (p *podRouter) update() {
	if !p.ready() {
		return
	}
	in := podroutes.Input{}
	if p.policy.Mode != podroutes.BGP {
		in.Nodes = p.nodeInfos()
	}
	p.mu.Lock()
	if p.policy.Mode == podroutes.Endpoint {
		in.Services = make([]*model.Service, 0, len(p.services))
		for _, s := range p.services {
			in.Services = append(in.Services, s)
		}
	}
	in.Learned = p.learned
	p.mu.Unlock()
	plan := p.policy.Plan(in)
	nodeOf := map[netip.Addr]string{}
	for _, n := range in.Nodes {
		for _, a := range n.InternalIPs {
			nodeOf[a] = n.Name
		}
	}
	p.mu.Lock()
	p.plan, p.nodeOf = plan, nodeOf
	p.mu.Unlock()
	if err := p.rec.Set(plan); err != nil {
		p.log.Warn("pod routes", "err", err)
	}
}

// run keeps the routes until ctx ends: the reconciler's repairs, the Node
// informer, and a new plan on every change of the inputs.
func (p *podRouter) run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := p.rec.Run(ctx); err != nil {
			errc <- err
		}
	})
	if p.nodes != nil {
		wg.Go(func() {
			if err := p.nodes.Run(ctx, p.kube); err != nil {
				errc <- fmt.Errorf("pod routes: nodes: %w", err)
			}
		})
	}
	var poll <-chan time.Time
	if p.policy.Mode == podroutes.BGP {
		t := time.NewTicker(learnedPoll)
		defer t.Stop()
		poll = t.C
	}
	p.trigger() // node mode without a cluster has all it needs
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-poll:
			l := p.readLearned()
			p.mu.Lock()
			same := slices.Equal(l, p.learned)
			p.learned = l
			p.mu.Unlock()
			if !same || p.plan.Mode == "" {
				p.update()
			}
		case <-p.kick:
			p.update()
		}
	}
}

func (p *podRouter) close() { p.rec.Close() }

// EdgePodRoutes is the routes to pods in GET /api/v1/edge.
type EdgePodRoutes struct {
	podroutes.Status
	// Via counts the routes per next hop, with the node it belongs to.
	Via []EdgePodRoutesVia `json:"via"`
}

// EdgePodRoutesVia is the routes through one next hop.
type EdgePodRoutesVia struct {
	Node   string     `json:"node,omitempty"`
	Via    netip.Addr `json:"via"`
	Routes int        `json:"routes"`
}

func (p *podRouter) view() *EdgePodRoutes {
	v := &EdgePodRoutes{Status: p.rec.Status(), Via: []EdgePodRoutesVia{}}
	p.mu.Lock()
	defer p.mu.Unlock()
	count := map[netip.Addr]int{}
	for _, r := range p.plan.Routes {
		count[r.Via]++
	}
	for via, n := range count {
		v.Via = append(v.Via, EdgePodRoutesVia{Node: p.nodeOf[via], Via: via, Routes: n})
	}
	slices.SortFunc(v.Via, func(a, b EdgePodRoutesVia) int { return a.Via.Compare(b.Via) })
	return v
}
