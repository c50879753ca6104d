package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// connPair is the via and the direct runs of one setting: with several
// rounds, each path's runs merged (mergeConns), and the ratio of each
// round whose two runs both came.
type connPair struct {
	Parallel, Sources int
	Via, Direct       ConnRun
	Rounds            []float64
}

// pairConns matches the via runs of each parallelism and number of sources
// with the direct runs of the same, in the order the settings first came:
// one pair a setting that has both.
func pairConns(runs []ConnRun) []connPair {
	type setting struct{ parallel, sources int }
	var order []setting
	byPath := map[setting]map[string][]ConnRun{}
	for _, r := range runs {
		k := setting{r.Parallel, r.Sources}
		if byPath[k] == nil {
			byPath[k] = map[string][]ConnRun{}
			order = append(order, k)
		}
		byPath[k][r.Path] = append(byPath[k][r.Path], r)
	}
	var out []connPair
	for _, k := range order {
		via, direct := byPath[k][pathVia], byPath[k][pathDirect]
		if len(via) == 0 || len(direct) == 0 {
			continue
		}
		p := connPair{Parallel: k.parallel, Sources: k.sources, Via: mergeConns(via), Direct: mergeConns(direct)}
		p.Rounds = roundRatios(len(via), len(direct),
			func(i int) (int, float64) { return via[i].Round, via[i].PerSecond },
			func(i int) (int, float64) { return direct[i].Round, direct[i].PerSecond })
		out = append(out, p)
	}
	return out
}

// roundRatios is via/direct of every round that has a run of both paths,
// in the order of the via runs; 0 where direct is 0.
func roundRatios(nv, nd int, via, direct func(int) (round int, v float64)) []float64 {
	var out []float64
	for i := range nv {
		rv, v := via(i)
		for j := range nd {
			if rd, d := direct(j); rd == rv {
				r := 0.0
				if d > 0 {
					r = v / d
				}
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// mergeConns is one path's runs of one setting as one: the mean rate;
// exchanges, stalls, failures, CPU time and counters summed; the worst
// round's p99, longest exchange and TIME_WAIT left. One run is itself.
func mergeConns(runs []ConnRun) ConnRun {
	if len(runs) == 1 {
		return runs[0]
	}
	m := runs[0]
	m.Backend, m.Client, m.Gateway = sumCounters(nil, m.Backend), sumCounters(nil, m.Client), sumCounters(nil, m.Gateway)
	var p50 []float64
	p50 = append(p50, m.P50us)
	for _, r := range runs[1:] {
		m.Completed += r.Completed
		m.PerSecond += r.PerSecond
		m.Exchanges += r.Exchanges
		m.Stalled += r.Stalled
		m.Failed += r.Failed
		p50 = append(p50, r.P50us)
		m.P99us, m.MaxUs = max(m.P99us, r.P99us), max(m.MaxUs, r.MaxUs)
		if r.LastError != "" {
			m.LastError = r.LastError
		}
		m.BackendTimeWait = max(m.BackendTimeWait, r.BackendTimeWait)
		m.Backend, m.Client, m.Gateway = sumCounters(m.Backend, r.Backend), sumCounters(m.Client, r.Client), sumCounters(m.Gateway, r.Gateway)
		m.CPUSeconds += r.CPUSeconds
		m.GatewayCPUSeconds += r.GatewayCPUSeconds
		m.ProxierCPUSeconds += r.ProxierCPUSeconds
	}
	m.PerSecond /= float64(len(runs))
	slices.Sort(p50)
	m.P50us = p50[len(p50)/2]
	m.Round = 0
	return m
}

// sumCounters adds b's counters to a copy of a; nil if both are.
func sumCounters(a, b map[string]int64) map[string]int64 {
	if a == nil && b == nil {
		return nil
	}
	out := make(map[string]int64, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] += v
	}
	return out
}

// bulkPair is the via and the direct iperf3 runs of a result, merged as
// mergeBulk does, with every round's ratio; ok is false without both.
func bulkPair(runs []BulkRun) (via, direct BulkRun, rounds []float64, ok bool) {
	var vs, ds []BulkRun
	for _, b := range runs {
		switch b.Path {
		case pathVia:
			vs = append(vs, b)
		case pathDirect:
			ds = append(ds, b)
		}
	}
	if len(vs) == 0 || len(ds) == 0 {
		return via, direct, nil, false
	}
	rounds = roundRatios(len(vs), len(ds),
		func(i int) (int, float64) { return vs[i].Round, vs[i].Gbps },
		func(i int) (int, float64) { return ds[i].Round, ds[i].Gbps })
	return mergeBulk(vs), mergeBulk(ds), rounds, true
}

// mergeBulk is one path's iperf3 runs as one: the mean rate; seconds, CPU
// time and retransmits summed (so softirq a second and a GiB are over all
// of them).
func mergeBulk(runs []BulkRun) BulkRun {
	m := runs[0]
	for _, r := range runs[1:] {
		m.Gbps += r.Gbps
		m.Retransmits += r.Retransmits
		m.Seconds += r.Seconds
		m.UserSeconds += r.UserSeconds
		m.SystemSeconds += r.SystemSeconds
		m.SoftirqSeconds += r.SoftirqSeconds
		m.GatewayCPUSeconds += r.GatewayCPUSeconds
		m.ProxierCPUSeconds += r.ProxierCPUSeconds
	}
	m.Gbps /= float64(len(runs))
	if len(runs) > 1 {
		m.Round = 0
	}
	return m
}

// gatewayBusyCell is " 0.62 / 0.55 |" with a CPU of its own (– for a run
// without the figure), else nothing.
func gatewayBusyCell(ownCPU bool, via, direct BulkRun) string {
	if !ownCPU {
		return ""
	}
	one := func(b BulkRun) string {
		if f := b.GatewayBusy(); f >= 0 {
			return fmt.Sprintf("%.2f", f)
		}
		return "–"
	}
	return " " + one(via) + " / " + one(direct) + " |"
}

// roundsCell is every round's ratio, "0.97, 1.02, 0.99".
func roundsCell(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(parts, ", ")
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
	rounds := r.Dataplane != nil && r.Dataplane.Rounds > 1
	ownCPU := r.Dataplane != nil && r.Dataplane.OwnCPU
	// With rounds, a column of every round's ratio after the ratio.
	each := func(rs []float64) string {
		if !rounds {
			return ""
		}
		return " " + roundsCell(rs) + " |"
	}
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
			fmt.Fprintf(&conns, "| %s | %s | %d | %d | %s | %s | **%s** |%s %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				res.Proxier, thousands(res.Services), p.Parallel, p.Sources,
				thousands(int(p.Via.PerSecond+0.5)), thousands(int(p.Direct.PerSecond+0.5)), viaRatio(p.Via.PerSecond, p.Direct.PerSecond),
				each(p.Rounds), p.Via.Stalled, p.Direct.Stalled, micros(p.Via.P99us), micros(p.Direct.P99us), thousands(p.Via.BackendTimeWait),
				counterPair(p.Via.Client, p.Direct.Client, "TCPSynRetrans"),
				counterPair(p.Via.Backend, p.Direct.Backend, "PAWSTimewait"), counterPair(p.Via.Backend, p.Direct.Backend, "ListenDrops"),
				counterPair(p.Via.Gateway, p.Direct.Gateway, "insert_failed"), cpuPair(p.Via, p.Direct))
		}
		if via, direct, rs, ok := bulkPair(res.Dataplane.Bulk); ok {
			fmt.Fprintf(&bulk, "| %s | %s | %.2f | %.2f | **%s** |%s %.2f | %.2f | %.2f | %.2f | %d / %d |%s\n",
				res.Proxier, thousands(res.Services), via.Gbps, direct.Gbps, viaRatio(via.Gbps, direct.Gbps), each(rs),
				via.SoftirqCores(), direct.SoftirqCores(), via.SoftirqPerGiB(), direct.SoftirqPerGiB(), via.Retransmits, direct.Retransmits,
				gatewayBusyCell(ownCPU, via, direct))
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
	if r.Dataplane != nil && r.Dataplane.ServersPaused && r.Source != sourceManifests {
		b.WriteString("kube-apiserver and etcd were paused (SIGSTOP) during each run and continued after it " +
			"(`--dataplane-servers-running` leaves them running): they share the CPUs of the clients and the backend, " +
			"which set the rate, and a gateway has none of their work. The proxier keeps its watch connections; nothing changes in a run.\n\n")
	}
	eachHead, eachAlign := "", ""
	if rounds {
		fmt.Fprintf(&b, "**%d rounds** (`--dataplane-rounds`): every run was made %d times, via and direct taking turns (via first in odd "+
			"rounds, direct first in even ones, so that a drift of the host's speed weighs on both paths alike). A row gives each "+
			"path's mean rate over the rounds and their ratio, then *each round*: the ratio of every round, in order; stalls, "+
			"counters and CPU time are summed over the rounds (CPU a connection: all rounds' time over all their connections), "+
			"p99 and backend TIME_WAIT are the worst round's.\n\n", r.Dataplane.Rounds, r.Dataplane.Rounds)
		eachHead, eachAlign = " each round |", "---|"
	}
	b.WriteString("New connections: each client connects, reads the line the server writes and its close, then closes (the server " +
		"closes first, as an HTTP server without keep-alive does, so TIME_WAIT is on the backend). *Stalled*: took 1 s or more " +
		"(a SYN retransmitted) or failed. p99 of one exchange, from connect() until the client saw the close. " +
		"Backend TIME_WAIT: sockets left on the backend at the end of the via run. TCP counters over the runs, via / direct: the client's " +
		"*SYNs retransmitted* (TcpExtTCPSynRetrans), and the backend's " +
		"*SYNs refused by TIME_WAIT* (TcpExtPAWSTimewait: a SYN matched a TIME_WAIT socket and carried an older timestamp, so it was " +
		"dropped and retransmitted after 1 s) and *listen drops* (TcpExtListenDrops: the server's queue was full); the gateway's " +
		"*conntrack insertion clashes* (insert_failed: a new connection's SYN dropped because another entry took its tuple first, " +
		"retransmitted after 1 s). The JSON has every counter recorded.\n\n")
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
	b.WriteString("| Proxier | N | clients | client addresses | via /s | direct /s | via/direct |" + eachHead + " stalled via | stalled direct | p99 via | p99 direct | backend TIME_WAIT | SYNs retransmitted | SYNs refused by TIME_WAIT | listen drops | conntrack insertion clashes | " + cpuHead + " |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|" + eachAlign + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
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
		"The machine is shared: other work counts too.")
	busyHead, busyAlign := "", ""
	if ownCPU {
		b.WriteString(" *Gateway CPU busy*: the share of the gateway's own CPU the run kept busy (its busy time less the " +
			"proxier's own, over the run): near 1.00 the gateway, not the endpoints, set the rate.")
		busyHead, busyAlign = " gateway CPU busy via / direct |", "---:|"
	}
	b.WriteString("\n\n| Proxier | N | via Gbit/s | direct Gbit/s | via/direct |" + eachHead + " softirq via (cores) | direct | softirq via (s/GiB) | direct | retransmits via / direct |" + busyHead + "\n")
	b.WriteString("|---|---:|---:|---:|---:|" + eachAlign + "---:|---:|---:|---:|---:|" + busyAlign + "\n")
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
