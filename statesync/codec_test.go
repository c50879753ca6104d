package statesync

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

var errTest = errors.New("test")

func sampleOps() []op {
	v6 := Entry{Proto: 17,
		Orig:   Tuple{Src: netip.MustParseAddrPort("[2001:db8::7]:5000"), Dst: netip.MustParseAddrPort("[2001:db8:1::10]:53")},
		Reply:  Tuple{Src: netip.MustParseAddrPort("[fd00:1::5]:5353"), Dst: netip.MustParseAddrPort("[2001:db8:2::1]:5000")},
		Status: 0x3a, Timeout: 30, Mark: ReplicaMark | 7}
	sctp := flow(1002)
	sctp.Proto, sctp.TCP = protoSCTP, TCPInfo{}
	sctp.SCTP = SCTPInfo{State: 3, VTagOrig: 0x5678ef01, VTagReply: 0x1234abcd}
	return []op{{entry: flow(1000)}, {del: true, entry: flow(1001)}, {entry: v6}, {entry: sctp}}
}

func TestBatchRoundTrip(t *testing.T) {
	var be batchEncoder
	be.reset(42, 1234567890)
	for _, o := range sampleOps() {
		if err := be.add(&o); err != nil {
			t.Fatal(err)
		}
	}
	mixed := op{entry: flow(1)}
	mixed.entry.Reply.Src = netip.MustParseAddrPort("[fd00::1]:80")
	if err := be.add(&mixed); err == nil {
		t.Error("an entry of two families encoded")
	}
	bt, err := decodeBatch(be.finish(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if bt.seq != 42 || bt.stamp != 1234567890 || !reflect.DeepEqual(bt.ops, sampleOps()) {
		t.Errorf("decoded %+v\nwant %+v", bt, sampleOps())
	}
	msg := be.finish()
	for i := range msg {
		if _, err := decodeBatch(msg[:i], nil); err == nil {
			t.Errorf("a batch cut at %d of %d bytes decoded", i, len(msg))
		}
	}
	bad := append([]byte{}, msg...)
	bad[0] = codecVersion + 1
	if _, err := decodeBatch(bad, nil); err == nil {
		t.Errorf("version %d decoded", bad[0])
	}
	a := ack{seq: 9, stamp: -5, written: 300, refused: 2}
	if got, err := decodeAck(encodeAck(a)); err != nil || got != a {
		t.Errorf("ack: %+v %v", got, err)
	}
}

// The decoder never panics and never allocates beyond what the message
// holds; what it accepts encodes back to the same bytes.
func FuzzDecodeBatch(f *testing.F) {
	var be batchEncoder
	be.reset(1, 2)
	for _, o := range sampleOps() {
		_ = be.add(&o)
	}
	f.Add(be.finish())
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, msg []byte) {
		bt, err := decodeBatch(msg, nil)
		if err != nil {
			return
		}
		var re batchEncoder
		re.reset(bt.seq, bt.stamp)
		for _, o := range bt.ops {
			if err := re.add(&o); err != nil {
				t.Fatalf("decoded entry does not encode: %v", err)
			}
		}
		if got := re.finish(); string(got) != string(msg) {
			// Only a non-minimal count varint may differ.
			bt2, err := decodeBatch(got, nil)
			if err != nil || !reflect.DeepEqual(bt2.ops, bt.ops) {
				t.Fatalf("re-encoding differs: %x vs %x", got, msg)
			}
		}
	})
}
