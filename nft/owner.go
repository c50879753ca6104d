package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/nftgate/nftgate/ruleset"
	"golang.org/x/sys/unix"
)

// Table ownership. nftgate marks every table it creates with a comment in
// the table's user data (NFTA_TABLE_USERDATA, where `nft` keeps
// `comment "..."`), and never changes, deletes or takes over a table of one
// of its names without the mark: the host's own `table ip filter` stays as
// it is when `table = "filter"` is configured, and nftgate refuses to
// start. A table without the mark whose chains all have names nftgate
// gives (those of its tables' skeletons, and Service chains), as an older
// nftgate left it, is nftgate's too: it is replaced by a marked one, in the
// same batch as the rest of the first sync, so traffic never sees it
// missing.

// TableComment is the comment nftgate marks its tables with.
const TableComment = "managed by nftgate"

// nftaTableUserdata is NFTA_TABLE_USERDATA, which x/sys/unix lacks.
const nftaTableUserdata = 6

// tableMark is a marked table's user data: a comment, NUL-terminated, as
// nft writes it.
var tableMark = userdata.Append(nil, userdata.TypeComment, []byte(TableComment+"\x00"))

// marked tells whether a table's user data carries nftgate's mark.
func marked(ud []byte) bool {
	return bytes.Equal(bytes.TrimRight(userdata.Get(ud, userdata.TypeComment), "\x00"), []byte(TableComment))
}

// ForeignTableError is a table of one of nftgate's names that nftgate did
// not make.
type ForeignTableError struct {
	Family ruleset.Family
	Name   string
}

func (e *ForeignTableError) Error() string {
	return fmt.Sprintf("table %s %s exists and was not made by nftgate (it has no %q comment): nftgate never changes a table it does not own; choose another table name",
		e.Family, e.Name, TableComment)
}

// tableInfo is one table in the kernel, as ownership sees it.
type tableInfo struct {
	name   string
	marked bool
}

// tables lists family f's tables, with their marks. google/nftables does
// not decode a table's user data.
func (r *reader) tables(f ruleset.Family) ([]tableInfo, error) {
	msgs, err := r.nl.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: []byte{byte(f), unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	var out []tableInfo
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		var t tableInfo
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_TABLE_NAME:
				t.name = ad.String()
			case nftaTableUserdata:
				t.marked = marked(ad.Bytes())
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		out = append(out, t)
	}
	return out, nil
}

// serviceChainName matches the chains nftgate makes for Services.
var serviceChainName = regexp.MustCompile(`^(svc|ep|local|ext|fw)-`)

// ownership decides, for family f, which of the tables of nftgate's names
// (cfg's main table and shard tables of any count) are nftgate's. It
// returns them by name, with true for those to replace by a marked table
// (an older nftgate's), and the names of those that are not nftgate's.
// chains are the names of the family's chains, by table.
func ownership(cfg *ruleset.Config, f ruleset.Family, present []tableInfo, chains map[string][]string) (own map[string]bool, foreign []string) {
	ts := ruleset.NewTables(cfg)
	skeleton := map[string]bool{}
	for _, slot := range ts.Slots(f)[:2] { // the main table and a shard
		for _, c := range ts.Skeletons[slot].Chains {
			skeleton[c.Name] = true
		}
	}
	own = map[string]bool{}
	for _, t := range present {
		if t.name != cfg.Table && !cfg.IsShardTable(t.name) {
			continue
		}
		if t.marked {
			own[t.name] = false
			continue
		}
		if !nftgateLayout(skeleton, chains[t.name]) {
			foreign = append(foreign, t.name)
			continue
		}
		own[t.name] = true
	}
	return own, foreign
}

// nftgateLayout tells whether a table's chains are of nftgate's layout:
// there are some, and each has a name of the skeleton, of a Service chain
// or of a chain the Services of a shard share.
func nftgateLayout(skeleton map[string]bool, chains []string) bool {
	for _, c := range chains {
		if !skeleton[c] && !ruleset.Shared(c) && (!serviceChainName.MatchString(c) || !strings.Contains(c, "/")) {
			return false
		}
	}
	return len(chains) > 0
}

// owned reads family f's tables and decides their ownership (see
// ownership).
func (r *reader) owned(cfg *ruleset.Config, f ruleset.Family) (own map[string]bool, foreign []string, err error) {
	present, err := r.tables(f)
	if err != nil {
		return nil, nil, err
	}
	chains := map[string][]string{}
	for _, t := range present {
		if !t.marked && (t.name == cfg.Table || cfg.IsShardTable(t.name)) {
			chains[t.name] = nil
		}
	}
	if len(chains) > 0 {
		list, err := r.conn.ListChainsOfTableFamily(nftFamily(f))
		if err != nil {
			return nil, nil, fmt.Errorf("list chains: %w", err)
		}
		for _, c := range list {
			if c.Table != nil {
				if _, ok := chains[c.Table.Name]; ok {
					chains[c.Table.Name] = append(chains[c.Table.Name], c.Name)
				}
			}
		}
	}
	own, foreign = ownership(cfg, f, present, chains)
	return own, foreign, nil
}

// checkOwnership fails with a ForeignTableError when a table nftgate
// would program (the main table or a shard of this shard count) is not
// nftgate's. Shard tables of another count that are not nftgate's are
// left alone. It returns the shard count of nftgate's tables in place:
// the number of its shard tables of family ip (or, without them, ip6)
// that follow one another from the first; 0 without any.
func (r *reader) checkOwnership(cfg *ruleset.Config) (inPlace int, err error) {
	ts := ruleset.NewTables(cfg)
	for _, f := range ruleset.Families {
		own, foreign, err := r.owned(cfg, f)
		if err != nil {
			return 0, err
		}
		for _, n := range foreign {
			if slices.Contains(ts.Names(f), n) {
				return 0, &ForeignTableError{Family: f, Name: n}
			}
		}
		if inPlace == 0 {
			for inPlace < ruleset.MaxShards {
				if _, ok := own[cfg.ShardTable(inPlace)]; !ok {
					break
				}
				inPlace++
			}
		}
	}
	return inPlace, nil
}
