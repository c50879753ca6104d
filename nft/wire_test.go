package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
)

// refEncode encodes planned operations the way nftgate did before it wrote
// batches itself: every message through google/nftables. The batch the
// encoder writes must be byte for byte the same, apart from the
// acknowledgement and echo flags, which batch.go sets on the last message
// only, and the sequence numbers and port ID, which it sets when sending.
func refEncode(t *testing.T, ts *tableSet, ds []*differ) []byte {
	t.Helper()
	rec, err := newRecorder(new(uint32))
	if err != nil {
		t.Fatal(err)
	}
	c := rec.conn
	// Every table and its new sets first, then the rest, table by table.
	refsOf := make([]setRefs, len(ds))
	for slot, d := range ds {
		o := &d.ops
		if o.empty() {
			continue
		}
		ref := ts.refs[slot]
		refsOf[slot] = newSetRefs(ref.name, ref.f)
		refs := &refsOf[slot]
		if o.createTable {
			c.AddTable(refs.table)
		}
		for _, s := range o.addSets {
			ns := setDefinition(refs.table, ref.f, s)
			ns.ID = rec.setID()
			if err := c.AddSet(ns, nil); err != nil {
				t.Fatal(err)
			}
			refs.sets[s.Name] = ns
		}
	}
	for slot, d := range ds {
		o := &d.ops
		if o.empty() {
			continue
		}
		ref := ts.refs[slot]
		refs := &refsOf[slot]
		table := refs.table
		chain := func(name string) *nftables.Chain { return &nftables.Chain{Table: table, Name: name} }
		addSet := func(s *Set) {
			ns := setDefinition(table, ref.f, s)
			ns.ID = rec.setID()
			if err := c.AddSet(ns, nil); err != nil {
				t.Fatal(err)
			}
			refs.sets[s.Name] = ns
		}
		addRules := func(p chainPlan) {
			for i, r := range p.chain.Rules {
				var exprs []expr.Any
				for _, s := range r {
					exprs = append(exprs, s.encode(ref.f, refs)...)
				}
				c.AddRule(&nftables.Rule{Table: table, Chain: chain(p.chain.Name), Exprs: exprs, UserData: appendFingerprint(nil, p.ruleFPs[i])})
			}
		}
		elements := func(els []Element, del bool) {
			byMap := map[string][]nftables.SetElement{}
			var order []string
			for _, el := range els {
				if _, ok := byMap[el.Map]; !ok {
					order = append(order, el.Map)
				}
				e := nftables.SetElement{Key: appendKey(nil, setShape(el.Map), el.Key)}
				if el.Verdict.Kind != 0 {
					e.VerdictData = el.Verdict.encode(ref.f, nil)[0].(*expr.Verdict)
				}
				byMap[el.Map] = append(byMap[el.Map], e)
			}
			for _, m := range order {
				shape := setShape(m)
				s := setDefinition(table, ref.f, &Set{Name: m, Map: shape != KeyAddr && shape != KeyAddrPair, Shape: shape})
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
		for _, p := range o.addChains {
			nc := chain(p.chain.Name)
			if h := p.chain.Hook; h != nil {
				num := hookNums[h.Hook]
				accept := nftables.ChainPolicyAccept
				nc.Type, nc.Hooknum, nc.Policy = nftables.ChainType(h.Type), &num, &accept
				nc.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(h.Priority))
			}
			c.AddChain(nc)
		}
		for _, p := range o.rewriteChains {
			c.FlushChain(chain(p.chain.Name))
		}
		for _, n := range o.flushChains {
			c.FlushChain(chain(n))
		}
		for _, s := range o.recreateSets {
			c.DelSet(setDefinition(table, ref.f, s))
			addSet(s)
		}
		for _, p := range o.addChains {
			addRules(p)
		}
		for _, p := range o.rewriteChains {
			addRules(p)
		}
		elements(o.delElems, true)
		elements(o.addElems, false)
		for _, n := range o.delChains {
			c.DelChain(chain(n))
		}
		for _, n := range o.delSets {
			c.DelSet(&nftables.Set{Table: table, Name: n})
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
			cfg := Config{Table: "nftgate", Node: model.Node{Name: "gw"}, HashSeed: 7, Shards: 3,
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("fd42:2::/64")}}
			w := &randomWorld{r: rand.New(rand.NewSource(seed)), services: map[model.ServiceKey]*model.Service{}, unique: seed%2 == 0}
			for range 80 {
				s := w.newService()
				w.services[s.Key] = s
			}
			ts := newTableSet(&cfg)
			state := make([]*tableState, len(ts.refs))
			for i := range state {
				state[i] = newTableState()
			}
			check := func(what string, ds []*differ) {
				t.Helper()
				got := encodeOps(t, ts, ds)
				compareBatches(t, what, wireMessages(got), refEncode(t, ts, ds))
				for slot, d := range ds {
					state[slot].apply(&d.ops)
				}
			}
			ds, book, _ := planFull(&cfg, ts, state, cloneServices(w.services))
			check("cold full sync", ds)
			programmed := cloneServices(w.services)
			for i := range 30 {
				changes := map[model.ServiceKey]*model.Service{}
				for range 1 + w.r.Intn(4) {
					k, s := w.mutate()
					changes[k] = s
				}
				ds, _, _ := planPartial(&cfg, ts, state, book, programmed, changes)
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
			ds, _, _ = planFull(&cfg, ts, state, half)
			check("full sync deleting Services", ds)
			// Set recreation: a changed definition under the same name.
			d := newDiffer(IPv4, state[ts.main(IPv4)])
			d.set(SetClusterIPs, &Set{Name: SetClusterIPs, Shape: KeyAddr, Timeout: time.Minute})
			for _, c := range ts.static[ts.main(IPv4)].Chains {
				d.chain(c.Name, c)
			}
			ds = make([]*differ, len(ts.refs))
			for slot := range ds {
				ds[slot] = newDiffer(ts.refs[slot].f, state[slot])
			}
			ds[ts.main(IPv4)] = d
			if len(d.ops.recreateSets) != 1 {
				t.Fatalf("changed set definition planned %+v, want one set recreated", d.ops)
			}
			check("set recreated", ds)
		})
	}
}

// TestWireExpressions compares single expressions, also of kinds and
// fields nftgate does not use (which the encoder hands to google/nftables),
// with expr.Marshal.
func TestWireExpressions(t *testing.T) {
	exprs := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2, CsumType: expr.CsumTypeInet, CsumOffset: 16},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{1, 2, 3}},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0, 0, 0x40, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Lookup{SourceRegister: 1, SetName: "s", SetID: 7},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: "service-ips", Invert: true},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Ct{Register: 1, Key: expr.CtKeySRC, Direction: 1},
		&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagDADDR: true},
		&expr.Fib{Register: 1, ResultOIF: true, FlagSADDR: true, FlagIIF: true, FlagMARK: true},
		&expr.Hash{SourceRegister: 2, DestRegister: 1, Length: 8, Modulus: 4, Seed: 7, Type: expr.HashTypeJenkins},
		&expr.Hash{SourceRegister: 2, DestRegister: 1, Length: 8, Modulus: 4, Offset: 3},
		&expr.Immediate{Register: 2, Data: []byte{0x1f, 0x90}},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: "svc-ABCDEFGH-ns/name/tcp/80"},
		&expr.Verdict{Kind: expr.VerdictReturn},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 2, Random: true, Persistent: true, Prefix: true},
		&expr.Dynset{SrcRegKey: 1, SetName: "aff", SetID: 3, Operation: unix.NFT_DYNSET_OP_UPDATE},
		&expr.Dynset{SrcRegKey: 1, SrcRegData: 2, SetName: "aff", Operation: unix.NFT_DYNSET_OP_ADD, Timeout: time.Minute, Invert: true},
		&expr.Dynset{SrcRegKey: 1, SetName: "aff", Exprs: []expr.Any{&expr.Counter{}}},
		&expr.Masq{FullyRandom: true},
		&expr.Masq{},
		&expr.Masq{ToPorts: true, RegProtoMin: 1, RegProtoMax: 2},
		&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3},
		&expr.Counter{Bytes: 1, Packets: 2},
	}
	for _, fam := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
		for _, e := range exprs {
			var w wire
			w.expr(fam, e)
			if w.err != nil {
				t.Fatal(w.err)
			}
			data, err := expr.Marshal(fam, e)
			if err != nil {
				t.Fatal(err)
			}
			want, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: data}})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(w.b, want) {
				t.Errorf("%T %+v:\n got: % x\nwant: % x", e, e, w.b, want)
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
	for _, f := range Families {
		for _, c := range []struct {
			s    Stmt
			want string
		}{
			{HashBucket{Seed: 0, Modulus: 1, Bucket: 0}, fmt.Sprintf("jhash %s saddr . th sport mod %d seed %#x %d", f, 1, uint32(0), 0)},
			{HashBucket{Seed: 0xdeadbeef, Modulus: 17, Bucket: 16}, fmt.Sprintf("jhash %s saddr . th sport mod %d seed %#x %d", f, 17, uint32(0xdeadbeef), 16)},
			{DNAT{Proto: model.SCTP, To: netip.MustParseAddrPort("[fd42::1]:8080")}, fmt.Sprintf("meta l4proto %s dnat to %s", model.SCTP, netip.MustParseAddrPort("[fd42::1]:8080"))},
			{DNAT{Proto: model.UDP, To: netip.MustParseAddrPort("10.1.2.3:53")}, "meta l4proto udp dnat to 10.1.2.3:53"},
			{Verdict{Kind: Goto, Chain: "svc-X"}, "goto svc-X"},
			{Verdict{Kind: Jump, Chain: "mark-for-masquerade"}, "jump mark-for-masquerade"},
			{Verdict{Kind: Drop}, "drop"},
			{MatchAddrInSet{Dir: Src, Set: "aff-1"}, fmt.Sprintf("%s %s @%s", f, "saddr", "aff-1")},
			{UpdateAffinity{Set: "aff-1"}, fmt.Sprintf("update @%s { %s saddr }", "aff-1", f)},
		} {
			if got := (Rule{c.s}).Text(f); got != c.want {
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
	ts := newTableSet(&cfg)
	empty := make([]*tableState, len(ts.refs))
	for i := range empty {
		empty[i] = newTableState()
	}
	ds, _, _ := planFull(&cfg, ts, empty, c.Services)
	bt := encodeOps(t, ts, ds)
	if bt.arena == nil {
		t.Fatalf("a batch of %d bytes is on the heap, want it in mapped memory", bt.size())
	}
	compareBatches(t, "cold sync of 2000 Services", wireMessages(bt), refEncode(t, ts, ds))
}
