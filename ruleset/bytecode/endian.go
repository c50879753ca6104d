package bytecode

import "encoding/binary"

func nativePut32(b []byte, v uint32) { binary.NativeEndian.PutUint32(b, v) }
