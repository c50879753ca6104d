package main

import (
	"flag"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nftgate/nftgate/appliance"
	"github.com/nftgate/nftgate/conntrack"
	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/nft"
)

// trafficFlags registers the counters' flags.
func trafficFlags(fs *flag.FlagSet, cfg *Config) {
	fs.BoolVar(&cfg.Counters, "counters", cfg.Counters, "count new, rejected and dropped connections per Service port in the kernel (see config.toml)")
	fs.BoolVar(&cfg.MetricsPerService, "metrics-per-service", cfg.MetricsPerService, "export the counters per Service port to Prometheus, not only the gateway's totals")
}

// traffic joins the kernel's counters and conntrack's flows per Service
// port for the API and the metrics; both read the kernel at most once a
// second however often they are asked.
type traffic struct {
	prog  *nft.Programmer
	flows *conntrack.Flows
}

func newTraffic(prog *nft.Programmer) *traffic {
	return &traffic{prog: prog, flows: conntrack.NewFlows()}
}

// Ports implements appliance.Traffic.
func (t *traffic) Ports() ([]appliance.TrafficPort, time.Time, error) {
	rd, err := t.prog.Counters()
	if err != nil {
		return nil, time.Time{}, err
	}
	flows, _, err := t.flows.Read()
	if err != nil {
		return nil, time.Time{}, err
	}
	type acc struct {
		port appliance.TrafficPort
		eps  map[netip.AddrPort]int
	}
	by := make(map[nft.PortRef]*acc, len(rd.Ports))
	get := func(ref nft.PortRef) *acc {
		a := by[ref]
		if a == nil {
			a = &acc{port: appliance.TrafficPort{Namespace: ref.Service.Namespace, Name: ref.Service.Name,
				Protocol: ref.Proto.KubeName(), Port: ref.Port}, eps: map[netip.AddrPort]int{}}
			by[ref] = a
		}
		return a
	}
	for ref, c := range rd.Ports {
		a := get(ref)
		a.port.NewConnections, a.port.Rejected, a.port.Dropped = c.New.Packets, c.Rejected.Packets, c.Dropped.Packets
	}
	for i := range flows {
		f := &flows[i]
		ref, ok := rd.PortOf(f.Proto, f.Dest)
		if !ok || !f.Open() {
			continue
		}
		a := get(ref)
		a.port.ActiveFlows++
		a.port.Bytes += f.Bytes
		a.eps[f.Endpoint]++
	}
	out := make([]appliance.TrafficPort, 0, len(by))
	for _, a := range by {
		for ep, n := range a.eps {
			a.port.Endpoints = append(a.port.Endpoints, appliance.TrafficEndpoint{Endpoint: ep.String(), ActiveFlows: n})
		}
		slices.SortFunc(a.port.Endpoints, func(x, y appliance.TrafficEndpoint) int { return strings.Compare(x.Endpoint, y.Endpoint) })
		out = append(out, a.port)
	}
	return out, rd.At, nil
}

// Flows implements appliance.Traffic.
func (t *traffic) Flows(namespace, name string) ([]appliance.FlowJSON, error) {
	rd, err := t.prog.Counters()
	if err != nil {
		return nil, err
	}
	flows, _, err := t.flows.Read()
	if err != nil {
		return nil, err
	}
	key := model.ServiceKey{Namespace: namespace, Name: name}
	out := []appliance.FlowJSON{}
	for i := range flows {
		f := &flows[i]
		if ref, ok := rd.PortOf(f.Proto, f.Dest); !ok || ref.Service != key {
			continue
		}
		out = append(out, appliance.FlowJSON{Protocol: f.Proto.KubeName(), Client: f.Client.String(), Destination: f.Dest.String(),
			Endpoint: f.Endpoint.String(), State: f.State, TimeoutSeconds: f.Timeout.Seconds(), AgeSeconds: f.Age.Seconds(), Bytes: f.Bytes})
	}
	return out, nil
}
