package main

import (
	"context"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/model"
	gsync "github.com/nftgate/nftgate/sync"
)

// statusPublisher feeds the status page. The Services table is rebuilt at
// most once a second, and only after a change: at ten thousand Services a
// rebuild per sync would cost more than the sync itself.
type statusPublisher struct {
	syncer *gsync.Syncer
	rec    *appliance.Recorder
	node   model.Node
	dirty  atomic.Bool
	wake   chan struct{}
}

func newStatusPublisher(s *gsync.Syncer, rec *appliance.Recorder, node model.Node) *statusPublisher {
	return &statusPublisher{syncer: s, rec: rec, node: node, wake: make(chan struct{}, 1)}
}

// Snapshot implements appliance.Source.
func (p *statusPublisher) Snapshot() appliance.Snapshot { return p.rec.Snapshot() }

func (p *statusPublisher) markDirty() {
	p.dirty.Store(true)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *statusPublisher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		if p.dirty.Swap(false) {
			p.rec.SetServices(servicesView(p.syncer.Services(), p.node))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// servicesView turns the sync loop's state into the page's rows. An endpoint
// is Used when the rules send traffic to it: the same choice the ruleset makes
// (model.Categorize), under either traffic policy.
func servicesView(states []gsync.ServiceState, node model.Node) []appliance.Service {
	out := make([]appliance.Service, 0, len(states))
	for _, st := range states {
		v := appliance.Service{Namespace: st.Key.Namespace, Name: st.Key.Name, Error: st.Error}
		if st.Skipped != "" && st.Model == nil {
			continue // not proxied at all: not the gateway's business
		}
		if m := st.Model; m != nil {
			v.Type = m.Type
			v.ClusterIPs, v.ExternalIPs, v.LoadBalancerIPs = m.ClusterIPs, m.ExternalIPs, m.LoadBalancerIPs
			v.ExternalPolicy, v.InternalPolicy = policy(m.ExternalLocal), policy(m.InternalLocal)
			v.Affinity = "None"
			if m.AffinityTimeout > 0 {
				v.Affinity, v.AffinityTimeout = "ClientIP", m.AffinityTimeout
			}
			v.SourceRanges = m.SourceRanges
			v.HealthCheckNodePort = m.HealthCheckNodePort
			for pi := range m.Ports {
				p := &m.Ports[pi]
				v.Ports = append(v.Ports, appliance.ServicePort{Name: p.Name, Protocol: strings.ToUpper(p.Protocol.String()), Port: p.Port, NodePort: p.NodePort})
				sets := model.Categorize(m, p, node)
				used := make(map[netip.AddrPort]bool, len(sets.Cluster)+len(sets.Local))
				for _, e := range append(sets.Cluster, sets.Local...) {
					used[e.AddrPort()] = true
				}
				for _, e := range p.Endpoints {
					v.Endpoints = append(v.Endpoints, appliance.Endpoint{PortName: p.Name, Addr: e.Addr, Port: e.Port,
						Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating, Node: e.NodeName, Zone: e.Zone,
						Used: used[e.AddrPort()]})
				}
			}
		}
		out = append(out, v)
	}
	return out
}

func policy(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}
