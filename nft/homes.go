package nft

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/ruleset"
)

// The elements of ruleset.MapMidstreamHomes are not rendered from the
// Services: the gateway set's liveness and holdings decide them at run
// time (a dead peer's masquerade addresses that this gateway holds, by
// bucket of the client's address hash). The Programmer writes them in a
// batch of its own socket, so that they are its transactions rather than
// drift; the read-back does not compare them, and a full sync that read
// the tables back or added a set writes them again, since the map may
// have been made anew.

// SetMidstreamHomes replaces the elements of every family's
// ruleset.MapMidstreamHomes with els (ruleset.MidstreamHomeElements; none
// empties the maps). Before the first full sync they are only kept: that
// sync writes them.
func (p *Programmer) SetMidstreamHomes(els []ruleset.Element) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.homes, p.homesDue = els, true
	if !p.synced || p.partway {
		return nil
	}
	return p.writeHomes()
}

// writeHomes commits the homes' elements alone.
func (p *Programmer) writeHomes() error {
	ds := make([]*ruleset.Ops, len(p.tables.Refs))
	for i := range ds {
		ds[i] = &ruleset.Ops{}
	}
	if _, _, err := p.commit(ds, nil, nil, p.homesPart); err != nil {
		return err
	}
	p.homesDue = false
	return nil
}

// homesPart encodes the flush of each family's map of homes and the
// elements of its family: nil when no family has the map.
func (p *Programmer) homesPart(lastID *atomic.Uint32, describe bool) *wire {
	w := newWire(256+len(p.homes)*64, len(p.homes)/elementsPerMessage+4, describe)
	for _, f := range ruleset.Families {
		if ruleset.MidstreamHomesModulus(&p.cfg, f) == 0 {
			continue
		}
		e := newEncoder(w, lastID, p.tables.Refs[p.tables.Main(f)].Name, f)
		// A deletion of elements that names none flushes the set.
		w.begin(unix.NFT_MSG_DELSETELEM, flagsCreate, byte(f))
		w.str(unix.NFTA_SET_ELEM_LIST_SET, ruleset.MapMidstreamHomes)
		w.str(unix.NFTA_SET_ELEM_LIST_TABLE, e.table)
		w.end()
		e.note(note{op: noteDelElems, name: ruleset.MapMidstreamHomes})
		var els []ruleset.Element
		for _, el := range p.homes {
			if ruleset.Of(el.To.Addr()) == f {
				els = append(els, el)
			}
		}
		if len(els) > 0 {
			e.elements(els, false)
		}
	}
	if w.count == 0 {
		return nil
	}
	return w
}
