package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftgate/nftgate/internal/nlattr"
	"github.com/nftgate/nftgate/ruleset"
)

// The elements of a set are read here rather than with google/nftables'
// GetSetElements, which allocates a SetElement, its byte slices and a
// counter expression per element, and a buffer per message: a reading of
// two full traffic sets (131,072 elements) allocated 437 MB. Here each
// dump message is received into one buffer the reader keeps, and each
// element is handed over as slices of it.

// Element attributes newer than golang.org/x/sys/unix's list
// (include/uapi/linux/netfilter/nf_tables.h).
const (
	nftaSetElemKeyEnd      = 10 // NFTA_SET_ELEM_KEY_END
	nftaSetElemExpressions = 11 // NFTA_SET_ELEM_EXPRESSIONS
)

// setElem is one element of a set or map as the kernel dumped it. Its
// slices point into the reader's receive buffer: they are valid only
// during the call that gets them.
type setElem struct {
	Key, KeyEnd []byte
	// Data is a map's data value; a verdict map's elements have a
	// Verdict instead (HasVerdict), and Chain for a jump or goto.
	Data       []byte
	HasVerdict bool
	Verdict    int32
	Chain      []byte
	Flags      uint32 // NFT_SET_ELEM_*
	// Timeout and Expires are the element's timeout and the time left
	// until it expires, when it has them.
	Timeout, Expires time.Duration
	// HasCounter says that the element carries a counter, Counter its
	// count.
	HasCounter bool
	Counter    Count
}

// eachElem dumps the elements of set name in table of family f and calls
// fn with each. An error of fn stops the calls; the rest of the dump is
// received and dropped, and the error returned.
func (r *reader) eachElem(f ruleset.Family, table, name string, fn func(*setElem) error) error {
	var e setElem
	return r.dump(f, unix.NFT_MSG_GETSETELEM, "set "+table+" "+name, []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(name + "\x00")},
	}, func(msg []byte) error {
		return eachListed(msg, unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(v []byte) error {
			e = setElem{}
			if err := decodeElem(v, &e); err != nil {
				return fmt.Errorf("element of set %s %s: %w", table, name, err)
			}
			return fn(&e)
		})
	})
}

// eachRuleCounter dumps the rules of chain in table of family f and calls
// fn with the count of each counter expression they hold. As eachElem,
// and for the same reason: google/nftables' GetRules builds every
// expression of every rule (at 100,000 Services, 5,000 with source
// ranges on two ports, a reading's one dump per chain allocated 97 MB).
func (r *reader) eachRuleCounter(f ruleset.Family, table, chain string, fn func(Count)) error {
	return r.dump(f, unix.NFT_MSG_GETRULE, "chain "+table+" "+chain, []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	}, func(msg []byte) error {
		return eachListed(msg, unix.NFTA_RULE_EXPRESSIONS, func(v []byte) error {
			c, ok, err := decodeCounterExpr(v)
			if ok {
				fn(c)
			}
			return err
		})
	})
}

// eachListed calls fn with each element (NFTA_LIST_ELEM) of the list
// attribute typ of msg.
func eachListed(msg []byte, typ uint16, fn func([]byte) error) error {
	return nlattr.Walk(msg, func(t uint16, v []byte) error {
		if t != typ {
			return nil
		}
		return nlattr.Walk(v, func(t uint16, v []byte) error {
			if t != unix.NFTA_LIST_ELEM {
				return nil
			}
			return fn(v)
		})
	})
}

// dump sends a dump request of type msg (NFT_MSG_GET*) with attrs for
// family f, and calls fn with the attributes of each message of the
// answer (after its nfgenmsg header), in the reader's one receive buffer.
// An error of fn stops the calls; the rest of the dump is received and
// dropped, and the error returned. what names the object in errors.
func (r *reader) dump(f ruleset.Family, msg int, what string, attrs []netlink.Attribute, fn func([]byte) error) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	req, err := r.nl.Send(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(f), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		return fmt.Errorf("ask the contents of %s: %w", what, err)
	}
	if r.buf == nil {
		r.buf = make([]byte, dumpMessageSize)
	}
	rc, err := r.nl.SyscallConn()
	if err != nil {
		return err
	}
	var (
		n, flags int
		rerr     error
	)
	recv := func(fd uintptr) bool {
		n, _, flags, _, rerr = unix.Recvmsg(int(fd), r.buf, nil, 0)
		return rerr != unix.EAGAIN
	}
	var ferr error // fn's, or a malformed message's
	for {
		if err := rc.Read(recv); err != nil {
			return err
		}
		if rerr != nil {
			return fmt.Errorf("receive the contents of %s: %w", what, rerr)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return fmt.Errorf("receive the contents of %s: message larger than %d bytes", what, len(r.buf))
		}
		msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
		if err != nil {
			return fmt.Errorf("receive the contents of %s: %w", what, err)
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Header.Sequence {
				continue // the rest of a dump given up on
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return ferr
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return fmt.Errorf("contents of %s: short netlink error", what)
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
					return fmt.Errorf("list the contents of %s: %w", what, unix.Errno(-code))
				}
				continue
			}
			if ferr != nil || len(m.Data) < 4 {
				continue
			}
			ferr = fn(m.Data[4:])
		}
	}
}

// decodeElem decodes one element's attributes (NFTA_SET_ELEM_*) into e.
func decodeElem(b []byte, e *setElem) error {
	return nlattr.Walk(b, func(typ uint16, v []byte) error {
		var err error
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			e.Key, err = dataValue(v)
		case nftaSetElemKeyEnd:
			e.KeyEnd, err = dataValue(v)
		case unix.NFTA_SET_ELEM_DATA:
			err = nlattr.Walk(v, func(typ uint16, v []byte) error {
				switch typ {
				case unix.NFTA_DATA_VALUE:
					e.Data = v
				case unix.NFTA_DATA_VERDICT:
					e.HasVerdict = true
					return nlattr.Walk(v, func(typ uint16, v []byte) error {
						switch typ {
						case unix.NFTA_VERDICT_CODE:
							c, err := be32(v)
							e.Verdict = int32(c)
							return err
						case unix.NFTA_VERDICT_CHAIN:
							e.Chain = cString(v)
						}
						return nil
					})
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_FLAGS:
			e.Flags, err = be32(v)
		case unix.NFTA_SET_ELEM_TIMEOUT:
			var ms uint64
			ms, err = be64(v)
			e.Timeout = time.Duration(ms) * time.Millisecond
		case unix.NFTA_SET_ELEM_EXPIRATION:
			var ms uint64
			ms, err = be64(v)
			e.Expires = time.Duration(ms) * time.Millisecond
		case unix.NFTA_SET_ELEM_EXPR:
			err = decodeElemExpr(v, e)
		case nftaSetElemExpressions:
			err = nlattr.Walk(v, func(typ uint16, v []byte) error {
				if typ != unix.NFTA_LIST_ELEM {
					return nil
				}
				return decodeElemExpr(v, e)
			})
		}
		return err
	})
}

// decodeElemExpr decodes one of an element's expressions: of them only a
// counter is read.
func decodeElemExpr(b []byte, e *setElem) error {
	c, ok, err := decodeCounterExpr(b)
	if ok {
		e.HasCounter, e.Counter = true, c
	}
	return err
}

// decodeCounterExpr decodes an expression (NFTA_EXPR_NAME, NFTA_EXPR_DATA)
// when it is a counter; ok is false for any other.
func decodeCounterExpr(b []byte) (c Count, ok bool, err error) {
	var name, data []byte
	if err := nlattr.Walk(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_EXPR_NAME:
			name = cString(v)
		case unix.NFTA_EXPR_DATA:
			data = v
		}
		return nil
	}); err != nil {
		return Count{}, false, err
	}
	if string(name) != "counter" {
		return Count{}, false, nil
	}
	err = nlattr.Walk(data, func(typ uint16, v []byte) error {
		var err error
		switch typ {
		case unix.NFTA_COUNTER_BYTES:
			c.Bytes, err = be64(v)
		case unix.NFTA_COUNTER_PACKETS:
			c.Packets, err = be64(v)
		}
		return err
	})
	return c, true, err
}

// dataValue returns the value of an NFTA_DATA_VALUE in b.
func dataValue(b []byte) ([]byte, error) {
	var out []byte
	err := nlattr.Walk(b, func(typ uint16, v []byte) error {
		if typ == unix.NFTA_DATA_VALUE {
			out = v
		}
		return nil
	})
	return out, err
}

var errAttrLen = errors.New("attribute of unexpected length")

func be32(b []byte) (uint32, error) {
	if len(b) != 4 {
		return 0, errAttrLen
	}
	return binary.BigEndian.Uint32(b), nil
}

func be64(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, errAttrLen
	}
	return binary.BigEndian.Uint64(b), nil
}

// cString is b without its terminating NUL.
func cString(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == 0 {
		return b[:n-1]
	}
	return b
}
