// Package trace replays packets through a ruleset of package ruleset, as the
// kernel would run it: the semantics of a ruleset checked in microseconds,
// without a kernel. It is test support; the product does not import it.
package trace

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// Packet is the first packet of a new connection, as Trace replays it.
type Packet struct {
	Src, Dst         netip.Addr
	Proto            model.Protocol
	SrcPort, DstPort uint16
	// Hook is where the packet enters the gateway: "prerouting" for
	// traffic that arrives from a network (to be forwarded, or addressed to
	// the gateway), "output" for the gateway's own traffic.
	Hook string
	// SrcLocal and DstLocal are what `fib saddr/daddr type local` answer:
	// whether the address is one of the gateway's own. A destination
	// rewritten by DNAT is an endpoint and never local.
	SrcLocal, DstLocal bool
	// AffinityHit names the affinity sets that already hold the source
	// address (a client seen before).
	AffinityHit map[string]bool
}

// Fate is what finally happens to a packet on one path through the rules.
type Fate uint8

// Fates of a packet.
const (
	Accepted Fate = iota + 1 // forwarded or delivered, DNATed or not
	Dropped
	Rejected
)

func (f Fate) String() string {
	switch f {
	case Accepted:
		return "accept"
	case Dropped:
		return "drop"
	case Rejected:
		return "reject"
	}
	return "?"
}

// Outcome is one possible path of the packet through the ruleset.
type Outcome struct {
	Fate Fate
	// DNAT is the endpoint the packet was sent to; zero when not DNATed.
	DNAT netip.AddrPort
	// Local is set when the packet was delivered to the gateway itself.
	Local bool
	// Redirect is the gateway's own port a redirect sent the packet to
	// (the PROXY protocol proxy); zero when not redirected.
	Redirect uint16
	// Here is set when a redirect without a port sent the packet to the
	// gateway itself (an echo request the gateway answers).
	Here bool
	// Marked tells that the masquerade mark bit was set when the packet
	// reached postrouting; Masqueraded that postrouting masqueraded it
	// (to the interface's address or a masquerade address).
	Marked, Masqueraded bool
	// Affinity lists the affinity sets the path recorded the client in.
	Affinity []string
	// Path is every rule that acted on the packet, as "chain: rule".
	Path []string
}

func (o Outcome) String() string {
	var s string
	if o.Fate == Accepted && o.DNAT.IsValid() {
		s = "dnat " + o.DNAT.String()
	} else if o.Fate == Accepted && o.Redirect != 0 {
		s = fmt.Sprintf("redirect :%d", o.Redirect)
	} else if o.Fate == Accepted && o.Here {
		s = "redirect"
	} else {
		s = o.Fate.String()
	}
	if o.Masqueraded {
		s += " masq"
	}
	return s
}

// TraceResult is every way the packet can go. Trace follows each branch of a
// hash of the client's address and port (HashBucket) over all its values, so
// a Service with N endpoints has (at least) N outcomes.
type TraceResult struct {
	Outcomes []Outcome
	// Err reports a ruleset the tracer cannot follow: a jump to a missing
	// chain, a lookup in a missing map, a loop, conflicting elements.
	Err error
}

// Targets are the distinct endpoints the packet may be DNATed to, in order.
func (r TraceResult) Targets() []netip.AddrPort {
	var out []netip.AddrPort
	for _, o := range r.Outcomes {
		if o.DNAT.IsValid() && !slices.Contains(out, o.DNAT) {
			out = append(out, o.DNAT)
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return out
}

// Dropped tells whether some path drops the packet.
func (r TraceResult) Dropped() bool { return r.any(func(o Outcome) bool { return o.Fate == Dropped }) }

// Rejected tells whether some path rejects the packet.
func (r TraceResult) Rejected() bool {
	return r.any(func(o Outcome) bool { return o.Fate == Rejected })
}

// AcceptedUnchanged tells whether some path lets the packet through without
// DNAT.
func (r TraceResult) AcceptedUnchanged() bool {
	return r.any(func(o Outcome) bool { return o.Fate == Accepted && !o.DNAT.IsValid() })
}

// Masqueraded tells whether some path masqueraded the packet.
func (r TraceResult) Masqueraded() bool { return r.any(func(o Outcome) bool { return o.Masqueraded }) }

func (r TraceResult) any(p func(Outcome) bool) bool { return slices.ContainsFunc(r.Outcomes, p) }

// Summary lists the distinct outcomes, sorted, as "dnat 10.0.0.1:80 masq,
// drop": a compact value for table tests to compare.
func (r TraceResult) Summary() string {
	if r.Err != nil {
		return "error: " + r.Err.Error()
	}
	var s []string
	for _, o := range r.Outcomes {
		if t := o.String(); !slices.Contains(s, t) {
			s = append(s, t)
		}
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// Paths writes every outcome with the rules it took, for failure messages.
func (r TraceResult) Paths() string {
	var b strings.Builder
	for i, o := range r.Outcomes {
		fmt.Fprintf(&b, "outcome %d: %s\n", i, o)
		for _, p := range o.Path {
			fmt.Fprintf(&b, "\t%s\n", p)
		}
	}
	return b.String()
}

// Trace replays the first packet of a new connection through family f's
// ruleset, made of frags (ruleset.Static's skeleton and the Services'
// fragments), as the kernel would: the base chains of each hook in priority
// order, jumps, gotos, returns, verdict maps, and every value a hash of the
// client's address and port can take (HashBucket). It is test infrastructure: the semantics of a ruleset checked
// in microseconds, without a kernel.
//
// The kernel's path for a new connection: a packet from a network passes
// prerouting, then input when its (possibly DNATed) destination is local, or
// forward and postrouting otherwise. The gateway's own packet passes output
// and postrouting, and when addressed to itself comes back in over loopback
// through prerouting and input, where NAT no longer applies because the
// connection's NAT is already set up.
func Trace(cfg *ruleset.Config, f ruleset.Family, tables []ruleset.Table, pkt Packet) TraceResult {
	t := &tracer{f: f, pkt: pkt, bit: ruleset.MasqueradeBitOf(cfg), hooks: map[string][]baseChain{}}
	for i := range tables {
		if err := t.index(&tables[i]); err != nil {
			return TraceResult{Err: fmt.Errorf("table %s: %w", tables[i].Name, err)}
		}
	}
	for _, cs := range t.hooks {
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].chain.Hook.Priority < cs[j].chain.Hook.Priority })
	}
	if !pkt.Src.IsValid() || !pkt.Dst.IsValid() || ruleset.Of(pkt.Src) != f || ruleset.Of(pkt.Dst) != f {
		return TraceResult{Err: fmt.Errorf("packet %s -> %s is not of family %s", pkt.Src, pkt.Dst, f)}
	}
	start := state{dst: pkt.Dst, dport: pkt.DstPort, dstLocal: pkt.DstLocal}
	switch pkt.Hook {
	case "prerouting":
		for _, st := range t.hook(start, "prerouting", true) {
			if st.dstLocal {
				for _, st := range t.hook(st, "input", true) {
					t.finish(st, false)
				}
				continue
			}
			for _, st := range t.hook(st, "forward", true) {
				t.finish(t.postrouting(st), true)
			}
		}
	case "output":
		for _, st := range t.hook(start, "output", true) {
			st = t.postrouting(st)
			if t.err != nil || !st.dstLocal {
				t.finish(st, true)
				continue
			}
			for _, st := range t.hook(st, "prerouting", false) {
				for _, st := range t.hook(st, "input", false) {
					t.finish(st, false)
				}
			}
		}
	default:
		return TraceResult{Err: fmt.Errorf("packet hook %q: want prerouting or output", pkt.Hook)}
	}
	if t.err != nil {
		return TraceResult{Err: t.err}
	}
	return TraceResult{Outcomes: t.out}
}

type tracer struct {
	f      ruleset.Family
	pkt    Packet
	bit    uint32
	tables []*traceTable
	hooks  map[string][]baseChain // base chains of every table per hook, by priority
	out    []Outcome
	err    error
}

// traceTable is one table's objects by name: a jump or a lookup never
// leaves its table.
type traceTable struct {
	name   string
	chains map[string]*ruleset.Chain
	sets   map[string]*ruleset.Set
	elems  map[string]map[ruleset.Key]ruleset.Verdict
	// endpoints are the endpoint maps' elements.
	endpoints map[string]map[ruleset.Key]netip.AddrPort
}

type baseChain struct {
	table *traceTable
	chain *ruleset.Chain
}

// state is what the rules may change about a packet on one path.
type state struct {
	dst         netip.Addr
	dport       uint16
	dstLocal    bool
	mark        uint32
	dnat        netip.AddrPort
	redirect    uint16
	here        bool
	marked      bool // mark bit seen at postrouting
	masqueraded bool
	affinity    []string
	path        []string
	// buckets holds the hash bucket this flow falls in, per seed,
	// modulus and whether the port is hashed (1) or not (0), once a
	// HashBucket match has forked the trace over them; and its CPU under
	// a mask (key {mask, 0, 2}), once a MatchCPU has.
	buckets map[[3]uint32]uint32
}

// inBucket is st with the flow in bucket b of key, the buckets of st
// left as they were.
func (st state) inBucket(key [3]uint32, b uint32) state {
	st.buckets = maps.Clone(st.buckets)
	if st.buckets == nil {
		st.buckets = map[[3]uint32]uint32{}
	}
	st.buckets[key] = b
	return st
}

func (st state) log(chain string, r ruleset.Rule, f ruleset.Family, note string) state {
	line := chain + ": " + r.Text(f)
	if note != "" {
		line += "  => " + note
	}
	st.path = append(slices.Clip(st.path), line)
	return st
}

func (t *tracer) index(table *ruleset.Table) error {
	tt := &traceTable{name: table.Name, chains: map[string]*ruleset.Chain{}, sets: map[string]*ruleset.Set{}, elems: map[string]map[ruleset.Key]ruleset.Verdict{}}
	t.tables = append(t.tables, tt)
	for _, s := range table.Sets {
		if _, dup := tt.sets[s.Name]; dup {
			return fmt.Errorf("set %q defined twice", s.Name)
		}
		tt.sets[s.Name] = s
		if s.Endpoints {
			if tt.endpoints == nil {
				tt.endpoints = map[string]map[ruleset.Key]netip.AddrPort{}
			}
			tt.endpoints[s.Name] = map[ruleset.Key]netip.AddrPort{}
			continue
		}
		if s.Map || s.Shape == ruleset.KeyAddr || s.Shape == ruleset.KeyAddrPair {
			tt.elems[s.Name] = map[ruleset.Key]ruleset.Verdict{}
		}
	}
	for _, c := range table.Chains {
		if _, dup := tt.chains[c.Name]; dup {
			return fmt.Errorf("chain %q defined twice", c.Name)
		}
		tt.chains[c.Name] = c
		if c.Hook != nil {
			t.hooks[c.Hook.Hook] = append(t.hooks[c.Hook.Hook], baseChain{tt, c})
		}
	}
	for i := range table.Picks {
		for _, e := range table.Picks[i].AppendElements(nil) {
			m, ok := tt.endpoints[e.Map]
			if !ok {
				return fmt.Errorf("element %s in missing endpoint map %q", e.Key, e.Map)
			}
			if to, dup := m[e.Key]; dup {
				return fmt.Errorf("endpoint map %s: key %s given %s and %s", e.Map, e.Key, to, e.To)
			}
			m[e.Key] = e.To
		}
	}
	for _, e := range table.Elements {
		m, ok := tt.elems[e.Map]
		if !ok {
			return fmt.Errorf("element %s in missing map %q", e.Key, e.Map)
		}
		if v, dup := m[e.Key]; dup && v != e.Verdict {
			return fmt.Errorf("map %s: key %s claimed by %q and %q", e.Map, e.Key, v, e.Verdict)
		}
		m[e.Key] = e.Verdict
	}
	return nil
}

func (t *tracer) fail(format string, args ...any) {
	if t.err == nil {
		t.err = fmt.Errorf(format, args...)
	}
}

// hook runs the base chains of one hook in priority order and returns the
// paths that survive it; dropped and rejected paths become outcomes. NAT
// chains run only while the connection has no NAT for this hook yet (and
// not at all when nat is false): the kernel consults them for the first
// packet only, and stops once one of them set up the translation.
func (t *tracer) hook(st state, hook string, nat bool) []state {
	live := []state{st}
	for _, bc := range t.hooks[hook] {
		var next []state
		for _, st := range live {
			if bc.chain.Hook.Type == "nat" && (!nat || natDone(hook, st)) {
				next = append(next, st)
				continue
			}
			for _, e := range t.runChain(st, bc.table, bc.chain.Name, 0) {
				switch e.kind {
				case endDrop:
					t.end(e.st, Dropped, false)
				case endReject:
					t.end(e.st, Rejected, false)
				default: // accept, return or the end of a base chain: policy accept
					next = append(next, e.st)
				}
			}
		}
		live = next
	}
	return live
}

// natDone tells whether the connection already has its NAT for the hook:
// destination NAT on prerouting and output, source NAT on the others.
func natDone(hook string, st state) bool {
	if hook == "prerouting" || hook == "output" {
		return st.dnat.IsValid() || st.redirect != 0 || st.here
	}
	return st.masqueraded
}

func (t *tracer) postrouting(st state) state {
	st.marked = st.mark&t.bit != 0
	live := t.hook(st, "postrouting", true)
	// Postrouting only masquerades here: the branches of the masquerade
	// pool's hash are one outcome when they all masquerade alike; any
	// other branch, or a drop, would be a ruleset the outcomes cannot
	// describe.
	if len(live) == 0 || slices.ContainsFunc(live[1:], func(o state) bool {
		return o.masqueraded != live[0].masqueraded || o.mark != live[0].mark
	}) {
		t.fail("postrouting left %d paths that differ, want 1", len(live))
		return st
	}
	return live[0]
}

func (t *tracer) finish(st state, forwarded bool) {
	t.end(st, Accepted, !forwarded)
}

func (t *tracer) end(st state, fate Fate, local bool) {
	t.out = append(t.out, Outcome{Fate: fate, DNAT: st.dnat, Redirect: st.redirect, Here: st.here, Local: local && fate == Accepted,
		Marked: st.marked, Masqueraded: st.masqueraded, Affinity: st.affinity, Path: st.path})
}

type endKind uint8

const (
	endNext   endKind = iota // the rule is done: go on with the next one
	endReturn                // return to the calling chain (also: end of chain)
	endAccept
	endDrop
	endReject
)

type end struct {
	st   state
	kind endKind
}

const maxDepth = 32

func (t *tracer) runChain(st state, tt *traceTable, name string, depth int) []end {
	if depth > maxDepth {
		t.fail("chain %q: jumps nest deeper than %d (a loop?)", name, maxDepth)
		return nil
	}
	c, ok := tt.chains[name]
	if !ok {
		t.fail("jump to missing chain %q in table %s", name, tt.name)
		return nil
	}
	return t.runRules(st, tt, c, 0, depth)
}

func (t *tracer) runRules(st state, tt *traceTable, c *ruleset.Chain, i, depth int) []end {
	if i == len(c.Rules) {
		return []end{{st, endReturn}}
	}
	var out []end
	for _, e := range t.runRule(st, tt, c, i, depth) {
		if e.kind == endNext {
			out = append(out, t.runRules(e.st, tt, c, i+1, depth)...)
		} else {
			out = append(out, e)
		}
	}
	return out
}

// runRule evaluates one rule's statements left to right. A failing match
// ends the rule; changes made before it stay, as in the kernel.
func (t *tracer) runRule(st state, tt *traceTable, c *ruleset.Chain, i, depth int) []end {
	r := c.Rules[i]
	orig := st
	for _, s := range r {
		switch s := s.(type) {
		case ruleset.MatchAddr:
			a := t.pkt.Src
			if s.Dir == ruleset.Dst {
				a = st.dst
			}
			if s.Prefix.Contains(a) == s.Not {
				return []end{{st, endNext}}
			}
		case ruleset.MatchAddrInSet:
			if _, ok := tt.sets[s.Set]; !ok {
				t.fail("chain %s: lookup in missing set %q", c.Name, s.Set)
				return nil
			}
			if elems, filled := tt.elems[s.Set]; filled {
				// An address set nftgate fills.
				a := t.pkt.Src
				if s.Dir == ruleset.Dst {
					a = st.dst
				}
				if _, hit := elems[ruleset.Key{Addr: a}]; !hit {
					return []end{{st, endNext}}
				}
			} else if s.Dir != ruleset.Src {
				t.fail("chain %s: destination lookups in dynamic sets are not traced", c.Name)
				return nil
			} else if !t.pkt.AffinityHit[s.Set] {
				return []end{{st, endNext}}
			}
		case ruleset.MatchAddrPairInSet:
			elems, ok := tt.elems[s.Set]
			if !ok {
				t.fail("chain %s: lookup in missing set %q", c.Name, s.Set)
				return nil
			}
			if _, hit := elems[ruleset.Key{Addr: t.pkt.Src}]; !hit || t.pkt.Src != st.dst {
				return []end{{st, endNext}}
			}
		case ruleset.MatchLocal:
			local := t.pkt.SrcLocal
			if s.Dir == ruleset.Dst {
				local = st.dstLocal
			}
			if !local {
				return []end{{st, endNext}}
			}
		case ruleset.MatchCtNew:
			// Trace replays the first packet of a connection.
		case ruleset.Counter, ruleset.CountTraffic, ruleset.AddConn, ruleset.SetCtEvents, ruleset.SetCtLabel:
			// Counts, remembers, chooses events or labels the close;
			// changes nothing.
		case ruleset.MatchL4Proto:
			if t.pkt.Proto != s.Proto {
				return []end{{st, endNext}}
			}
		case ruleset.MatchCtNotDNAT:
			if st.dnat.IsValid() || st.redirect != 0 {
				return []end{{st, endNext}}
			}
		case ruleset.MatchCtInvalid:
			// Trace replays a connection's first packet, which conntrack
			// tracks.
			return []end{{st, endNext}}
		case ruleset.MatchCtNewOrInvalid:
			// It is new.
		case ruleset.MatchCtNotAssured:
			// The first packet of a connection is not assured yet.
		case ruleset.MatchConnInSet, ruleset.MatchCtConnInSet:
			// Only refused connections' resets are in the one, only
			// connections waiting for their replica in the others, never
			// a first packet.
			return []end{{st, endNext}}
		case ruleset.MatchCtEstablished, ruleset.MatchCtDNAT, ruleset.FlowOffload, ruleset.MatchTCPNotSYN,
			ruleset.MatchCtMasqueraded, ruleset.MatchCtUntracked, ruleset.MatchCtMark:
			// The first packet of a connection is not established, is
			// never offloaded, and opens a TCP connection with a SYN;
			// before NAT it is not translated yet, it is tracked, and
			// its connection's mark holds no close.
			return []end{{st, endNext}}
		case ruleset.MatchTCPFlags:
			if s.Any && s.Mask&ruleset.TCPFlagSYN != 0 || !s.Any && s.Flags == ruleset.TCPFlagSYN&s.Mask {
				t.fail("chain %s: %s matches a SYN, which the trace cannot tell from another protocol's packet", c.Name, r.Text(t.f))
				return nil
			}
			return []end{{st, endNext}}
		case ruleset.MatchCtDirection:
			if s.Reply {
				return []end{{st, endNext}}
			}
		case ruleset.MatchMarkSet:
			if st.mark&s.Bit == 0 {
				return []end{{st, endNext}}
			}
		case ruleset.MatchMarkUnset:
			if st.mark&s.Bit != 0 {
				return []end{{st, endNext}}
			}
		case ruleset.SetMark:
			if s.Xor {
				st.mark ^= s.Bit
			} else {
				st.mark |= s.Bit
			}
		case ruleset.UpdateAffinity:
			if _, ok := tt.sets[s.Set]; !ok {
				t.fail("chain %s: update of missing set %q", c.Name, s.Set)
				return nil
			}
			st.affinity = append(slices.Clip(st.affinity), s.Set)
		case ruleset.DNAT:
			if t.pkt.Proto != s.Proto {
				return []end{{st, endNext}}
			}
			if ruleset.Of(s.To.Addr()) != t.f {
				t.fail("chain %s: dnat to %s in family %s", c.Name, s.To, t.f)
				return nil
			}
			// NAT statements end the chain with accept; later chains
			// of the hook already see the new destination.
			st.dnat, st.dst, st.dport, st.dstLocal = s.To, s.To.Addr(), s.To.Port(), false
			return []end{{st.log(c.Name, r, t.f, ""), endAccept}}
		case ruleset.DNATMap:
			if t.pkt.Proto != s.Proto {
				return []end{{st, endNext}}
			}
			m, ok := tt.endpoints[s.Map]
			if !ok {
				t.fail("chain %s: lookup in missing endpoint map %q", c.Name, s.Map)
				return nil
			}
			k := ruleset.Key{Proto: t.pkt.Proto, Port: st.dport}
			if !s.NodePort {
				k.Addr = st.dst
			}
			to, hit := m[k]
			if !hit {
				// A lookup that misses ends the rule.
				return []end{{st, endNext}}
			}
			if ruleset.Of(to.Addr()) != t.f {
				t.fail("chain %s: dnat to %s in family %s", c.Name, to, t.f)
				return nil
			}
			st.dnat, st.dst, st.dport, st.dstLocal = to, to.Addr(), to.Port(), false
			return []end{{st.log(c.Name, r, t.f, "element "+k.String()+" : "+to.String()), endAccept}}
		case ruleset.Redirect:
			if t.pkt.Proto != s.Proto {
				return []end{{st, endNext}}
			}
			// To the gateway itself: delivered, not forwarded.
			st.redirect, st.dport, st.dstLocal = s.Port, s.Port, true
			return []end{{st.log(c.Name, r, t.f, ""), endAccept}}
		case ruleset.MatchEchoRequest:
			want := ruleset.ProtoICMP
			if t.f == ruleset.IPv6 {
				want = ruleset.ProtoICMPv6
			}
			if t.pkt.Proto != want { // every ICMP packet traced is an echo request
				return []end{{st, endNext}}
			}
		case ruleset.LimitRate:
			// Trace replays one packet: within any rate.
		case ruleset.LimitBySource:
			if _, ok := tt.sets[s.Set]; !ok {
				t.fail("chain %s: update of missing set %q", c.Name, s.Set)
				return nil
			}
		case ruleset.RedirectHere:
			st.here, st.dstLocal = true, true
			return []end{{st.log(c.Name, r, t.f, ""), endAccept}}
		case ruleset.Masquerade:
			if s.Ports.Min != 0 && t.pkt.Proto != s.Ports.Proto {
				return []end{{st, endNext}}
			}
			st.masqueraded = true
			return []end{{st.log(c.Name, r, t.f, ""), endAccept}}
		case ruleset.SNAT:
			if s.Ports.Min != 0 && t.pkt.Proto != s.Ports.Proto {
				return []end{{st, endNext}}
			}
			if ruleset.Of(s.To) != t.f {
				t.fail("chain %s: snat to %s in family %s", c.Name, s.To, t.f)
				return nil
			}
			st.masqueraded = true
			return []end{{st.log(c.Name, r, t.f, ""), endAccept}}
		case ruleset.Reject:
			return []end{{st.log(c.Name, r, t.f, ""), endReject}}
		case ruleset.Verdict:
			return t.verdict(st.log(c.Name, r, t.f, ""), tt, s, depth)
		case ruleset.VmapDispatch:
			m, ok := tt.elems[s.Map]
			if !ok {
				t.fail("chain %s: lookup in missing map %q", c.Name, s.Map)
				return nil
			}
			k := ruleset.Key{Proto: t.pkt.Proto, Port: st.dport}
			if s.Shape == ruleset.KeyAddrProtoPort {
				k.Addr = st.dst
			}
			v, hit := m[k]
			if !hit {
				return []end{{st, endNext}}
			}
			return t.verdict(st.log(c.Name, r, t.f, "element "+k.String()+" : "+v.String()), tt, v, depth)
		case ruleset.MaglevDispatch:
			m, ok := tt.elems[s.Map]
			if !ok {
				t.fail("chain %s: lookup in missing map %q", c.Name, s.Map)
				return nil
			}
			if s.Modulus == 0 {
				t.fail("chain %s: hash modulus 0", c.Name)
				return nil
			}
			key := [3]uint32{s.Seed, s.Modulus, 1}
			if chosen, ok := st.buckets[key]; ok {
				v, hit := m[ruleset.Key{Slot: chosen}]
				if !hit {
					return []end{{st, endNext}}
				}
				return t.verdict(st.log(c.Name, r, t.f, fmt.Sprintf("slot %d : %s", chosen, v)), tt, v, depth)
			}
			// The flow may fall in any slot: one outcome per distinct
			// verdict (the first slot that has it), and one for the
			// slots the map lacks, which fall through to the next rule.
			var out []end
			seen := map[ruleset.Verdict]bool{}
			missed := false
			for slot := uint32(0); slot < s.Modulus; slot++ {
				v, hit := m[ruleset.Key{Slot: slot}]
				if hit && seen[v] || !hit && missed {
					continue
				}
				seen[v], missed = seen[v] || hit, missed || !hit
				out = append(out, t.runRule(orig.inBucket(key, slot), tt, c, i, depth)...)
			}
			return out
		case ruleset.MatchCPU:
			if t.pkt.Proto != s.Proto {
				return []end{{st, endNext}}
			}
			// The CPU is one more bucket: the first CPU match of a flow
			// forks the trace, one outcome per value under the mask (one
			// less than a power of two).
			key := [3]uint32{s.Mask, 0, 2}
			chosen, ok := st.buckets[key]
			if !ok {
				var out []end
				for v := uint32(0); v <= s.Mask; v++ {
					out = append(out, t.runRule(orig.inBucket(key, v), tt, c, i, depth)...)
				}
				return out
			}
			if chosen != s.Value {
				return []end{{st, endNext}}
			}
		case ruleset.HashBucket:
			if s.Modulus == 0 {
				t.fail("chain %s: hash modulus 0", c.Name)
				return nil
			}
			key := [3]uint32{s.Seed, s.Modulus, 1}
			if s.AddrOnly {
				key[2] = 0
			}
			chosen, ok := st.buckets[key]
			if !ok {
				// The first bucket match of a flow forks the trace: one
				// outcome per bucket, each replaying this rule.
				var out []end
				for b := uint32(0); b < s.Modulus; b++ {
					out = append(out, t.runRule(orig.inBucket(key, b), tt, c, i, depth)...)
				}
				return out
			}
			if chosen != s.Bucket {
				return []end{{st, endNext}}
			}
		default:
			t.fail("chain %s: statement %T is not traced", c.Name, s)
			return nil
		}
	}
	return []end{{st.log(c.Name, r, t.f, ""), endNext}}
}

func (t *tracer) verdict(st state, tt *traceTable, v ruleset.Verdict, depth int) []end {
	switch v.Kind {
	case ruleset.Accept:
		return []end{{st, endAccept}}
	case ruleset.Drop:
		return []end{{st, endDrop}}
	case ruleset.Return:
		return []end{{st, endReturn}}
	case ruleset.Jump:
		ends := t.runChain(st, tt, v.Chain, depth+1)
		for i := range ends {
			if ends[i].kind == endReturn {
				ends[i].kind = endNext // back in the caller, after the jump
			}
		}
		return ends
	case ruleset.Goto:
		// A return from the target returns to this chain's caller.
		return t.runChain(st, tt, v.Chain, depth+1)
	}
	t.fail("verdict %v is not traced", v)
	return nil
}
