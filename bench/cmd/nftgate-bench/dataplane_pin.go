package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/testing/lab"
)

// The gateway on a CPU of its own (--dataplane-own-cpu): on one machine the
// clients, the backend and the gateway share the CPUs, so a connection's
// every microsecond of gateway work is taken from the endpoints, which a
// gateway on its own box does not do. With the setting, the data-plane
// phase gives the gateway the last CPU and everything else the others: the
// gateway namespace's interfaces steer their received packets to it (RPS,
// so forwarding, NAT and conntrack run there), the proxier's threads run
// there, and the benchmark (the backend's line server), its client
// processes, iperf3, kube-apiserver and etcd run on the others, as do the
// client's and the backend's received packets. Each run then also records
// the gateway CPU's busy time: its work per connection.

// cpuSplit is the gateway's CPU and the others, of the CPUs this process
// may run on.
type cpuSplit struct {
	Gateway int
	Others  []int
}

// splitCPUs takes the highest of the allowed CPUs for the gateway.
func splitCPUs(allowed []int) (cpuSplit, error) {
	if len(allowed) < 2 {
		return cpuSplit{}, fmt.Errorf("--dataplane-own-cpu: %d CPU(s) allowed: want at least 2 (one for the gateway, the others for the clients and the backend)", len(allowed))
	}
	hi := 0
	for i, c := range allowed {
		if c > allowed[hi] {
			hi = i
		}
	}
	s := cpuSplit{Gateway: allowed[hi]}
	for i, c := range allowed {
		if i != hi {
			s.Others = append(s.Others, c)
		}
	}
	return s, nil
}

// rpsMask is the rps_cpus mask of cpus: comma-separated 32-bit hex words,
// most significant first, as the kernel prints bitmaps.
func rpsMask(cpus []int) string {
	hi := 0
	for _, c := range cpus {
		hi = max(hi, c)
	}
	words := make([]uint32, hi/32+1)
	for _, c := range cpus {
		words[c/32] |= 1 << (c % 32)
	}
	parts := make([]string, len(words))
	for i, w := range words {
		parts[len(words)-1-i] = fmt.Sprintf("%08x", w)
	}
	return strings.Join(parts, ",")
}

func cpuSet(cpus []int) *unix.CPUSet {
	var s unix.CPUSet
	for _, c := range cpus {
		s.Set(c)
	}
	return &s
}

func allowedCPUs() ([]int, error) {
	var s unix.CPUSet
	if err := unix.SchedGetaffinity(0, &s); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var out []int
	for c := range 1024 {
		if s.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// processChildren maps each process ID to its children's, from /proc's
// parent IDs.
func processChildren() (map[int][]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	return children, nil
}

// below is every process below root in children.
func below(children map[int][]int, root int) []int {
	var out []int
	for _, c := range children[root] {
		out = append(out, c)
		out = append(out, below(children, c)...)
	}
	return out
}

// pinning remembers what pinDataplane changed, to put it back.
type pinning struct {
	allowed []int                           // this process's CPUs before
	rps     map[*lab.Host]map[string]string // host → queue file → value before
}

// pinThreads sets every thread of pid to cpus. A thread or process that
// ended meanwhile is skipped.
func pinThreads(pid int, cpus []int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, cpuSet(cpus)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("sched_setaffinity of thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}

// steer writes mask to every receive queue's rps_cpus of ifname in h,
// through a command in the namespace (whose /sys shows its interfaces).
func (p *pinning) steer(ctx context.Context, h *lab.Host, ifname, mask string) error {
	glob := "/sys/class/net/" + ifname + "/queues/rx-*/rps_cpus"
	out, err := h.Command(ctx, "sh", "-c", `for f in `+glob+`; do printf '%s %s\n' "$f" "$(cat "$f")"; echo `+mask+` > "$f" || exit 1; done`).CombinedOutput()
	if err != nil {
		return fmt.Errorf("RPS of %s in %s: %v: %.300s", ifname, h, err, out)
	}
	if p.rps[h] == nil {
		p.rps[h] = map[string]string{}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f, v, ok := strings.Cut(line, " "); ok {
			if _, seen := p.rps[h][f]; !seen {
				p.rps[h][f] = v
			}
		}
	}
	return nil
}

// restore gives every thread of this process and of its descendants (the
// proxier among them) this process's CPUs of before, threads started
// since included, and puts back every queue's RPS mask.
func (p *pinning) restore(ctx context.Context) error {
	var errs []error
	self := os.Getpid()
	children, err := processChildren()
	errs = append(errs, err)
	for _, pid := range append([]int{self}, below(children, self)...) {
		errs = append(errs, pinThreads(pid, p.allowed))
	}
	for h, files := range p.rps {
		var script strings.Builder
		for f, v := range files {
			fmt.Fprintf(&script, "echo %s > %s || exit 1\n", v, f)
		}
		if out, err := h.Command(ctx, "sh", "-c", script.String()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("RPS in %s: %v: %.300s", h, err, out))
		}
	}
	return errors.Join(errs...)
}

// pinDataplane gives the gateway its own CPU (see above) until restore:
// the proxier's process (proxierPID) and the gateway's received packets on
// the last CPU, this process, its other descendants and the endpoints'
// received packets on the others.
func (e *Env) pinDataplane(ctx context.Context, proxierPID int) (split cpuSplit, restore func() error, err error) {
	allowed, err := allowedCPUs()
	if err != nil {
		return cpuSplit{}, nil, err
	}
	if split, err = splitCPUs(allowed); err != nil {
		return cpuSplit{}, nil, err
	}
	p := &pinning{allowed: allowed, rps: map[*lab.Host]map[string]string{}}
	restore = func() error { return p.restore(context.WithoutCancel(ctx)) }
	defer func() {
		if err != nil {
			_ = restore()
		}
	}()
	gw, others := rpsMask([]int{split.Gateway}), rpsMask(split.Others)
	for _, s := range []struct {
		h      *lab.Host
		ifname string
		mask   string
	}{
		{e.Topo.Gateway, e.Topo.GatewayClientIface, gw},
		{e.Topo.Gateway, e.Topo.GatewayBackendIface, gw},
		{e.Topo.Client, e.Topo.ClientIface, others},
		{e.Topo.Backend, e.Topo.BackendIface, others},
	} {
		if err := p.steer(ctx, s.h, s.ifname, s.mask); err != nil {
			return cpuSplit{}, nil, err
		}
	}
	self := os.Getpid()
	if err := pinThreads(self, split.Others); err != nil {
		return cpuSplit{}, nil, err
	}
	children, err := processChildren()
	if err != nil {
		return cpuSplit{}, nil, err
	}
	// The proxier's own descendants (none today) go with it.
	proxier := map[int]bool{proxierPID: true}
	for _, d := range below(children, proxierPID) {
		proxier[d] = true
	}
	for _, pid := range below(children, self) {
		cpus := split.Others
		if proxier[pid] {
			cpus = []int{split.Gateway}
		}
		if err := pinThreads(pid, cpus); err != nil {
			return cpuSplit{}, nil, err
		}
	}
	return split, restore, nil
}
