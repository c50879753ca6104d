package ctnetlink

import (
	"encoding/binary"
	"testing"
)

// msg is a netlink message of type typ with payload bytes of payload.
func msg(typ uint16, payload int) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(NlmsgHdrLen+payload))
	b = binary.NativeEndian.AppendUint16(b, typ)
	return append(b, make([]byte, 10+payload)...)
}

// Messages walks a datagram's messages, padded to four bytes each or not
// at its end, stops when told, and says when a length does not fit.
func TestMessages(t *testing.T) {
	var dgram []byte
	dgram = append(dgram, msg(1, 3)...) // 19 bytes: padded to 20 below
	dgram = append(dgram, 0)
	dgram = append(dgram, msg(2, 4)...)
	dgram = append(dgram, msg(3, 1)...) // the last one, unpadded
	var types []uint16
	if err := Messages(dgram, func(typ uint16, m []byte) bool { types = append(types, typ); return true }); err != nil || len(types) != 3 {
		t.Errorf("walked %v, %v; want types 1, 2, 3", types, err)
	}
	types = nil
	_ = Messages(dgram, func(typ uint16, m []byte) bool { types = append(types, typ); return typ != 2 })
	if len(types) != 2 {
		t.Errorf("walked %v after being told to stop at 2", types)
	}
	bad := append(msg(1, 0), msg(2, 0)...)
	binary.NativeEndian.PutUint32(bad[NlmsgHdrLen:], 100)
	types = nil
	if err := Messages(bad, func(typ uint16, m []byte) bool { types = append(types, typ); return true }); err == nil || len(types) != 1 {
		t.Errorf("a length past the end: walked %v, %v; want the first message and an error", types, err)
	}
}
