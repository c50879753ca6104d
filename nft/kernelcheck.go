package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// The kernel feature check runs once at start, before nftgate programs
// anything: a kernel built without one of the nf_tables pieces nftgate uses
// would otherwise fail the first sync with a bare EINVAL or ENOENT from
// netlink, or, worse, accept the skeleton and refuse only the first Service
// that needs the missing piece. The check programs a throwaway table per
// family with one use of every feature and deletes the tables in the same
// batch: the kernel looks up and initialises every chain type, set type and
// expression (loading modules as needed) and nothing stays behind. Only
// when that batch fails is each feature tried alone, to name the culprit.
//
// Each probe is a rule of the ruleset's own statements, encoded and sent as
// every sync is: what the check tries is what nftgate programs.

// kernelProbe is one kernel capability nftgate relies on, and a minimal use
// of it to try.
type kernelProbe struct {
	// Feature names the capability as the error reports it.
	Feature string
	// Option is the kernel configuration option that provides it.
	Option string
	// Needs lists the Features of earlier probes this one builds on; when
	// one of those is missing, this one is not reported separately.
	Needs []string
	// add puts the use of the feature into a batch.
	add func(b *probeBatch)
}

// probeRunner sends the probes in one batch and returns the kernel's
// verdict.
type probeRunner func(probes []kernelProbe) error

// missingFeature is a probe the kernel refused on its own.
type missingFeature struct {
	Feature, Option string
	Err             error
}

// kernelFeatureError lists what the kernel lacks.
type kernelFeatureError struct {
	Missing []missingFeature
}

func (e *kernelFeatureError) Error() string {
	parts := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		parts[i] = fmt.Sprintf("%s (kernel option %s): refused with %q", m.Feature, m.Option, m.Err)
	}
	return "the kernel lacks nf_tables features nftgate needs: " + strings.Join(parts, "; ")
}

// CheckKernel verifies, in the process's own network namespace, that the
// kernel supports every nf_tables feature nftgate programs under cfg: the
// flowtable's only when cfg turns it on.
func CheckKernel(cfg *ruleset.Config) error {
	return checkKernelFeatures(kernelProbesFor(cfg), netlinkProbeRunner(0, probeTableName()))
}

// kernelProbesFor lists the probes of what nftgate programs under cfg.
func kernelProbesFor(cfg *ruleset.Config) []kernelProbe {
	probes := kernelProbes()
	if len(cfg.FlowtableDevices) > 0 {
		probes = append(probes, flowtableProbes(cfg.FlowtablePackets)...)
	}
	if cfg.Counters {
		probes = append(probes, counterProbes(cfg.TrafficElements > 0)...)
	}
	if cfg.MasqueradePortGroups > 1 {
		probes = append(probes, cpuPortProbes()...)
	}
	if cfg.UntranslatedEventsOff {
		probes = append(probes, eventProbes()...)
	}
	if cfg.LeanServiceEvents {
		probes = append(probes, leanEventProbes()...)
	}
	if cfg.MidstreamBounded() {
		probes = append(probes, midstreamWaitProbes()...)
	}
	if !cfg.ServiceEchoOff {
		probes = append(probes, echoProbes(cfg)...)
	}
	return probes
}

// echoProbes try, per family, the rule that answers echo requests to the
// Service addresses (ruleset.Config.ServiceEchoOff), limits (one of them a
// set element's) and redirect without a port, in a NAT prerouting chain.
func echoProbes(cfg *ruleset.Config) []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		ps = append(ps, kernelProbe{Feature: "limit expression, redir without a port (answer_service_address_ping)" + w,
			Option: "CONFIG_NFT_LIMIT and CONFIG_NFT_REDIR", Needs: []string{"nat chains" + w, "redir expression" + w},
			add: func(b *probeBatch) {
				b.set(f, &ruleset.Set{Name: ruleset.SetServiceAddrs, Shape: ruleset.KeyAddr})
				b.set(f, ruleset.EchoSourcesSet())
				b.rule(b.natPrerouting(f), ruleset.EchoRule(cfg)...)
			}})
	}
	return ps
}

// midstreamWaitProbes try, per family, the bounded wait for a replica
// (ruleset.Config.MidstreamWait): lookups and adds of connection tuples
// in a NAT postrouting chain.
func midstreamWaitProbes() []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		ps = append(ps, kernelProbe{Feature: "dynset add and lookup of connection tuples in a NAT chain (gateways.midstream_tcp_wait)" + w,
			Option: "CONFIG_NFT_CT", Needs: []string{"nat chains" + w, "ct expression" + w},
			add: func(b *probeBatch) {
				b.set(f, &ruleset.Set{Name: "midstream", Shape: ruleset.KeyConn, Timeout: time.Second, Size: 16})
				c := b.natPostrouting(f)
				b.rule(c, ruleset.MatchL4Proto{Proto: model.TCP}, ruleset.MatchCtConnInSet{Set: "midstream"}, ruleset.Verdict{Kind: ruleset.Drop})
				b.rule(c, ruleset.MatchL4Proto{Proto: model.TCP}, ruleset.AddConn{Set: "midstream"}, ruleset.Verdict{Kind: ruleset.Drop})
			}})
	}
	return ps
}

// eventProbes try, per family, the rule that silences the conntrack
// events of untranslated connections (ruleset.Config.
// UntranslatedEventsOff), in the NAT postrouting chain where it runs.
func eventProbes() []kernelProbe {
	return natRuleProbes("ct event set (gateways.conntrack_events other than \"all\", as with state_sync by default)",
		"CONFIG_NF_CONNTRACK_EVENTS", ruleset.UntranslatedEventsRule())
}

// leanEventProbes try, per family, the event mask of a masqueraded TCP
// connection and the close's label (ruleset.Config.LeanServiceEvents).
func leanEventProbes() []kernelProbe {
	return natRuleProbes("ct event set and ct label set (gateways.conntrack_events = \"lean\"; \"services\" needs no labels)",
		"CONFIG_NF_CONNTRACK_EVENTS and CONFIG_NF_CONNTRACK_LABELS", ruleset.LeanEventsRule(), ruleset.CloseLabelRule())
}

// CheckLeanEvents verifies, in the process's own network namespace, that
// the kernel takes the rules of gateways.conntrack_events = "lean" (ct
// labels): "auto", the default with state sync, runs as "services" where
// it does not.
func CheckLeanEvents() error {
	return checkKernelFeatures(leanEventProbes(), netlinkProbeRunner(0, probeTableName()))
}

// natRuleProbes try, per family, rules in a NAT postrouting chain: the
// feature and the kernel option named when the kernel refuses them.
func natRuleProbes(feature, option string, rules ...ruleset.Rule) []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		ps = append(ps, kernelProbe{Feature: feature + w, Option: option, Needs: []string{"nat chains" + w, "ct expression" + w},
			add: func(b *probeBatch) {
				for _, r := range rules {
					b.rule(b.natPostrouting(f), r...)
				}
			}})
	}
	return ps
}

// cpuPortProbes try, per family, the masquerade and the SNAT to a CPU
// group's ports (ruleset.Config.MasqueradePortGroups).
func cpuPortProbes() []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		ps = append(ps, kernelProbe{Feature: "meta cpu, and masq and snat to a port range (masquerade ports by CPU)" + w,
			Option: "CONFIG_NFT_MASQ and CONFIG_NFT_NAT", Needs: []string{"nat chains" + w}, add: func(b *probeBatch) {
				c := b.natPostrouting(f)
				b.rule(c, ruleset.MatchCPU{Proto: model.TCP, Mask: 1, Value: 0}, ruleset.Masquerade{Ports: ruleset.GroupPorts(0, 2)})
				b.rule(c, ruleset.SNAT{To: probeAddrs[f], Ports: ruleset.GroupPorts(1, 2)})
			}})
	}
	return ps
}

// probeTableName is unique per process, so two gateways starting in one
// namespace never delete each other's probe.
func probeTableName() string { return fmt.Sprintf("nftgate-kernel-check-%d", os.Getpid()) }

// checkKernelFeatures sends all probes in one batch; when the kernel refuses
// it, it tries each probe alone (after the ones it needs) and reports the
// ones the kernel refuses.
func checkKernelFeatures(probes []kernelProbe, run probeRunner) error {
	allErr := run(probes)
	if allErr == nil {
		return nil
	}
	failed := map[string]bool{}
	var missing []missingFeature
	for _, p := range probes {
		if slices.ContainsFunc(p.Needs, func(n string) bool { return failed[n] }) {
			// Its base is already reported; trying it would only fail
			// for the same reason.
			failed[p.Feature] = true
			continue
		}
		if err := run([]kernelProbe{p}); err != nil {
			failed[p.Feature] = true
			missing = append(missing, missingFeature{Feature: p.Feature, Option: p.Option, Err: err})
		}
	}
	if len(missing) == 0 {
		return fmt.Errorf("the kernel refused nftgate's nf_tables feature check, although it accepts each feature alone: %w", allErr)
	}
	return &kernelFeatureError{Missing: missing}
}

// netlinkProbeRunner sends probes to nf_tables in the network namespace
// netnsFD (0: the process's own), in one batch that creates the tables
// named table, uses every probe's feature in them and deletes them again.
func netlinkProbeRunner(netnsFD int, table string) probeRunner {
	return func(probes []kernelProbe) error {
		conn, err := dialBatch(netnsFD)
		if err != nil {
			return err
		}
		defer conn.Close()
		b := &probeBatch{name: table, tables: map[ruleset.Family]*probeTable{}}
		for _, p := range probes {
			p.add(b)
		}
		bt, err := b.encode()
		if err != nil {
			return err
		}
		defer bt.release()
		err = conn.send(bt, nil)
		var be *BatchError
		var errno unix.Errno
		switch {
		case err == nil:
			return nil
		case errors.As(err, &be) && len(be.errs) > 0:
			err = be.errs[0]
		}
		switch {
		case errors.Is(err, unix.EPERM):
			return fmt.Errorf("%w (nftgate needs CAP_NET_ADMIN)", err)
		case errors.As(err, &errno):
			// The kernel's errno says it all; the layers of wrapping
			// around it only say that it came over netlink.
			return errno
		}
		return err
	}
}

// probeBatch collects the probes' tables, sets, chains and rules, per
// family, creating each once.
type probeBatch struct {
	name   string
	order  []ruleset.Family
	tables map[ruleset.Family]*probeTable
	// forget are traffic elements to destroy once the tables are made.
	forget []trafficKey
}

type probeTable struct {
	sets       []*ruleset.Set
	flowtables []*ruleset.Flowtable
	chains     []*ruleset.Chain
}

func (b *probeBatch) table(f ruleset.Family) *probeTable {
	t, ok := b.tables[f]
	if !ok {
		t = &probeTable{}
		b.tables[f] = t
		b.order = append(b.order, f)
	}
	return t
}

// chain returns the family's chain of that name, on hook h if not nil.
func (b *probeBatch) chain(f ruleset.Family, name string, h *ruleset.Hook) *ruleset.Chain {
	t := b.table(f)
	for _, c := range t.chains {
		if c.Name == name {
			return c
		}
	}
	c := &ruleset.Chain{Name: name, Hook: h}
	t.chains = append(t.chains, c)
	return c
}

// filterChain is where most probes put their rule: reject is valid on
// input, and so is every match.
func (b *probeBatch) filterChain(f ruleset.Family) *ruleset.Chain {
	return b.chain(f, "filter-input", &ruleset.Hook{Type: "filter", Hook: "input", Priority: ruleset.PrioFilter})
}

func (b *probeBatch) natPrerouting(f ruleset.Family) *ruleset.Chain {
	return b.chain(f, "nat-prerouting", &ruleset.Hook{Type: "nat", Hook: "prerouting", Priority: ruleset.PrioDstNAT})
}

func (b *probeBatch) natPostrouting(f ruleset.Family) *ruleset.Chain {
	return b.chain(f, "nat-postrouting", &ruleset.Hook{Type: "nat", Hook: "postrouting", Priority: ruleset.PrioSrcNAT})
}

func (b *probeBatch) rule(c *ruleset.Chain, stmts ...ruleset.Stmt) {
	c.Rules = append(c.Rules, ruleset.Rule(stmts))
}

// flowtable adds the family's flowtable, once.
func (b *probeBatch) flowtable(f ruleset.Family) {
	t := b.table(f)
	if len(t.flowtables) == 0 {
		t.flowtables = append(t.flowtables, &ruleset.Flowtable{Name: ruleset.FlowtableName, Priority: ruleset.PrioFilter, Counter: true})
	}
}

func (b *probeBatch) set(f ruleset.Family, s *ruleset.Set) {
	t := b.table(f)
	t.sets = append(t.sets, s)
}

// encode writes the batch as a sync's encoder does: each family's table
// (created, so that a table of that name that is not the check's fails
// the check rather than being deleted), its sets, chains and rules, and
// then the deletion of every table.
func (b *probeBatch) encode() (*batch, error) {
	var lastID atomic.Uint32
	w := newWire(16<<10, 64, false)
	w.marker(unix.NFNL_MSG_BATCH_BEGIN)
	for _, f := range b.order {
		t := b.tables[f]
		e := newEncoder(w, &lastID, b.name, f)
		e.tableMessage(unix.NFT_MSG_NEWTABLE, flagsCreate|netlink.Excl, nil)
		for _, s := range t.sets {
			e.addSet(s)
		}
		for _, ft := range t.flowtables {
			e.addFlowtable(ft)
		}
		for _, c := range t.chains {
			e.addChain(c)
		}
		for _, c := range t.chains {
			e.addRules(ruleset.PlanChain(f, c, nil))
		}
		if e.err != nil {
			return nil, e.err
		}
	}
	for _, f := range b.order {
		newEncoder(w, &lastID, b.name, f).destroyTraffic(ofFamily(b.forget, f))
	}
	for _, f := range b.order {
		newEncoder(w, &lastID, b.name, f).tableMessage(unix.NFT_MSG_DELTABLE, netlink.Request, nil)
	}
	if w.err != nil {
		return nil, w.err
	}
	return &batch{parts: []*wire{w}}, nil
}

// flowtableProbes try, per family, a flowtable (on no device: the probe
// is about the kernel, not the configured interfaces) and the rule that
// adds flows to it, on the forward hook, the only one it is valid on, with
// its packet count when packets is not zero.
func flowtableProbes(packets uint64) []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		ft := "flowtable" + w
		ps = append(ps,
			kernelProbe{Feature: ft, Option: "CONFIG_NF_FLOW_TABLE and CONFIG_NF_FLOW_TABLE_INET", add: func(b *probeBatch) {
				b.flowtable(f)
			}},
			kernelProbe{Feature: "flow_offload expression" + w, Option: "CONFIG_NFT_FLOW_OFFLOAD", Needs: []string{ft},
				add: func(b *probeBatch) {
					b.flowtable(f)
					c := b.chain(f, "filter-forward", &ruleset.Hook{Type: "filter", Hook: "forward", Priority: ruleset.PrioFilter})
					b.rule(c, ruleset.OffloadRule(packets)...)
				}},
		)
	}
	return ps
}

// counterProbes try, per family, the counter statement and a map whose
// elements each carry a counter, and with traffic, the traffic sets'
// update from the forward path.
func counterProbes(traffic bool) []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		base := "nf_tables " + f.String() + " family with filter chains"
		ps = append(ps,
			kernelProbe{Feature: "counter expression" + w, Option: "CONFIG_NFT_COUNTER", Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.Counter{}, ruleset.Verdict{Kind: ruleset.Drop})
				}},
			kernelProbe{Feature: "counters on map elements" + w, Option: "CONFIG_NFT_COUNTER", Needs: []string{base},
				add: func(b *probeBatch) {
					b.set(f, &ruleset.Set{Name: "counted", Map: true, Shape: ruleset.KeyAddrProtoPort, Counter: true})
				}},
		)
		if traffic {
			ps = append(ps, kernelProbe{Feature: "dynset expression with counters on a set of conntrack tuples" + w, Option: "CONFIG_NFT_CT",
				Needs: []string{base}, add: func(b *probeBatch) {
					b.set(f, &ruleset.Set{Name: "traffic", Shape: ruleset.KeyTraffic, Timeout: ruleset.TrafficTimeout, Size: 16})
					b.rule(b.filterChain(f), ruleset.CountTraffic{Set: "traffic", Reply: true, Proto: model.TCP})
				}})
		}
	}
	return ps
}

// CheckReleaseTimeWait verifies, in the process's own network namespace,
// that the kernel has what Config.ReleaseTimeWait programs: conntrack
// marks, the dup expression and the TCP reset. A kernel without them (the
// stock gokrazy kernel has no conntrack marks) runs without the release,
// which the caller tells.
func CheckReleaseTimeWait() error {
	return checkKernelFeatures(releaseProbes(), netlinkProbeRunner(0, probeTableName()))
}

// CheckAnswerRefusedSYNs verifies, in the process's own network namespace,
// that the kernel has what Config.AnswerRefusedSYNs programs: the dup
// expression, the TCP reset and the set of refused connections, with its
// add and lookup. No conntrack marks.
func CheckAnswerRefusedSYNs() error {
	return checkKernelFeatures(refusedProbes(), netlinkProbeRunner(0, probeTableName()))
}

// releaseProbes try, per family, the statements of the release's rules.
func releaseProbes() []kernelProbe {
	return resetProbes(func(f ruleset.Family, base string) kernelProbe {
		return kernelProbe{Feature: "conntrack marks (" + f.String() + ")", Option: "CONFIG_NF_CONNTRACK_MARK and CONFIG_NFT_CT", Needs: []string{base},
			add: func(b *probeBatch) {
				b.rule(b.filterChain(f), ruleset.MatchCtMark{Bit: ruleset.CloseMarkReplyFIN}, ruleset.SetCtMark{Bit: ruleset.CloseMarkClientFIN})
			}}
	})
}

// refusedProbes try, per family, the statements of the answer to refused
// SYNs.
func refusedProbes() []kernelProbe {
	return resetProbes(func(f ruleset.Family, base string) kernelProbe {
		return kernelProbe{Feature: "dynset add and lookup on a set of connection tuples (" + f.String() + ")", Option: "CONFIG_NFT_CT", Needs: []string{base},
			add: func(b *probeBatch) {
				b.set(f, &ruleset.Set{Name: "refused", Shape: ruleset.KeyConn, Timeout: ruleset.RefusedTimeout, Size: 16})
				b.rule(b.filterChain(f), ruleset.MatchCtNotAssured{}, ruleset.AddConn{Set: "refused"})
				b.rule(b.filterChain(f), ruleset.MatchTCPFlags{Mask: ruleset.TCPFlagRST, Flags: ruleset.TCPFlagRST},
					ruleset.MatchConnInSet{Set: "refused"}, ruleset.Verdict{Kind: ruleset.Drop})
			}}
	})
}

// resetProbes try, per family, what both the release and the answer to
// refused SYNs use (the filter table, the copy of a packet to the
// gateway's output path and the reset that answers it), and then the
// probe own makes for the family's base feature.
func resetProbes(own func(f ruleset.Family, base string) kernelProbe) []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		opt := probeOptions[f]
		base := "nf_tables " + f.String() + " family with filter chains"
		ps = append(ps,
			kernelProbe{Feature: base, Option: opt.table, add: func(b *probeBatch) {
				b.filterChain(f)
			}},
			own(f, base),
			kernelProbe{Feature: "dup expression" + w, Option: opt.dup, Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.MatchMarkUnset{Bit: ruleset.DefaultMasqueradeBit}, ruleset.DupToSelf{Bit: ruleset.DefaultMasqueradeBit})
				}},
			kernelProbe{Feature: "reject with tcp reset" + w, Option: "CONFIG_NFT_REJECT and " + opt.reject, Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.MatchCtUntracked{}, ruleset.MatchTCPFlags{Mask: ruleset.TCPFlagACK, Flags: ruleset.TCPFlagACK},
						ruleset.Reject{TCPReset: true})
				}},
		)
	}
	return ps
}

// probeAddrs are addresses of the documentation ranges, per family.
var probeAddrs = map[ruleset.Family]netip.Addr{
	ruleset.IPv4: netip.MustParseAddr("192.0.2.1"),
	ruleset.IPv6: netip.MustParseAddr("2001:db8::1"),
}

// probeOptions are the kernel options of what differs per family.
var probeOptions = map[ruleset.Family]struct{ table, fib, reject, dup string }{
	ruleset.IPv4: {"CONFIG_NF_TABLES_IPV4", "CONFIG_NFT_FIB_IPV4", "CONFIG_NFT_REJECT_IPV4", "CONFIG_NFT_DUP_IPV4"},
	ruleset.IPv6: {"CONFIG_NF_TABLES_IPV6", "CONFIG_NFT_FIB_IPV6", "CONFIG_NFT_REJECT_IPV6", "CONFIG_NFT_DUP_IPV6"},
}

// kernelProbes lists, per family, every nf_tables feature the rulesets of
// package ruleset use, each as a rule of the statements nftgate programs.
func kernelProbes() []kernelProbe {
	var ps []kernelProbe
	for _, f := range ruleset.Families {
		w := " (" + f.String() + ")"
		opt := probeOptions[f]
		addr := probeAddrs[f]
		base := "nf_tables " + f.String() + " family with filter chains"
		nat := "nat chains" + w
		ps = append(ps,
			kernelProbe{Feature: base, Option: opt.table, add: func(b *probeBatch) {
				b.filterChain(f)
			}},
			kernelProbe{Feature: nat, Option: "CONFIG_NFT_NAT", Needs: []string{base}, add: func(b *probeBatch) {
				b.natPrerouting(f)
				b.natPostrouting(f)
			}},
			kernelProbe{Feature: "payload and cmp expressions" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.MatchAddr{Dir: ruleset.Dst, Prefix: netip.PrefixFrom(addr, addr.BitLen())})
				}},
			kernelProbe{Feature: "bitwise expression" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					// ip saddr != 192.0.2.0/25: a cluster CIDR match
					b.rule(b.filterChain(f), ruleset.MatchAddr{Dir: ruleset.Src, Prefix: netip.PrefixFrom(addr, 25).Masked(), Not: true})
				}},
			kernelProbe{Feature: "meta expression (l4proto, mark) and TCP flags" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					c := b.filterChain(f)
					b.rule(c, ruleset.MatchMarkUnset{Bit: ruleset.DefaultMasqueradeBit})
					b.rule(c, ruleset.MatchTCPNotSYN{}, ruleset.Verdict{Kind: ruleset.Drop})
					b.rule(c, ruleset.SetMark{Bit: ruleset.DefaultMasqueradeBit, Xor: true})
				}},
			kernelProbe{Feature: "immediate expression (jump, goto)" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					target := b.chain(f, "target", nil)
					b.rule(target, ruleset.Verdict{Kind: ruleset.Return})
					c := b.filterChain(f)
					b.rule(c, ruleset.Verdict{Kind: ruleset.Jump, Chain: target.Name})
					b.rule(c, ruleset.Verdict{Kind: ruleset.Goto, Chain: target.Name})
				}},
			kernelProbe{Feature: "lookup expression in verdict maps with concatenated keys" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					// ip daddr . meta l4proto . th dport vmap @services, and
					// meta l4proto . th dport vmap @nodeports
					c := b.filterChain(f)
					b.set(f, &ruleset.Set{Name: "services", Map: true, Shape: ruleset.KeyAddrProtoPort})
					b.rule(c, ruleset.VmapDispatch{Map: "services", Shape: ruleset.KeyAddrProtoPort})
					b.set(f, &ruleset.Set{Name: "nodeports", Map: true, Shape: ruleset.KeyProtoPort})
					b.rule(c, ruleset.VmapDispatch{Map: "nodeports", Shape: ruleset.KeyProtoPort})
				}},
			kernelProbe{Feature: "lookup expression in address sets" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					c := b.filterChain(f)
					b.set(f, &ruleset.Set{Name: "addrs", Shape: ruleset.KeyAddr})
					b.rule(c, ruleset.MatchAddrInSet{Dir: ruleset.Dst, Set: "addrs"})
					b.set(f, &ruleset.Set{Name: "pairs", Shape: ruleset.KeyAddrPair})
					b.rule(c, ruleset.MatchAddrPairInSet{Set: "pairs"})
				}},
			kernelProbe{Feature: "dynset expression on a set with timeouts" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					b.set(f, &ruleset.Set{Name: "affinity", Timeout: 3 * time.Hour})
					b.rule(b.filterChain(f), ruleset.UpdateAffinity{Set: "affinity"})
				}},
			kernelProbe{Feature: "ct expression" + w, Option: "CONFIG_NFT_CT", Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.MatchCtNew{})
				}},
			kernelProbe{Feature: "fib expression" + w, Option: opt.fib, Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.MatchLocal{Dir: ruleset.Dst})
				}},
			kernelProbe{Feature: "hash expression (jhash)" + w, Option: "CONFIG_NFT_HASH", Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.HashBucket{Seed: ruleset.DefaultHashSeed, Modulus: 2, Bucket: 1})
				}},
			kernelProbe{Feature: "hash expression into a verdict map of slots (Maglev)" + w, Option: "CONFIG_NFT_HASH",
				Needs: []string{base, "hash expression (jhash)" + w}, add: func(b *probeBatch) {
					b.set(f, &ruleset.Set{Name: "maglev", Map: true, Shape: ruleset.KeySlot})
					b.rule(b.filterChain(f), ruleset.MaglevDispatch{Seed: ruleset.DefaultHashSeed, Modulus: 509, Map: "maglev"})
				}},
			kernelProbe{Feature: "reject expression" + w, Option: "CONFIG_NFT_REJECT and " + opt.reject, Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f), ruleset.Reject{})
				}},
			kernelProbe{Feature: "nat expression (dnat)" + w, Option: "CONFIG_NFT_NAT", Needs: []string{nat},
				add: func(b *probeBatch) {
					b.rule(b.natPrerouting(f), ruleset.DNAT{Proto: model.TCP, To: netip.AddrPortFrom(addr, 8080)})
				}},
			kernelProbe{Feature: "redir expression" + w, Option: "CONFIG_NFT_REDIR", Needs: []string{nat},
				add: func(b *probeBatch) {
					b.rule(b.natPrerouting(f), ruleset.Redirect{Proto: model.TCP, Port: 9190})
				}},
			kernelProbe{Feature: "masq expression" + w, Option: "CONFIG_NFT_MASQ", Needs: []string{nat},
				add: func(b *probeBatch) {
					b.rule(b.natPostrouting(f), ruleset.Masquerade{})
				}},
			kernelProbe{Feature: "nat expression (snat to a masquerade address chosen by jhash)" + w, Option: "CONFIG_NFT_NAT",
				Needs: []string{nat, "hash expression (jhash)" + w}, add: func(b *probeBatch) {
					b.rule(b.natPostrouting(f),
						ruleset.HashBucket{Seed: ruleset.DefaultHashSeed, Modulus: 2, Bucket: 1, AddrOnly: true},
						ruleset.SNAT{To: addr})
				}},
		)
	}
	return ps
}
