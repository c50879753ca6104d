// Package status feeds the status page from the sync loop and the source:
// one row per Service, rebuilt only for the Services a sync touched.
package status

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/loop"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/source"
)

// Publisher feeds the status page. Rows are rebuilt only for the
// Services a sync touched, at most once a second: at ten thousand Services
// rebuilding every row after each change cost more than the sync itself.
type Publisher struct {
	syncer *loop.Syncer
	rec    *appliance.Recorder
	node   model.Node
	wake   chan struct{}

	mu      sync.Mutex
	all     bool // rebuild every row
	touched map[model.ServiceKey]struct{}

	// rows are the rows last published: a list that never changes, so
	// the next is made from it by replacing only the touched rows.
	rows appliance.ServiceList // owned by run
	// warned holds the warnings last logged for each Service that has
	// some (owned by run): each is logged once, when it appears.
	warned map[model.ServiceKey][]string
	log    *slog.Logger

	// Rebuilt, when set, is called once every row was made anew (after
	// the first full sync): the garbage that leaves is the size of the
	// cluster.
	Rebuilt func()
}

// NewPublisher returns a Publisher of s's Services into rec; node decides
// which endpoints the page shows as used.
func NewPublisher(s *loop.Syncer, rec *appliance.Recorder, node model.Node, log *slog.Logger) *Publisher {
	p := &Publisher{syncer: s, rec: rec, node: node, wake: make(chan struct{}, 1),
		touched: map[model.ServiceKey]struct{}{}, warned: map[model.ServiceKey][]string{}, log: log}
	return p
}

// noteWarnings logs the warnings of a Service that were not logged yet,
// and that a Service with warnings has none any more.
func (p *Publisher) noteWarnings(k model.ServiceKey, ws []string) {
	old := p.warned[k]
	if slices.Equal(old, ws) {
		return
	}
	if len(ws) == 0 {
		delete(p.warned, k)
		p.log.Info("service served in full", "service", k)
		return
	}
	p.warned[k] = ws
	for _, w := range ws {
		if !slices.Contains(old, w) {
			p.log.Warn("service not served in full", "service", k, "warning", w)
		}
	}
}

// Snapshot implements appliance.Source.
func (p *Publisher) Snapshot() appliance.Snapshot { return p.rec.Snapshot() }

// Touch records Services whose row may have changed; nil means all of them.
func (p *Publisher) Touch(keys []model.ServiceKey) {
	p.mu.Lock()
	if keys == nil {
		p.all = true
	}
	for _, k := range keys {
		p.touched[k] = struct{}{}
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run publishes the touched rows, at most once a second, until ctx ends.
func (p *Publisher) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		all, touched := p.all, p.touched
		p.all, p.touched = false, map[model.ServiceKey]struct{}{}
		p.mu.Unlock()
		if all {
			p.rebuild(p.syncer.Services())
			if p.Rebuilt != nil {
				p.Rebuilt()
			}
		} else if len(touched) > 0 {
			var set []any
			var remove []appliance.ServiceName
			for k := range touched {
				st, _ := p.syncer.Service(k)
				p.noteWarnings(k, st.Warnings)
				if data, ok := row(st); ok {
					set = append(set, data)
				} else {
					remove = append(remove, appliance.ServiceName{Namespace: k.Namespace(), Name: k.Name()})
				}
			}
			p.rows = p.rows.WithRows((*rows)(p), set, remove...)
			p.rec.SetServices(p.rows)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// rebuild makes every row anew from states (in any order: the list orders
// them), and logs what changed of the Services' warnings.
func (p *Publisher) rebuild(states []loop.ServiceState) {
	data := make([]any, 0, len(states))
	// seen: the listed Services with warnings, those noteWarnings keeps
	// in warned (a set of every Service cost as much as their rows).
	seen := make(map[model.ServiceKey]bool, len(p.warned))
	for _, st := range states {
		p.noteWarnings(st.Key, st.Warnings)
		if len(st.Warnings) > 0 {
			seen[st.Key] = true
		}
		if d, ok := row(st); ok {
			data = append(data, d)
		}
	}
	for k := range p.warned {
		if !seen[k] {
			p.noteWarnings(k, nil)
		}
	}
	p.rows = appliance.ServiceList{}.WithRows((*rows)(p), data)
	p.rec.SetServices(p.rows)
}

// row returns what makes one Service's row on the page (serviceRow) when it
// is shown; ok is false for a Service that is not proxied at all or gone.
// A Service served as programmed, as nearly all are, is kept as its model
// alone (the model never changes); one with an error or warnings as a copy
// of its state.
func row(st loop.ServiceState) (data any, ok bool) {
	if st.Model == nil && st.Error == "" && st.KernelError == "" {
		return nil, false
	}
	if m := st.Model; m != nil && m.Key == st.Key && st.Error == "" && st.KernelError == "" && len(st.Warnings) == 0 {
		return m, true
	}
	c := st // a copy made here: &st would move every call's st to the heap
	return &c, true
}

// rows are the appliance.Rows of the data row returns: a *model.Service
// or a *loop.ServiceState.
type rows Publisher

func (r *rows) Name(data any) (namespace, name string) {
	var k model.ServiceKey
	switch d := data.(type) {
	case *model.Service:
		k = d.Key
	case *loop.ServiceState:
		k = d.Key
	}
	return k.Namespace(), k.Name()
}

func (r *rows) Make(data any) appliance.Service {
	var st loop.ServiceState
	switch d := data.(type) {
	case *model.Service:
		st = loop.ServiceState{Key: d.Key, Model: d}
	case *loop.ServiceState:
		st = *d
	}
	v, _ := serviceRow(st, &r.node)
	return v
}

// serviceRow turns one Service's state into its row on the page; ok is
// false for a Service that is not proxied at all (not the gateway's
// business) or gone. The row counts the endpoints and makes their list only
// when the page shows it (endpointRows), from the programmed model, which
// never changes: rows holding a copy of every endpoint were a tenth of the
// gateway's memory at ten thousand Services.
func serviceRow(st loop.ServiceState, node *model.Node) (appliance.Service, bool) {
	v := appliance.Service{Namespace: st.Key.Namespace(), Name: st.Key.Name(), Error: st.Error, KernelError: st.KernelError, Warnings: st.Warnings}
	if st.Model == nil && st.Error == "" && st.KernelError == "" {
		return v, false
	}
	if m := st.Model; m != nil {
		v.Type = m.Type.String()
		v.ClusterIPs, v.ExternalIPs, v.LoadBalancerIPs = m.ClusterIPs, m.ExternalIPs(), m.LoadBalancerIPs()
		v.ExternalPolicy, v.InternalPolicy = policy(m.ExternalLocal), policy(m.InternalLocal)
		v.Affinity = "None"
		if m.AffinityTimeout() > 0 {
			v.Affinity, v.AffinityTimeout = "ClientIP", m.AffinityTimeout()
		}
		v.SourceRanges = m.SourceRanges()
		v.HealthCheckNodePort = m.HealthCheckNodePort
		v.Ports = make([]appliance.ServicePort, 0, len(m.Ports))
		for pi := range m.Ports {
			p := &m.Ports[pi]
			v.Ports = append(v.Ports, appliance.ServicePort{Name: p.Name, Protocol: p.Protocol.KubeName(), Port: p.Port, NodePort: p.NodePort})
		}
		for pi := range m.Ports {
			p := &m.Ports[pi]
			v.EndpointCount += len(p.Endpoints)
			v.UsedCount += usedCount(m, p, node)
		}
		v.EndpointsFunc = func() []appliance.Endpoint { return endpointRows(m, node) }
	}
	return v, true
}

// endpointRows lists a Service's endpoints for the page. An endpoint is
// Used when the rules send traffic to it: the same choice the ruleset
// makes (model.Categorize), under either policy.
func endpointRows(m *model.Service, node *model.Node) []appliance.Endpoint {
	var out []appliance.Endpoint
	for pi := range m.Ports {
		p := &m.Ports[pi]
		used := usedEndpoints(m, p, node)
		for _, e := range p.Endpoints {
			out = append(out, appliance.Endpoint{PortName: p.Name, Addr: e.Addr(), Port: e.Port,
				Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating, Node: e.Place.Node(), Zone: e.Place.Zone(),
				Used: used[e.AddrPort()]})
		}
	}
	return out
}

// usedCount counts the endpoints of a Service port the rules send traffic
// to. Most often that is every one, and no set of them is made: a set per
// port was most of the cost of the rows of a hundred thousand Services.
func usedCount(m *model.Service, p *model.ServicePort, node *model.Node) int {
	sets := model.Categorize(m, p, *node)
	if len(sets.Cluster) == len(p.Endpoints) || len(sets.Local) == len(p.Endpoints) {
		// Either set is the port's endpoints less some, in order: as
		// long as them, it is all of them.
		return len(p.Endpoints)
	}
	used, n := usedIn(sets), 0
	for _, e := range p.Endpoints {
		if used[e.AddrPort()] {
			n++
		}
	}
	return n
}

// usedEndpoints are the endpoints of a Service port the rules send traffic
// to.
func usedEndpoints(m *model.Service, p *model.ServicePort, node *model.Node) map[netip.AddrPort]bool {
	return usedIn(model.Categorize(m, p, *node))
}

// usedIn are the endpoints of a port's sets.
func usedIn(sets model.EndpointSets) map[netip.AddrPort]bool {
	used := make(map[netip.AddrPort]bool, len(sets.Cluster)+len(sets.Local))
	for _, e := range sets.Cluster {
		used[e.AddrPort()] = true
	}
	for _, e := range sets.Local {
		used[e.AddrPort()] = true
	}
	return used
}

func policy(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

// FollowSource copies what the source cannot read (a manifest file
// refused, the API's last error) and, for the Kubernetes API, whether its
// watch holds, into the recorder every interval until ctx ends: a refused
// file changes no Service, so no sync would report it.
func FollowSource(ctx context.Context, src source.Source, rec *appliance.Recorder, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	connected, _ := src.(interface{ Connected() bool })
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rec.SetSourceProblems(src.Problems())
			if connected != nil {
				rec.SetAPIConnected(connected.Connected())
			}
		}
	}
}
