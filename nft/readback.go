package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"unique"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/model"
	"github.com/nftgate/nftgate/ruleset"
)

// reader reads nftgate's tables back from the kernel into a tableState. It
// decodes no rule bytecode: each rule's identity is the fingerprint nftgate
// stored in its user data, so a rule edited or added by hand (which carries
// none, or another) shows up as a changed chain.
type reader struct {
	conn  *nftables.Conn
	nl    *netlink.Conn
	links *vnl.Handle // the namespace's links, for the flowtable's devices
	buf   []byte      // eachElem's receive buffer
}

func newReader(netnsFD int) (*reader, error) {
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(netnsFD), nftables.WithSockOptions(largeDumps))
	if err != nil {
		return nil, fmt.Errorf("open nf_tables netlink socket: %w", err)
	}
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		conn.CloseLasting()
		return nil, fmt.Errorf("open nf_tables netlink socket: %w", err)
	}
	var links *vnl.Handle
	if netnsFD != 0 {
		links, err = vnl.NewHandleAt(netns.NsHandle(netnsFD))
	} else {
		links, err = vnl.NewHandle()
	}
	if err != nil {
		conn.CloseLasting()
		nl.Close()
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	return &reader{conn: conn, nl: nl, links: links}, nil
}

func (r *reader) Close() {
	r.conn.CloseLasting()
	r.nl.Close()
	r.links.Close()
}

var hookNames = map[nftables.ChainHook]string{
	*nftables.ChainHookPrerouting:  "prerouting",
	*nftables.ChainHookInput:       "input",
	*nftables.ChainHookForward:     "forward",
	*nftables.ChainHookOutput:      "output",
	*nftables.ChainHookPostrouting: "postrouting",
}

// readFamily reads family f's tables named in names (main first) and
// returns their states in that order, and the names of shard tables of
// another shard count, which do not belong. Reading every rule is what
// costs at scale, so when believed (what nftgate last committed, per table)
// is given, only the chains for which readRules says so have their rules
// read; the others are taken to hold what nftgate believes. Chains, sets
// and map elements are always read in full. With keep, the tables it
// names (by their index in names) are not read at all: believed holds
// them as they are.
func (r *reader) readFamily(cfg *ruleset.Config, f ruleset.Family, names []string, believed []*ruleset.TableState, readRules func(chain string) bool, keep func(int) bool) ([]*ruleset.TableState, []string, error) {
	kept := func(i int) bool { return keep != nil && keep(i) && believed != nil && believed[i] != nil }
	own, foreign, err := r.owned(cfg, f)
	if err != nil {
		return nil, nil, err
	}
	slot := map[string]int{}
	for i, n := range names {
		slot[n] = i
	}
	for _, n := range foreign {
		if _, ok := slot[n]; ok {
			return nil, nil, &ForeignTableError{Family: f, Name: n}
		}
	}
	out := make([]*ruleset.TableState, len(names))
	for i := range out {
		out[i] = ruleset.NewTableState()
	}
	var extra []string
	for n, replace := range own {
		i, ok := slot[n]
		switch {
		case !ok:
			extra = append(extra, n)
		case kept(i):
		case replace:
			out[i].Replace = true // read as empty: created anew
		default:
			out[i].Exists = true
		}
	}
	sort.Strings(extra)
	for i := range out {
		if kept(i) {
			out[i] = believed[i]
		}
	}
	// One dump of the family's chains serves every table.
	chains, err := r.conn.ListChainsOfTableFamily(nftFamily(f))
	if err != nil {
		return nil, nil, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table == nil {
			continue
		}
		i, ok := slot[c.Table.Name]
		if !ok || !out[i].Exists || kept(i) {
			continue
		}
		var h *ruleset.Hook
		if c.Hooknum != nil && c.Priority != nil {
			h = &ruleset.Hook{Type: string(c.Type), Hook: hookNames[*c.Hooknum], Priority: int32(*c.Priority)}
		}
		if believed != nil && believed[i] != nil && !readRules(c.Name) {
			if info, ok := believed[i].Chains[c.Name]; ok {
				out[i].Chains[c.Name] = info
				continue
			}
		}
		rules, err := r.ruleFingerprints(c.Table.Name, f, c.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("list rules of chain %s %s: %w", c.Table.Name, c.Name, err)
		}
		out[i].Chains[c.Name] = ruleset.ChainInfo{FP: ruleset.ChainFingerprint(h, rules), Rules: int32(len(rules))}
	}
	for i, n := range names {
		if !out[i].Exists || kept(i) {
			continue
		}
		if err := r.readSets(n, f, out[i], cfg.Counters); err != nil {
			return nil, nil, fmt.Errorf("table %s: %w", n, err)
		}
		if err := r.readFlowtables(n, f, cfg.FlowtableDevices, out[i]); err != nil {
			return nil, nil, fmt.Errorf("table %s: %w", n, err)
		}
	}
	return out, extra, nil
}

// readElems reads table name's sets and map elements; its chains and
// flowtables are taken to be as believed.
func (r *reader) readElems(cfg *ruleset.Config, f ruleset.Family, name string, believed *ruleset.TableState) (*ruleset.TableState, error) {
	st := ruleset.NewTableState()
	st.Exists, st.Chains, st.Flowtables = true, believed.Chains, believed.Flowtables
	if err := r.readSets(name, f, st, cfg.Counters); err != nil {
		return nil, fmt.Errorf("table %s: %w", name, err)
	}
	return st, nil
}

// readSets reads a table's sets and the elements of the maps nftgate fills.
// google/nftables does not decode a set's own counter flag, only its
// elements' counters: a map counts when its elements carry counters, and
// an empty map of those that count is taken to be as counters says.
func (r *reader) readSets(name string, f ruleset.Family, st *ruleset.TableState, counters bool) error {
	table := &nftables.Table{Name: name, Family: nftFamily(f)}
	sets, err := r.conn.GetSets(table)
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	picks := map[ruleset.ElemID][]pickPart{}
	for _, s := range sets {
		if s.Anonymous {
			continue // bound to a rule; goes with it
		}
		if i, nodePort, ok := ruleset.EndpointMapIndex(s.Name); ok && s.IsMap {
			if err := r.readEndpointMap(f, name, s, i, nodePort, st, picks); err != nil {
				return err
			}
			continue
		}
		// google/nftables does not decode concatenated key types, so the
		// shape comes from the name, and is checked against the keys below.
		def := ruleset.SetDef{Map: s.IsMap, Shape: ruleset.SetShape(s.Name)}
		if s.HasTimeout {
			def.Timeout = s.Timeout.Milliseconds()
		}
		st.Sets[s.Name] = def
		if def.Shape == 0 || def.Shape == ruleset.KeyTraffic || s.Name == ruleset.MapMidstreamHomes || s.Name == ruleset.SetMidstreamPeerDead {
			continue // filled by the packet path or at run time (SetMidstreamElements), or not nftgate's
		}
		first, other := true, false
		if err := r.eachElem(f, name, s.Name, func(e *setElem) error {
			if def.Map && first {
				def.Counter = e.HasCounter
			}
			first = false
			if other {
				return nil
			}
			k, ok := keyFromBytes(f, def.Shape, e.Key)
			if !ok {
				// Keys of another shape: the map is not what nftgate
				// made, so it is recreated.
				other = true
				return nil
			}
			var v ruleset.Verdict
			if e.HasVerdict {
				chain := string(e.Chain)
				if ruleset.Shared(chain) {
					// Most elements go to one of a few shared chains:
					// one copy of each name.
					chain = unique.Make(chain).Value()
				}
				v = ruleset.VerdictOf(e.Verdict, chain)
			}
			st.Elems.Put(ruleset.NewElemID(s.Name, k), v)
			return nil
		}); err != nil {
			return err
		}
		if def.Map && first {
			def.Counter = counters && isCounted(s.Name)
		}
		if other {
			def.Shape = 0
		}
		st.Sets[s.Name] = def
	}
	putPicks(st, picks)
	return nil
}

// pickPart is one element of an endpoint map: its bucket and endpoint.
type pickPart struct {
	i  int
	to netip.AddrPort
}

// readEndpointMap reads endpoint map s (of bucket i) into parts, by pick.
// Elements of another shape make the map one to recreate.
func (r *reader) readEndpointMap(f ruleset.Family, table string, s *nftables.Set, i int, nodePort bool, st *ruleset.TableState, parts map[ruleset.ElemID][]pickPart) error {
	def := ruleset.SetDef{Map: true, Shape: ruleset.SetShape(s.Name), Endpoints: true}
	if s.HasTimeout {
		def.Shape = 0 // not a map nftgate made
	}
	n := int(f.AddrLen())
	var mine []ruleset.ElemID
	err := r.eachElem(f, table, s.Name, func(e *setElem) error {
		if def.Shape == 0 {
			return nil
		}
		k, ok := keyFromBytes(f, def.Shape, e.Key)
		if !ok || e.HasVerdict || e.HasCounter || len(e.Data) != n+4 {
			def.Shape = 0
			return nil
		}
		a, _ := netip.AddrFromSlice(e.Data[:n])
		id := ruleset.PickID(nodePort, k)
		parts[id] = append(parts[id], pickPart{i, netip.AddrPortFrom(a, uint16(e.Data[n])<<8|uint16(e.Data[n+1]))})
		mine = append(mine, id)
		return nil
	})
	if def.Shape == 0 {
		// Not a map nftgate made: its elements go with it.
		for _, id := range mine {
			ps := parts[id]
			parts[id] = slices.DeleteFunc(ps, func(p pickPart) bool { return p.i == i })
		}
	}
	st.Sets[s.Name] = def
	return err
}

// putPicks records the picks read back: a destination whose elements are
// in maps 0 to N-1 as one pick; one with a gap, element by element, so
// that a plan deletes them.
func putPicks(st *ruleset.TableState, parts map[ruleset.ElemID][]pickPart) {
	for id, ps := range parts {
		if len(ps) == 0 {
			continue
		}
		slices.SortFunc(ps, func(a, b pickPart) int { return a.i - b.i })
		whole := true
		to := make([]netip.AddrPort, len(ps))
		for j, p := range ps {
			whole = whole && p.i == j
			to[j] = p.to
		}
		if whole {
			st.Picks.Put(id, ruleset.PickInfoOf(to))
			continue
		}
		nodePort, k := ruleset.PickIsNodePort(id), id.Key()
		for _, p := range ps {
			st.Elems.Put(ruleset.NewElemID(ruleset.EndpointMap(nodePort, p.i), k), ruleset.Verdict{})
		}
	}
}

// readFlowtables reads a table's flowtables: their priority and devices.
func (r *reader) readFlowtables(name string, f ruleset.Family, want []string, st *ruleset.TableState) error {
	fts, err := r.conn.ListFlowtables(&nftables.Table{Name: name, Family: nftFamily(f)})
	if err != nil {
		return fmt.Errorf("list flowtables: %w", err)
	}
	for _, ft := range fts {
		var prio int32
		if ft.Priority != nil {
			prio = int32(*ft.Priority)
		}
		if st.Flowtables == nil {
			st.Flowtables = map[string]ruleset.FlowtableDef{}
		}
		devs := withAbsentDevices(ft.Devices, want, func(d string) bool {
			_, err := r.links.LinkByName(d)
			var nf vnl.LinkNotFoundError
			return !errors.As(err, &nf)
		})
		st.Flowtables[ft.Name] = ruleset.FlowtableDefFrom(prio, devs, ft.Flags&nftables.FlowtableFlagsCounter != 0)
	}
	return nil
}

// withAbsentDevices is a flowtable's devices as the kernel lists them,
// plus the wanted devices that do not exist now. The kernel drops a device
// from its flowtable when the device goes away; counting that as drift
// would recreate the flowtable with a device the kernel refuses, and fail
// every full sync until the device is back. When it is back, it is
// missing from the flowtable, and the flowtable is recreated with it.
func withAbsentDevices(kernel, want []string, exists func(string) bool) []string {
	out := kernel
	for _, d := range want {
		if !slices.Contains(kernel, d) && !exists(d) {
			out = append(slices.Clip(out), d)
		}
	}
	return out
}

// ruleFingerprints dumps the rules of one chain and returns their
// fingerprints in order. A rule without nftgate's fingerprint gets a value
// no real rule has. One dump per chain, because the kernel resumes a dump of
// a whole table by skipping every rule already sent: at 50,000 rules that
// one dump takes 14 s, the per-chain dumps together well under one.
func (r *reader) ruleFingerprints(table string, f ruleset.Family, chain string) ([]uint64, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := r.nl.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(f), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, err
		}
		fp := uint64(0xdeadbeefdeadbeef)
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_USERDATA:
				if v, ok := fingerprintFromUserData(ad.Bytes()); ok {
					fp = v
				}
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		out = append(out, fp)
	}
	return out, nil
}

func keyFromBytes(f ruleset.Family, shape ruleset.KeyShape, b []byte) (ruleset.Key, bool) {
	var k ruleset.Key
	n := 0
	if shape == ruleset.KeyAddrProtoPort || shape == ruleset.KeyAddr {
		n = int(f.AddrLen())
	}
	if shape == ruleset.KeySlot {
		if len(b) != 4 {
			return k, false
		}
		return ruleset.Key{Slot: binary.NativeEndian.Uint32(b)}, true
	}
	if shape == ruleset.KeyAddr {
		a, ok := netip.AddrFromSlice(b)
		return ruleset.Key{Addr: a}, ok && len(b) == n
	}
	if shape == ruleset.KeyAddrPair {
		n = int(f.AddrLen())
		if len(b) != 2*n || !bytes.Equal(b[:n], b[n:]) {
			return k, false
		}
		a, ok := netip.AddrFromSlice(b[:n])
		return ruleset.Key{Addr: a}, ok
	}
	if len(b) != n+8 {
		return k, false
	}
	if n > 0 {
		a, _ := netip.AddrFromSlice(b[:n])
		k.Addr = a
		b = b[n:]
	}
	k.Proto = model.Protocol(b[0])
	k.Port = uint16(b[4])<<8 | uint16(b[5])
	return k, true
}

// nftFamily is f as google/nftables names it, for reading back.
func nftFamily(f ruleset.Family) nftables.TableFamily { return nftables.TableFamily(f) }
