package appliance

import (
	"net/netip"
	"runtime"
	"time"
)

// The JSON API's wire types. They are separate from Snapshot so that the Go
// side can use time.Duration and netip types while the wire format uses
// seconds, RFC 3339 times and camelCase names, and stays stable.

// StatusJSON is the body of GET /api/v1/status.
type StatusJSON struct {
	Healthy   bool          `json:"healthy"`
	Ready     bool          `json:"ready"`
	Reason    string        `json:"reason"`
	Now       time.Time     `json:"now"`
	Identity  IdentityJSON  `json:"identity"`
	Sync      SyncJSON      `json:"sync"`
	Conntrack ConntrackJSON `json:"conntrack"`
	Services  SummaryJSON   `json:"services"`
	// SourceProblems lists what the source could not read, naming files.
	SourceProblems []string `json:"sourceProblems"`
}

// IdentityJSON is Identity on the wire.
type IdentityJSON struct {
	NodeName      string    `json:"nodeName"`
	Version       string    `json:"version"`
	GoVersion     string    `json:"goVersion"`
	StartTime     time.Time `json:"startTime"`
	UptimeSeconds float64   `json:"uptimeSeconds"`
	Kernel        string    `json:"kernel"`
	Table         string    `json:"table"`
	Source        string    `json:"source"`
	APIConnected  bool      `json:"apiConnected"`
}

// SyncJSON is SyncState on the wire. Times are absent until they happened.
type SyncJSON struct {
	FirstSyncDone       bool       `json:"firstSyncDone"`
	LastSync            *time.Time `json:"lastSync,omitempty"`
	LastSyncAgeSeconds  *float64   `json:"lastSyncAgeSeconds,omitempty"`
	LastAttempt         *time.Time `json:"lastAttempt,omitempty"`
	LastDurationSeconds float64    `json:"lastDurationSeconds"`
	LastKind            string     `json:"lastKind"`
	LastChanges         int        `json:"lastChanges"`
	LastError           string     `json:"lastError,omitempty"`
	LastErrorTime       *time.Time `json:"lastErrorTime,omitempty"`
	Failing             bool       `json:"failing"`
	KernelMatches       bool       `json:"kernelMatches"`
	Syncs               uint64     `json:"syncs"`
	Failures            uint64     `json:"failures"`
	Chains              int        `json:"chains"`
	Rules               int        `json:"rules"`
	MapElements         int        `json:"mapElements"`
	ServicesRevision    uint64     `json:"servicesRevision"`
}

// ConntrackJSON is ConntrackState on the wire.
type ConntrackJSON struct {
	Cleanups            uint64     `json:"cleanups"`
	FlowsDeleted        uint64     `json:"flowsDeleted"`
	LastCleanup         *time.Time `json:"lastCleanup,omitempty"`
	LastDurationSeconds float64    `json:"lastDurationSeconds"`
	Errors              uint64     `json:"errors"`
	LastError           string     `json:"lastError,omitempty"`
}

// SummaryJSON counts Services by condition.
type SummaryJSON struct {
	Total int `json:"total"`
	// Rejected Services carry an Error.
	Rejected int `json:"rejected"`
	// NoEndpoints Services are programmed and have no endpoint in use.
	NoEndpoints int `json:"noEndpoints"`
	Endpoints   int `json:"endpoints"`
	// KernelRefused Services carry a KernelError: the kernel refused
	// their rules and they stay at their last good state.
	KernelRefused int `json:"kernelRefused"`
	// WithWarnings Services are served in part (see ServiceJSON.Warnings).
	WithWarnings int `json:"withWarnings"`
}

// ServiceListJSON is the body of GET /api/v1/services.
type ServiceListJSON struct {
	Revision uint64        `json:"revision"`
	Total    int           `json:"total"`
	Matched  int           `json:"matched"`
	Services []ServiceJSON `json:"services"`
}

// ServiceJSON is Service on the wire.
type ServiceJSON struct {
	Namespace              string         `json:"namespace"`
	Name                   string         `json:"name"`
	Type                   string         `json:"type"`
	ClusterIPs             []netip.Addr   `json:"clusterIPs"`
	ExternalIPs            []netip.Addr   `json:"externalIPs"`
	LoadBalancerIPs        []netip.Addr   `json:"loadBalancerIPs"`
	Ports                  []PortJSON     `json:"ports"`
	ExternalTrafficPolicy  string         `json:"externalTrafficPolicy"`
	InternalTrafficPolicy  string         `json:"internalTrafficPolicy"`
	SessionAffinity        string         `json:"sessionAffinity"`
	AffinityTimeoutSeconds float64        `json:"affinityTimeoutSeconds,omitempty"`
	SourceRanges           []netip.Prefix `json:"loadBalancerSourceRanges"`
	HealthCheckNodePort    uint16         `json:"healthCheckNodePort,omitempty"`
	Endpoints              []EndpointJSON `json:"endpoints"`
	Error                  string         `json:"error,omitempty"`
	KernelError            string         `json:"kernelError,omitempty"`
	Warnings               []string       `json:"warnings"`
}

// PortJSON is ServicePort on the wire.
type PortJSON struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
	NodePort uint16 `json:"nodePort,omitempty"`
}

// EndpointJSON is Endpoint on the wire.
type EndpointJSON struct {
	PortName    string     `json:"portName"`
	Addr        netip.Addr `json:"addr"`
	Port        uint16     `json:"port"`
	Ready       bool       `json:"ready"`
	Serving     bool       `json:"serving"`
	Terminating bool       `json:"terminating"`
	Node        string     `json:"node,omitempty"`
	Zone        string     `json:"zone,omitempty"`
	Used        bool       `json:"used"`
}

// SyncsJSON is the body of GET /api/v1/syncs.
type SyncsJSON struct {
	Syncs    uint64           `json:"syncs"`
	Failures uint64           `json:"failures"`
	Samples  []SyncSampleJSON `json:"samples"`
}

// SyncSampleJSON is SyncSample on the wire.
type SyncSampleJSON struct {
	Time                      time.Time `json:"time"`
	DurationSeconds           float64   `json:"durationSeconds"`
	Kind                      string    `json:"kind"`
	Changes                   int       `json:"changes"`
	ProgrammingLatencySeconds float64   `json:"programmingLatencySeconds,omitempty"`
	Error                     string    `json:"error,omitempty"`
}

// ErrorJSON is the body of an API error.
type ErrorJSON struct {
	Error string `json:"error"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func statusJSON(s Snapshot, now time.Time, maxAge time.Duration) StatusJSON {
	healthy, reason := Health(s, now, maxAge)
	st := s.Sync
	out := StatusJSON{
		Healthy: healthy,
		Ready:   st.FirstSyncDone,
		Reason:  reason,
		Now:     now,
		Identity: IdentityJSON{
			NodeName: s.Identity.NodeName, Version: s.Identity.Version, GoVersion: runtime.Version(),
			StartTime: s.Identity.StartTime, UptimeSeconds: now.Sub(s.Identity.StartTime).Seconds(),
			Kernel: s.Identity.Kernel, Table: s.Identity.Table, Source: s.Identity.Source,
			APIConnected: s.Identity.APIConnected,
		},
		Sync: SyncJSON{
			FirstSyncDone: st.FirstSyncDone, LastSync: timePtr(st.LastSync), LastAttempt: timePtr(st.LastAttempt),
			LastDurationSeconds: st.LastDuration.Seconds(), LastKind: st.LastKind, LastChanges: st.LastChanges,
			LastError: st.LastError, LastErrorTime: timePtr(st.LastErrorTime), Failing: st.Failing(),
			KernelMatches: st.KernelMatches, Syncs: st.Syncs, Failures: st.Failures,
			Chains: st.Chains, Rules: st.Rules, MapElements: st.MapElements,
			ServicesRevision: st.ServicesRevision,
		},
		Conntrack: ConntrackJSON{
			Cleanups: s.Conntrack.Cleanups, FlowsDeleted: s.Conntrack.FlowsDeleted,
			LastCleanup: timePtr(s.Conntrack.LastCleanup), LastDurationSeconds: s.Conntrack.LastDuration.Seconds(),
			Errors: s.Conntrack.Errors, LastError: s.Conntrack.LastError,
		},
	}
	if !st.LastSync.IsZero() {
		age := now.Sub(st.LastSync).Seconds()
		out.Sync.LastSyncAgeSeconds = &age
	}
	out.SourceProblems = orEmpty(s.SourceProblems)
	out.Services = s.Services.Summary()
	return out
}

func serviceJSON(s *Service) ServiceJSON {
	endpoints := s.EndpointList()
	out := ServiceJSON{
		Namespace: s.Namespace, Name: s.Name, Type: s.Type,
		ClusterIPs: orEmpty(s.ClusterIPs), ExternalIPs: orEmpty(s.ExternalIPs),
		LoadBalancerIPs: orEmpty(s.LoadBalancerIPs), SourceRanges: orEmpty(s.SourceRanges),
		ExternalTrafficPolicy: s.ExternalPolicy, InternalTrafficPolicy: s.InternalPolicy,
		SessionAffinity: s.Affinity, AffinityTimeoutSeconds: s.AffinityTimeout.Seconds(),
		HealthCheckNodePort: s.HealthCheckNodePort, Error: s.Error,
		KernelError: s.KernelError, Warnings: orEmpty(s.Warnings),
		Ports:     make([]PortJSON, 0, len(s.Ports)),
		Endpoints: make([]EndpointJSON, 0, len(endpoints)),
	}
	for _, p := range s.Ports {
		out.Ports = append(out.Ports, PortJSON{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort})
	}
	for _, e := range endpoints {
		out.Endpoints = append(out.Endpoints, EndpointJSON{
			PortName: e.PortName, Addr: e.Addr, Port: e.Port,
			Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
			Node: e.Node, Zone: e.Zone, Used: e.Used,
		})
	}
	return out
}

func syncsJSON(s Snapshot) SyncsJSON {
	out := SyncsJSON{Syncs: s.Sync.Syncs, Failures: s.Sync.Failures, Samples: make([]SyncSampleJSON, 0, len(s.History))}
	for _, h := range s.History {
		out.Samples = append(out.Samples, SyncSampleJSON{
			Time: h.Time, DurationSeconds: h.Duration.Seconds(), Kind: h.Kind, Changes: h.Changes,
			ProgrammingLatencySeconds: h.ProgrammingLatency.Seconds(), Error: h.Error,
		})
	}
	return out
}
