package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
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

// checkKernel verifies, in the process's own network namespace, that the
// kernel supports every nf_tables feature nftgate programs.
func checkKernel() error {
	return checkKernelFeatures(kernelProbes(), netlinkProbeRunner(0, probeTableName()))
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
		var opts []nftables.ConnOption
		if netnsFD != 0 {
			opts = append(opts, nftables.WithNetNSFd(netnsFD))
		}
		conn, err := nftables.New(opts...)
		if err != nil {
			return err
		}
		b := newProbeBatch(conn, table)
		for _, p := range probes {
			p.add(b)
		}
		b.deleteTables()
		err = conn.Flush()
		var errno unix.Errno
		switch {
		case err == nil:
			return nil
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

// probeBatch builds one batch of probes, creating the tables and chains
// they use once.
type probeBatch struct {
	conn   *nftables.Conn
	name   string
	order  []nftables.TableFamily
	tables map[nftables.TableFamily]*nftables.Table
	chains map[string]*nftables.Chain
}

func newProbeBatch(conn *nftables.Conn, table string) *probeBatch {
	return &probeBatch{conn: conn, name: table,
		tables: map[nftables.TableFamily]*nftables.Table{}, chains: map[string]*nftables.Chain{}}
}

func (b *probeBatch) table(f nftables.TableFamily) *nftables.Table {
	if t, ok := b.tables[f]; ok {
		return t
	}
	// Create, not add: a table of that name that is not ours is an error
	// rather than something to delete.
	t := b.conn.CreateTable(&nftables.Table{Name: b.name, Family: f})
	b.tables[f] = t
	b.order = append(b.order, f)
	return t
}

func (b *probeBatch) deleteTables() {
	for _, f := range b.order {
		b.conn.DelTable(b.tables[f])
	}
}

// baseChain returns the family's base chain of that type on that hook.
func (b *probeBatch) baseChain(f nftables.TableFamily, typ nftables.ChainType, hook *nftables.ChainHook, prio nftables.ChainPriority) *nftables.Chain {
	key := fmt.Sprintf("%d/%s/%d", f, typ, *hook)
	if c, ok := b.chains[key]; ok {
		return c
	}
	accept := nftables.ChainPolicyAccept
	c := b.conn.AddChain(&nftables.Chain{
		Name: fmt.Sprintf("%s-%d", typ, *hook), Table: b.table(f),
		Type: typ, Hooknum: hook, Priority: nftables.ChainPriorityRef(prio), Policy: &accept,
	})
	b.chains[key] = c
	return c
}

// filterChain is where most probes put their rule: reject is valid on
// input, and so is every match.
func (b *probeBatch) filterChain(f nftables.TableFamily) *nftables.Chain {
	return b.baseChain(f, nftables.ChainTypeFilter, nftables.ChainHookInput, *nftables.ChainPriorityFilter)
}

func (b *probeBatch) natPrerouting(f nftables.TableFamily) *nftables.Chain {
	return b.baseChain(f, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, *nftables.ChainPriorityNATDest)
}

func (b *probeBatch) natPostrouting(f nftables.TableFamily) *nftables.Chain {
	return b.baseChain(f, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, *nftables.ChainPriorityNATSource)
}

func (b *probeBatch) regularChain(f nftables.TableFamily, name string) *nftables.Chain {
	key := fmt.Sprintf("%d/%s", f, name)
	if c, ok := b.chains[key]; ok {
		return c
	}
	c := b.conn.AddChain(&nftables.Chain{Name: name, Table: b.table(f)})
	b.chains[key] = c
	return c
}

func (b *probeBatch) rule(c *nftables.Chain, exprs ...expr.Any) {
	b.conn.AddRule(&nftables.Rule{Table: c.Table, Chain: c, Exprs: exprs})
}

// set adds a set to the family's table; a failure to encode it fails the
// batch at Flush.
func (b *probeBatch) set(f nftables.TableFamily, s *nftables.Set) *nftables.Set {
	s.Table = b.table(f)
	_ = b.conn.AddSet(s, nil)
	return s
}

// Register numbers as nft allocates them (see nft/stmt.go).
const (
	probeReg1   = 1
	probeReg2   = 2
	probeReg3   = 3
	probeReg32a = 9
	probeReg32b = 10
	probeReg32c = 13
)

// probeFamily holds what differs between the ip and ip6 probes.
type probeFamily struct {
	fam                nftables.TableFamily
	word               string // "ip" or "ip6"
	tableOption        string
	fibOption          string
	rejectOption       string
	addrLen            uint32
	saddrOff, daddrOff uint32
	addrType           nftables.SetDatatype
	addr               []byte // an address of the documentation range
	icmpPortUnreach    uint8
	natFamily          uint32
}

var probeFamilies = []probeFamily{
	{fam: nftables.TableFamilyIPv4, word: "ip", tableOption: "CONFIG_NF_TABLES_IPV4",
		fibOption: "CONFIG_NFT_FIB_IPV4", rejectOption: "CONFIG_NFT_REJECT_IPV4",
		addrLen: 4, saddrOff: 12, daddrOff: 16, addrType: nftables.TypeIPAddr,
		addr: []byte{192, 0, 2, 1}, icmpPortUnreach: 3, natFamily: unix.NFPROTO_IPV4},
	{fam: nftables.TableFamilyIPv6, word: "ip6", tableOption: "CONFIG_NF_TABLES_IPV6",
		fibOption: "CONFIG_NFT_FIB_IPV6", rejectOption: "CONFIG_NFT_REJECT_IPV6",
		addrLen: 16, saddrOff: 8, daddrOff: 24, addrType: nftables.TypeIP6Addr,
		addr: []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1}, icmpPortUnreach: 4, natFamily: unix.NFPROTO_IPV6},
}

func (pf probeFamily) load(off, reg, n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

// kernelProbes lists, per family, every nf_tables feature the rulesets of
// package nft use, each as a rule shaped like the one nftgate programs.
func kernelProbes() []kernelProbe {
	var ps []kernelProbe
	for _, pf := range probeFamilies {
		f := pf.fam
		w := " (" + pf.word + ")"
		base := "nf_tables " + pf.word + " family with filter chains"
		nat := "nat chains" + w
		tcp := []byte{unix.IPPROTO_TCP}
		mark := binaryutil.NativeEndian.PutUint32(0x4000)
		zero4 := make([]byte, 4)
		ps = append(ps,
			kernelProbe{Feature: base, Option: pf.tableOption, add: func(b *probeBatch) {
				b.filterChain(f)
			}},
			kernelProbe{Feature: nat, Option: "CONFIG_NFT_NAT", Needs: []string{base}, add: func(b *probeBatch) {
				b.natPrerouting(f)
				b.natPostrouting(f)
			}},
			kernelProbe{Feature: "payload and cmp expressions" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					// ip daddr 192.0.2.1
					b.rule(b.filterChain(f),
						pf.load(pf.daddrOff, probeReg1, pf.addrLen),
						&expr.Cmp{Op: expr.CmpOpEq, Register: probeReg1, Data: pf.addr})
				}},
			kernelProbe{Feature: "bitwise expression" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					// ip saddr != 192.0.2.0/25: a cluster CIDR match
					mask := make([]byte, pf.addrLen)
					for i := range mask[:3] {
						mask[i] = 0xff
					}
					mask[3] = 0x80
					b.rule(b.filterChain(f),
						pf.load(pf.saddrOff, probeReg1, pf.addrLen),
						&expr.Bitwise{SourceRegister: probeReg1, DestRegister: probeReg1, Len: pf.addrLen,
							Mask: mask, Xor: make([]byte, pf.addrLen)},
						&expr.Cmp{Op: expr.CmpOpNeq, Register: probeReg1, Data: pf.addr})
				}},
			kernelProbe{Feature: "meta expression (l4proto, mark)" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					c := b.filterChain(f)
					// meta mark & 0x4000 == 0 meta l4proto tcp
					b.rule(c,
						&expr.Meta{Key: expr.MetaKeyMARK, Register: probeReg1},
						&expr.Bitwise{SourceRegister: probeReg1, DestRegister: probeReg1, Len: 4, Mask: mark, Xor: zero4},
						&expr.Cmp{Op: expr.CmpOpEq, Register: probeReg1, Data: zero4},
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: probeReg1},
						&expr.Cmp{Op: expr.CmpOpEq, Register: probeReg1, Data: tcp})
					// meta mark set meta mark ^ 0x4000
					b.rule(c,
						&expr.Meta{Key: expr.MetaKeyMARK, Register: probeReg1},
						&expr.Bitwise{SourceRegister: probeReg1, DestRegister: probeReg1, Len: 4,
							Mask: binaryutil.NativeEndian.PutUint32(0xffffffff), Xor: mark},
						&expr.Meta{Key: expr.MetaKeyMARK, Register: probeReg1, SourceRegister: true})
				}},
			kernelProbe{Feature: "immediate expression (jump, goto)" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					target := b.regularChain(f, "target")
					b.rule(target, &expr.Verdict{Kind: expr.VerdictReturn})
					c := b.filterChain(f)
					b.rule(c, &expr.Verdict{Kind: expr.VerdictJump, Chain: target.Name})
					b.rule(c, &expr.Verdict{Kind: expr.VerdictGoto, Chain: target.Name})
				}},
			kernelProbe{Feature: "lookup expression in verdict maps with concatenated keys" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					// ip daddr . meta l4proto . th dport vmap @services
					svc := b.set(f, &nftables.Set{Name: "services", IsMap: true, Concatenation: true,
						DataType: nftables.TypeVerdict,
						KeyType:  nftables.MustConcatSetType(pf.addrType, nftables.TypeInetProto, nftables.TypeInetService)})
					protoReg, portReg := uint32(probeReg32a), uint32(probeReg32b)
					if f == nftables.TableFamilyIPv6 {
						protoReg, portReg = probeReg2, probeReg32c
					}
					c := b.filterChain(f)
					b.rule(c,
						pf.load(pf.daddrOff, probeReg1, pf.addrLen),
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: protoReg},
						&expr.Payload{DestRegister: portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
						&expr.Lookup{SourceRegister: probeReg1, SetName: svc.Name, SetID: svc.ID, IsDestRegSet: true})
					// meta l4proto . th dport vmap @nodeports
					np := b.set(f, &nftables.Set{Name: "nodeports", IsMap: true, Concatenation: true,
						DataType: nftables.TypeVerdict,
						KeyType:  nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)})
					b.rule(c,
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: probeReg1},
						&expr.Payload{DestRegister: probeReg32a, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
						&expr.Lookup{SourceRegister: probeReg1, SetName: np.Name, SetID: np.ID, IsDestRegSet: true})
				}},
			kernelProbe{Feature: "lookup expression in address sets" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					c := b.filterChain(f)
					// ip daddr @cluster-ips
					ips := b.set(f, &nftables.Set{Name: "addrs", KeyType: pf.addrType})
					b.rule(c,
						pf.load(pf.daddrOff, probeReg1, pf.addrLen),
						&expr.Lookup{SourceRegister: probeReg1, SetName: ips.Name, SetID: ips.ID})
					// ip saddr . ip daddr @hairpin
					pairs := b.set(f, &nftables.Set{Name: "pairs", Concatenation: true,
						KeyType: nftables.MustConcatSetType(pf.addrType, pf.addrType)})
					second := uint32(probeReg32a)
					if f == nftables.TableFamilyIPv6 {
						second = probeReg2
					}
					b.rule(c,
						pf.load(pf.saddrOff, probeReg1, pf.addrLen),
						pf.load(pf.daddrOff, second, pf.addrLen),
						&expr.Lookup{SourceRegister: probeReg1, SetName: pairs.Name, SetID: pairs.ID})
				}},
			kernelProbe{Feature: "dynset expression on a set with timeouts" + w, Option: "CONFIG_NF_TABLES", Needs: []string{base},
				add: func(b *probeBatch) {
					// update @affinity { ip saddr }
					aff := b.set(f, &nftables.Set{Name: "affinity", KeyType: pf.addrType,
						Dynamic: true, HasTimeout: true, Timeout: 3 * time.Hour})
					b.rule(b.filterChain(f),
						pf.load(pf.saddrOff, probeReg1, pf.addrLen),
						&expr.Dynset{SrcRegKey: probeReg1, SetName: aff.Name, SetID: aff.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
				}},
			kernelProbe{Feature: "ct expression" + w, Option: "CONFIG_NFT_CT", Needs: []string{base},
				add: func(b *probeBatch) {
					// ct state new
					b.rule(b.filterChain(f),
						&expr.Ct{Register: probeReg1, Key: expr.CtKeySTATE},
						&expr.Bitwise{SourceRegister: probeReg1, DestRegister: probeReg1, Len: 4,
							Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: zero4},
						&expr.Cmp{Op: expr.CmpOpNeq, Register: probeReg1, Data: zero4})
				}},
			kernelProbe{Feature: "fib expression" + w, Option: pf.fibOption, Needs: []string{base},
				add: func(b *probeBatch) {
					// fib daddr type local
					b.rule(b.filterChain(f),
						&expr.Fib{Register: probeReg1, ResultADDRTYPE: true, FlagDADDR: true},
						&expr.Cmp{Op: expr.CmpOpEq, Register: probeReg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
				}},
			kernelProbe{Feature: "hash expression (jhash)" + w, Option: "CONFIG_NFT_HASH", Needs: []string{base},
				add: func(b *probeBatch) {
					// jhash ip saddr . th sport mod 2 seed 0x6e667467 == 1
					sportReg, n := uint32(probeReg32c), uint32(8)
					if f == nftables.TableFamilyIPv6 {
						sportReg, n = probeReg3, 20
					}
					b.rule(b.filterChain(f),
						pf.load(pf.saddrOff, probeReg2, pf.addrLen),
						&expr.Payload{DestRegister: sportReg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
						&expr.Hash{SourceRegister: probeReg2, DestRegister: probeReg1, Length: n, Modulus: 2,
							Seed: 0x6e667467, Type: expr.HashTypeJenkins},
						&expr.Cmp{Op: expr.CmpOpEq, Register: probeReg1, Data: binaryutil.NativeEndian.PutUint32(1)})
				}},
			kernelProbe{Feature: "reject expression" + w, Option: "CONFIG_NFT_REJECT and " + pf.rejectOption, Needs: []string{base},
				add: func(b *probeBatch) {
					b.rule(b.filterChain(f),
						&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: pf.icmpPortUnreach})
				}},
			kernelProbe{Feature: "nat expression (dnat)" + w, Option: "CONFIG_NFT_NAT", Needs: []string{nat},
				add: func(b *probeBatch) {
					// meta l4proto tcp dnat to 192.0.2.1:8080
					b.rule(b.natPrerouting(f),
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: probeReg1},
						&expr.Cmp{Op: expr.CmpOpEq, Register: probeReg1, Data: tcp},
						&expr.Immediate{Register: probeReg1, Data: pf.addr},
						&expr.Immediate{Register: probeReg2, Data: binaryutil.BigEndian.PutUint16(8080)},
						&expr.NAT{Type: expr.NATTypeDestNAT, Family: pf.natFamily, RegAddrMin: probeReg1,
							RegProtoMin: probeReg2, Specified: true})
				}},
			kernelProbe{Feature: "masq expression" + w, Option: "CONFIG_NFT_MASQ", Needs: []string{nat},
				add: func(b *probeBatch) {
					b.rule(b.natPostrouting(f), &expr.Masq{FullyRandom: true})
				}},
		)
	}
	return ps
}
