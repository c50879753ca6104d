package main

import (
	"cmp"
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

// read reads the counters and the flows.
func (t *traffic) read() (*nft.Reading, []conntrack.Flow, error) {
	rd, err := t.prog.Counters()
	if err != nil {
		return nil, nil, err
	}
	flows, _, err := t.flows.Read()
	if err != nil {
		return nil, nil, err
	}
	return rd, flows, nil
}

// Ports implements appliance.Traffic. It makes a row for every port and
// nothing else per port (the history asks every minute, and at 100,000
// ports a map of endpoints and a struct for each were half of 47 MB): the
// rows are found by an index while they are filled, and the endpoints of
// all of them share one array.
func (t *traffic) Ports() ([]appliance.TrafficPort, time.Time, error) {
	rd, flows, err := t.read()
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]appliance.TrafficPort, 0, rd.NumPorts())
	index := make(map[nft.PortRef]int32, rd.NumPorts())
	row := func(ref nft.PortRef) int32 {
		i, ok := index[ref]
		if !ok {
			i = int32(len(out))
			index[ref] = i
			out = append(out, appliance.TrafficPort{Namespace: ref.Service.Namespace(), Name: ref.Service.Name(),
				Protocol: ref.Proto.KubeName(), Port: ref.Port})
		}
		return i
	}
	type epKey struct {
		row int32
		ep  netip.AddrPort
	}
	type epRow struct {
		row int32
		ep  appliance.TrafficEndpoint
	}
	var eps []epRow
	epIndex := map[epKey]int{}
	endpoint := func(row int32, ep netip.AddrPort) *appliance.TrafficEndpoint {
		k := epKey{row, ep}
		i, ok := epIndex[k]
		if !ok {
			i = len(eps)
			epIndex[k] = i
			eps = append(eps, epRow{row, appliance.TrafficEndpoint{Endpoint: ep.String()}})
		}
		return &eps[i].ep
	}
	for ref, c := range rd.Ports() {
		i := row(ref) // before out is indexed: row may grow it
		setCounts(&out[i], c)
	}
	for ref, c := range rd.Endpoints {
		e := endpoint(row(ref.Port), ref.Endpoint)
		e.PacketsIn, e.BytesIn = c.In.Packets, c.In.Bytes
		e.PacketsOut, e.BytesOut = c.Out.Packets, c.Out.Bytes
	}
	for i := range flows {
		f := &flows[i]
		ref, ok := rd.PortOf(f.Proto, f.Dest)
		if !ok || !f.Open() {
			continue
		}
		r := row(ref)
		out[r].ActiveFlows++
		out[r].Bytes += f.Bytes
		endpoint(r, f.Endpoint).ActiveFlows++
	}
	if len(eps) > 0 {
		slices.SortFunc(eps, func(x, y epRow) int {
			if x.row != y.row {
				return cmp.Compare(x.row, y.row)
			}
			return strings.Compare(x.ep.Endpoint, y.ep.Endpoint)
		})
		all := make([]appliance.TrafficEndpoint, len(eps))
		for i := range eps {
			all[i] = eps[i].ep
		}
		for i := 0; i < len(eps); {
			j := i + 1
			for j < len(eps) && eps[j].row == eps[i].row {
				j++
			}
			out[eps[i].row].Endpoints = all[i:j:j]
			i = j
		}
	}
	return out, rd.At, nil
}

// setCounts sets a port's row from its counters in the kernel.
func setCounts(p *appliance.TrafficPort, c nft.PortCounters) {
	p.NewConnections, p.Rejected, p.Dropped = c.New, c.Rejected, c.Dropped
	p.PacketsIn, p.BytesIn = c.Traffic.In.Packets, c.Traffic.In.Bytes
	p.PacketsOut, p.BytesOut = c.Traffic.Out.Packets, c.Traffic.Out.Bytes
}

// Totals implements appliance.Traffic: the sums Ports' rows would add up
// to, without them.
func (t *traffic) Totals() (appliance.TrafficTotals, error) {
	rd, flows, err := t.read()
	if err != nil {
		return appliance.TrafficTotals{}, err
	}
	var tt appliance.TrafficTotals
	var p appliance.TrafficPort
	for _, c := range rd.Ports() {
		setCounts(&p, c)
		tt.Add(&p)
	}
	for i := range flows {
		f := &flows[i]
		if _, ok := rd.PortOf(f.Proto, f.Dest); ok && f.Open() {
			tt.ActiveFlows++
		}
	}
	return tt, nil
}

// resets reads the gateway's resets of endpoints' TIME_WAIT from the
// counters, for the reasons turned on (release_time_wait,
// answer_refused_syns).
func (t *traffic) resets(released, refused bool) appliance.ResetsFunc {
	return func() (map[string]uint64, error) {
		rd, err := t.prog.Counters()
		if err != nil {
			return nil, err
		}
		n := map[string]uint64{}
		if released {
			n["released"] = rd.Resets.Released
		}
		if refused {
			n["refused"] = rd.Resets.Refused
		}
		return n, nil
	}
}

// midstream reads the connections that waited for their replica, and
// those given up, from the counters ([gateways] midstream_tcp_wait).
func (t *traffic) midstream() (map[string]uint64, error) {
	rd, err := t.prog.Counters()
	if err != nil {
		return nil, err
	}
	return map[string]uint64{"waited": rd.Midstream.Waited, "given_up": rd.Midstream.GivenUp}, nil
}

// strayReplies reads the packets dropped as stray replies
// (ruleset.ChainStrayReplies), under the empty label.
func (t *traffic) strayReplies() (map[string]uint64, error) {
	rd, err := t.prog.Counters()
	if err != nil {
		return nil, err
	}
	return map[string]uint64{"": rd.Midstream.StrayReplies}, nil
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
	key := model.NewServiceKey(namespace, name)
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
