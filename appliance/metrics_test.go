package appliance

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// kubeProxyNamed are the metrics that mean the same as kube-proxy's and carry
// its names with the nftgate_ prefix.
var kubeProxyNamed = []string{
	"nftgate_sync_proxy_rules_duration_seconds",
	"nftgate_sync_full_proxy_rules_duration_seconds",
	"nftgate_sync_partial_proxy_rules_duration_seconds",
	"nftgate_network_programming_duration_seconds",
	"nftgate_sync_proxy_rules_last_timestamp_seconds",
	"nftgate_sync_proxy_rules_last_queued_timestamp_seconds",
	"nftgate_sync_proxy_rules_endpoint_changes_total",
	"nftgate_sync_proxy_rules_service_changes_total",
	"nftgate_sync_proxy_rules_endpoint_changes_pending",
	"nftgate_sync_proxy_rules_service_changes_pending",
	"nftgate_sync_proxy_rules_no_local_endpoints_total",
	"nftgate_sync_proxy_rules_nftables_sync_failures_total",
	"nftgate_proxy_healthz_total",
	"nftgate_proxy_livez_total",
	"nftgate_conntrack_reconciler_deleted_entries_total",
	"nftgate_conntrack_reconciler_sync_duration_seconds",
}

func TestMetricsLint(t *testing.T) {
	m := NewMetrics("v1.2.3")
	m.ObserveSync(SyncFull, 3*time.Millisecond, 120, nil)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// kube-proxy names this gauge with a _total suffix; the name is kept
		// so dashboards port by swapping the prefix.
		if p.Metric == "nftgate_sync_proxy_rules_no_local_endpoints_total" && strings.Contains(p.Text, `"_total" suffix`) {
			continue
		}
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestMetricsNames(t *testing.T) {
	m := NewMetrics("v1.2.3")
	m.ObserveSync(SyncPartial, time.Millisecond, 4, nil)
	m.ObserveProgrammingLatency(20 * time.Millisecond)
	m.ObserveConntrack(1, time.Millisecond, nil)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range families {
		have[f.GetName()] = true
	}
	for _, name := range append(kubeProxyNamed,
		"nftgate_programmed_chains", "nftgate_programmed_rules", "nftgate_programmed_map_elements",
		"nftgate_drift_repairs_total", "nftgate_conntrack_reconciler_errors_total", "nftgate_netlink_batch_messages",
		"nftgate_build_info", "go_goroutines", "process_start_time_seconds",
		"nftgate_source_problems", "nftgate_services_kernel_refused", "nftgate_services_with_warnings") {
		if !have[name] {
			t.Errorf("metric %s not exported", name)
		}
	}
}

func TestMetricsObserve(t *testing.T) {
	m := NewMetrics("v1.2.3")
	before := time.Now()
	m.ObserveSync(SyncFull, 5*time.Millisecond, 300, nil)
	m.ObserveSync(SyncPartial, 200*time.Microsecond, 4, nil)
	m.ObserveSync(SyncPartial, time.Millisecond, 2, errors.New("EBUSY"))
	m.ObserveSync("other", time.Millisecond, 0, nil)

	if got := testutil.CollectAndCount(m.syncDuration); got != 1 {
		t.Errorf("sync duration series = %d", got)
	}
	checkHistogram(t, m, "nftgate_sync_proxy_rules_duration_seconds", 4, 0.0072)
	checkHistogram(t, m, "nftgate_sync_full_proxy_rules_duration_seconds", 1, 0.005)
	checkHistogram(t, m, "nftgate_sync_partial_proxy_rules_duration_seconds", 2, 0.0012)
	// Zero-message syncs do not count as batches.
	checkHistogram(t, m, "nftgate_netlink_batch_messages", 3, 306)
	if got := testutil.ToFloat64(m.syncFailures); got != 1 {
		t.Errorf("sync failures = %v", got)
	}
	if ts := testutil.ToFloat64(m.lastSyncTimestamp); ts < float64(before.Unix()) || ts > float64(time.Now().Unix()+1) {
		t.Errorf("last sync timestamp = %v, want about now", ts)
	}

	m.ObserveProgrammingLatency(40 * time.Millisecond)
	checkHistogram(t, m, "nftgate_network_programming_duration_seconds", 1, 0.04)

	m.SetProgrammed(10, 20, 30)
	if testutil.ToFloat64(m.programmedChains) != 10 || testutil.ToFloat64(m.programmedRules) != 20 || testutil.ToFloat64(m.programmedElems) != 30 {
		t.Error("SetProgrammed not reflected")
	}

	m.DriftRepaired(DriftMissing)
	m.DriftRepaired(DriftMissing)
	m.DriftRepaired("something new")
	err := testutil.CollectAndCompare(m.driftRepairs, strings.NewReader(`
# HELP nftgate_drift_repairs_total Cumulative repairs of kernel state that differed from the desired ruleset, by reason.
# TYPE nftgate_drift_repairs_total counter
nftgate_drift_repairs_total{reason="missing"} 2
nftgate_drift_repairs_total{reason="modified"} 0
nftgate_drift_repairs_total{reason="other"} 1
nftgate_drift_repairs_total{reason="table"} 0
nftgate_drift_repairs_total{reason="unexpected"} 0
`))
	if err != nil {
		t.Error(err)
	}

	m.ObserveConntrack(7, 2*time.Millisecond, nil)
	m.ObserveConntrack(0, time.Millisecond, errors.New("ENOBUFS"))
	m.ObserveConntrack(-1, time.Millisecond, nil) // ignored, counters only grow
	if testutil.ToFloat64(m.conntrackDeleted) != 7 || testutil.ToFloat64(m.conntrackErrors) != 1 {
		t.Errorf("conntrack deleted=%v errors=%v", testutil.ToFloat64(m.conntrackDeleted), testutil.ToFloat64(m.conntrackErrors))
	}
	checkHistogram(t, m, "nftgate_conntrack_reconciler_sync_duration_seconds", 3, 0.004)

	m.ServiceChanged(3)
	m.EndpointsChanged(5)
	m.SetPending(1, 2)
	m.SetNoLocalEndpoints(4, 6)
	m.SyncQueued()
	err = testutil.CollectAndCompare(m.noLocalEndpoints, strings.NewReader(`
# HELP nftgate_sync_proxy_rules_no_local_endpoints_total Number of services with a Local traffic policy and no local endpoints.
# TYPE nftgate_sync_proxy_rules_no_local_endpoints_total gauge
nftgate_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external"} 6
nftgate_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"} 4
`))
	if err != nil {
		t.Error(err)
	}
	if testutil.ToFloat64(m.serviceChanges) != 3 || testutil.ToFloat64(m.endpointChanges) != 5 ||
		testutil.ToFloat64(m.servicePending) != 1 || testutil.ToFloat64(m.endpointPending) != 2 ||
		testutil.ToFloat64(m.lastQueuedTimestamp) < float64(before.Unix()) {
		t.Error("change counters or pending gauges wrong")
	}
}

func checkHistogram(t *testing.T, m *Metrics, name string, count uint64, sum float64) {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != count || h.GetSampleSum() < sum*0.999 || h.GetSampleSum() > sum*1.001 {
			t.Errorf("%s: count %d sum %v, want %d %v", name, h.GetSampleCount(), h.GetSampleSum(), count, sum)
		}
		return
	}
	t.Errorf("%s not gathered", name)
}

func TestMetricsEndpoint(t *testing.T) {
	m := NewMetrics("v9.9.9")
	rec := NewRecorder(Identity{NodeName: "edge-1"}, m, 0)
	rec.RecordSync(SyncResult{Kind: SyncFull, Duration: 2 * time.Millisecond, Messages: 42, KernelMatches: true,
		ProgrammingLatencies: []time.Duration{15 * time.Millisecond}, Chains: 3, Rules: 4, MapElements: 5})
	ts := httptest.NewServer(NewServer(Options{Source: rec, Metrics: m}))
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	for _, want := range []string{
		`nftgate_build_info{version="v9.9.9"} 1`,
		"nftgate_sync_full_proxy_rules_duration_seconds_count 1",
		"nftgate_network_programming_duration_seconds_count 1",
		"nftgate_programmed_map_elements 5",
		`nftgate_netlink_batch_messages_bucket{le="64"} 1`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestProblemGauges: the Recorder keeps the gauges of source problems,
// kernel-refused Services and Services with warnings up to date.
func TestProblemGauges(t *testing.T) {
	m := NewMetrics("v1.2.3")
	r := NewRecorder(Identity{}, m, 0)
	gauges := func() [3]float64 {
		return [3]float64{testutil.ToFloat64(m.sourceProblems), testutil.ToFloat64(m.servicesKernelRefused), testutil.ToFloat64(m.servicesWithWarnings)}
	}
	if g := gauges(); g != [3]float64{} {
		t.Errorf("gauges at start = %v, want zeros", g)
	}
	svcs := fixtureServices()
	svcs[0].KernelError = "netlink: chain add: invalid argument"
	svcs[1].Warnings = []string{"externalIP 192.0.2.1 is outside external_ip_cidrs: not served"}
	svcs[2].Warnings = []string{"a", "b"}
	r.SetServices(NewServiceList(svcs...))
	problems := []string{"/m/f.yaml: a FIFO, not a regular file; not read", "/m/z.yaml: a character device"}
	r.SetSourceProblems(problems)
	if g := gauges(); g != [3]float64{2, 1, 2} {
		t.Errorf("gauges = %v, want [2 1 2]", g)
	}
	problems[0] = "changed by the caller"
	if got := r.Snapshot().SourceProblems; len(got) != 2 || got[0] == "changed by the caller" {
		t.Errorf("snapshot's problems = %q: the Recorder must keep its own copy", got)
	}
	if got := statusJSON(r.Snapshot(), fixtureNow, time.Minute); len(got.SourceProblems) != 2 || got.Services.KernelRefused != 1 || got.Services.WithWarnings != 2 {
		t.Errorf("status: problems %q, summary %+v", got.SourceProblems, got.Services)
	}
	r.SetServices(NewServiceList(fixtureServices()...))
	r.SetSourceProblems(nil)
	if g := gauges(); g != [3]float64{} {
		t.Errorf("gauges after the problems went = %v, want zeros", g)
	}
	if got := statusJSON(r.Snapshot(), fixtureNow, time.Minute).SourceProblems; got == nil || len(got) != 0 {
		t.Errorf("status without problems: %#v, want []", got)
	}
}
