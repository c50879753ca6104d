package model

// Node is where the gateway stands: the node name endpoints are compared with
// for traffic policy Local, and the zone for topology hints.
type Node struct {
	Name string
	Zone string
}

// isLocal tells whether an endpoint runs on this node. A gateway without a
// node name has no local endpoints, whatever the endpoints say.
func (n Node) isLocal(e *Endpoint) bool { return n.Name != "" && e.Place.Node() == n.Name }

// EndpointSets are the endpoints one Service port may send traffic to, chosen
// the way kube-proxy's topology code chooses them. A set may be the port's
// own list of endpoints: it is read, never changed.
type EndpointSets struct {
	// Cluster serves traffic under policy Cluster: ready endpoints after
	// topology filtering, else serving-and-terminating ones.
	Cluster []Endpoint
	// Local serves traffic under policy Local: this node's ready endpoints,
	// else its serving-and-terminating ones.
	Local []Endpoint
	// Any tells whether the port has any usable endpoint anywhere, which
	// decides between dropping (none here) and rejecting (none at all).
	Any bool
}

// Categorize picks the endpoints of p for node, following kube-proxy's
// CategorizeEndpoints: topology hints apply only when every ready endpoint
// carries them and one matches; a port falls back to serving+terminating
// endpoints when no ready one exists, so connections drain during rollouts.
func Categorize(s *Service, p *ServicePort, node Node) EndpointSets {
	var out EndpointSets
	eps := p.Endpoints
	externallyAccessible := s.ExternallyAccessible()
	usesCluster := !s.InternalLocal || externallyAccessible
	usesLocal := s.InternalLocal || (externallyAccessible && s.ExternalLocal)

	if usesCluster {
		mode := topologyMode(eps, node)
		out.Cluster = filter(eps, func(e *Endpoint) bool {
			return e.Ready && availableForTopology(e, mode, node)
		})
		if len(out.Cluster) == 0 {
			out.Cluster = filter(eps, func(e *Endpoint) bool {
				return e.Serving && e.Terminating && availableForTopology(e, mode, node)
			})
		}
		out.Any = len(out.Cluster) > 0
		if !usesLocal {
			return out
		}
	}

	localReady, localTerminating := false, false
	for i := range eps {
		e := &eps[i]
		switch {
		case e.Ready:
			out.Any = true
			localReady = localReady || node.isLocal(e)
		case e.Serving && e.Terminating:
			out.Any = true
			localTerminating = localTerminating || node.isLocal(e)
		}
	}
	switch {
	case localReady:
		out.Local = filter(eps, func(e *Endpoint) bool { return node.isLocal(e) && e.Ready })
	case localTerminating:
		out.Local = filter(eps, func(e *Endpoint) bool {
			return node.isLocal(e) && e.Serving && e.Terminating
		})
	}
	return out
}

const (
	preferSameNode = "PreferSameNode"
	preferSameZone = "PreferSameZone"
)

// topologyMode decides whether hints are usable: only when every ready
// endpoint has them and at least one names this node (or zone). Otherwise all
// endpoints are used, so a half-rolled-out hint set never strands traffic.
func topologyMode(eps []Endpoint, node Node) string {
	allNode, forNode := true, false
	allZone, forZone := true, false
	for i := range eps {
		e := &eps[i]
		if !e.Ready {
			continue
		}
		p := e.Place.value()
		if p.forNodes == "" {
			allNode = false
		} else if hinted(p.forNodes, node.Name) {
			forNode = true
		}
		if p.forZones == "" {
			allZone = false
		} else if hinted(p.forZones, node.Zone) {
			forZone = true
		}
	}
	if allNode && forNode {
		return preferSameNode
	}
	if allZone && forZone && node.Zone != "" {
		return preferSameZone
	}
	return ""
}

func availableForTopology(e *Endpoint, mode string, node Node) bool {
	switch mode {
	case preferSameNode:
		return hinted(e.Place.value().forNodes, node.Name)
	case preferSameZone:
		return hinted(e.Place.value().forZones, node.Zone)
	}
	return true
}

func filter(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	n := 0
	for i := range eps {
		if keep(&eps[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		// Most often every endpoint is kept: the port's own list is
		// the answer (its capacity cut, so that an append copies), as
		// Categorize's callers only read it.
		return eps[:n:n]
	}
	out := make([]Endpoint, 0, n)
	for i := range eps {
		if keep(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}
