package main

import (
	"bytes"
	"fmt"
	"strings"
)

// connPair is the via and the direct run of one setting.
type connPair struct {
	Parallel, Sources int
	Via, Direct       ConnRun
}

// pairConns matches each via run with the direct run of the same
// parallelism and number of sources, in the order the via runs came.
func pairConns(runs []ConnRun) []connPair {
	var out []connPair
	for _, v := range runs {
		if v.Path != pathVia {
			continue
		}
		for _, d := range runs {
			if d.Path == pathDirect && d.Parallel == v.Parallel && d.Sources == v.Sources {
				out = append(out, connPair{Parallel: v.Parallel, Sources: v.Sources, Via: v, Direct: d})
				break
			}
		}
	}
	return out
}

// viaRatio is via/direct with two decimals, or "–" without a direct figure.
func viaRatio(via, direct float64) string {
	if direct <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", via/direct)
}

// DataplaneMarkdown renders the data-plane phase: the method, then a table
// of new connections per second and one of bulk throughput, and the
// configuration added to nftgate's. Without a data-plane phase only the
// latter, if any.
func (r *Report) DataplaneMarkdown() string {
	var conns, bulk, shards bytes.Buffer
	for _, res := range r.Results {
		if res.Dataplane == nil {
			continue
		}
		if d := res.Dataplane; d.Shards == 1 {
			fmt.Fprintf(&shards, "- %s at %s Services: one shard; every new connection passes its NAT chain.\n",
				res.Proxier, thousands(res.Services))
		} else if d.Shards > 0 {
			fmt.Fprintf(&shards, "- %s at %s Services: %d shards; a new connection via the Service passes %d of their NAT chains, one direct all %d.\n",
				res.Proxier, thousands(res.Services), d.Shards, d.ShardsPassedVia, d.Shards)
		}
		for _, p := range pairConns(res.Dataplane.Connections) {
			fmt.Fprintf(&conns, "| %s | %s | %d | %d | %s | %s | **%s** | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				res.Proxier, thousands(res.Services), p.Parallel, p.Sources,
				thousands(int(p.Via.PerSecond+0.5)), thousands(int(p.Direct.PerSecond+0.5)), viaRatio(p.Via.PerSecond, p.Direct.PerSecond),
				p.Via.Stalled, p.Direct.Stalled, micros(p.Via.P99us), micros(p.Direct.P99us), thousands(p.Via.BackendTimeWait),
				counterPair(p.Via.Client, p.Direct.Client, "TCPSynRetrans"),
				counterPair(p.Via.Backend, p.Direct.Backend, "PAWSTimewait"), counterPair(p.Via.Backend, p.Direct.Backend, "ListenDrops"),
				counterPair(p.Via.Gateway, p.Direct.Gateway, "insert_failed"), cpuPair(p.Via, p.Direct))
		}
		var via, direct *BulkRun
		for i, b := range res.Dataplane.Bulk {
			switch b.Path {
			case pathVia:
				via = &res.Dataplane.Bulk[i]
			case pathDirect:
				direct = &res.Dataplane.Bulk[i]
			}
		}
		if via != nil && direct != nil {
			fmt.Fprintf(&bulk, "| %s | %s | %.2f | %.2f | **%s** | %.2f | %.2f | %.2f | %.2f | %d / %d |\n",
				res.Proxier, thousands(res.Services), via.Gbps, direct.Gbps, viaRatio(via.Gbps, direct.Gbps),
				via.SoftirqCores(), direct.SoftirqCores(), via.SoftirqPerGiB(), direct.SoftirqPerGiB(), via.Retransmits, direct.Retransmits)
		}
	}
	extra := ""
	if r.Dataplane != nil && r.Dataplane.NftgateConfigExtra != "" {
		extra = fmt.Sprintf("\nnftgate ran with this added to its configuration (`--nftgate-config-extra`):\n\n```toml\n%s\n```\n",
			strings.TrimSpace(r.Dataplane.NftgateConfigExtra))
	}
	if conns.Len() == 0 && bulk.Len() == 0 {
		return extra
	}
	var b strings.Builder
	b.WriteString("\n## Data plane\n\n")
	secs := 0.0
	if r.Dataplane != nil {
		secs = r.Dataplane.Seconds
	}
	fmt.Fprintf(&b, "Client → gateway (the proxier) → one backend, whose way back is the gateway. *Via*: the Service's ClusterIP "+
		"(one endpoint; the client is outside the cluster CIDRs, policy Cluster: masqueraded, the default), *direct*: the same "+
		"backend by its address, routed by the same gateway without NAT — the limit. Each path from client addresses of its own. "+
		"Each run lasts %.0f s and starts with the gateway's conntrack table flushed and no TIME_WAIT socket on the backend.\n\n", secs)
	b.WriteString("New connections: each client connects, reads the line the server writes and its close, then closes (the server " +
		"closes first, as an HTTP server without keep-alive does, so TIME_WAIT is on the backend). *Stalled*: took 1 s or more " +
		"(a SYN retransmitted) or failed. p99 of one exchange, from connect() until the client saw the close. " +
		"Backend TIME_WAIT: sockets left on the backend at the end of the via run. TCP counters over the runs, via / direct: the client's " +
		"*SYNs retransmitted* (TcpExtTCPSynRetrans), and the backend's " +
		"*SYNs refused by TIME_WAIT* (TcpExtPAWSTimewait: a SYN matched a TIME_WAIT socket and carried an older timestamp, so it was " +
		"dropped and retransmitted after 1 s) and *listen drops* (TcpExtListenDrops: the server's queue was full); the gateway's " +
		"*conntrack insertion clashes* (insert_failed: a new connection's SYN dropped because another entry took its tuple first, " +
		"retransmitted after 1 s). The JSON has every counter recorded.\n\n")
	ownCPU := r.Dataplane != nil && r.Dataplane.OwnCPU
	if ownCPU {
		b.WriteString("**The gateway on a CPU of its own** (`--dataplane-own-cpu`), as on a box of its own: the packets the gateway's " +
			"interfaces receive are steered to the last CPU (RPS: forwarding, NAT, conntrack and the proxier's rules run there), " +
			"and the proxier's threads run there; the clients, the backend, the benchmark, kube-apiserver and etcd, and the packets " +
			"the client's and the backend's interfaces receive, on the others. The endpoints' CPUs are then what limits the rate; " +
			"*gateway CPU a connection* is the gateway CPU's busy time (user, system, irq, softirq) over the run, less the " +
			"proxier process's own CPU time (its periodic work is not a connection's), per connection: what a connection costs " +
			"the gateway's kernel on each path at the load the run gave it, an upper bound (other work the machine runs on that " +
			"CPU counts too).\n\n")
	} else {
		b.WriteString("The clients, the gateway and the backend share the machine's CPUs, so a connection's every microsecond of " +
			"gateway work is taken from the endpoints: via/direct is about the CPU a connection costs direct over what it costs via. " +
			"*CPU a connection*: the machine's busy time (user, system, irq, softirq of every CPU, whatever ran) over the run per " +
			"connection. `--dataplane-own-cpu` measures the gateway on a CPU of its own.\n\n")
	}
	cpuHead := "CPU a connection via / direct"
	if ownCPU {
		cpuHead = "gateway CPU a connection via / direct"
	}
	b.WriteString("| Proxier | N | clients | client addresses | via /s | direct /s | via/direct | stalled via | stalled direct | p99 via | p99 direct | backend TIME_WAIT | SYNs retransmitted | SYNs refused by TIME_WAIT | listen drops | conntrack insertion clashes | " + cpuHead + " |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	b.Write(conns.Bytes())
	if shards.Len() > 0 {
		b.WriteString("\nShards passed: the first packet of a new connection passes the NAT chain of every service shard until one " +
			"translates it (the kernel passes them last created first), so one direct passes them all and one via the Service " +
			"those up to its own: via/direct depends on where the Service's shard lies (docs/design/dataplane.md, " +
			"\"What a shard costs a new connection\").\n\n")
		b.Write(shards.Bytes())
	}
	b.WriteString("\nBulk: one iperf3 TCP stream, client to backend. Softirq: the machine's softirq time from /proc/stat during " +
		"the run (all namespaces share the kernel; forwarding, NAT and conntrack at the gateway and the TCP receive at both ends " +
		"run there, so via minus direct is the gateway's extra work), per second of the run (cores) and per GiB moved. " +
		"The machine is shared: other work counts too.\n\n")
	b.WriteString("| Proxier | N | via Gbit/s | direct Gbit/s | via/direct | softirq via (cores) | direct | softirq via (s/GiB) | direct | retransmits via / direct |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	b.Write(bulk.Bytes())
	b.WriteString(extra)
	return b.String()
}

// counterPair is counter k of the via and the direct run, "–" where the
// run has no counters (results from before they were recorded).
func counterPair(via, direct map[string]int64, k string) string {
	one := func(m map[string]int64) string {
		if v, ok := m[k]; ok {
			return thousands(int(v))
		}
		return "–"
	}
	return one(via) + " / " + one(direct)
}

// cpuPair is the busy time a connection of the via and the direct run,
// "86 / 82 µs", with "–" for a run without the figure.
func cpuPair(via, direct ConnRun) string {
	one := func(r ConnRun) string {
		if us := r.CPUPerConnection(); us > 0 {
			return fmt.Sprintf("%.1f", us)
		}
		return "–"
	}
	return one(via) + " / " + one(direct) + " µs"
}

func micros(us float64) string {
	if us >= 10_000 {
		return millis(us / 1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}
