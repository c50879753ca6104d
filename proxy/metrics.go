package proxy

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	active  *prometheus.GaugeVec
	total   *prometheus.CounterVec
	errors  *prometheus.CounterVec
	limited prometheus.Counter
	unknown prometheus.Counter
}

func newMetrics() metrics {
	return metrics{
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "nftgate_proxy_connections_active",
			Help: "PROXY protocol connections open now, per Service."}, []string{"service"}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_proxy_connections_total",
			Help: "Connections accepted by the PROXY protocol proxy, per Service."}, []string{"service"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nftgate_proxy_errors_total",
			Help: "Proxied connections that failed, per Service and stage (dial: no endpoint answered; header: the header could not be written)."},
			[]string{"service", "stage"}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftgate_proxy_limit_reached_total",
			Help: "Connections closed at once because proxy_max_connections were open."}),
		unknown: prometheus.NewCounter(prometheus.CounterOpts{Name: "nftgate_proxy_unknown_destination_total",
			Help: "Connections to the proxy's port that no rule redirected, or whose Service had gone: closed at once."}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.active, m.total, m.errors, m.limited, m.unknown} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
