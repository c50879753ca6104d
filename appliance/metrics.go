package appliance

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds nftgate's Prometheus collectors on a private registry.
//
// Names follow kube-proxy's (pkg/proxy/metrics) where they mean the same, with
// the prefix nftgate_ instead of kubeproxy_, so existing dashboards carry over
// by renaming. Buckets start lower than kube-proxy's because nftgate syncs in
// sub-millisecond to millisecond time. All labels have a small fixed set of
// values.
//
// All methods are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	syncDuration        prometheus.Histogram
	syncFullDuration    prometheus.Histogram
	syncPartialDuration prometheus.Histogram
	programmingLatency  prometheus.Histogram
	lastSyncTimestamp   prometheus.Gauge
	lastQueuedTimestamp prometheus.Gauge
	endpointChanges     prometheus.Counter
	serviceChanges      prometheus.Counter
	endpointPending     prometheus.Gauge
	servicePending      prometheus.Gauge
	noLocalEndpoints    *prometheus.GaugeVec
	syncFailures        prometheus.Counter
	healthzTotal        *prometheus.CounterVec
	livezTotal          *prometheus.CounterVec

	conntrackDeleted  prometheus.Counter
	conntrackDuration prometheus.Histogram
	conntrackErrors   prometheus.Counter

	batchMessages    prometheus.Histogram
	programmedChains prometheus.Gauge
	programmedRules  prometheus.Gauge
	programmedElems  prometheus.Gauge
	driftRepairs     *prometheus.CounterVec
	buildInfo        *prometheus.GaugeVec

	sourceProblems        prometheus.Gauge
	servicesKernelRefused prometheus.Gauge
	servicesWithWarnings  prometheus.Gauge
}

// Drift repair reasons for DriftRepaired. Other values are folded into
// DriftOther to keep the label's cardinality fixed.
const (
	DriftMissing    = "missing"    // an object the kernel should have was absent
	DriftUnexpected = "unexpected" // the kernel had an object nftgate did not want
	DriftModified   = "modified"   // an object differed from the desired one
	DriftTable      = "table"      // the whole table was gone or replaced
	DriftOther      = "other"
)

// syncBuckets go from 100µs to about 26s.
var syncBuckets = prometheus.ExponentialBuckets(0.0001, 2, 19)

// programmingBuckets cover the fast range nftgate aims for, then follow
// kube-proxy's coarse buckets up to five minutes.
var programmingBuckets = mergeBuckets(
	[]float64{0.005, 0.01, 0.025, 0.05, 0.1},
	prometheus.LinearBuckets(0.25, 0.25, 2),
	prometheus.LinearBuckets(1, 1, 59),
	prometheus.LinearBuckets(60, 5, 12),
	prometheus.LinearBuckets(120, 30, 7),
)

func mergeBuckets(parts ...[]float64) []float64 {
	var out []float64
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// NewMetrics creates the collectors and registers them, with the Go runtime
// and process collectors, on a new private registry. version is exported as
// the label of nftgate_build_info.
func NewMetrics(version string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "nftgate", Name: name, Help: help, Buckets: buckets})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "nftgate", Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "nftgate", Name: name, Help: help})
	}

	m.syncDuration = hist("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds, full and partial syncs together.", syncBuckets)
	m.syncFullDuration = hist("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs.", syncBuckets)
	m.syncPartialDuration = hist("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs.", syncBuckets)
	m.programmingLatency = hist("network_programming_duration_seconds", "Network programming latency in seconds: from a Service or EndpointSlice change to the kernel having it.", programmingBuckets)
	m.lastSyncTimestamp = gauge("sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced, in seconds since the epoch.")
	m.lastQueuedTimestamp = gauge("sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued, in seconds since the epoch.")
	m.endpointChanges = counter("sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes.")
	m.serviceChanges = counter("sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes.")
	m.endpointPending = gauge("sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes.")
	m.servicePending = gauge("sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes.")
	// Kept as a gauge named like kube-proxy's, whose name ends in _total.
	m.noLocalEndpoints = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "nftgate", Name: "sync_proxy_rules_no_local_endpoints_total",
		Help: "Number of services with a Local traffic policy and no local endpoints.",
	}, []string{"traffic_policy"})
	m.syncFailures = counter("sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures.")
	m.healthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftgate", Name: "proxy_healthz_total", Help: "Cumulative proxy healthz HTTP status.",
	}, []string{"code"})
	m.livezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftgate", Name: "proxy_livez_total", Help: "Cumulative proxy livez HTTP status.",
	}, []string{"code"})

	m.conntrackDeleted = counter("conntrack_reconciler_deleted_entries_total", "Cumulative stale conntrack entries deleted.")
	m.conntrackDuration = hist("conntrack_reconciler_sync_duration_seconds", "Duration in seconds of one stale conntrack cleanup.", syncBuckets)
	m.conntrackErrors = counter("conntrack_reconciler_errors_total", "Cumulative failed stale conntrack cleanups.")

	m.batchMessages = hist("netlink_batch_messages", "Netlink messages in one nftables transaction.", prometheus.ExponentialBuckets(1, 4, 11))
	m.programmedChains = gauge("programmed_chains", "Chains in nftgate's nftables table after the last successful sync.")
	m.programmedRules = gauge("programmed_rules", "Rules in nftgate's nftables table after the last successful sync.")
	m.programmedElems = gauge("programmed_map_elements", "Set and map elements in nftgate's nftables table after the last successful sync.")
	m.driftRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftgate", Name: "drift_repairs_total",
		Help: "Cumulative repairs of kernel state that differed from the desired ruleset, by reason.",
	}, []string{"reason"})
	m.sourceProblems = gauge("source_problems", "Things the source of Services cannot read right now (a manifest file refused); the status page and /api/v1/status name them.")
	m.servicesKernelRefused = gauge("services_kernel_refused", "Services whose rules the kernel refused; they stay at their last good state.")
	m.servicesWithWarnings = gauge("services_with_warnings", "Services served in part: the status page and /api/v1/services say what is not served and why.")
	m.buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "nftgate", Name: "build_info", Help: "A metric with a constant value of 1, labelled by nftgate's version.",
	}, []string{"version"})

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.programmingLatency,
		m.lastSyncTimestamp, m.lastQueuedTimestamp, m.endpointChanges, m.serviceChanges,
		m.endpointPending, m.servicePending, m.noLocalEndpoints, m.syncFailures,
		m.healthzTotal, m.livezTotal,
		m.conntrackDeleted, m.conntrackDuration, m.conntrackErrors,
		m.batchMessages, m.programmedChains, m.programmedRules, m.programmedElems,
		m.driftRepairs, m.buildInfo,
		m.sourceProblems, m.servicesKernelRefused, m.servicesWithWarnings,
	)
	// Pre-create the fixed label values so every series is exported from the
	// start and rate() sees the first increment.
	for _, p := range []string{"internal", "external"} {
		m.noLocalEndpoints.WithLabelValues(p)
	}
	for _, r := range []string{DriftMissing, DriftUnexpected, DriftModified, DriftTable, DriftOther} {
		m.driftRepairs.WithLabelValues(r)
	}
	for _, code := range []int{http.StatusOK, http.StatusServiceUnavailable} {
		m.healthzTotal.WithLabelValues(httpCode(code))
	}
	m.livezTotal.WithLabelValues(httpCode(http.StatusOK))
	m.buildInfo.WithLabelValues(version).Set(1)
	return m
}

// Registry is the private registry, for tests and for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveSync records one sync attempt of the given kind (SyncFull or
// SyncPartial) that took d and sent messages netlink messages. A nil err
// marks success and sets the last-sync timestamp; a non-nil err counts a sync
// failure. Durations are observed for failed attempts too, as kube-proxy does.
func (m *Metrics) ObserveSync(kind string, d time.Duration, messages int, err error) {
	m.observeSyncAt(kind, d, messages, err, time.Now())
}

func (m *Metrics) observeSyncAt(kind string, d time.Duration, messages int, err error, end time.Time) {
	s := d.Seconds()
	m.syncDuration.Observe(s)
	switch kind {
	case SyncFull:
		m.syncFullDuration.Observe(s)
	case SyncPartial:
		m.syncPartialDuration.Observe(s)
	}
	if messages > 0 {
		m.batchMessages.Observe(float64(messages))
	}
	if err != nil {
		m.syncFailures.Inc()
		return
	}
	m.lastSyncTimestamp.Set(float64(end.UnixNano()) / 1e9)
}

// ObserveProgrammingLatency records, for one changed object, the time from its
// change in the source to the kernel having it.
func (m *Metrics) ObserveProgrammingLatency(d time.Duration) {
	m.programmingLatency.Observe(d.Seconds())
}

// SyncQueued records that a sync was requested now.
func (m *Metrics) SyncQueued() {
	m.lastQueuedTimestamp.Set(float64(time.Now().UnixNano()) / 1e9)
}

// ServiceChanged counts n Service changes seen from the source.
func (m *Metrics) ServiceChanged(n int) { m.serviceChanges.Add(float64(max(n, 0))) }

// EndpointsChanged counts n EndpointSlice changes seen from the source.
func (m *Metrics) EndpointsChanged(n int) { m.endpointChanges.Add(float64(max(n, 0))) }

// SetPending sets the numbers of Service and EndpointSlice changes not yet synced.
func (m *Metrics) SetPending(services, endpoints int) {
	m.servicePending.Set(float64(services))
	m.endpointPending.Set(float64(endpoints))
}

// SetNoLocalEndpoints sets how many services with internalTrafficPolicy Local
// (internal) and externalTrafficPolicy Local (external) have no local endpoint.
func (m *Metrics) SetNoLocalEndpoints(internal, external int) {
	m.noLocalEndpoints.WithLabelValues("internal").Set(float64(internal))
	m.noLocalEndpoints.WithLabelValues("external").Set(float64(external))
}

// SetProgrammed sets the numbers of chains, rules and set/map elements that
// nftgate's table holds after a successful sync.
func (m *Metrics) SetProgrammed(chains, rules, elements int) {
	m.programmedChains.Set(float64(chains))
	m.programmedRules.Set(float64(rules))
	m.programmedElems.Set(float64(elements))
}

// SetSourceProblems sets how many things the source cannot read right now.
func (m *Metrics) SetSourceProblems(n int) { m.sourceProblems.Set(float64(n)) }

// SetServiceProblems sets how many Services the kernel refused and how many
// are served with warnings.
func (m *Metrics) SetServiceProblems(kernelRefused, withWarnings int) {
	m.servicesKernelRefused.Set(float64(kernelRefused))
	m.servicesWithWarnings.Set(float64(withWarnings))
}

// DriftRepaired counts one repair of kernel state. reason should be one of
// the Drift* constants; any other value is counted as DriftOther.
func (m *Metrics) DriftRepaired(reason string) {
	switch reason {
	case DriftMissing, DriftUnexpected, DriftModified, DriftTable:
	default:
		reason = DriftOther
	}
	m.driftRepairs.WithLabelValues(reason).Inc()
}

// ObserveConntrack records one stale-flow cleanup that deleted deleted flows
// in d; a non-nil err counts a cleanup error.
func (m *Metrics) ObserveConntrack(deleted int, d time.Duration, err error) {
	m.conntrackDeleted.Add(float64(max(deleted, 0)))
	m.conntrackDuration.Observe(d.Seconds())
	if err != nil {
		m.conntrackErrors.Inc()
	}
}

func (m *Metrics) countProbe(v *prometheus.CounterVec, code int) {
	if m == nil {
		return
	}
	v.WithLabelValues(httpCode(code)).Inc()
}

func httpCode(code int) string {
	switch code {
	case http.StatusOK:
		return "200"
	case http.StatusServiceUnavailable:
		return "503"
	}
	return "other"
}
