package nft

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/ruleset"
)

// The elements of ruleset.MapMidstreamHomes and of the flag
// ruleset.SetMidstreamPeerDead are not rendered from the Services: the
// gateway set's liveness and holdings decide them at run time (a dead
// peer's masquerade addresses, by bucket of the client's address hash;
// whether a peer is dead). The Programmer writes them in a batch of its
// own socket, so that they are its transactions rather than drift; the
// read-back does not compare them, and a full sync that read the tables
// back or added a set writes them again, since the sets may have been made
// anew.

// SetMidstreamElements replaces the elements of every family's
// ruleset.MapMidstreamHomes and ruleset.SetMidstreamPeerDead with els
// (ruleset.MidstreamHomeElements, each written in its address's family,
// and ruleset.MidstreamPeerDeadElement, in every family; none empties
// them). Before the first full sync they are only kept: that sync writes
// them.
func (p *Programmer) SetMidstreamElements(els []ruleset.Element) error {
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

// homesPart encodes the flush of each family's map of homes and flag of a
// dead peer, and their elements of its family: nil when no family has
// either.
func (p *Programmer) homesPart(lastID *atomic.Uint32, describe bool) *wire {
	w := newWire(256+len(p.homes)*64, len(p.homes)/elementsPerMessage+4, describe)
	for _, f := range ruleset.Families {
		var sets []string
		if ruleset.MidstreamHomesModulus(&p.cfg, f) > 0 {
			sets = append(sets, ruleset.MapMidstreamHomes)
		}
		if p.cfg.MidstreamShortens() {
			sets = append(sets, ruleset.SetMidstreamPeerDead)
		}
		if len(sets) == 0 {
			continue
		}
		e := newEncoder(w, lastID, p.tables.Refs[p.tables.Main(f)].Name, f)
		for _, set := range sets {
			// A deletion of elements that names none flushes the set.
			w.begin(unix.NFT_MSG_DELSETELEM, flagsCreate, byte(f))
			w.str(unix.NFTA_SET_ELEM_LIST_SET, set)
			w.str(unix.NFTA_SET_ELEM_LIST_TABLE, e.table)
			w.end()
			e.note(note{op: noteDelElems, name: set})
			var els []ruleset.Element
			for _, el := range p.homes {
				if el.Map == set && (set != ruleset.MapMidstreamHomes || ruleset.Of(el.To.Addr()) == f) {
					els = append(els, el)
				}
			}
			if len(els) > 0 {
				e.elements(els, false)
			}
		}
	}
	if w.count == 0 {
		return nil
	}
	return w
}
