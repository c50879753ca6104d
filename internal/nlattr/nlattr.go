// Package nlattr walks netlink attributes in place: each attribute's value
// is a slice of the message it came in, so that a dump of hundreds of
// thousands of flows or set elements is decoded without allocating.
// (mdlayher/netlink's AttributeDecoder copies every attribute's value.)
package nlattr

import (
	"encoding/binary"
	"fmt"
)

// typeMask clears NLA_F_NESTED and NLA_F_NET_BYTEORDER from an
// attribute's type.
const typeMask = 0x3fff

// Walk calls fn for each netlink attribute in b, with its type (without
// the nested and byte-order flags) and its value, a slice of b. It
// allocates nothing. It stops at fn's first error, and returns it.
func Walk(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) & typeMask
		if l < 4 || l > len(b) {
			return fmt.Errorf("malformed netlink attribute (length %d, %d bytes left)", l, len(b))
		}
		if err := fn(typ, b[4:l]); err != nil {
			return err
		}
		al := (l + 3) &^ 3
		if al > len(b) {
			break
		}
		b = b[al:]
	}
	return nil
}
