package appliance

import (
	"cmp"
	"hash/maphash"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Traffic supplies what the gateway counts: the kernel's counters per
// Service port with their active flows, and the live flows. Both are read
// from the kernel at a bounded rate by their implementation.
type Traffic interface {
	// Ports returns the counters of every Service port, and when they were
	// read.
	Ports() ([]TrafficPort, time.Time, error)
	// Totals returns the sums of every port's counters, as Ports would
	// give them, without a row per port: the metrics' totals, asked at
	// every scrape.
	Totals() (TrafficTotals, error)
	// Flows returns the live flows of a Service.
	Flows(namespace, name string) ([]FlowJSON, error)
}

// TrafficTotals are the sums of the counters of every Service port.
type TrafficTotals struct {
	NewConnections, Rejected, Dropped        uint64
	ActiveFlows                              int
	PacketsIn, BytesIn, PacketsOut, BytesOut uint64
}

// Add adds one port's counters to the totals.
func (t *TrafficTotals) Add(p *TrafficPort) {
	t.NewConnections, t.Rejected, t.Dropped = t.NewConnections+p.NewConnections, t.Rejected+p.Rejected, t.Dropped+p.Dropped
	t.ActiveFlows += p.ActiveFlows
	t.PacketsIn, t.BytesIn, t.PacketsOut, t.BytesOut = t.PacketsIn+p.PacketsIn, t.BytesIn+p.BytesIn, t.PacketsOut+p.PacketsOut, t.BytesOut+p.BytesOut
}

// TrafficPort is what the gateway counted of one Service port: totals
// since the port's map elements were made.
type TrafficPort struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Protocol  string `json:"protocol"`
	Port      uint16 `json:"port"`
	// NewConnections were dispatched to the port's endpoints.
	NewConnections uint64 `json:"newConnections"`
	// Rejected were refused for want of endpoints.
	Rejected uint64 `json:"rejected"`
	// Dropped were dropped by loadBalancerSourceRanges.
	Dropped uint64 `json:"dropped"`
	// ActiveFlows are the conntrack flows translated to the port's
	// endpoints that have not ended; Bytes their bytes both ways (with
	// nf_conntrack_acct).
	ActiveFlows int    `json:"activeFlows"`
	Bytes       uint64 `json:"bytes"`
	// PacketsIn and BytesIn are what clients sent to the port's endpoints,
	// PacketsOut and BytesOut the endpoints' replies: every packet of the
	// port's translated connections, counted in the forward path
	// (counters_traffic_elements), since nftgate started.
	PacketsIn  uint64            `json:"packetsIn"`
	BytesIn    uint64            `json:"bytesIn"`
	PacketsOut uint64            `json:"packetsOut"`
	BytesOut   uint64            `json:"bytesOut"`
	Endpoints  []TrafficEndpoint `json:"endpoints"`
	// NewPerSecond is the rate of new connections over the last minute
	// (over what is known of it, since the start).
	NewPerSecond float64 `json:"newPerSecond"`
}

// TrafficEndpoint is one endpoint's share of a port's active flows and
// of its traffic (as TrafficPort's, while the port has the endpoint).
type TrafficEndpoint struct {
	Endpoint    string `json:"endpoint"`
	ActiveFlows int    `json:"activeFlows"`
	PacketsIn   uint64 `json:"packetsIn"`
	BytesIn     uint64 `json:"bytesIn"`
	PacketsOut  uint64 `json:"packetsOut"`
	BytesOut    uint64 `json:"bytesOut"`
}

// TrafficJSON is the body of GET /api/v1/traffic.
type TrafficJSON struct {
	ReadAt time.Time     `json:"readAt"`
	Sort   string        `json:"sort"`
	Ports  []TrafficPort `json:"ports"`
}

// FlowJSON is one live flow of a Service.
type FlowJSON struct {
	Protocol       string  `json:"protocol"`
	Client         string  `json:"client"`
	Destination    string  `json:"destination"`
	Endpoint       string  `json:"endpoint"`
	State          string  `json:"state,omitempty"`
	TimeoutSeconds float64 `json:"timeoutSeconds"`
	// AgeSeconds is how long ago the flow began; zero when the kernel
	// does not stamp flows (nf_conntrack_timestamp = 0).
	AgeSeconds float64 `json:"ageSeconds,omitempty"`
	Bytes      uint64  `json:"bytes"`
}

// FlowsJSON is the body of GET /api/v1/services/{namespace}/{name}/flows.
type FlowsJSON struct {
	Total     int        `json:"total"`
	Truncated bool       `json:"truncated"`
	Flows     []FlowJSON `json:"flows"`
	// All counts the Service's flows, whatever the filter; TopClients are
	// the ten client addresses with the most of them (each endpoint's
	// share of the open flows is in GET /api/v1/traffic).
	All        int             `json:"all"`
	TopClients []FlowShareJSON `json:"topClients"`
}

// FlowShareJSON is one client's share of a Service's flows.
type FlowShareJSON struct {
	Address string `json:"address"`
	Flows   int    `json:"flows"`
	Bytes   uint64 `json:"bytes"`
}

// TopClients is how many clients FlowsJSON.TopClients lists.
const TopClients = 10

// Flow listing bounds: ?limit= defaults to, and is capped at, these.
const (
	DefaultFlowLimit = 100
	MaxFlowLimit     = 1000
)

// trafficSorts are the orders of ?sort=, each descending but "name".
var trafficSorts = map[string]func(a, b *TrafficPort) int{
	"new":      func(a, b *TrafficPort) int { return cmp.Compare(b.NewConnections, a.NewConnections) },
	"rate":     func(a, b *TrafficPort) int { return cmp.Compare(b.NewPerSecond, a.NewPerSecond) },
	"rejected": func(a, b *TrafficPort) int { return cmp.Compare(b.Rejected, a.Rejected) },
	"dropped":  func(a, b *TrafficPort) int { return cmp.Compare(b.Dropped, a.Dropped) },
	"flows":    func(a, b *TrafficPort) int { return cmp.Compare(b.ActiveFlows, a.ActiveFlows) },
	"bytes":    func(a, b *TrafficPort) int { return cmp.Compare(b.Bytes, a.Bytes) },
	"traffic":  func(a, b *TrafficPort) int { return cmp.Compare(b.BytesIn+b.BytesOut, a.BytesIn+a.BytesOut) },
	"name":     func(a, b *TrafficPort) int { return 0 },
}

// portID identifies a Service port in the rate history.
type portID struct {
	ns, name, proto string
	port            uint16
}

func idOf(p *TrafficPort) portID { return portID{p.Namespace, p.Name, p.Protocol, p.Port} }

// portSeed seeds the hash of a port's identity in the kept readings.
var portSeed = maphash.MakeSeed()

// portIndex is what a kept reading holds of each port, by a 64-bit hash of
// the port's identity, in hash order. The readings kept for the rates and
// the history were maps by the port's names, about 90 bytes a port a
// reading: 133 MB at 100,000 ports once a minute of readings was in
// (BenchmarkTrafficKept). Two ports whose identities hash alike (about one
// chance in 10^9 a reading among 100,000 ports) would show each other's
// rate for a point.
type portIndex[V any] []portValue[V]

type portValue[V any] struct {
	key uint64
	v   V
}

func portKey(p *TrafficPort) uint64 { return maphash.Comparable(portSeed, idOf(p)) }

// portKeys are the ports' keys, in their order.
func portKeys(ports []TrafficPort) []uint64 {
	keys := make([]uint64, len(ports))
	for i := range ports {
		keys[i] = portKey(&ports[i])
	}
	return keys
}

// indexPorts keeps value(p) of every port; keys are portKeys(ports).
func indexPorts[V any](ports []TrafficPort, keys []uint64, value func(*TrafficPort) V) portIndex[V] {
	x := make(portIndex[V], len(ports))
	for i := range ports {
		x[i] = portValue[V]{keys[i], value(&ports[i])}
	}
	slices.SortFunc(x, func(a, b portValue[V]) int { return cmp.Compare(a.key, b.key) })
	return x
}

// get returns what the index keeps of the port of key k.
func (x portIndex[V]) get(k uint64) (V, bool) {
	i, ok := slices.BinarySearchFunc(x, k, func(e portValue[V], k uint64) int { return cmp.Compare(e.key, k) })
	if !ok {
		var zero V
		return zero, false
	}
	return x[i].v, true
}

// rateWindow is the span NewPerSecond is measured over; rateStep the
// least time between two kept readings, which bounds the history to
// rateWindow/rateStep+1 readings.
const (
	rateWindow = time.Minute
	rateStep   = 5 * time.Second
)

// reading is one kept reading of the new-connection counters.
type reading struct {
	at  time.Time
	new portIndex[uint64]
}

// rates keeps the readings of the last minute.
type rates struct {
	mu   sync.Mutex
	hist []reading
}

// fill sets NewPerSecond of ports read at at, from the oldest kept reading
// of the window, and keeps this one when the last is rateStep old.
func (r *rates) fill(ports []TrafficPort, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.hist) > 0 && at.Sub(r.hist[0].at) > rateWindow {
		r.hist = r.hist[1:]
	}
	keys := portKeys(ports)
	if len(r.hist) > 0 {
		old := r.hist[0]
		if dt := at.Sub(old.at).Seconds(); dt > 0 {
			for i := range ports {
				p := &ports[i]
				if n, ok := old.new.get(keys[i]); ok && p.NewConnections >= n {
					p.NewPerSecond = float64(p.NewConnections-n) / dt
				}
			}
		}
	}
	if len(r.hist) == 0 || at.Sub(r.hist[len(r.hist)-1].at) >= rateStep {
		r.hist = append(r.hist, reading{at, indexPorts(ports, keys, func(p *TrafficPort) uint64 { return p.NewConnections })})
	}
}

func (s *server) traffic(w http.ResponseWriter, r *http.Request) {
	sortBy := r.URL.Query().Get("sort")
	if sortBy == "" {
		sortBy = "new"
	}
	order, ok := trafficSorts[sortBy]
	if !ok {
		s.writeJSON(w, r, http.StatusBadRequest, ErrorJSON{Error: "sort: " + strconv.Quote(sortBy) + " is none of new, rate, rejected, dropped, flows, bytes, traffic, name"})
		return
	}
	ports, at, err := s.opts.Traffic.Ports()
	if err != nil {
		s.writeJSON(w, r, http.StatusServiceUnavailable, ErrorJSON{Error: err.Error()})
		return
	}
	ports = slices.Clone(ports)
	for i := range ports {
		if ports[i].Endpoints == nil {
			ports[i].Endpoints = []TrafficEndpoint{} // the API's empty lists are []
		}
	}
	s.rates.fill(ports, at)
	// The order is total (the name breaks ties), so an unstable sort gives the
	// same answer; sorting pointers moves and copies no ports, which at
	// 10,000 ports is several times faster than a stable sort of the ports.
	byOrder := make([]*TrafficPort, len(ports))
	for i := range ports {
		byOrder[i] = &ports[i]
	}
	slices.SortFunc(byOrder, func(a, b *TrafficPort) int {
		if c := order(a, b); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	s.writeJSONList(w, r, TrafficJSON{ReadAt: at, Sort: sortBy}, "ports", func(yield func(any) bool) {
		for _, p := range byOrder {
			if !yield(p) {
				return
			}
		}
	})
}

func (s *server) flows(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultFlowLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeJSON(w, r, http.StatusBadRequest, ErrorJSON{Error: "limit: " + strconv.Quote(v) + " is not a positive number"})
			return
		}
		limit = min(n, MaxFlowLimit)
	}
	var client netip.Prefix
	if v := q.Get("client"); v != "" {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				s.writeJSON(w, r, http.StatusBadRequest, ErrorJSON{Error: "client: " + strconv.Quote(v) + " is no address or prefix"})
				return
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		client = p.Masked()
	}
	search := strings.ToLower(q.Get("q"))
	all, err := s.opts.Traffic.Flows(r.PathValue("namespace"), r.PathValue("name"))
	if err != nil {
		s.writeJSON(w, r, http.StatusServiceUnavailable, ErrorJSON{Error: err.Error()})
		return
	}
	out := FlowsJSON{Flows: []FlowJSON{}, All: len(all)}
	clients := map[string]*FlowShareJSON{}
	for i := range all {
		f := &all[i]
		ap, perr := netip.ParseAddrPort(f.Client)
		if perr == nil {
			a := ap.Addr().String()
			sh := clients[a]
			if sh == nil {
				sh = &FlowShareJSON{Address: a}
				clients[a] = sh
			}
			sh.Flows++
			sh.Bytes += f.Bytes
		}
		if client.IsValid() && (perr != nil || !client.Contains(ap.Addr())) {
			continue
		}
		if search != "" && !strings.Contains(strings.ToLower(f.Client+" "+f.Destination+" "+f.Endpoint+" "+f.State+" "+f.Protocol), search) {
			continue
		}
		out.Total++
		if len(out.Flows) < limit {
			out.Flows = append(out.Flows, *f)
		}
	}
	out.Truncated = out.Total > len(out.Flows)
	out.TopClients = topClients(clients)
	s.writeJSON(w, r, http.StatusOK, out)
}

// topClients lists the TopClients clients of m with the most flows, then
// by address.
func topClients(m map[string]*FlowShareJSON) []FlowShareJSON {
	out := make([]FlowShareJSON, 0, len(m))
	for _, sh := range m {
		out = append(out, *sh)
	}
	slices.SortFunc(out, func(a, b FlowShareJSON) int {
		return cmp.Or(cmp.Compare(b.Flows, a.Flows), cmp.Compare(a.Address, b.Address))
	})
	return out[:min(len(out), TopClients)]
}

// TrafficCollector exports the counters to Prometheus, read at most at
// the Traffic's own rate: the gateway's totals always, and per Service
// port only with perService (a series set per port: a cardinality the
// operator chooses).
type TrafficCollector struct {
	traffic    Traffic
	perService bool
}

// NewTrafficCollector returns the collector of t's counters.
func NewTrafficCollector(t Traffic, perService bool) *TrafficCollector {
	return &TrafficCollector{traffic: t, perService: perService}
}

var (
	trafficLabels   = []string{"kind"}
	descConnections = prometheus.NewDesc("nftgate_connections_total",
		"New connections to Services counted by the kernel, by kind: new (dispatched to endpoints), rejected (no endpoints), dropped (loadBalancerSourceRanges).", trafficLabels, nil)
	descActiveFlows = prometheus.NewDesc("nftgate_active_flows",
		"Conntrack flows translated to Service endpoints that have not ended.", nil, nil)
	serviceLabels          = []string{"namespace", "service", "protocol", "port", "kind"}
	descServiceConnections = prometheus.NewDesc("nftgate_service_connections_total",
		"New connections to one Service port, by kind as nftgate_connections_total (metrics_per_service).", serviceLabels, nil)
	descServiceActiveFlows = prometheus.NewDesc("nftgate_service_active_flows",
		"Active flows of one Service port (metrics_per_service).", serviceLabels[:4], nil)
	directionLabels  = []string{"direction"}
	descTrafficBytes = prometheus.NewDesc("nftgate_traffic_bytes_total",
		"Bytes of the connections translated to Service endpoints, counted in the forward path, by direction: in (from clients), out (replies).", directionLabels, nil)
	descTrafficPackets = prometheus.NewDesc("nftgate_traffic_packets_total",
		"Packets of the connections translated to Service endpoints, by direction as nftgate_traffic_bytes_total.", directionLabels, nil)
	serviceDirectionLabels  = append(slices.Clone(serviceLabels[:4]), "direction")
	descServiceTrafficBytes = prometheus.NewDesc("nftgate_service_traffic_bytes_total",
		"Bytes of one Service port's connections, by direction as nftgate_traffic_bytes_total (metrics_per_service).", serviceDirectionLabels, nil)
	descServiceTrafficPackets = prometheus.NewDesc("nftgate_service_traffic_packets_total",
		"Packets of one Service port's connections, by direction as nftgate_traffic_bytes_total (metrics_per_service).", serviceDirectionLabels, nil)
)

// Describe implements prometheus.Collector.
func (c *TrafficCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descConnections
	ch <- descActiveFlows
	ch <- descTrafficBytes
	ch <- descTrafficPackets
	if c.perService {
		ch <- descServiceConnections
		ch <- descServiceActiveFlows
		ch <- descServiceTrafficBytes
		ch <- descServiceTrafficPackets
	}
}

// Collect implements prometheus.Collector. Without the per-Service
// metrics it asks only for the totals: a row for every port at every
// scrape was 47 MB of garbage at 100,000 Services.
func (c *TrafficCollector) Collect(ch chan<- prometheus.Metric) {
	var t TrafficTotals
	if !c.perService {
		var err error
		if t, err = c.traffic.Totals(); err != nil {
			return // the rest of the scrape stands; the API says what failed
		}
	} else {
		ports, _, err := c.traffic.Ports()
		if err != nil {
			return
		}
		for i := range ports {
			p := &ports[i]
			t.Add(p)
			port := strconv.Itoa(int(p.Port))
			for _, k := range []struct {
				kind string
				v    uint64
			}{{"new", p.NewConnections}, {"rejected", p.Rejected}, {"dropped", p.Dropped}} {
				ch <- prometheus.MustNewConstMetric(descServiceConnections, prometheus.CounterValue, float64(k.v), p.Namespace, p.Name, p.Protocol, port, k.kind)
			}
			ch <- prometheus.MustNewConstMetric(descServiceActiveFlows, prometheus.GaugeValue, float64(p.ActiveFlows), p.Namespace, p.Name, p.Protocol, port)
			for _, d := range []struct {
				dir             string
				packets, nbytes uint64
			}{{"in", p.PacketsIn, p.BytesIn}, {"out", p.PacketsOut, p.BytesOut}} {
				ch <- prometheus.MustNewConstMetric(descServiceTrafficBytes, prometheus.CounterValue, float64(d.nbytes), p.Namespace, p.Name, p.Protocol, port, d.dir)
				ch <- prometheus.MustNewConstMetric(descServiceTrafficPackets, prometheus.CounterValue, float64(d.packets), p.Namespace, p.Name, p.Protocol, port, d.dir)
			}
		}
	}
	n, rej, drop, flows := t.NewConnections, t.Rejected, t.Dropped, t.ActiveFlows
	pin, bin, pout, bout := t.PacketsIn, t.BytesIn, t.PacketsOut, t.BytesOut
	ch <- prometheus.MustNewConstMetric(descConnections, prometheus.CounterValue, float64(n), "new")
	ch <- prometheus.MustNewConstMetric(descConnections, prometheus.CounterValue, float64(rej), "rejected")
	ch <- prometheus.MustNewConstMetric(descConnections, prometheus.CounterValue, float64(drop), "dropped")
	ch <- prometheus.MustNewConstMetric(descActiveFlows, prometheus.GaugeValue, float64(flows))
	ch <- prometheus.MustNewConstMetric(descTrafficBytes, prometheus.CounterValue, float64(bin), "in")
	ch <- prometheus.MustNewConstMetric(descTrafficBytes, prometheus.CounterValue, float64(bout), "out")
	ch <- prometheus.MustNewConstMetric(descTrafficPackets, prometheus.CounterValue, float64(pin), "in")
	ch <- prometheus.MustNewConstMetric(descTrafficPackets, prometheus.CounterValue, float64(pout), "out")
}

// CountsFunc reads counts since the rules that count them were made, by
// the value of one label: only the values the gateway runs with.
type CountsFunc func() (map[string]uint64, error)

// ResetsFunc reads the gateway's resets of endpoints' TIME_WAIT by reason
// ("released", "refused").
type ResetsFunc = CountsFunc

// CountsCollector exports a CountsFunc's counts to Prometheus as one
// counter with one label (without, for the count read under the empty
// label of a counter that has none). A read that fails leaves the counter
// out of the scrape: reported as 0, it would look like a reset.
type CountsCollector struct {
	desc *prometheus.Desc
	read CountsFunc
}

// NewResetsCollector returns the collector of read's resets.
func NewResetsCollector(read ResetsFunc) *CountsCollector {
	return &CountsCollector{desc: descTimeWaitResets, read: read}
}

// NewMidstreamCollector returns the collector of read's connections that
// waited for their replica, by outcome ("waited", "given_up").
func NewMidstreamCollector(read CountsFunc) *CountsCollector {
	return &CountsCollector{desc: descMidstream, read: read}
}

var descTimeWaitResets = prometheus.NewDesc("nftgate_time_wait_resets_total",
	"TCP resets the gateway sent to endpoints to end a TIME_WAIT on a masquerade address and port, by reason: released (both ends had closed the connection, release_time_wait), refused (the endpoint refused a client's SYN on it, answer_refused_syns).",
	[]string{"reason"}, nil)

var descMidstream = prometheus.NewDesc("nftgate_midstream_tcp_connections_total",
	"Masqueraded TCP connections whose packets came to the gateway without a conntrack entry (moved here from another gateway ahead of their replica), by outcome: waited (their packets were dropped, waiting for the replica, midstream_tcp = \"wait\"), given_up (no replica came within midstream_tcp_wait: picked up here).",
	[]string{"outcome"}, nil)

// NewStrayRepliesCollector returns the collector of the packets dropped
// as stray replies, which read returns under the empty label.
func NewStrayRepliesCollector(read CountsFunc) *CountsCollector {
	return &CountsCollector{desc: descStrayReplies, read: read}
}

var descStrayReplies = prometheus.NewDesc("nftgate_midstream_stray_replies_dropped_total",
	"Packets dropped that went to a masquerade address of the gateway set without a conntrack entry here: an endpoint's answers to a connection a peer picked up in mid-stream, before its replica came (or strays that would have been routed back to the router).",
	nil, nil)

// Describe implements prometheus.Collector.
func (c *CountsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *CountsCollector) Collect(ch chan<- prometheus.Metric) {
	n, err := c.read()
	if err != nil {
		return // the rest of the scrape stands
	}
	for label, v := range n {
		var labels []string
		if label != "" {
			labels = []string{label}
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v), labels...)
	}
}
