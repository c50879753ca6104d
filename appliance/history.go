package appliance

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
)

// History defaults: one point a minute for an hour, for at most 10,000
// Service ports.
const (
	DefaultHistoryStep   = time.Minute
	DefaultHistoryPoints = 60
	DefaultHistoryPorts  = 10000
)

// History keeps the recent traffic of the Service ports that had any: one
// point per step (new and refused connections per second, active flows),
// the last Points of them, for at most MaxPorts ports. A port leaves when
// its kept points are all zero. Each kept port costs 12 bytes a point
// (720 bytes at 60 points) besides its map entry.
type History struct {
	step     time.Duration
	points   int
	maxPorts int

	mu      sync.Mutex
	times   []time.Time // ring of the sample times, oldest at slot (k % points) once full
	k       int         // samples taken
	prev    portIndex[[2]uint64]
	prevAt  time.Time
	ports   map[portID]*portHistory
	skipped int // ports with traffic left out at the last sample for MaxPorts
}

type portHistory struct {
	newRate, refusedRate, flows []float32 // slots as History.times
}

// NewHistory returns a history of points points, one per step, of at most
// maxPorts ports; zero values take the defaults.
func NewHistory(step time.Duration, points, maxPorts int) *History {
	if step <= 0 {
		step = DefaultHistoryStep
	}
	if points <= 0 {
		points = DefaultHistoryPoints
	}
	if maxPorts <= 0 {
		maxPorts = DefaultHistoryPorts
	}
	return &History{step: step, points: points, maxPorts: maxPorts, times: make([]time.Time, points),
		ports: map[portID]*portHistory{}}
}

// Step is the time between two points.
func (h *History) Step() time.Duration { return h.step }

// Run samples t every step, from one step after it starts, until ctx
// ends. A failed reading leaves a gap
// (logged at debug level: the API says what failed).
func (h *History) Run(ctx context.Context, t Traffic, log *slog.Logger) {
	tick := time.NewTicker(h.step)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ports, at, err := t.Ports()
		if err != nil {
			log.Debug("traffic history: reading the counters failed", "err", err)
		} else {
			h.Sample(ports, at)
		}
	}
}

// Sample adds the point of the counters read at at. The first sample only
// sets the base the rates of the next are counted from.
func (h *History) Sample(ports []TrafficPort, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	first := h.prevAt.IsZero()
	dt := at.Sub(h.prevAt).Seconds()
	prev := h.prev
	keys := portKeys(ports)
	h.prev = indexPorts(ports, keys, func(p *TrafficPort) [2]uint64 { return [2]uint64{p.NewConnections, p.Rejected + p.Dropped} })
	h.prevAt = at
	if first || dt <= 0 {
		return
	}
	slot := h.k % h.points
	h.times[slot] = at
	h.k++
	seen := make(map[portID]bool, len(h.ports))
	h.skipped = 0
	for i := range ports {
		p := &ports[i]
		id := idOf(p)
		var nr, rr float32
		if old, ok := prev.get(keys[i]); ok {
			if p.NewConnections >= old[0] {
				nr = float32(float64(p.NewConnections-old[0]) / dt)
			}
			if c := p.Rejected + p.Dropped; c >= old[1] {
				rr = float32(float64(c-old[1]) / dt)
			}
		}
		ph := h.ports[id]
		if ph == nil {
			if nr == 0 && rr == 0 && p.ActiveFlows == 0 {
				continue
			}
			if len(h.ports) >= h.maxPorts {
				h.skipped++
				continue
			}
			ph = &portHistory{newRate: make([]float32, h.points), refusedRate: make([]float32, h.points), flows: make([]float32, h.points)}
			h.ports[id] = ph
		}
		seen[id] = true
		ph.newRate[slot], ph.refusedRate[slot], ph.flows[slot] = nr, rr, float32(p.ActiveFlows)
	}
	for id, ph := range h.ports {
		if !seen[id] {
			ph.newRate[slot], ph.refusedRate[slot], ph.flows[slot] = 0, 0, 0
		}
		if ph.idle() {
			delete(h.ports, id)
		}
	}
}

func (ph *portHistory) idle() bool {
	for i := range ph.newRate {
		if ph.newRate[i] != 0 || ph.refusedRate[i] != 0 || ph.flows[i] != 0 {
			return false
		}
	}
	return true
}

// HistoryJSON is the body of GET /api/v1/traffic/history.
type HistoryJSON struct {
	StepSeconds float64 `json:"stepSeconds"`
	// Times are the points' times, oldest first; every port's lists are
	// as long, point for point.
	Times []time.Time       `json:"times"`
	Ports []PortHistoryJSON `json:"ports"`
	// Untracked counts the ports with traffic left out for the bound on
	// ports (traffic_history_ports) at the last point.
	Untracked int `json:"untracked"`
}

// PortHistoryJSON is the recent traffic of one Service port.
type PortHistoryJSON struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Protocol  string `json:"protocol"`
	Port      uint16 `json:"port"`
	// NewPerSecond and RefusedPerSecond (rejected and dropped) are the
	// rates over each step; Flows the active flows at its end.
	NewPerSecond     []float32 `json:"newPerSecond"`
	RefusedPerSecond []float32 `json:"refusedPerSecond"`
	Flows            []float32 `json:"flows"`
}

// JSON returns the history, of one Service when namespace and name are
// given.
func (h *History) JSON(namespace, name string) HistoryJSON {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := min(h.k, h.points)
	start := h.k - n
	out := HistoryJSON{StepSeconds: h.step.Seconds(), Times: make([]time.Time, 0, n), Ports: []PortHistoryJSON{}, Untracked: h.skipped}
	for i := start; i < h.k; i++ {
		out.Times = append(out.Times, h.times[i%h.points])
	}
	order := func(s []float32) []float32 {
		o := make([]float32, 0, n)
		for i := start; i < h.k; i++ {
			o = append(o, s[i%h.points])
		}
		return o
	}
	for id, ph := range h.ports {
		if name != "" && (id.ns != namespace || id.name != name) {
			continue
		}
		out.Ports = append(out.Ports, PortHistoryJSON{Namespace: id.ns, Name: id.name, Protocol: id.proto, Port: id.port,
			NewPerSecond: order(ph.newRate), RefusedPerSecond: order(ph.refusedRate), Flows: order(ph.flows)})
	}
	slices.SortFunc(out.Ports, func(a, b PortHistoryJSON) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	return out
}

func (s *server) history(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns, name := q.Get("namespace"), q.Get("name")
	if (ns == "") != (name == "") {
		s.writeJSON(w, r, http.StatusBadRequest, ErrorJSON{Error: "namespace and name: give both or neither"})
		return
	}
	s.writeJSON(w, r, http.StatusOK, s.opts.History.JSON(ns, name))
}
