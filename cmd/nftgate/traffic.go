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
	fs.IntVar(&cfg.CountersTrafficElements, "counters-traffic-elements", cfg.CountersTrafficElements, "bound of the traffic sets that count packets and bytes per Service destination and endpoint, each way; 0 turns them off (see config.toml)")
	fs.BoolVar(&cfg.MetricsPerService, "metrics-per-service", cfg.MetricsPerService, "export the counters per Service port to Prometheus, not only the gateway's totals")
}

// Bounds of counters_traffic_elements: each element is a Service
// destination and endpoint pair one way, about 200 bytes of kernel memory.
const (
	defaultTrafficElements = 65536
	maxTrafficElements     = 1 << 22
)

// validateTraffic checks the counters' keys.
func (c *Config) validateTraffic(bad func(key, format string, args ...any)) {
	if c.CountersTrafficElements < 0 || c.CountersTrafficElements > maxTrafficElements {
		bad("counters_traffic_elements", "%d is not between 0 (no traffic sets) and %d", c.CountersTrafficElements, maxTrafficElements)
	}
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
		eps  map[netip.AddrPort]*appliance.TrafficEndpoint
	}
	by := make(map[nft.PortRef]*acc, len(rd.Ports))
	get := func(ref nft.PortRef) *acc {
		a := by[ref]
		if a == nil {
			a = &acc{port: appliance.TrafficPort{Namespace: ref.Service.Namespace, Name: ref.Service.Name,
				Protocol: ref.Proto.KubeName(), Port: ref.Port}, eps: map[netip.AddrPort]*appliance.TrafficEndpoint{}}
			by[ref] = a
		}
		return a
	}
	endpoint := func(a *acc, ep netip.AddrPort) *appliance.TrafficEndpoint {
		e := a.eps[ep]
		if e == nil {
			e = &appliance.TrafficEndpoint{Endpoint: ep.String()}
			a.eps[ep] = e
		}
		return e
	}
	for ref, c := range rd.Ports {
		a := get(ref)
		a.port.NewConnections, a.port.Rejected, a.port.Dropped = c.New.Packets, c.Rejected.Packets, c.Dropped.Packets
		a.port.PacketsIn, a.port.BytesIn = c.Traffic.In.Packets, c.Traffic.In.Bytes
		a.port.PacketsOut, a.port.BytesOut = c.Traffic.Out.Packets, c.Traffic.Out.Bytes
	}
	for ref, c := range rd.Endpoints {
		e := endpoint(get(ref.Port), ref.Endpoint)
		e.PacketsIn, e.BytesIn = c.In.Packets, c.In.Bytes
		e.PacketsOut, e.BytesOut = c.Out.Packets, c.Out.Bytes
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
		endpoint(a, f.Endpoint).ActiveFlows++
	}
	out := make([]appliance.TrafficPort, 0, len(by))
	for _, a := range by {
		for _, e := range a.eps {
			a.port.Endpoints = append(a.port.Endpoints, *e)
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
