// Package appliance is the operator surface of an nftgate box: a status page,
// a read-only JSON API, health endpoints, Prometheus metrics and logging setup.
//
// It knows nothing about how rules are programmed. The sync loop hands it data
// through the Source interface (usually a *Recorder it updates after every
// sync) and reports measurements through *Metrics.
package appliance

import (
	"fmt"
	"net/netip"
	"time"
)

// Sync kinds used in SyncState.LastKind, SyncSample.Kind and as the kind
// argument of Metrics.ObserveSync.
const (
	SyncFull    = "full"
	SyncPartial = "partial"
)

// Snapshot is everything the operator surface shows, as of one moment.
// A Source hands out snapshots that the server only reads; slices in it must
// not be modified afterwards by the Source (build new ones instead).
type Snapshot struct {
	Identity  Identity
	Sync      SyncState
	Services  ServiceList
	Conntrack ConntrackState
	// History holds recent syncs, oldest first.
	History []SyncSample
	// SourceProblems lists what the source of Services could not read
	// right now (a manifest file refused, and why), one line each, naming
	// the file.
	SourceProblems []string
}

// Source supplies snapshots. Snapshot is called for every status request, so
// it must be cheap and safe for concurrent use.
type Source interface {
	Snapshot() Snapshot
}

// SourceFunc adapts a function to the Source interface.
type SourceFunc func() Snapshot

// Snapshot returns f().
func (f SourceFunc) Snapshot() Snapshot { return f() }

// Identity describes the gateway process and where its configuration comes from.
type Identity struct {
	NodeName  string
	Version   string
	StartTime time.Time
	// Kernel is the running kernel release (uname -r).
	Kernel string
	// Table is the nftables table nftgate owns, e.g. "inet nftgate".
	Table string
	// Source is "kubernetes" or "manifests:DIR".
	Source string
	// APIConnected tells whether the Kubernetes API watch is established
	// (always false for a manifests source).
	APIConnected bool
	// APILostAt is when the gateway lost contact with the Kubernetes API;
	// zero while connected, or when it serves manifests.
	APILostAt time.Time
}

// SyncState summarises the sync loop.
type SyncState struct {
	// FirstSyncDone is set once a complete sync has been programmed.
	FirstSyncDone bool
	// LastSync is when the last successful sync finished.
	LastSync time.Time
	// LastAttempt is when the last sync, successful or not, finished.
	LastAttempt  time.Time
	LastDuration time.Duration
	// LastKind is SyncFull or SyncPartial.
	LastKind string
	// LastChanges counts the netlink messages (objects changed) of the last sync.
	LastChanges int
	// LastError is the error of the most recent failed sync and LastErrorTime
	// when it happened. They are kept after later successes; the loop is
	// failing right now when LastErrorTime is after LastSync (see Failing).
	LastError     string
	LastErrorTime time.Time
	// KernelMatches reports that the last reconcile found the kernel's
	// ruleset equal to the desired one (no drift).
	KernelMatches bool
	// Syncs and Failures count sync attempts since start.
	Syncs    uint64
	Failures uint64
	// Programmed objects in the kernel after the last successful sync.
	Chains      int
	Rules       int
	MapElements int
	// ServicesRevision changes whenever Services changes, so clients can skip
	// refetching an unchanged list.
	ServicesRevision uint64
}

// Service is one Kubernetes Service as the gateway sees it. A Service the
// gateway rejected before it ever programmed it carries only Namespace, Name
// and Error: its Type is empty, and it counts as rejected, not as a Service
// without endpoints.
type Service struct {
	Namespace string
	Name      string
	// Type is ClusterIP, NodePort, LoadBalancer or ExternalName.
	Type            string
	ClusterIPs      []netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	Ports           []ServicePort
	// ExternalPolicy and InternalPolicy are "Cluster" or "Local".
	ExternalPolicy string
	InternalPolicy string
	// Affinity is "None" or "ClientIP"; AffinityTimeout applies to ClientIP.
	Affinity        string
	AffinityTimeout time.Duration
	// SourceRanges are the loadBalancerSourceRanges.
	SourceRanges        []netip.Prefix
	HealthCheckNodePort uint16
	// Endpoints are the Service's endpoints. A Source of thousands of
	// Services sets EndpointsFunc instead, which makes them when they are
	// shown, and counts them in EndpointCount and UsedCount: a copy of
	// every endpoint kept for a page nobody may be looking at was a tenth
	// of the gateway's memory.
	Endpoints     []Endpoint
	EndpointsFunc func() []Endpoint
	EndpointCount int
	UsedCount     int
	// Error is set when the gateway rejected the Service; it says why.
	Error string
	// KernelError is set when the kernel refused this Service's rules: the
	// Service stays at its last good state, and this is the kernel's word.
	KernelError string
	// Warnings say what of the Service is not served and why, while the
	// rest of it is: an externalIP outside external_ip_cidrs, an address
	// another Service holds (a conflict), a forbidden address.
	Warnings []string
}

// EndpointList returns the Service's endpoints, made now if the Source
// gave EndpointsFunc.
func (s *Service) EndpointList() []Endpoint {
	if s.EndpointsFunc != nil {
		return s.EndpointsFunc()
	}
	return s.Endpoints
}

// endpointCounts counts the Service's endpoints and those in use.
func (s *Service) endpointCounts() (total, used int) {
	if s.EndpointsFunc != nil {
		return s.EndpointCount, s.UsedCount
	}
	for _, e := range s.Endpoints {
		if e.Used {
			used++
		}
	}
	return len(s.Endpoints), used
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name string
	// Protocol is TCP, UDP or SCTP.
	Protocol string
	Port     uint16
	// NodePort is 0 when the port has none.
	NodePort uint16
}

// Endpoint is one backend address for one port of a Service.
type Endpoint struct {
	// PortName names the ServicePort this endpoint serves.
	PortName    string
	Addr        netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	Node        string
	Zone        string
	// Used reports that the gateway currently sends traffic to it.
	Used bool
}

// Failing reports that the most recent sync attempt failed.
func (s SyncState) Failing() bool {
	return s.LastError != "" && s.LastErrorTime.After(s.LastSync)
}

// Key is "namespace/name".
func (s Service) Key() string { return s.Namespace + "/" + s.Name }

// ConntrackState summarises stale-flow cleanup.
type ConntrackState struct {
	Cleanups     uint64
	FlowsDeleted uint64
	LastCleanup  time.Time
	LastDuration time.Duration
	Errors       uint64
	LastError    string
}

// SyncSample is one sync in the recent history.
type SyncSample struct {
	// Time is when the sync finished.
	Time     time.Time
	Duration time.Duration
	Kind     string
	Changes  int
	// ProgrammingLatency is the longest time, among the objects this sync
	// programmed, from the object's change in the source to the kernel; zero
	// when unknown.
	ProgrammingLatency time.Duration
	Error              string
}

// Health tells whether the gateway is healthy at now: the first complete sync
// is done, the last successful sync is no older than maxAge (ignored when
// maxAge <= 0) and the kernel matches the desired ruleset. When not healthy,
// reason says why in one short sentence.
func Health(s Snapshot, now time.Time, maxAge time.Duration) (ok bool, reason string) {
	switch {
	case !s.Sync.FirstSyncDone:
		if s.Sync.LastError != "" {
			return false, "first sync not done: last attempt failed: " + s.Sync.LastError
		}
		return false, "first sync not done yet"
	case maxAge > 0 && now.Sub(s.Sync.LastSync) > maxAge:
		r := fmt.Sprintf("last successful sync was %s ago (max %s)",
			now.Sub(s.Sync.LastSync).Round(time.Second), maxAge)
		if s.Sync.Failing() {
			r += ": " + s.Sync.LastError
		}
		return false, r
	case !s.Sync.KernelMatches:
		return false, "kernel ruleset differs from the desired one"
	case maxAge > 0 && !s.Identity.APILostAt.IsZero() && now.Sub(s.Identity.APILostAt) > maxAge:
		// The rules still serve, but changes in the cluster no longer
		// reach them: an upstream balancer should know.
		return false, fmt.Sprintf("no contact with the Kubernetes API for %s (max %s); the last rules stay in place",
			now.Sub(s.Identity.APILostAt).Round(time.Second), maxAge)
	}
	return true, "ok"
}

// StatusLine is a one-line summary fit for systemd's STATUS= or a log line.
func StatusLine(s Snapshot, now time.Time) string {
	if !s.Sync.FirstSyncDone {
		if s.Sync.LastError != "" {
			return "waiting for first sync: " + s.Sync.LastError
		}
		return "waiting for first sync"
	}
	line := fmt.Sprintf("%d services, last %s sync %s ago took %s (%d changes)",
		s.Services.Len(), s.Sync.LastKind, now.Sub(s.Sync.LastSync).Round(time.Second),
		s.Sync.LastDuration.Round(time.Microsecond), s.Sync.LastChanges)
	if !s.Sync.KernelMatches {
		line += "; kernel drift"
	}
	if s.Sync.Failing() {
		line += "; last sync failed: " + s.Sync.LastError
	}
	return line
}
