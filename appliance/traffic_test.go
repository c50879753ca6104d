package appliance

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeTraffic serves fixed readings: the unit tests' stand-in for the
// kernel's counters and conntrack (the e2e tests read the real ones).
type fakeTraffic struct {
	ports []TrafficPort
	at    time.Time
	flows map[string][]FlowJSON
}

func (f *fakeTraffic) Ports() ([]TrafficPort, time.Time, error) { return f.ports, f.at, nil }

func (f *fakeTraffic) Totals() (TrafficTotals, error) {
	var t TrafficTotals
	for i := range f.ports {
		t.Add(&f.ports[i])
	}
	return t, nil
}

func (f *fakeTraffic) Flows(ns, name string) ([]FlowJSON, error) { return f.flows[ns+"/"+name], nil }

func trafficFixture() *fakeTraffic {
	return &fakeTraffic{at: fixtureNow, ports: []TrafficPort{
		{Namespace: "shop", Name: "web", Protocol: "TCP", Port: 80, NewConnections: 10, ActiveFlows: 4,
			PacketsIn: 30, BytesIn: 3_000, PacketsOut: 40, BytesOut: 2_000_000},
		{Namespace: "shop", Name: "cart", Protocol: "TCP", Port: 8080, NewConnections: 500, ActiveFlows: 1,
			PacketsIn: 1_000, BytesIn: 60_000, PacketsOut: 900, BytesOut: 50_000},
		{Namespace: "legacy", Name: "broken", Protocol: "TCP", Port: 80, Rejected: 7},
	}, flows: map[string][]FlowJSON{"shop/web": {
		{Protocol: "TCP", Client: "198.51.100.7:40000", Endpoint: "10.244.1.5:8080", State: "ESTABLISHED"},
		{Protocol: "TCP", Client: "198.51.100.8:40001", Endpoint: "10.244.1.5:8080", State: "ESTABLISHED"},
		{Protocol: "TCP", Client: "203.0.113.9:40002", Endpoint: "10.244.2.9:8080", State: "SYN_SENT"},
	}}}
}

func names(ports []TrafficPort) string {
	var b []string
	for _, p := range ports {
		b = append(b, p.Namespace+"/"+p.Name)
	}
	return strings.Join(b, " ")
}

func TestTrafficSorts(t *testing.T) {
	ts, _ := newTestServer(t, Snapshot{}, Options{Traffic: trafficFixture()})
	for sort, want := range map[string]string{
		"":         "shop/cart shop/web legacy/broken",
		"new":      "shop/cart shop/web legacy/broken",
		"rejected": "legacy/broken shop/cart shop/web",
		"flows":    "shop/web shop/cart legacy/broken",
		"traffic":  "shop/web shop/cart legacy/broken",
		"name":     "legacy/broken shop/cart shop/web",
	} {
		var got TrafficJSON
		getJSON(t, ts.URL+"/api/v1/traffic?sort="+sort, http.StatusOK, &got)
		if names(got.Ports) != want {
			t.Errorf("sort=%q: %s, want %s", sort, names(got.Ports), want)
		}
	}
	var bad ErrorJSON
	getJSON(t, ts.URL+"/api/v1/traffic?sort=size", http.StatusBadRequest, &bad)
	if !strings.Contains(bad.Error, `"size"`) {
		t.Errorf("bad sort: %q, want the value named", bad.Error)
	}
}

func TestTrafficRateOverTheLastMinute(t *testing.T) {
	var r rates
	port := func(n uint64) []TrafficPort {
		return []TrafficPort{{Namespace: "a", Name: "b", Protocol: "TCP", Port: 80, NewConnections: n}}
	}
	r.fill(port(100), fixtureNow)
	p := port(130)
	r.fill(p, fixtureNow.Add(30*time.Second))
	if p[0].NewPerSecond != 1 {
		t.Errorf("30 connections in 30 s: %v/s", p[0].NewPerSecond)
	}
	// Older readings than a minute no longer count, and the history stays
	// bounded by the spacing of its readings.
	for i := range 100 {
		r.fill(port(130+uint64(i)), fixtureNow.Add(31*time.Second+time.Duration(i)*time.Second))
	}
	if n := len(r.hist); n > int(rateWindow/rateStep)+1 {
		t.Errorf("%d readings kept, want at most %d", n, rateWindow/rateStep+1)
	}
	p = port(1000)
	r.fill(p, fixtureNow.Add(10*time.Minute))
	if p[0].NewPerSecond != 0 {
		t.Errorf("rate from a reading older than a minute: %v", p[0].NewPerSecond)
	}
}

func TestServiceFlowsFilterAndLimit(t *testing.T) {
	ts, _ := newTestServer(t, Snapshot{}, Options{Traffic: trafficFixture()})
	var got FlowsJSON
	getJSON(t, ts.URL+"/api/v1/services/shop/web/flows", http.StatusOK, &got)
	if got.Total != 3 || len(got.Flows) != 3 || got.Truncated {
		t.Errorf("all flows: %+v", got)
	}
	getJSON(t, ts.URL+"/api/v1/services/shop/web/flows?client=198.51.100.0/24&limit=1", http.StatusOK, &got)
	if got.Total != 2 || len(got.Flows) != 1 || !got.Truncated || got.Flows[0].Client != "198.51.100.7:40000" {
		t.Errorf("client 198.51.100.0/24, limit 1: %+v", got)
	}
	getJSON(t, ts.URL+"/api/v1/services/shop/web/flows?client=203.0.113.9", http.StatusOK, &got)
	if got.Total != 1 || got.Flows[0].Endpoint != "10.244.2.9:8080" {
		t.Errorf("client 203.0.113.9: %+v", got)
	}
	var bad ErrorJSON
	getJSON(t, ts.URL+"/api/v1/services/shop/web/flows?client=nowhere", http.StatusBadRequest, &bad)
	getJSON(t, ts.URL+"/api/v1/services/shop/web/flows?limit=-1", http.StatusBadRequest, &bad)
}

func TestTrafficWithoutCountersIsNotFound(t *testing.T) {
	ts, _ := newTestServer(t, Snapshot{}, Options{})
	var e ErrorJSON
	getJSON(t, ts.URL+"/api/v1/traffic", http.StatusNotFound, &e)
}

func TestTrafficMetricsPerServiceOnlyWhenAsked(t *testing.T) {
	for _, perService := range []bool{false, true} {
		t.Run(fmt.Sprint("perService=", perService), func(t *testing.T) {
			body := scrape(t, NewTrafficCollector(trafficFixture(), perService))
			for _, want := range []string{`nftgate_connections_total{kind="new"} 510`, `nftgate_connections_total{kind="rejected"} 7`,
				`nftgate_connections_total{kind="dropped"} 0`, `nftgate_active_flows 5`,
				`nftgate_traffic_bytes_total{direction="in"} 63000`, `nftgate_traffic_bytes_total{direction="out"} 2.05e+06`,
				`nftgate_traffic_packets_total{direction="in"} 1030`, `nftgate_traffic_packets_total{direction="out"} 940`} {
				if !strings.Contains(body, want) {
					t.Errorf("no %s in the metrics", want)
				}
			}
			for _, series := range []string{
				`nftgate_service_connections_total{kind="new",namespace="shop",port="8080",protocol="TCP",service="cart"} 500`,
				`nftgate_service_traffic_bytes_total{direction="out",namespace="shop",port="80",protocol="TCP",service="web"} 2e+06`,
				`nftgate_service_traffic_packets_total{direction="in",namespace="shop",port="8080",protocol="TCP",service="cart"} 1000`,
			} {
				if strings.Contains(body, series) != perService {
					t.Errorf("per-Service series %s present: %v, want %v", series, !perService, perService)
				}
			}
		})
	}
}

// The resets are exported by reason, only the reasons read gives (the
// features the gateway runs with); a failed reading leaves them out of the
// scrape and the rest stands.
func TestResetsMetrics(t *testing.T) {
	for _, tc := range []struct {
		name      string
		read      ResetsFunc
		want, not []string
	}{
		{"both", func() (map[string]uint64, error) { return map[string]uint64{"released": 1200, "refused": 7}, nil },
			[]string{`nftgate_time_wait_resets_total{reason="released"} 1200`, `nftgate_time_wait_resets_total{reason="refused"} 7`}, nil},
		{"answer alone", func() (map[string]uint64, error) { return map[string]uint64{"refused": 3}, nil },
			[]string{`nftgate_time_wait_resets_total{reason="refused"} 3`}, []string{`reason="released"`}},
		{"failed reading", func() (map[string]uint64, error) { return nil, errors.New("netlink: no buffer space") },
			[]string{"nftgate_build_info"}, []string{"nftgate_time_wait_resets_total"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := scrape(t, NewResetsCollector(tc.read))
			for _, want := range tc.want {
				if !strings.Contains(body, want) {
					t.Errorf("no %s in the metrics", want)
				}
			}
			for _, not := range tc.not {
				if strings.Contains(body, not) {
					t.Errorf("%s in the metrics", not)
				}
			}
		})
	}
}

// scrape serves /metrics with c registered and returns what it says.
func scrape(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	m := NewMetrics("test")
	m.Registry().MustRegister(c)
	ts, _ := newTestServer(t, Snapshot{}, Options{Metrics: m})
	_, _, b := get(t, ts.URL+"/metrics")
	return string(b)
}
