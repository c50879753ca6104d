package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"testing"
	"time"

	bc "github.com/nftgate/nftgate/ruleset/bytecode"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// refEncode encodes planned operations the way nftgate did before it wrote
// batches itself: every message through google/nftables. The batch the
// encoder writes must be byte for byte the same, apart from the
// acknowledgement and echo flags, which batch.go sets on the last message
// only, and the sequence numbers and port ID, which it sets when sending.
func refEncode(t *testing.T, ts *ruleset.Tables, ds []*ruleset.Ops) []byte {
	t.Helper()
	rec, err := newRecorder()
	if err != nil {
		t.Fatal(err)
	}
	c := rec.conn
	// Every table and its new sets first, then the rest, table by table.
	refsOf := make([]*googleSink, len(ds))
	for slot, o := range ds {
		if o.Empty() {
			continue
		}
		ref := ts.Refs[slot]
		refsOf[slot] = newGoogleSink(ref.Name, ref.Family)
		refs := refsOf[slot]
		if o.CreateTable {
			c.AddTable(refs.table)
		}
		for _, s := range o.AddSets {
			ns := setDefinition(refs.table, ref.Family, s)
			ns.ID = rec.setID()
			if err := c.AddSet(ns, nil); err != nil {
				t.Fatal(err)
			}
			refs.sets[s.Name] = ns
		}
		for _, ft := range o.AddFlowtables {
			c.AddFlowtable(flowtableDefinition(refs.table, ft))
		}
	}
	for slot, o := range ds {
		if o.Empty() {
			continue
		}
		ref := ts.Refs[slot]
		refs := refsOf[slot]
		table := refs.table
		chain := func(name string) *nftables.Chain { return &nftables.Chain{Table: table, Name: name} }
		addSet := func(s *ruleset.Set) {
			ns := setDefinition(table, ref.Family, s)
			ns.ID = rec.setID()
			if err := c.AddSet(ns, nil); err != nil {
				t.Fatal(err)
			}
			refs.sets[s.Name] = ns
		}
		addRules := func(p ruleset.ChainPlan) {
			for i, r := range p.Chain.Rules {
				refs.exprs = nil
				for _, s := range r {
					s.Encode(ref.Family, refs)
				}
				c.AddRule(&nftables.Rule{Table: table, Chain: chain(p.Chain.Name), Exprs: refs.exprs, UserData: appendFingerprint(nil, p.RuleFPs[i])})
			}
		}
		elements := func(els []ruleset.Element, del bool) {
			byMap := map[string][]nftables.SetElement{}
			var order []string
			for _, el := range els {
				if _, ok := byMap[el.Map]; !ok {
					order = append(order, el.Map)
				}
				e := nftables.SetElement{Key: appendKey(nil, ruleset.SetShape(el.Map), el.Key)}
				if el.Verdict.Kind != 0 {
					v := el.Verdict.Bytecode()
					e.VerdictData = &expr.Verdict{Kind: expr.VerdictKind(v.Code), Chain: v.Chain}
				}
				if el.To.IsValid() && !del {
					e.Val = appendEndpoint(nil, el.To)
				}
				byMap[el.Map] = append(byMap[el.Map], e)
			}
			for _, m := range order {
				shape := ruleset.SetShape(m)
				_, _, endpoints := ruleset.EndpointMapIndex(m)
				s := setDefinition(table, ref.Family, &ruleset.Set{Name: m, Map: shape != ruleset.KeyAddr && shape != ruleset.KeyAddrPair, Shape: shape, Endpoints: endpoints})
				for chunk := range chunks(byMap[m], elementsPerMessage) {
					if del {
						err = c.SetDeleteElements(s, chunk)
					} else {
						err = c.SetAddElements(s, chunk)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		for _, p := range o.AddChains {
			nc := chain(p.Chain.Name)
			if h := p.Chain.Hook; h != nil {
				num := nftables.ChainHook(hookNums[h.Hook])
				accept := nftables.ChainPolicyAccept
				nc.Type, nc.Hooknum, nc.Policy = nftables.ChainType(h.Type), &num, &accept
				nc.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(h.Priority))
			}
			c.AddChain(nc)
		}
		for _, p := range o.RewriteChains {
			c.FlushChain(chain(p.Chain.Name))
		}
		for _, n := range o.FlushChains {
			c.FlushChain(chain(n))
		}
		for _, s := range o.RecreateSets {
			c.DelSet(setDefinition(table, ref.Family, s))
			addSet(s)
		}
		for _, ft := range o.RecreateFlowtables {
			c.DelFlowtable(flowtableDefinition(table, ft))
			c.AddFlowtable(flowtableDefinition(table, ft))
		}
		for _, p := range o.AddChains {
			addRules(p)
		}
		for _, p := range o.RewriteChains {
			addRules(p)
		}
		elements(o.DelElems, true)
		elements(o.AddElems, false)
		for _, n := range o.DelChains {
			c.DelChain(chain(n))
		}
		for _, n := range o.DelSets {
			c.DelSet(&nftables.Set{Table: table, Name: n})
		}
		for _, n := range o.DelFlowtables {
			c.DelFlowtable(&nftables.Flowtable{Table: table, Name: n})
		}
	}
	msgs, err := rec.take()
	if err != nil {
		t.Fatal(err)
	}
	// google/nftables writes no table user data: nftgate's mark is the
	// one attribute nftgate adds, after the others.
	mark, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: nftaTableUserdata, Data: tableMark}})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, m := range msgs {
		if m.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWTABLE) {
			m.Data = append(m.Data[:len(m.Data):len(m.Data)], mark...)
		}
		out = appendRefMessage(out, m)
	}
	return out
}

func appendRefMessage(out []byte, m netlink.Message) []byte {
	out = binary.NativeEndian.AppendUint32(out, uint32(16+len(m.Data)))
	out = binary.NativeEndian.AppendUint16(out, uint16(m.Header.Type))
	out = binary.NativeEndian.AppendUint16(out, uint16(m.Header.Flags&^(netlink.Acknowledge|unix.NLM_F_ECHO)))
	out = append(out, make([]byte, 8)...)
	out = append(out, m.Data...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	return out
}

// wireMessages is the encoder's batch without its beginning, as refEncode
// writes it.
func wireMessages(bt *batch) []byte {
	var out []byte
	for _, w := range bt.parts {
		out = append(out, w.b...)
	}
	return out[nlmsgHeaderLen+nfgenHeaderLen:]
}

// compareBatches reports the first message where two batches differ.
func compareBatches(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for i := 0; ; i++ {
		if len(got) < 16 || len(want) < 16 {
			t.Fatalf("%s: batches differ in length after %d messages: %d bytes left, want %d", what, i, len(got), len(want))
		}
		gl, wl := binary.NativeEndian.Uint32(got), binary.NativeEndian.Uint32(want)
		gm, wm := got[:min(int(gl+3)&^3, len(got))], want[:min(int(wl+3)&^3, len(want))]
		if !bytes.Equal(gm, wm) {
			t.Fatalf("%s: message %d differs:\n got: % x\nwant: % x", what, i, gm, wm)
		}
		got, want = got[len(gm):], want[len(wm):]
	}
}

// TestWireMatchesGoogleNftables encodes random worlds, their changes and
// their removal with the encoder and with google/nftables: the bytes must
// be the same, so that the kernel sees exactly what google/nftables (whose
// output TestNetlinkMatchesNft compares with nft's) would have sent.
func TestWireMatchesGoogleNftables(t *testing.T) {
	for seed := int64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			cfg := ruleset.Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, Shards: 3,
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("fd42:2::/64")}}
			if seed%2 == 1 {
				cfg.FlowtableDevices = []string{"eth0", "eth1.100"}
			}
			cfg.Counters = seed > 2
			cfg.UntranslatedEventsOff = seed%2 == 0
			cfg.LeanServiceEvents = seed == 2 || seed == 3
			cfg.ReleaseTimeWait = seed == 2
			cfg.DropMidstreamTCP = seed >= 3
			if seed == 3 {
				cfg.MidstreamWait = 10 * time.Second
				cfg.MidstreamWaitPeerDead = 500 * time.Millisecond
			}
			if seed == 4 {
				cfg.TrafficElements = 4096
			}
			w := &randomWorld{r: rand.New(rand.NewSource(seed)), services: map[model.ServiceKey]*model.Service{}, unique: seed%2 == 0}
			for range 80 {
				s := w.newService()
				w.services[s.Key] = s
			}
			ts := ruleset.NewTables(&cfg)
			state := make([]*ruleset.TableState, len(ts.Refs))
			for i := range state {
				state[i] = ruleset.NewTableState()
			}
			check := func(what string, ds []*ruleset.Ops) {
				t.Helper()
				got := encodeOps(t, ts, ds)
				compareBatches(t, what, wireMessages(got), refEncode(t, ts, ds))
				for slot, o := range ds {
					state[slot].Apply(o)
				}
			}
			ds, book, _ := ruleset.PlanFull(&cfg, ts, state, ruleset.CloneServices(w.services))
			check("cold full sync", ds)
			programmed := ruleset.CloneServices(w.services)
			for i := range 30 {
				changes := map[model.ServiceKey]*model.Service{}
				for range 1 + w.r.Intn(4) {
					k, s := w.mutate()
					changes[k] = s
				}
				ds, _, _ := ruleset.PlanPartial(&cfg, ts, state, book, programmed, changes)
				check(fmt.Sprintf("partial sync %d", i), ds)
				for k, s := range changes {
					if s == nil {
						delete(programmed, k)
					} else {
						programmed[k] = s
					}
				}
			}
			// A full sync of half the Services deletes the rest.
			half := map[model.ServiceKey]*model.Service{}
			for k, s := range programmed {
				if len(half) < len(programmed)/2 {
					half[k] = s
				}
			}
			ds, _, _ = ruleset.PlanFull(&cfg, ts, state, half)
			check("full sync deleting Services", ds)
			// Set recreation: a changed definition under the same name.
			changed := *ts
			main := ts.Main(ruleset.IPv4)
			changed.Skeletons = slices.Clone(ts.Skeletons)
			sk := &changed.Skeletons[main]
			sk.Sets = slices.Clone(sk.Sets)
			for i, set := range sk.Sets {
				if set.Name == ruleset.SetClusterIPs {
					sk.Sets[i] = &ruleset.Set{Name: ruleset.SetClusterIPs, Shape: ruleset.KeyAddr, Timeout: time.Minute}
				}
			}
			ds, _, _ = ruleset.PlanFull(&cfg, &changed, state, half)
			if len(ds[main].RecreateSets) != 1 {
				t.Fatalf("changed set definition planned %+v, want one set recreated", ds[main])
			}
			check("set recreated", ds)
			// The flowtable's devices change, and then it is turned off
			// (or on, for the seeds that started without it).
			moved := cfg
			moved.FlowtableDevices = []string{"eth2"}
			ds, _, _ = ruleset.PlanFull(&moved, ruleset.NewTables(&moved), state, half)
			want := 0
			if len(cfg.FlowtableDevices) > 0 {
				want = 1
			}
			if len(ds[main].RecreateFlowtables) != want || len(ds[main].AddFlowtables) != 1-want {
				t.Fatalf("flowtable on other devices planned %+v", ds[main])
			}
			check("flowtable devices changed", ds)
			off := cfg
			off.FlowtableDevices = nil
			ds, _, _ = ruleset.PlanFull(&off, ruleset.NewTables(&off), state, half)
			if len(ds[main].DelFlowtables) != 1 {
				t.Fatalf("flowtable turned off planned %+v, want it deleted", ds[main])
			}
			check("flowtable turned off", ds)
		})
	}
}

// exprBytes writes one expression with the encoder, and with
// google/nftables' expr.Marshal as a list element: the two to compare.
func exprBytes(t testing.TB, fam byte, emit func(bc.Sink)) (got, want []byte, ok bool) {
	t.Helper()
	e := &encoder{w: &wire{}, ids: map[string]uint32{"s": 7, "aff": 3}}
	emit(e)
	g := &googleSink{sets: map[string]*nftables.Set{"s": {Name: "s", ID: 7}, "aff": {Name: "aff", ID: 3}}}
	emit(g)
	if e.w.err != nil || len(g.exprs) != 1 {
		return nil, nil, false // an attribute over 64 KiB: refused, not written
	}
	data, err := expr.Marshal(fam, g.exprs[0])
	if err != nil {
		return nil, nil, false // google/nftables refuses it: nothing to compare
	}
	want, err = netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	return e.w.b, ctDirected(want), true
}

// TestWireExpressions compares single expressions, of every kind and
// field the statements use, with expr.Marshal.
func TestWireExpressions(t *testing.T) {
	exprs := []func(bc.Sink){
		func(s bc.Sink) { s.Payload(bc.Payload{Dreg: 1, Base: bc.NetworkHeader, Offset: 12, Len: 4}) },
		func(s bc.Sink) { s.Payload(bc.Payload{Dreg: 13, Base: bc.TransportHeader, Offset: 2, Len: 2}) },
		func(s bc.Sink) { s.Cmp(bc.Cmp{Op: bc.CmpNeq, Sreg: 1, Data: bc.Bytes(1, 2, 3)}) },
		func(s bc.Sink) { s.Cmp(bc.Cmp{Op: bc.CmpEq, Sreg: 1}) },
		func(s bc.Sink) {
			s.Bitwise(bc.Bitwise{Sreg: 1, Dreg: 1, Len: 4, Mask: bc.Bytes(0, 0, 0x40, 0), Xor: bc.Zero(4)})
		},
		func(s bc.Sink) { s.Lookup(bc.Lookup{Sreg: 1, Set: "s"}) },
		func(s bc.Sink) { s.Lookup(bc.Lookup{Sreg: 1, HasDreg: true, Set: "service-ips"}) },
		func(s bc.Sink) { s.Meta(bc.Meta{Key: bc.MetaMark, Reg: 1, Set: true}) },
		func(s bc.Sink) { s.Meta(bc.Meta{Key: bc.MetaL4Proto, Reg: 9}) },
		func(s bc.Sink) { s.Ct(bc.Ct{Key: bc.CtState, Dreg: 1}) },
		func(s bc.Sink) { s.Ct(bc.Ct{Key: bc.CtDirection, Dreg: 1}) },
		func(s bc.Sink) { s.Ct(bc.Ct{Key: bc.CtDstIP, Dreg: 9}) },
		func(s bc.Sink) { s.Ct(bc.Ct{Key: bc.CtProtoDst, Dreg: 19}) },
		func(s bc.Sink) { s.Ct(bc.Ct{Key: bc.CtEventMask, Dreg: 1, Set: true}) },
		func(s bc.Sink) { s.Ct(bc.Ct{Key: bc.CtLabels, Dreg: 1, Set: true}) },
		func(s bc.Sink) {
			s.Immediate(bc.Immediate{Dreg: 1, Data: bc.Bytes(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80)})
		},
		func(s bc.Sink) { s.Fib(bc.Fib{Dreg: 1, Flags: bc.FibDaddr, Result: bc.FibAddrType}) },
		func(s bc.Sink) {
			s.Fib(bc.Fib{Dreg: 1, Flags: bc.FibSaddr | unix.NFTA_FIB_F_IIF, Result: unix.NFT_FIB_RESULT_OIF})
		},
		func(s bc.Sink) { s.Hash(bc.Hash{Sreg: 2, Dreg: 1, Len: 8, Modulus: 4, Seed: 7}) },
		func(s bc.Sink) { s.Hash(bc.Hash{Sreg: 2, Dreg: 1, Len: 8, Modulus: 4}) },
		func(s bc.Sink) { s.Immediate(bc.Immediate{Dreg: 2, Data: bc.Bytes(0x1f, 0x90)}) },
		func(s bc.Sink) { s.Immediate(bc.Immediate{Dreg: 1, Data: bc.U32(0)}) },
		func(s bc.Sink) { s.Verdict(bc.Verdict{Code: bc.VerdictGoto, Chain: "svc-ABCDEFGH-ns/name/tcp/80"}) },
		func(s bc.Sink) { s.Verdict(bc.Verdict{Code: bc.VerdictReturn}) },
		func(s bc.Sink) {
			s.NAT(bc.NAT{Type: bc.NATDest, Family: unix.NFPROTO_IPV6, RegAddr: 1, RegProto: 2, Flags: bc.NATSpecified})
		},
		func(s bc.Sink) { s.NAT(bc.NAT{Type: bc.NATDest, Family: unix.NFPROTO_IPV4, RegAddr: 1}) },
		func(s bc.Sink) { s.NAT(bc.NAT{Type: bc.NATSource, Family: unix.NFPROTO_IPV6, RegAddr: 1}) },
		func(s bc.Sink) {
			s.NAT(bc.NAT{Type: bc.NATSource, Family: unix.NFPROTO_IPV4, RegAddr: 1, RegProto: 2, RegProtoMax: 3, Flags: bc.NATSpecified})
		},
		func(s bc.Sink) { s.Dynset(bc.Dynset{Sreg: 1, Op: bc.DynsetUpdate, Set: "aff"}) },
		func(s bc.Sink) { s.Dynset(bc.Dynset{Sreg: 1, Op: bc.DynsetUpdate, Set: "s", Counter: true}) },
		func(s bc.Sink) { s.Dynset(bc.Dynset{Sreg: 1, Op: unix.NFT_DYNSET_OP_ADD, Set: "other"}) },
		func(s bc.Sink) {
			s.Dynset(bc.Dynset{Sreg: 1, Op: bc.DynsetUpdate, Set: "src", Limit: bc.Limit{Rate: 100, Burst: 100}})
		},
		func(s bc.Sink) { s.Masq(bc.Masq{Flags: bc.NATFullyRandom}) },
		func(s bc.Sink) { s.Masq(bc.Masq{}) },
		func(s bc.Sink) { s.Redir(bc.Redir{RegProto: 1, Flags: bc.NATSpecified}) },
		func(s bc.Sink) { s.Redir(bc.Redir{}) },
		func(s bc.Sink) { s.Reject(bc.Reject{Type: bc.RejectICMPUnrch, Code: 3}) },
		func(s bc.Sink) { s.FlowOffload(bc.FlowOffload{Flowtable: ruleset.FlowtableName}) },
		func(s bc.Sink) {
			s.Byteorder(bc.Byteorder{Sreg: bc.Reg1, Dreg: bc.Reg1, Op: bc.ByteorderHton, Len: 8, Size: 8})
		},
		func(s bc.Sink) { s.Cmp(bc.Cmp{Op: bc.CmpGt, Sreg: bc.Reg1, Data: bc.U64BE(20)}) },
		func(s bc.Sink) { s.Counter() },
	}
	for _, fam := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
		for i, emit := range exprs {
			got, want, ok := exprBytes(t, fam, emit)
			if !ok {
				t.Fatalf("expression %d: not comparable", i)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("expression %d:\n got: % x\nwant: % x", i, got, want)
			}
		}
	}
}

// TestWireAttributeLimit: an attribute over 64 KiB is an error, not a
// length that silently wraps.
func TestWireAttributeLimit(t *testing.T) {
	var w wire
	at := w.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	w.attr(unix.NFTA_DATA_VALUE, make([]byte, 40_000))
	w.attr(unix.NFTA_DATA_VALUE, make([]byte, 40_000))
	w.close(at)
	if w.err == nil {
		t.Fatal("nested attribute of 80,000 bytes encoded without an error")
	}
}

// TestRuleTextFormats checks the statements that write their own text
// against the formats they had when they used fmt: the text is hashed into
// every rule's fingerprint in the kernel, so a rule programmed by an older
// nftgate must keep its fingerprint.
func TestRuleTextFormats(t *testing.T) {
	for _, f := range ruleset.Families {
		for _, c := range []struct {
			s    ruleset.Stmt
			want string
		}{
			{ruleset.HashBucket{Seed: 0, Modulus: 1, Bucket: 0}, fmt.Sprintf("jhash %s saddr . th sport mod %d seed %#x %d", f, 1, uint32(0), 0)},
			{ruleset.HashBucket{Seed: 0xdeadbeef, Modulus: 17, Bucket: 16}, fmt.Sprintf("jhash %s saddr . th sport mod %d seed %#x %d", f, 17, uint32(0xdeadbeef), 16)},
			{ruleset.DNAT{Proto: model.SCTP, To: netip.MustParseAddrPort("[fd42::1]:8080")}, fmt.Sprintf("meta l4proto %s dnat to %s", model.SCTP, netip.MustParseAddrPort("[fd42::1]:8080"))},
			{ruleset.DNAT{Proto: model.UDP, To: netip.MustParseAddrPort("10.1.2.3:53")}, "meta l4proto udp dnat to 10.1.2.3:53"},
			{ruleset.Redirect{Proto: model.TCP, Port: 9190}, "meta l4proto tcp redirect to :9190"},
			{ruleset.Verdict{Kind: ruleset.Goto, Chain: "svc-X"}, "goto svc-X"},
			{ruleset.Verdict{Kind: ruleset.Jump, Chain: "mark-for-masquerade"}, "jump mark-for-masquerade"},
			{ruleset.Verdict{Kind: ruleset.Drop}, "drop"},
			{ruleset.MatchAddrInSet{Dir: ruleset.Src, Set: "aff-1"}, fmt.Sprintf("%s %s @%s", f, "saddr", "aff-1")},
			{ruleset.UpdateAffinity{Set: "aff-1"}, fmt.Sprintf("update @%s { %s saddr }", "aff-1", f)},
			{ruleset.HashBucket{Seed: 7, Modulus: 3, Bucket: 2, AddrOnly: true}, fmt.Sprintf("jhash %s saddr mod 3 seed 0x7 2", f)},
			{ruleset.SNAT{To: netip.MustParseAddr("198.51.100.7")}, fmt.Sprintf("snat %s to 198.51.100.7", f)},
			{ruleset.Masquerade{}, "masquerade"},
			{ruleset.Masquerade{Ports: ruleset.GroupPorts(0, 2)}, "meta l4proto tcp masquerade to :1024-33279"},
			{ruleset.SNAT{To: netip.MustParseAddr("198.51.100.7"), Ports: ruleset.GroupPorts(1, 2)}, fmt.Sprintf("meta l4proto tcp snat %s to 198.51.100.7:33280-65535", f)},
			{ruleset.SNAT{To: netip.MustParseAddr("2001:db8::7"), Ports: ruleset.GroupPorts(15, 16)}, fmt.Sprintf("meta l4proto tcp snat %s to [2001:db8::7]:61504-65535", f)},
			{ruleset.MatchCPU{Proto: model.TCP, Mask: 15, Value: 3}, "meta l4proto tcp meta cpu & 15 == 3"},
		} {
			if got := (ruleset.Rule{c.s}).Text(f); got != c.want {
				t.Errorf("%s %#v: text %q, want %q", f, c.s, got, c.want)
			}
		}
	}
}

// TestWireMatchesGoogleNftablesAtScale compares a batch large enough to be
// placed in mapped memory, parts written in parallel, with google/nftables.
func TestWireMatchesGoogleNftablesAtScale(t *testing.T) {
	cfg := scaleConfig()
	c := newScaleCluster(2_000, scaleEndpoints)
	ts := ruleset.NewTables(&cfg)
	empty := make([]*ruleset.TableState, len(ts.Refs))
	for i := range empty {
		empty[i] = ruleset.NewTableState()
	}
	ds, _, _ := ruleset.PlanFull(&cfg, ts, empty, c.Services)
	bt := encodeOps(t, ts, ds)
	if bt.arena == nil {
		t.Fatalf("a batch of %d bytes is on the heap, want it in mapped memory", bt.size())
	}
	compareBatches(t, "cold sync of 2000 Services", wireMessages(bt), refEncode(t, ts, ds))
}

func chunks[T any](s []T, n int) func(func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}
