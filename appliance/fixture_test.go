package appliance

import (
	"fmt"
	"net/netip"
	"time"
)

var fixtureNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// fixtureServices covers every Service type, both policies, affinity, source
// ranges, endpoint states and a rejected Service.
func fixtureServices() []Service {
	return []Service{
		{
			Namespace: "shop", Name: "web", Type: "LoadBalancer",
			ClusterIPs: addrs("10.96.0.10", "fd00::10"), LoadBalancerIPs: addrs("203.0.113.7"),
			Ports: []ServicePort{
				{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080},
				{Name: "https", Protocol: "TCP", Port: 443, NodePort: 30443},
			},
			ExternalPolicy: "Local", InternalPolicy: "Cluster", Affinity: "None",
			SourceRanges:        []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			HealthCheckNodePort: 32000,
			Endpoints: []Endpoint{
				{PortName: "http", Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080, Ready: true, Serving: true, Node: "node-a", Zone: "z1", Used: true},
				{PortName: "https", Addr: netip.MustParseAddr("10.244.1.5"), Port: 8443, Ready: true, Serving: true, Node: "node-a", Zone: "z1", Used: true},
				{PortName: "http", Addr: netip.MustParseAddr("10.244.2.9"), Port: 8080, Serving: true, Terminating: true, Node: "node-b", Zone: "z2"},
			},
		},
		{
			Namespace: "kube-system", Name: "kube-dns", Type: "ClusterIP",
			ClusterIPs: addrs("10.96.0.53"),
			Ports: []ServicePort{
				{Name: "dns", Protocol: "UDP", Port: 53},
				{Name: "dns-tcp", Protocol: "TCP", Port: 53},
			},
			ExternalPolicy: "Cluster", InternalPolicy: "Cluster", Affinity: "ClientIP", AffinityTimeout: 3 * time.Hour,
			Endpoints: []Endpoint{
				{PortName: "dns", Addr: netip.MustParseAddr("10.244.0.2"), Port: 53, Ready: true, Serving: true, Node: "node-a", Used: true},
				{PortName: "dns", Addr: netip.MustParseAddr("10.244.0.3"), Port: 53, Node: "node-b"},
			},
		},
		{
			Namespace: "shop", Name: "cart", Type: "NodePort",
			ClusterIPs: addrs("10.96.3.3"), ExternalIPs: addrs("192.0.2.44"),
			Ports:          []ServicePort{{Protocol: "TCP", Port: 8080, NodePort: 31000}},
			ExternalPolicy: "Cluster", InternalPolicy: "Local", Affinity: "None",
		},
		{
			Namespace: "legacy", Name: "broken", Type: "NodePort",
			ClusterIPs:     addrs("10.96.9.9"),
			Ports:          []ServicePort{{Protocol: "TCP", Port: 80, NodePort: 30080}},
			ExternalPolicy: "Cluster", InternalPolicy: "Cluster", Affinity: "None",
			Error: `spec.ports[0].nodePort: 30080 is already used by shop/web`,
		},
		{
			Namespace: "default", Name: "docs", Type: "ExternalName", Affinity: "None",
		},
	}
}

func fixtureHistory(n int) []SyncSample {
	out := make([]SyncSample, n)
	for i := range out {
		kind := SyncPartial
		if i%10 == 0 {
			kind = SyncFull
		}
		out[i] = SyncSample{
			Time:     fixtureNow.Add(time.Duration(i-n) * 5 * time.Second),
			Duration: time.Duration(300+37*(i%11)) * time.Microsecond, Kind: kind, Changes: 3 + i%7,
			ProgrammingLatency: time.Duration(8+3*(i%5)) * time.Millisecond,
		}
	}
	if n > 5 {
		out[n-5].Error = "netlink: EBUSY"
		out[n-5].Duration = 2 * time.Millisecond
	}
	return out
}

// healthySnapshot is a gateway that synced 3s before fixtureNow.
func healthySnapshot() Snapshot {
	svcs := fixtureServices()
	return Snapshot{
		Identity: Identity{
			NodeName: "edge-1", Version: "v0.1.0-test", StartTime: fixtureNow.Add(-26 * time.Hour),
			Kernel: "6.12.1-gokrazy", Table: "inet nftgate", Source: "kubernetes", APIConnected: true,
		},
		Sync: SyncState{
			FirstSyncDone: true, LastSync: fixtureNow.Add(-3 * time.Second), LastAttempt: fixtureNow.Add(-3 * time.Second),
			LastDuration: 420 * time.Microsecond, LastKind: SyncPartial, LastChanges: 6,
			LastError: "netlink: EBUSY", LastErrorTime: fixtureNow.Add(-30 * time.Second),
			KernelMatches: true, Syncs: 1234, Failures: 1, Chains: 41, Rules: 97, MapElements: 312,
			ServicesRevision: 7,
		},
		Services:  NewServiceList(svcs...),
		Conntrack: ConntrackState{Cleanups: 17, FlowsDeleted: 5, LastCleanup: fixtureNow.Add(-time.Minute), LastDuration: 90 * time.Microsecond},
		History:   fixtureHistory(60),
	}
}

// manyServices returns n generated Services, for size and paging checks.
func manyServices(n int) []Service {
	out := make([]Service, n)
	for i := range out {
		out[i] = Service{
			Namespace: fmt.Sprintf("ns-%02d", i%40), Name: fmt.Sprintf("svc-%05d", i), Type: "ClusterIP",
			ClusterIPs:     addrs(fmt.Sprintf("10.%d.%d.%d", 96+i/62500, i/250%250, i%250+1)),
			Ports:          []ServicePort{{Name: "http", Protocol: "TCP", Port: 80}},
			ExternalPolicy: "Cluster", InternalPolicy: "Cluster", Affinity: "None",
			Endpoints: []Endpoint{{PortName: "http", Addr: netip.MustParseAddr(fmt.Sprintf("10.%d.%d.%d", 244-i/62500, i/250%250, i%250+1)),
				Port: 8080, Ready: true, Serving: true, Node: "node-a", Used: true}},
		}
	}
	return out
}

// copyRows copies the list's Services, in name order.
func (l ServiceList) copyRows() []Service {
	out := make([]Service, 0, l.Len())
	for s := range l.All() {
		out = append(out, *s)
	}
	return out
}
